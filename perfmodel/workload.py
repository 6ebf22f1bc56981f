"""ModelSpec -> workload: parameters, FLOPs and activation bytes of a decoder transformer.

A model file has exactly the keys of ``MODEL_KEYS``. Layernorm models (GPT-2/3, NeoX, BERT)
carry biases on every linear layer; rmsnorm models (LLaMA) none. Conventions:

* ``params``: every weight, embeddings included (tied embeddings counted once).
* Model FLOPs per token (Narayanan et al., SC21, and PaLM's MFU): ``6 N`` for the
  weights plus ``12 L h s`` for attention scores (QK^T and AV, forward 4 L h s, the full
  s x s matrix as Megatron counts it), N = ``params``.
* Activation bytes per layer (Korthikanti et al., MLSys 2023, Eq. 1-6, 2-byte activations):
  ``34 s b h`` without parallelism; tensor parallelism divides the 24 sbh of TP-split tensors
  (and with sequence parallelism the other 10 sbh too), full recompute keeps only the 2 sbh
  layer input. Korthikanti's ``5 a s^2 b`` of attention (softmax output, dropout mask and
  output: the s x s scores) is not kept: every attention the model prices is flash-style
  (``kernels`` fused: Transformer Engine's FlashAttention; eager: PyTorch's
  ``scaled_dot_product_attention`` and realrun's ring blocks, recomputed in backward), which
  keeps the softmax statistics instead, an fp32 log-sum-exp per head and token (Dao et al.
  2022, Algorithm 2: ``4 a s b`` bytes, TP-split); selective recompute drops those too. With
  the s x s term every FlashAttention-trained row of ``validation/published`` (per-GPU batch 32
  of GPT3-125M at 2048 tokens, no checkpointing, on 80 GB) was predicted not to fit, and
  Megatron-Core's 2024 rows from 70B.

Mixture-of-experts models add the optional keys of ``MOE_KEYS`` (all absent: a dense model).
A MoE layer replaces the MLP with a router (an h x E linear layer, 2 h E FLOPs a token), E
routed experts of ``moe_ffn_hidden_size`` (each an MLP of the model's ``activation``), of which
each token visits ``moe_top_k``, and ``moe_shared_experts`` experts of the same size every token
visits. Which layers: every ``moe_layer_freq``-th layer after the first ``moe_first_dense``
dense ones (DeepSeek-V3: 1 and 3; GShard-style every other layer: 2). ``params`` counts every
expert; ``active_params`` what one token meets (top-k routed plus shared), and the model FLOPs
per token are ``6 active_params + 12 L h s``. ``moe_capacity_factor`` (0: dropless) caps the
tokens an expert takes at that multiple of its fair share; ``moe_load_imbalance`` (>= 1) is how
many times its fair share the most loaded expert receives, and that expert sets the layer's
time: the expert GEMMs run at ``min(imbalance, capacity)`` times the balanced load.
``moe_pad_to_capacity`` (Megatron-Core's ``--moe-pad-expert-input-to-capacity``; realrun's MoE
layer pads where it is set, else sends each expert its kept rows) fills every expert's queue to its capacity: the dispatch and combine carry
``capacity x experts`` rows and every expert computes its capacity's, whatever the routing.

Attention (the optional keys of ``ATTENTION_KEYS``; all absent: multi-head attention of
``hidden_size / num_heads``-wide heads, grouped-query where ``num_kv_heads < num_heads``; docs/predict.md,
Attention kinds). ``head_dim`` sets the heads' width apart from the hidden size (Qwen3: 32 heads of 128
beside a 2048 hidden; GPT-OSS: 64 of 64 beside 2880), so Q is ``num_heads x head_dim`` wide, K and V
``num_kv_heads x head_dim``, and the output projection takes ``num_heads x head_dim`` back to the hidden
size. ``sliding_window`` (tokens a query sees, itself included; HF's ``sliding_window``, Megatron-Core's
``window_size`` + 1) makes a layer's scores ``seq x min(seq, window)``; ``window_attn_skip_freq`` N keeps
every N-th layer (1-based, Megatron-Core's ``window_attn_skip_freq``) at full attention (GPT-OSS: 2; 0:
every layer windowed). ``attention = "mla"`` is DeepSeek's multi-head latent attention (DeepSeek-V2,
arXiv 2405.04434, section 2.1), as Megatron-Core builds it
(megatron/core/transformer/multi_latent_attention.py, ``MLASelfAttention``): the query through a
``q_lora_rank`` latent (a down projection, an RMSNorm, an up projection to ``num_heads x (qk_nope_head_dim
+ qk_rope_head_dim)``; 0: one plain projection, as DeepSeek-V2-Lite), keys and values through a
``kv_lora_rank`` latent (one down projection to ``kv_lora_rank + qk_rope_head_dim``, an RMSNorm on the
latent, an up projection to ``num_heads x (qk_nope_head_dim + v_head_dim)``; the rope part of the key is
shared by the heads), scores over ``qk_nope + qk_rope`` dims, values and output of ``v_head_dim``.

Model FLOPs per token: ``6 active_params`` plus, per layer, ``6 x keys x num_heads x (qk + v)`` for its
scores and values (keys: the sequence, or the window; qk = v = head_dim outside MLA: the ``12 L h s`` of
multi-head attention). Activation bytes per layer keep Korthikanti's count with the attention's part
taken from its shapes (``attention_kept_bytes``): 3 bytes a hidden element kept whole (the QKV input and the
dropout mask) and 8 bytes a query element TP-split (Q, K, V and the output at the query's width, as
Korthikanti counts multi-head attention: grouped-query K and V are counted as wide as Q, as before);
MLA keeps its latents (each norm's input and the up projection's input), the rope key, and Q, K, V and the
output at their own widths. A window does not change them: flash-style attention keeps per-token
tensors, never the scores.

``mtp_layers`` (DeepSeek-V3's multi-token prediction, arXiv 2412.19437 section 2.2; Megatron-Core's
``mtp_num_layers``, megatron/core/transformer/multi_token_prediction.py): each module is one more
transformer layer of the kind of the model's last layer (MoE in DeepSeek-V3:
``get_gpt_mtp_block_spec`` takes the last layer's spec), a ``2h x h`` projection of the hidden state
and the next token's embedding (each RMS-normed first) and a final norm, with the embedding and LM head
shared with the model; its loss is one more pass of the LM head. Megatron-Core builds it on the last
pipeline stage (``mtp_on_this_rank``), so ``stage_layer_params`` counts it with the layers that end the
model; ``params`` and ``active_params`` include it (the published counts of DeepSeek-V3, 671B and 37B,
do not: the catalog model has none, ``deepseek-v3:mtp_layers=1`` has its module).

Hybrid models (the optional keys of ``HYBRID_KEYS``; docs/predict.md, Hybrid layer patterns) stack layers of one
mixer each, as Megatron-Core's hybrid stack builds them: ``hybrid_layer_pattern`` has a symbol a layer
(``HYBRID_SYMBOLS``: ``M`` a Mamba-2 mixer, ``*`` attention, ``-`` an MLP, ``E`` a MoE MLP, each with its own norm),
its ``E`` layers the MoE layers; the Mamba-2 mixer's shape is Megatron's ``mamba_*`` keys, its parameters, scan FLOPs
and kept activations ``perfmodel.step.mamba``'s. A layer's parameters, FLOPs and kept bytes are its mixer's
(``hybrid_layer_params``, ``hybrid_kept_bytes``), the model's their sum over the pattern, plus three passes of every
Mamba layer's SSD scan in the model FLOPs. ``moe_latent_size`` (LatentMoE, Megatron-Core's ``moe_latent_size``)
runs the routed experts on tokens that wide, projected from and back to the hidden size (``latent_params``); the
shared experts stay on the hidden size. ``activation = "relu2"`` is squared ReLU (no gate). ``mtp_use_repeated_layer``
runs every multi-token-prediction depth on one module's weights (``mtp_copies``): the parameters hold one module,
the FLOPs every depth.

A model name may carry changed keys, ``NAME:key=value,...`` (``deepseek-v3:mtp_layers=1``,
``qwen3-30b-a3b:moe_capacity_factor=1,moe_pad_to_capacity=true``), each value a TOML value, the
result validated as a model file is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache, cache
from pathlib import Path
from types import SimpleNamespace

from perfmodel.devices import read_catalog
from perfmodel.step import mamba
from topologies import bounds
from topologies.clikit import file_format
from topologies.errors import InputError
from topologies.variants import parse_options

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

MODEL_KEYS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size",
              "vocab_size", "seq_len", "activation", "norm", "tied_embeddings")
# bytes flash-style attention keeps per head and token for backward: the fp32 log-sum-exp of
# each query's scores (Dao et al. 2022, FlashAttention, Algorithm 2; Transformer Engine and
# PyTorch's scaled_dot_product_attention keep the same), in place of Korthikanti's s x s scores
SOFTMAX_STAT_BYTES = 4.0
# relu2: squared ReLU, an MLP without a gate (Megatron's --squared-relu; Nemotron-H's and Nemotron 3's MLPs and experts)
CHOICES = {"activation": ("gelu", "swiglu", "relu2"), "norm": ("layernorm", "rmsnorm")}
# optional keys of a mixture-of-experts model, and their dense defaults
MOE_KEYS = {"num_experts": 0, "moe_top_k": 0, "moe_shared_experts": 0, "moe_ffn_hidden_size": 0,
            "moe_layer_freq": 1, "moe_first_dense": 0, "moe_capacity_factor": 0.0, "moe_load_imbalance": 1.0,
            "moe_pad_to_capacity": False, "moe_latent_size": 0}
# optional keys of the attention and the multi-token-prediction modules, and their defaults (module doc)
ATTENTION_KINDS = ("gqa", "mla")   # multi-head / grouped-query by num_kv_heads, or multi-head latent attention
ATTENTION_KEYS = {"attention": "gqa", "head_dim": 0, "sliding_window": 0, "window_attn_skip_freq": 0,
                  "q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0,
                  "mtp_layers": 0, "mtp_use_repeated_layer": False}
# bytes a multi-token-prediction module keeps beside its layer per token and hidden element (2-byte activations):
# the inputs of its enorm and hnorm (2 each), of its 2h x h projection (the two normed halves, 4) and of its final
# norm (2); under full recompute the hidden state and the next tokens' embedding it starts from (2 each)
MTP_KEPT_BYTES, MTP_RECOMPUTE_KEPT_BYTES = 2 + 2 + 4 + 2, 2 + 2
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# A hybrid model's layer symbols, as Megatron-Core's hybrid_layer_pattern spells them (megatron/core/models/hybrid/
# hybrid_layer_allocation.py @ NVIDIA/Megatron-LM d98e8a64dd, Symbols, lines 14-26): each a layer of one mixer.
# Its other symbols (G gated delta net, D DeepSeek sparse attention, + MLA, | pipeline split, / MTP) are not held.
HYBRID_SYMBOLS = {"M": "Mamba-2 mixer", "*": "self-attention", "-": "MLP", "E": "mixture of experts"}
# optional keys of a hybrid model (module doc), and their defaults: the pattern and the Mamba-2 mixer's shape
HYBRID_KEYS = {"hybrid_layer_pattern": "", **mamba.DEFAULTS}
# bounds of the Mamba keys (0 for mamba_num_heads: expand x hidden_size / mamba_head_dim heads)
MAMBA_BOUNDS = {"mamba_state_dim": (1, 4096), "mamba_head_dim": (1, 4096), "mamba_num_heads": (0, 2**14),
                "mamba_num_groups": (1, 2**14), "mamba_d_conv": (1, 64), "mamba_expand": (1, 64),
                "mamba_chunk_size": (1, 2**16)}


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    activation: str
    norm: str
    tied_embeddings: bool
    num_experts: int = 0              # routed experts per MoE layer (0: a dense model)
    moe_top_k: int = 0                # routed experts each token visits
    moe_shared_experts: int = 0       # experts every token visits
    moe_ffn_hidden_size: int = 0      # one expert's MLP width
    moe_layer_freq: int = 1           # every k-th layer (after the dense ones) is MoE
    moe_first_dense: int = 0          # the first layers that stay dense
    moe_capacity_factor: float = 0.0  # tokens an expert takes, times its fair share (0: dropless)
    moe_load_imbalance: float = 1.0   # the most loaded expert's tokens, times its fair share
    moe_pad_to_capacity: bool = False  # every expert's input padded to its capacity (Megatron-Core's
    #                                    --moe-pad-expert-input-to-capacity; realrun's layer does)
    attention: str = "gqa"            # gqa (multi-head, grouped-query by num_kv_heads) or mla (module doc)
    head_dim: int = 0                 # a head's width (0 given: hidden_size // num_heads; MLA: qk_nope + qk_rope)
    sliding_window: int = 0           # tokens a windowed layer's query sees (0: full attention everywhere)
    window_attn_skip_freq: int = 0    # every N-th layer (1-based) keeps full attention (0: all windowed)
    q_lora_rank: int = 0              # MLA: the query's latent width (0: a plain query projection)
    kv_lora_rank: int = 0             # MLA: the keys' and values' latent width
    qk_nope_head_dim: int = 0         # MLA: a head's score dims without rope
    qk_rope_head_dim: int = 0         # MLA: a head's rope dims (the rope key shared by the heads)
    v_head_dim: int = 0               # MLA: a head's value width
    mtp_layers: int = 0               # multi-token-prediction modules (DeepSeek-V3: 1), on the last stage
    mtp_use_repeated_layer: bool = False  # every MTP depth runs one module's weights (Megatron-Core's option)
    moe_latent_size: int = 0          # LatentMoE: the routed experts' input and output width (0: hidden_size)
    hybrid_layer_pattern: str = ""    # a layer per symbol of HYBRID_SYMBOLS ("": attention + MLP every layer)
    mamba_state_dim: int = 128        # Mamba-2: d_state
    mamba_head_dim: int = 64          # Mamba-2: a head's width
    mamba_num_heads: int = 0          # Mamba-2: heads (0: mamba_expand x hidden_size / mamba_head_dim)
    mamba_num_groups: int = 8         # Mamba-2: groups sharing B and C
    mamba_d_conv: int = 4             # Mamba-2: the causal conv1d's taps
    mamba_expand: int = 2             # Mamba-2: d_inner / hidden_size where mamba_num_heads is 0
    mamba_chunk_size: int = 128       # Mamba-2: the SSD scan's chunk length

    def __post_init__(self):
        if not self.head_dim:       # the width a head scores over, as every user of head_dim reads it
            width = self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.hidden_size // self.num_heads
            object.__setattr__(self, "head_dim", width)

    @property
    def is_mla(self) -> bool:
        return self.attention == "mla"

    @property
    def score_dim(self) -> int:
        """The dims a query and a key head score over (MLA: the no-rope and rope parts)."""
        return self.head_dim

    @property
    def value_dim(self) -> int:
        """A value head's (and an attention output head's) width."""
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def q_width(self) -> int:
        """Width of the queries of a token (all heads)."""
        return self.num_heads * self.score_dim

    @property
    def out_width(self) -> int:
        """Width of a token's attention output, the output projection's input (all heads)."""
        return self.num_heads * self.value_dim

    @property
    def kv_dim(self) -> int:
        """Width of a token's keys (and of its values): num_kv_heads x head_dim; under MLA, whose keys
        and values differ in width, their mean (2 kv_dim: what a token's K and V hold, as context
        parallelism passes them)."""
        if self.is_mla:
            return self.num_heads * (self.score_dim + self.value_dim) // 2
        return self.num_kv_heads * self.head_dim

    @property
    def plain_attention(self) -> bool:
        """Multi-head or grouped-query attention of hidden_size / num_heads-wide heads, every layer at full
        attention and an MLP (gelu or swiglu, experts of hidden_size input), no multi-token prediction, no hybrid
        layer pattern: the layers realrun.train.model builds."""
        mlp = self.activation != "relu2" and not self.moe_latent_size
        return not self.is_mla and self.q_width == self.hidden_size and not self.sliding_window \
            and not self.mtp_layers and not self.is_hybrid and mlp

    @property
    def is_hybrid(self) -> bool:
        """Whether the model stacks layers of one mixer each (``hybrid_layer_pattern``, module doc)."""
        return bool(self.hybrid_layer_pattern)

    def kinds_in(self, first: int, count: int) -> dict[str, int]:
        """A hybrid model's layers ``first`` .. ``first + count - 1`` by symbol (``HYBRID_SYMBOLS``; every
        symbol present, 0 where none)."""
        part = self.hybrid_layer_pattern[first:first + count]
        return {symbol: part.count(symbol) for symbol in HYBRID_SYMBOLS}

    @property
    def attention_layers(self) -> int:
        """Layers with self-attention: every layer, or a hybrid model's ``*`` layers."""
        return self.kinds_in(0, self.num_layers)["*"] if self.is_hybrid else self.num_layers

    @property
    def mamba_layers(self) -> int:
        """A hybrid model's Mamba-2 layers (``M``; 0 in other models)."""
        return self.kinds_in(0, self.num_layers)["M"] if self.is_hybrid else 0

    def is_window_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) attends within ``sliding_window`` (Megatron-Core's
        ``is_layer_window_attention``: layer_number % window_attn_skip_freq != 0, 1-based)."""
        freq = self.window_attn_skip_freq
        return self.sliding_window > 0 and (freq == 0 or (index + 1) % freq != 0)

    @property
    def window_layers(self) -> int:
        """Layers that attend within the window (``is_window_layer``), in closed form."""
        if self.sliding_window == 0:
            return 0
        freq = self.window_attn_skip_freq
        return self.num_layers - (self.num_layers // freq if freq else 0)

    def score_keys(self, seq: int) -> float:
        """Keys a query is scored against in a layer, the mean over the model's (attention) layers: the sequence
        (the full s x s as Megatron counts causal attention) or, in a windowed layer, min(seq, window)."""
        windowed = self.window_layers
        if windowed == 0:
            return seq
        return ((self.num_layers - windowed) * seq + windowed * min(seq, self.sliding_window)) / self.num_layers

    @property
    def biased(self) -> bool:
        return self.norm == "layernorm"

    @property
    def mlp_up_width(self) -> int:
        """Output width of the MLP's first GEMM: f (gelu) or 2f (swiglu gate and up)."""
        return self.ffn_hidden_size * (2 if self.activation == "swiglu" else 1)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) is a MoE layer (a hybrid model's: an ``E``)."""
        if self.is_hybrid:
            return self.hybrid_layer_pattern[index] == "E"
        return self.is_moe and index >= self.moe_first_dense \
            and (index - self.moe_first_dense) % self.moe_layer_freq == 0

    def moe_layers_in(self, first: int, count: int) -> int:
        """MoE layers among layers ``first`` .. ``first + count - 1`` (a pipeline stage's): the
        multiples of ``moe_layer_freq`` in [lo, hi), counted from ``moe_first_dense`` (a hybrid
        model's: its ``E`` layers there)."""
        if not self.is_moe:
            return 0
        if self.is_hybrid:
            return self.kinds_in(first, count)["E"]
        d, f = self.moe_first_dense, self.moe_layer_freq
        lo, hi = max(first, d) - d, first + count - d
        return max(0, -(-hi // f) + (-lo // f))        # ceil(hi / f) - ceil(lo / f)

    @property
    def num_moe_layers(self) -> int:
        return self.moe_layers_in(0, self.num_layers)

    @property
    def expert_up_width(self) -> int:
        return self.moe_ffn_hidden_size * (2 if self.activation == "swiglu" else 1)

    @property
    def expert_width(self) -> int:
        """A routed expert's input and output width: ``moe_latent_size`` in a LatentMoE, else the hidden size."""
        return self.moe_latent_size or self.hidden_size

    def expert_params(self) -> int:
        """One routed expert's MLP (of ``expert_width`` input and output)."""
        return self.expert_width * (self.expert_up_width + self.moe_ffn_hidden_size)

    def shared_expert_params(self) -> int:
        """One shared expert's MLP: of the hidden size (a LatentMoE runs its shared experts before the latent
        projection: Megatron-Core's MoELayer, megatron/core/transformer/moe/moe_layer.py @ d98e8a64dd lines 423-428)."""
        return self.hidden_size * (self.expert_up_width + self.moe_ffn_hidden_size)

    def latent_params(self) -> int:
        """A LatentMoE's projections of the tokens to and from the experts' latent width (``fc1_latent_proj``,
        ``fc2_latent_proj``: duplicated TELinears, moe_layer.py lines 265-303; 0 in other models)."""
        return 2 * self.hidden_size * self.moe_latent_size

    @property
    def expert_copies(self) -> int:
        """Expert MLPs one token passes through in a MoE layer: top-k routed plus shared."""
        return self.moe_top_k + self.moe_shared_experts

    @property
    def expert_load(self) -> float:
        """The most loaded expert's rows over its fair share: the imbalance, capped by capacity;
        padded to capacity, the capacity itself (every expert computes its capacity's rows: the
        factor, at most all the tokens, ``num_experts / moe_top_k``, as ``dispatched_rows``)."""
        cap, every = self.moe_capacity_factor, self.num_experts / self.moe_top_k
        if self.moe_pad_to_capacity:
            return min(cap, every) if cap > 0 else every
        return min(self.moe_load_imbalance, cap) if cap > 0 else self.moe_load_imbalance

    def dispatched_rows(self, tokens: int) -> int:
        """Rows a GPU's dispatch of ``tokens`` tokens sends (its combine returns as many): a row per
        token copy, or padded to capacity ``num_experts x ceil(factor x tokens x top_k / num_experts)``
        (at most ``tokens`` per expert; dropless: ``tokens``), as realrun's layer sends them."""
        k, e = self.moe_top_k, self.num_experts
        if not self.moe_pad_to_capacity:
            return tokens * k
        cf = self.moe_capacity_factor
        return e * (min(tokens, math.ceil(cf * tokens * k / e)) if cf > 0 else tokens)

    def attention_params(self) -> int:
        """One layer's attention projections: Q, K, V and output (MLA: its down and up projections
        and the norms on its latents), without biases."""
        h, n, out = self.hidden_size, self.num_heads, self.out_width
        if not self.is_mla:
            return h * (self.q_width + 2 * self.kv_dim) + out * h
        q_rank, kv_rank = self.q_lora_rank, self.kv_lora_rank
        query = q_rank * (h + 1 + self.q_width) if q_rank else h * self.q_width   # down, norm, up
        kv = h * (kv_rank + self.qk_rope_head_dim) + kv_rank + kv_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
        return query + kv + out * h

    def _attention_norm_params(self) -> int:
        h = self.hidden_size
        norms = (2 if self.biased else 1) * h * 2
        bias = (self._qkv_width + h + h) if self.biased else 0
        return self.attention_params() + norms + bias

    @property
    def _qkv_width(self) -> int:
        """Output width of the projections that make Q, K and V from the latents or the hidden state."""
        if self.is_mla:
            return self.q_width + self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
        return self.q_width + 2 * self.kv_dim

    def _mlp_params(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        return h * self.mlp_up_width + f * h + (self.mlp_up_width if self.biased else 0)

    def layer_params(self) -> int:
        """A dense layer: attention, MLP, norms (and biases)."""
        return self._attention_norm_params() + self._mlp_params()

    def _moe_mlp_params(self) -> int:
        """A MoE MLP's parts every rank of an expert-parallel group holds: router, shared experts, latent
        projections."""
        return self.hidden_size * self.num_experts + self.moe_shared_experts * self.shared_expert_params() \
            + self.latent_params()

    def moe_dense_params(self) -> int:
        """The parts of a MoE layer every rank of an expert-parallel group holds: attention,
        norms, router, shared experts (and a LatentMoE's projections)."""
        return self._attention_norm_params() + self._moe_mlp_params()

    def hybrid_layer_params(self, symbol: str) -> int:
        """A hybrid model's layer of ``symbol`` (its routed experts apart): a Mamba-2 mixer
        (``perfmodel.step.mamba.layer_params``), an attention layer (its norm, projections, biases), an MLP
        layer (its norm and MLP) or a MoE layer's router, shared experts and projections (and its norm)."""
        norm, bias = (2 if self.biased else 1) * self.hidden_size, self.hidden_size if self.biased else 0
        if symbol == "M":
            return mamba.layer_params(self)
        if symbol == "*":
            return self._attention_norm_params() - norm - bias
        if symbol == "-":
            return self._mlp_params() + norm + bias
        return norm + self._moe_mlp_params()

    def moe_routed_params(self) -> int:
        """A MoE layer's routed experts (sharded over the ep axis)."""
        return self.num_experts * self.expert_params()

    def stage_layer_params(self, first: int, count: int) -> tuple[int, int]:
        """(dense, routed-expert) parameters of layers ``first`` .. ``first + count - 1``, and of the
        multi-token-prediction modules where those layers end the model (Megatron-Core builds them on
        the last pipeline stage: ``mtp_on_this_rank``); a hybrid model's layers each of its symbol."""
        moe = self.moe_layers_in(first, count)
        if self.is_hybrid:
            dense = sum(n * self.hybrid_layer_params(k) for k, n in self.kinds_in(first, count).items())
        else:
            dense = (count - moe) * self.layer_params() + moe * self.moe_dense_params()
        routed = moe * self.moe_routed_params()
        if self.mtp_layers and count and first + count == self.num_layers:
            mtp_dense, mtp_routed = self.mtp_params()
            dense, routed = dense + mtp_dense, routed + mtp_routed
        return dense, routed

    @property
    def mtp_moe_layers(self) -> int:
        """MoE layers of the multi-token-prediction modules: one each where the model's last layer is MoE."""
        return self.mtp_layers if self.is_moe_layer(self.num_layers - 1) else 0

    @property
    def mtp_copies(self) -> int:
        """Multi-token-prediction modules with weights of their own: one where every depth repeats one module
        (``mtp_use_repeated_layer``, Megatron-Core's ``mtp_use_repeated_layer``), else each."""
        return min(1, self.mtp_layers) if self.mtp_use_repeated_layer else self.mtp_layers

    def _mtp_module_params(self) -> tuple[int, int]:
        """(dense, routed-expert) parameters of one multi-token-prediction module: a layer of the last layer's
        kind (attention and a MoE MLP where that is MoE, in a hybrid model as in Nemotron 3's ``*E``), its
        ``2h x h`` projection and three norms (Megatron-Core's ``enorm``, ``hnorm``, ``final_layernorm``)."""
        h = self.hidden_size
        own = 2 * h * h + 3 * (2 if self.biased else 1) * h
        if self.is_moe_layer(self.num_layers - 1):
            return self.moe_dense_params() + own, self.moe_routed_params()
        return self.layer_params() + own, 0

    def mtp_params(self) -> tuple[int, int]:
        """(dense, routed-expert) parameters of the multi-token-prediction modules (``mtp_copies`` of
        ``_mtp_module_params``); the embedding and LM head are the model's."""
        dense, routed = self._mtp_module_params()
        return self.mtp_copies * dense, self.mtp_copies * routed

    def _mtp_module_active(self) -> int:
        """Parameters a token meets in one multi-token-prediction module."""
        dense, routed = self._mtp_module_params()
        return dense + (routed and self.moe_top_k * self.expert_params())

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self) -> int:
        """The LM head: shares the embedding when tied."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def _ends_params(self) -> int:
        final_norm = (2 if self.biased else 1) * self.hidden_size
        return self.embedding_params() + self.head_params() + final_norm

    @property
    def params(self) -> int:
        dense, routed = self.stage_layer_params(0, self.num_layers)
        return dense + routed + self._ends_params()

    @property
    def active_params(self) -> int:
        """Parameters one token meets: every routed expert replaced by the top-k it visits (the
        multi-token-prediction modules' included)."""
        dense, routed = self.stage_layer_params(0, self.num_layers)
        dense -= self.mtp_params()[0]
        routed = self.num_moe_layers * self.moe_top_k * self.expert_params()
        return dense + routed + self.mtp_copies * self._mtp_module_active() + self._ends_params()

    def attention_flops_per_token(self, keys: float) -> float:
        """Forward FLOPs of one layer's scores and values for a token scored against ``keys`` keys:
        ``2 keys num_heads (qk + v)`` (QK^T over the score dims, AV over the value dims)."""
        return 2.0 * keys * self.num_heads * (self.score_dim + self.value_dim)

    def model_flops_per_token(self, seq: int | None = None) -> float:
        """``6 active_params`` and three passes of every attention layer's scores and values and every Mamba
        layer's SSD scan (module doc); each multi-token-prediction module adds its layer's (full attention) and a
        pass of the LM head (6 V h: its weights are counted once in the parameters), and each depth that repeats
        a module's weights (``mtp_use_repeated_layer``) that module's weights once more."""
        s = seq or self.seq_len
        attention = self.attention_layers * self.attention_flops_per_token(self.score_keys(s))
        scan = self.mamba_layers * mamba.ssd_flops_per_token(self) if self.is_hybrid else 0.0
        extra = self.mtp_layers * (self.attention_flops_per_token(s) + 2.0 * self.vocab_size * self.hidden_size)
        repeated = (self.mtp_layers - self.mtp_copies) * self._mtp_module_active()
        return 6.0 * (self.active_params + repeated) + 3.0 * (attention + scan + extra)

    def attention_kept_bytes(self) -> tuple[float, float]:
        """Bytes per token one layer's attention keeps for backward, but the softmax statistics, as
        (kept whole or sequence-split, TP-split): Korthikanti's 3h (the projections' input, 2 bytes a
        hidden element, and the dropout mask, 1) and 8 bytes a query element (Q, K, V, output; module
        doc). MLA (Megatron-Core's ``MLASelfAttention`` with Transformer Engine's fused attention): the
        same 3h, 4 bytes a latent element (each latent norm's input and the up projection's input, on
        the sequence shard under sequence parallelism: the down projections are duplicated
        ``TELinear``s), 2 a rope key element, and 2 bytes each element of Q, K (both qk wide), V and
        the output (v wide), TP-split as the heads."""
        h = self.hidden_size
        if not self.is_mla:
            return 3.0 * h, 8.0 * self.q_width
        latent = 4.0 * (self.q_lora_rank + self.kv_lora_rank) + 2.0 * self.qk_rope_head_dim
        return 3.0 * h + latent, 2.0 * (2 * self.q_width + 2 * self.out_width)

    def activation_bytes_per_layer(self, mbs: int, seq: int, tp: int, sp: bool, recompute: str) -> float:
        """Bytes one layer keeps for backward, per GPU (Korthikanti et al. 2023): 7h kept whole and 16h
        TP-split by the norms and the MLP, the attention's ``attention_kept_bytes``, and its softmax
        statistics."""
        s, b, h, a = seq, mbs, self.hidden_size, self.num_heads
        if recompute == "full":
            return 2.0 * s * b * h / (tp if sp else 1)
        whole, split = self.attention_kept_bytes()
        attention = 0.0 if recompute == "selective" else SOFTMAX_STAT_BYTES * a / h / tp
        replicated = (7.0 + whole / h) / tp if sp else 7.0 + whole / h
        return s * b * h * (replicated + (16.0 + split / h) / tp + attention)

    def mtp_activation_bytes(self, mbs: int, seq: int, tp: int, sp: bool, recompute: str) -> float:
        """Bytes the multi-token-prediction modules keep for backward on the last stage, per GPU and
        microbatch (0 without them): each its layer's (of the last layer's kind) and its norms' and
        projection's inputs (``MTP_KEPT_BYTES``, whole or sequence-split); with full recompute what it
        starts from (Megatron-Core checkpoints the module whole: ``MTP_RECOMPUTE_KEPT_BYTES``)."""
        if not self.mtp_layers:
            return 0.0
        elements = seq * mbs * self.hidden_size / (tp if sp else 1)
        if recompute == "full":
            return self.mtp_layers * MTP_RECOMPUTE_KEPT_BYTES * elements
        kept = self.moe_activation_bytes_per_layer if self.mtp_moe_layers else self.activation_bytes_per_layer
        return self.mtp_layers * (kept(mbs, seq, tp, sp, recompute) + MTP_KEPT_BYTES * elements)

    def moe_mlp_kept_bytes(self) -> tuple[float, float]:
        """Bytes per token a MoE MLP keeps for backward, as (kept whole or sequence-split, TP-split): the
        router's input and the token's ``expert_copies`` dispatched copies (2 bytes an element, kept whole; a
        LatentMoE's routed copies ``moe_latent_size`` wide, and its combined output, the up projection's input,
        too) and, per copy, the expert's up-projection and activation outputs (TP-split), times the expert load."""
        h, c, latent = self.hidden_size, self.expert_copies, self.moe_latent_size
        if latent:
            whole = 2.0 * h + 2.0 * (self.moe_top_k * latent + self.moe_shared_experts * h) + 2.0 * latent
        else:
            whole = (2.0 + 2.0 * c) * h
        return whole, c * self.expert_load * 2.0 * (self.expert_up_width + self.moe_ffn_hidden_size)

    def moe_activation_bytes_per_layer(self, mbs: int, seq: int, tp: int, sp: bool, recompute: str) -> float:
        """A MoE layer's bytes kept for backward: the dense layer's with its MLP (3 sbh kept
        whole, 16 sbh TP-split in Korthikanti's count) replaced by the MoE MLP's (``moe_mlp_kept_bytes``)."""
        dense = self.activation_bytes_per_layer(mbs, seq, tp, sp, recompute)
        if recompute == "full":
            return dense
        s, b, h = seq, mbs, self.hidden_size
        whole, split = self.moe_mlp_kept_bytes()
        return dense + s * b * h * ((whole / h - 3.0) / (tp if sp else 1) + (split / h - 16.0) / tp)

    def hybrid_kept_bytes(self, symbol: str) -> tuple[float, float, float]:
        """Bytes per token a hybrid model's layer of ``symbol`` keeps for backward, as (kept whole or
        sequence-split, TP-split, the softmax statistics): its norm's input (2 bytes a hidden element) and its
        mixer's, each as Korthikanti counts it in a transformer layer: a Mamba-2 mixer's
        (``perfmodel.step.mamba.kept_bytes``, its norm's included), attention's (``attention_kept_bytes`` and the
        statistics), an MLP's (3h whole, 16h TP-split) or a MoE MLP's (``moe_mlp_kept_bytes``)."""
        h = self.hidden_size
        if symbol == "M":
            return (*mamba.kept_bytes(self), 0.0)
        if symbol == "*":
            whole, split = self.attention_kept_bytes()
            return 2.0 * h + whole, split, SOFTMAX_STAT_BYTES * self.num_heads
        if symbol == "-":
            return 5.0 * h, 16.0 * h, 0.0
        whole, split = self.moe_mlp_kept_bytes()
        return 2.0 * h + whole, split, 0.0

    def hybrid_activation_bytes(self, symbol: str, mbs: int, seq: int, tp: int, sp: bool, recompute: str) -> float:
        """Bytes a hybrid model's layer of ``symbol`` keeps for backward, per GPU (``hybrid_kept_bytes``; under
        full recompute its input, as every layer's; selective recompute drops the softmax statistics)."""
        tokens = seq * mbs
        if recompute == "full":
            return 2.0 * tokens * self.hidden_size / (tp if sp else 1)
        whole, split, stats = self.hybrid_kept_bytes(symbol)
        stats = 0.0 if recompute == "selective" else stats
        return tokens * (whole / (tp if sp else 1) + (split + stats) / tp)


def _validate(raw: dict, name: str) -> ModelSpec:
    for key in raw:
        if key not in MODEL_KEYS and key not in MOE_KEYS and key not in ATTENTION_KEYS and key not in HYBRID_KEYS:
            raise InputError(f"model.{key}", raw[key], "not a model key; allowed: " + ", ".join(MODEL_KEYS)
                             + "; for mixture-of-experts models " + ", ".join(MOE_KEYS)
                             + "; for the attention and multi-token prediction " + ", ".join(ATTENTION_KEYS)
                             + "; for hybrid models " + ", ".join(HYBRID_KEYS))
    for key in MODEL_KEYS:
        if key not in raw:
            raise InputError(f"model.{key}", None, "required in a model file")
    for key in MODEL_KEYS[:7]:
        _whole(key, raw[key])
    for key, allowed in CHOICES.items():
        if raw[key] not in allowed:
            raise InputError(f"model.{key}", raw[key], " or ".join(allowed))
    if not isinstance(raw["tied_embeddings"], bool):
        raise InputError("model.tied_embeddings", raw["tied_embeddings"], "true or false")
    attention = _attention_fields(raw)
    if raw["hidden_size"] % raw["num_heads"] and not attention["head_dim"] and attention["attention"] == "gqa":
        raise InputError("model.num_heads", raw["num_heads"], f"a divisor of hidden_size {raw['hidden_size']} "
                         "(or give the heads' width, head_dim)")
    if raw["num_heads"] % raw["num_kv_heads"]:
        raise InputError("model.num_kv_heads", raw["num_kv_heads"], f"a divisor of num_heads {raw['num_heads']}")
    moe, hybrid = _moe_fields(raw), _hybrid_fields(raw)
    if hybrid["hybrid_layer_pattern"]:
        _check_hybrid_moe(raw, hybrid["hybrid_layer_pattern"], moe, attention)
    return ModelSpec(name=name, **{k: raw[k] for k in MODEL_KEYS}, **moe, **attention, **hybrid)


def _hybrid_fields(raw: dict) -> dict:
    """The hybrid keys of a model file, validated (all absent: every layer attention and an MLP)."""
    out = {k: raw.get(k, default) for k, default in HYBRID_KEYS.items()}
    pattern, symbols = out["hybrid_layer_pattern"], ", ".join(f"{k} ({v})" for k, v in HYBRID_SYMBOLS.items())
    if "hybrid_layer_pattern" in raw and (not isinstance(pattern, str) or not pattern
                                          or set(pattern) - set(HYBRID_SYMBOLS)):
        raise InputError("model.hybrid_layer_pattern", pattern, f"a string of the symbols {symbols}, one a layer "
                         "(Megatron-Core's hybrid_layer_pattern; its G, D, +, | and / are not modelled: give the "
                         "multi-token-prediction modules as mtp_layers)")
    mamba_keys = [k for k in mamba.DEFAULTS if k in raw]
    if not pattern:
        if mamba_keys:
            raise InputError(f"model.{mamba_keys[0]}", raw[mamba_keys[0]], "only with a hybrid_layer_pattern")
        return out
    if len(pattern) != raw["num_layers"]:
        raise InputError("model.hybrid_layer_pattern", pattern, f"{raw['num_layers']} symbols, one per layer "
                         "(num_layers)")
    for key, (low, high) in MAMBA_BOUNDS.items():
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InputError(f"model.{key}", value, f"an integer from {low} to {high}")
    heads = mamba.heads(SimpleNamespace(hidden_size=raw["hidden_size"], **out))
    if not out["mamba_num_heads"] and (out["mamba_expand"] * raw["hidden_size"]) % out["mamba_head_dim"]:
        raise InputError("model.mamba_head_dim", out["mamba_head_dim"], "a divisor of mamba_expand x hidden_size "
                         f"{out['mamba_expand'] * raw['hidden_size']} (or give mamba_num_heads)")
    if heads % out["mamba_num_groups"]:
        raise InputError("model.mamba_num_groups", out["mamba_num_groups"], f"a divisor of the Mamba heads {heads}")
    return out


def _check_hybrid_moe(raw: dict, pattern: str, moe: dict, attention: dict) -> None:
    """A hybrid pattern's MoE layers (E) need the MoE keys, which its pattern places; no window (not modelled)."""
    if ("E" in pattern) != (moe["num_experts"] > 0):
        raise InputError("model.hybrid_layer_pattern", pattern, "E layers exactly where the model has MoE keys "
                         "(num_experts, moe_top_k, moe_ffn_hidden_size)")
    for key in ("moe_layer_freq", "moe_first_dense"):
        if key in raw:
            raise InputError(f"model.{key}", raw[key], "absent with a hybrid_layer_pattern (its E layers are the "
                             "MoE layers)")
    if attention["sliding_window"]:
        raise InputError("model.sliding_window", attention["sliding_window"], "0 with a hybrid_layer_pattern "
                         "(windowed hybrid attention layers are not modelled)")


def _attention_fields(raw: dict) -> dict:
    """The attention and multi-token-prediction keys of a model file, validated (all absent:
    multi-head or grouped-query attention of hidden_size / num_heads-wide heads, no window, no MTP)."""
    out = {k: raw.get(k, default) for k, default in ATTENTION_KEYS.items()}
    if out["attention"] not in ATTENTION_KINDS:
        raise InputError("model.attention", out["attention"], " or ".join(f'"{k}"' for k in ATTENTION_KINDS))
    for key in ATTENTION_KEYS:
        if key not in ("attention", "mtp_use_repeated_layer") and key in raw:
            _whole(key, raw[key])
    if not isinstance(out["mtp_use_repeated_layer"], bool):
        raise InputError("model.mtp_use_repeated_layer", out["mtp_use_repeated_layer"], "true or false")
    mla = 'with attention = "mla"'
    if out["attention"] == "mla":
        for key in MLA_KEYS[1:]:
            if key not in raw:
                raise InputError(f"model.{key}", None, f"required {mla} (q_lora_rank optional: 0, a plain query)")
        if "head_dim" in raw:
            raise InputError("model.head_dim", raw["head_dim"], f"absent {mla}: its heads score over qk_nope_head_dim "
                             "+ qk_rope_head_dim and their values are v_head_dim wide")
        if raw["num_kv_heads"] != raw["num_heads"]:
            raise InputError("model.num_kv_heads", raw["num_kv_heads"], f"num_heads {raw['num_heads']} {mla} (every "
                             "head has its own keys and values, made from the shared latent)")
    else:
        for key in MLA_KEYS:
            if key in raw:
                raise InputError(f"model.{key}", raw[key], f'only {mla} (multi-head latent attention)')
    if "window_attn_skip_freq" in raw and not out["sliding_window"]:
        raise InputError("model.window_attn_skip_freq", raw["window_attn_skip_freq"],
                         "only with a sliding_window above 0 (the layers it leaves at full attention)")
    return out


def _whole(key: str, value, why: str = "") -> int:
    """``value``, an int within ``key``'s declared bound (``topologies.bounds``: no model sizes an absurd
    step), else InputError naming ``model.key``, the bound and ``why``."""
    kind, low, high = bounds.bound(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"model.{key}", value, bounds.describe(key) + why)
    return value


def _moe_fields(raw: dict) -> dict:
    """The MoE keys of a model file, validated (all absent: dense)."""
    moe = {k: raw.get(k, default) for k, default in MOE_KEYS.items()}
    if not any(k in raw for k in MOE_KEYS):
        return moe
    for key in ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "moe_layer_freq", "moe_shared_experts",
                "moe_first_dense"):
        _whole(key, moe[key], " (a MoE model needs num_experts, moe_top_k and moe_ffn_hidden_size)")
    if moe["moe_top_k"] > moe["num_experts"]:
        raise InputError("model.moe_top_k", moe["moe_top_k"], f"at most num_experts {moe['num_experts']}")
    if moe["moe_first_dense"] >= raw["num_layers"]:
        raise InputError("model.moe_first_dense", moe["moe_first_dense"], f"below num_layers {raw['num_layers']}")
    for key in ("moe_capacity_factor", "moe_load_imbalance"):
        moe[key] = float(bounds.check(f"model.{key}", moe[key]))
    if 0 < moe["moe_capacity_factor"] < 1:
        raise InputError("model.moe_capacity_factor", moe["moe_capacity_factor"], "0 (dropless) or >= 1")
    if not isinstance(moe["moe_pad_to_capacity"], bool):
        raise InputError("model.moe_pad_to_capacity", moe["moe_pad_to_capacity"], "true or false")
    latent = moe["moe_latent_size"]
    if isinstance(latent, bool) or not isinstance(latent, int) or not 0 <= latent <= raw["hidden_size"]:
        raise InputError("model.moe_latent_size", latent, f"an integer from 0 (no latent projection) to hidden_size "
                         f"{raw['hidden_size']}")
    return moe


@cache
def _catalog_raw() -> dict[str, dict]:
    return {name: {k: v for k, v in body.items() if k != "source"} for name, body in read_catalog("models").items()}


@cache
def model_catalog() -> dict[str, ModelSpec]:
    return {name: _validate(raw, name) for name, raw in _catalog_raw().items()}


@lru_cache(maxsize=64)
def load_model(name_or_path: str | ModelSpec) -> ModelSpec:
    """A catalog model by name, a user's model TOML file, either with changed keys
    (``NAME:key=value,...``, module doc), or a ``ModelSpec`` (validated as a model file is)."""
    if isinstance(name_or_path, ModelSpec):
        return _validate(_spec_keys(name_or_path), name_or_path.name)
    if not isinstance(name_or_path, str):
        raise InputError("model", name_or_path, "a catalog name, a TOML file path or a perfmodel.workload.ModelSpec")
    base, sep, options = name_or_path.partition(":")
    if sep and not Path(name_or_path).exists() and (base in _catalog_raw() or Path(base).is_file()):
        return _validate({**_raw_model(base)[0], **_options(options)}, name_or_path)
    raw, name = _raw_model(name_or_path)
    return model_catalog()[name] if name_or_path in _catalog_raw() else _validate(raw, name)


def _spec_keys(spec: ModelSpec) -> dict:
    """The keys of a model file that describe ``spec``: every required one, the optional ones it sets
    apart from their defaults (head_dim where it is not the one its shape gives)."""
    keys = {k: getattr(spec, k) for k in MODEL_KEYS}
    for key, default in {**MOE_KEYS, **ATTENTION_KEYS, **HYBRID_KEYS}.items():
        value = getattr(spec, key)
        if value != default and (key != "head_dim" or value != replace(spec, head_dim=0).head_dim):
            keys[key] = value
    return keys


def _raw_model(name_or_path: str) -> tuple[dict, str]:
    """(keys, name) of a catalog model or a model TOML file, as read (not yet validated)."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or path.exists():
        if not path.is_file():
            raise InputError("model", name_or_path, "a catalog name or an existing TOML file")
        text = path.read_text()
        try:
            return tomllib.loads(text), path.stem
        except tomllib.TOMLDecodeError as err:
            raise InputError("model", name_or_path, _not_toml(text, err)) from None
    catalog = _catalog_raw()
    if name_or_path not in catalog:
        raise InputError("model", name_or_path, "one of " + ", ".join(catalog) + ", or a TOML file path, either "
                         "with changed keys (NAME:key=value,...)")
    return dict(catalog[name_or_path]), name_or_path


def _options(text: str) -> dict:
    """``key=value,...`` of a model name: each value read as a TOML value (numbers, true/false, "text")."""
    out = {}
    try:
        options = parse_options(text, "model")
    except InputError as err:      # its wording of a repeated key, the model's example of the syntax
        raise InputError("model", err.value, err.allowed if err.allowed.startswith("each key once") else
                         "key=value items separated by commas after the model's name, e.g. deepseek-v3:mtp_layers=1") \
            from None
    for key, value in options.items():
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            raise InputError(f"model.{key}", value, 'a TOML value (a number, true or false, or "text")') from None
    return out


def _not_toml(text: str, err: Exception) -> str:
    """What a model file that is not TOML should be instead, naming the format it looks like."""
    kind = file_format(text)
    if kind is None:
        return f"valid TOML ({err})"
    return (f"a model TOML file, and this looks like {kind}: pass a catalog model (perfmodel catalog models) "
            f"or a TOML file with the keys {', '.join(MODEL_KEYS)} (docs/predict.md, Models, shows one)")


MODEL_FIELDS = tuple(f.name for f in fields(ModelSpec))
