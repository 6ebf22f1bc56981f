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
layer always pads) fills every expert's queue to its capacity: the dispatch and combine carry
``capacity x experts`` rows and every expert computes its capacity's, whatever the routing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache, cache
from pathlib import Path

from perfmodel.devices import read_catalog
from topologies import bounds
from topologies.clikit import file_format
from topologies.errors import InputError

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
CHOICES = {"activation": ("gelu", "swiglu"), "norm": ("layernorm", "rmsnorm")}
# optional keys of a mixture-of-experts model, and their dense defaults
MOE_KEYS = {"num_experts": 0, "moe_top_k": 0, "moe_shared_experts": 0, "moe_ffn_hidden_size": 0,
            "moe_layer_freq": 1, "moe_first_dense": 0, "moe_capacity_factor": 0.0, "moe_load_imbalance": 1.0,
            "moe_pad_to_capacity": False}


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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

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
        """Whether layer ``index`` (0-based) is a MoE layer."""
        return self.is_moe and index >= self.moe_first_dense \
            and (index - self.moe_first_dense) % self.moe_layer_freq == 0

    def moe_layers_in(self, first: int, count: int) -> int:
        """MoE layers among layers ``first`` .. ``first + count - 1`` (a pipeline stage's): the
        multiples of ``moe_layer_freq`` in [lo, hi), counted from ``moe_first_dense``."""
        if not self.is_moe:
            return 0
        d, f = self.moe_first_dense, self.moe_layer_freq
        lo, hi = max(first, d) - d, first + count - d
        return max(0, -(-hi // f) + (-lo // f))        # ceil(hi / f) - ceil(lo / f)

    @property
    def num_moe_layers(self) -> int:
        return self.moe_layers_in(0, self.num_layers)

    @property
    def expert_up_width(self) -> int:
        return self.moe_ffn_hidden_size * (2 if self.activation == "swiglu" else 1)

    def expert_params(self) -> int:
        """One expert's MLP (the routed and the shared ones alike)."""
        return self.hidden_size * self.expert_up_width + self.moe_ffn_hidden_size * self.hidden_size

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

    def _attention_norm_params(self) -> int:
        h = self.hidden_size
        attn = h * (h + 2 * self.kv_dim) + h * h
        norms = (2 if self.biased else 1) * h * 2
        bias = (h + 2 * self.kv_dim + h + h) if self.biased else 0
        return attn + norms + bias

    def layer_params(self) -> int:
        """A dense layer: attention, MLP, norms (and biases)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        mlp = h * self.mlp_up_width + f * h + (self.mlp_up_width if self.biased else 0)
        return self._attention_norm_params() + mlp

    def moe_dense_params(self) -> int:
        """The parts of a MoE layer every rank of an expert-parallel group holds: attention,
        norms, router, shared experts."""
        return self._attention_norm_params() + self.hidden_size * self.num_experts \
            + self.moe_shared_experts * self.expert_params()

    def moe_routed_params(self) -> int:
        """A MoE layer's routed experts (sharded over the ep axis)."""
        return self.num_experts * self.expert_params()

    def stage_layer_params(self, first: int, count: int) -> tuple[int, int]:
        """(dense, routed-expert) parameters of layers ``first`` .. ``first + count - 1``."""
        moe = self.moe_layers_in(first, count)
        dense = (count - moe) * self.layer_params() + moe * self.moe_dense_params()
        return dense, moe * self.moe_routed_params()

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
        """Parameters one token meets: every routed expert replaced by the top-k it visits."""
        dense, _ = self.stage_layer_params(0, self.num_layers)
        routed = self.num_moe_layers * self.moe_top_k * self.expert_params()
        return dense + routed + self._ends_params()

    def model_flops_per_token(self, seq: int | None = None) -> float:
        s = seq or self.seq_len
        return 6.0 * self.active_params + 12.0 * self.num_layers * self.hidden_size * s

    def activation_bytes_per_layer(self, mbs: int, seq: int, tp: int, sp: bool, recompute: str) -> float:
        """Bytes one layer keeps for backward, per GPU (Korthikanti et al. 2023)."""
        s, b, h, a = seq, mbs, self.hidden_size, self.num_heads
        if recompute == "full":
            return 2.0 * s * b * h / (tp if sp else 1)
        attention = 0.0 if recompute == "selective" else SOFTMAX_STAT_BYTES * a / h / tp
        replicated = 10.0 / tp if sp else 10.0
        return s * b * h * (replicated + 24.0 / tp + attention)

    def moe_activation_bytes_per_layer(self, mbs: int, seq: int, tp: int, sp: bool, recompute: str) -> float:
        """A MoE layer's bytes kept for backward: the dense layer's with its MLP (3 sbh kept
        whole, 16 sbh TP-split in Korthikanti's count) replaced by the router's input and the
        token's ``expert_copies`` dispatched copies (2 sbh each, kept whole) and, per copy, the
        expert's up-projection and activation outputs (TP-split), times the expert load."""
        dense = self.activation_bytes_per_layer(mbs, seq, tp, sp, recompute)
        if recompute == "full":
            return dense
        s, b, h, c = seq, mbs, self.hidden_size, self.expert_copies
        whole = (2.0 + 2.0 * c - 3.0) / (tp if sp else 1)
        split = (c * self.expert_load * 2.0 * (self.expert_up_width + self.moe_ffn_hidden_size) / h - 16.0) / tp
        return dense + s * b * h * (whole + split)


def _validate(raw: dict, name: str) -> ModelSpec:
    for key in raw:
        if key not in MODEL_KEYS and key not in MOE_KEYS:
            raise InputError(f"model.{key}", raw[key], "not a model key; allowed: " + ", ".join(MODEL_KEYS)
                             + " and, for mixture-of-experts models, " + ", ".join(MOE_KEYS))
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
    if raw["hidden_size"] % raw["num_heads"]:
        raise InputError("model.num_heads", raw["num_heads"], f"a divisor of hidden_size {raw['hidden_size']}")
    if raw["num_heads"] % raw["num_kv_heads"]:
        raise InputError("model.num_kv_heads", raw["num_kv_heads"], f"a divisor of num_heads {raw['num_heads']}")
    return ModelSpec(name=name, **{k: raw[k] for k in MODEL_KEYS}, **_moe_fields(raw))


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
    return moe


@cache
def model_catalog() -> dict[str, ModelSpec]:
    return {name: _validate({k: v for k, v in body.items() if k != "source"}, name)
            for name, body in read_catalog("models").items()}


@lru_cache(maxsize=64)
def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a user's model TOML file."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or path.exists():
        if not path.is_file():
            raise InputError("model", name_or_path, "a catalog name or an existing TOML file")
        text = path.read_text()
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise InputError("model", name_or_path, _not_toml(text, err)) from None
        return _validate(raw, path.stem)
    catalog = model_catalog()
    if name_or_path not in catalog:
        raise InputError("model", name_or_path, "one of " + ", ".join(catalog) + ", or a TOML file path")
    return catalog[name_or_path]


def _not_toml(text: str, err: Exception) -> str:
    """What a model file that is not TOML should be instead, naming the format it looks like."""
    kind = file_format(text)
    if kind is None:
        return f"valid TOML ({err})"
    return (f"a model TOML file, and this looks like {kind}: pass a catalog model (perfmodel catalog models) "
            f"or a TOML file with the keys {', '.join(MODEL_KEYS)} (docs/predict.md, Models, shows one)")


MODEL_FIELDS = tuple(f.name for f in fields(ModelSpec))
