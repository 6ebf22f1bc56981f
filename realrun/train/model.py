"""A decoder-only transformer built from the model description perfmodel uses (``ModelSpec``).

Per layer, in perfmodel's parameter layout (``ModelSpec.layer_params``): a fused QKV
projection (h -> h + 2 kv) and an output projection, an MLP (h -> f, or 2f gate and up for
swiglu, then f -> h), two norms (layernorm with bias, or rmsnorm), and biases on every linear
layer for layernorm models. Token embedding, a final norm and the LM head (tied to the
embedding or not). Positions are rotary (RoPE, Su et al. 2021): no parameters, so the count
equals ``ModelSpec.params`` exactly (a test checks several shapes). Attention is causal,
``torch.nn.functional.scaled_dot_product_attention``, grouped-query where num_kv_heads <
num_heads. Layers the spec makes mixture-of-experts ones (``ModelSpec.is_moe_layer``) have a
``realrun.train.moe.MoE`` MLP instead. Under context parallelism (``shard_context``) a rank
holds two chunks of every sequence and attention is ``context_parallel.ring_attention``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from perfmodel.workload import ModelSpec
from realrun.train.context_parallel import ContextParallel, ring_attention
from realrun.train.moe import ExpertParallel, MoE
from realrun.train.tensor_parallel import (TensorParallel, copy_to_group, parallel_cross_entropy,
                                           parallel_embedding, reduce_from_group, shard_cols, shard_rows, vocab_range)

ROPE_BASE = 10000.0   # the RoPE paper's base


def norm_layer(kind: str, size: int) -> nn.Module:
    """A layer's norm as the model names it: ``layernorm`` (with bias) or ``rmsnorm``."""
    if kind == "layernorm":
        return nn.LayerNorm(size)
    return nn.RMSNorm(size, eps=1e-5)


def _norm(spec: ModelSpec) -> nn.Module:
    return norm_layer(spec.norm, spec.hidden_size)


def rope(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = ROPE_BASE) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` (batch, heads, seq, dim) by position-dependent angles;
    ``positions``: each token's position in its sequence (default 0 .. seq - 1; a context-parallel
    rank's tokens are chunks of the sequence, see ``context_parallel``)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim)
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


def _bias(n: int, on: bool):
    return nn.Parameter(torch.zeros(n)) if on else None


class Block(nn.Module):
    """One layer; with tensor parallelism (``shard``) a rank holds its heads and MLP share."""

    def __init__(self, spec: ModelSpec, index: int = 0):
        super().__init__()
        h, kv, bias = spec.hidden_size, spec.kv_dim, spec.biased
        self.spec, self.index, self.tp = spec, index, TensorParallel(1, 0, None, None)
        self.cp = ContextParallel(1, 0, None)   # the whole sequence here (see GPT.shard_context)
        self.norm1, self.norm2 = _norm(spec), _norm(spec)
        self.qkv = nn.Linear(h, h + 2 * kv, bias=bias)
        self.out = nn.Linear(h, h, bias=False)       # row-parallel: bias added after the reduction
        self.out_bias = _bias(h, bias)
        self.moe = MoE(spec, index) if spec.is_moe_layer(index) else None   # replaces the dense MLP
        if self.moe is None:
            self.fc1 = nn.Linear(h, spec.mlp_up_width, bias=bias)
            self.fc2 = nn.Linear(spec.ffn_hidden_size, h, bias=False)
            self.fc2_bias = _bias(h, bias)

    def shard(self, tp: TensorParallel) -> None:
        """Keep this rank's rows of QKV and FC1 and columns of the output projection and FC2 (a
        MoE layer's experts stay whole on every rank of the group, as its norms do)."""
        s, n, r = self.spec, tp.size, tp.rank
        up = [s.ffn_hidden_size] * (2 if s.activation == "swiglu" else 1)
        dense = self.moe is None
        for layer, parts in ((self.qkv, [s.hidden_size, s.kv_dim, s.kv_dim]),) + (((self.fc1, up),) if dense else ()):
            layer.weight = nn.Parameter(shard_rows(layer.weight.data, parts, n, r).clone())
            if layer.bias is not None:
                layer.bias = nn.Parameter(shard_rows(layer.bias.data, parts, n, r).clone())
        for layer in (self.out, self.fc2) if dense else (self.out,):
            layer.weight = nn.Parameter(shard_cols(layer.weight.data, n, r).contiguous())
        self.tp = tp

    def _row_parallel(self, layer, bias, y, key):
        out = reduce_from_group(layer(y), self.tp, key)
        return out if bias is None else out + bias

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        s, n, b, t = self.spec, self.tp.size, x.shape[0], x.shape[1]
        heads, kv_heads = s.num_heads // n, s.num_kv_heads // n
        x = copy_to_group(x, self.tp, f"l{self.index}.attn")
        q, k, v = self.qkv(x).split([heads * s.head_dim, kv_heads * s.head_dim, kv_heads * s.head_dim], dim=-1)
        q = q.view(b, t, heads, s.head_dim).transpose(1, 2)
        k = k.view(b, t, kv_heads, s.head_dim).transpose(1, 2)
        v = v.view(b, t, kv_heads, s.head_dim).transpose(1, 2)
        if self.cp.size > 1:   # this rank's chunks of the sequence: K/V round the cp ring
            at = self.cp.positions(t, device=x.device)
            y = ring_attention(rope(q, at), rope(k, at), v, self.cp, f"l{self.index}.attn")
        else:
            if kv_heads != heads:   # grouped-query attention: each KV head serves a group
                k, v = k.repeat_interleave(heads // kv_heads, dim=1), v.repeat_interleave(heads // kv_heads, dim=1)
            y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, heads * s.head_dim)
        return self._row_parallel(self.out, self.out_bias, y, f"l{self.index}.attn_out")

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return self.moe(x)
        x = copy_to_group(x, self.tp, f"l{self.index}.mlp")
        up = self.fc1(x)
        if self.spec.activation == "swiglu":
            gate, up = up.chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        else:
            hidden = F.gelu(up)
        return self._row_parallel(self.fc2, self.fc2_bias, hidden, f"l{self.index}.mlp_out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """The whole model; ``forward(tokens, targets)`` returns the mean next-token cross-entropy."""

    def __init__(self, spec: ModelSpec, seed: int = 0):
        super().__init__()
        self.spec = spec
        generator = torch.Generator().manual_seed(seed)
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.blocks = nn.ModuleList(Block(spec, i) for i in range(spec.num_layers))
        self.norm = _norm(spec)
        self.head = None if spec.tied_embeddings else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.first = self.last = True   # one pipeline stage holds everything (see keep_stage)
        self.tp = TensorParallel(1, 0, None, None)   # the whole vocabulary here (see shard)
        self._init(generator)

    def _init(self, generator: torch.Generator) -> None:
        """GPT-2's initialization: N(0, 0.02), output projections scaled by 1/sqrt(2L); zero biases."""
        scaled = 0.02 / math.sqrt(2 * self.spec.num_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                continue
            std = scaled if name.endswith(("out.weight", "fc2.weight", "w_down", "shared_down")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=generator) * std)

    def shard(self, tp: TensorParallel) -> GPT:
        """Keep this rank's tensor-parallel shard of every layer (the full model was initialised
        first, so any TP degree starts from the same weights as one rank)."""
        if tp.size > 1:
            for block in self.blocks:
                block.shard(tp)
            rows = slice(*vocab_range(self.spec.vocab_size, tp))   # vocabulary-parallel table and head
            for layer in (self.embed, self.head):
                if layer is not None:
                    layer.weight = nn.Parameter(layer.weight.data[rows].clone())
        self.tp = tp
        return self

    def shard_experts(self, ep: ExpertParallel) -> GPT:
        """Keep this rank's routed experts of every MoE layer (expert parallelism over ``ep``)."""
        for block in self.blocks:
            if block.moe is not None:
                block.moe.shard(ep)
        return self

    def shard_context(self, cp: ContextParallel) -> GPT:
        """Attend as one rank of the context-parallel group ``cp`` (ring attention over its
        chunks of every sequence; the weights stay whole)."""
        for block in self.blocks:
            block.cp = cp
        return self

    def expert_parameters(self) -> list[nn.Parameter]:
        """The routed experts' weights of this stage's MoE layers (their gradients reduce over
        the expert-data-parallel group; every other parameter's over dp)."""
        return [p for block in self.blocks if block.moe is not None for p in block.moe.expert_parameters()]

    def keep_stage(self, start: int, end: int, first: bool, last: bool) -> GPT:
        """Keep pipeline stage ``[start, end)`` of the layers: the embedding on the first stage,
        the final norm and LM head on the last; with tied embeddings the last stage keeps a copy
        of the embedding as its head (Megatron-LM's choice; their gradients are summed between
        the two stages, see ``pipeline``). Layers keep their global index (keys, init)."""
        self.blocks = nn.ModuleList(list(self.blocks)[start:end])
        self.first, self.last = first, last
        if not (first or (last and self.head is None)):
            self.embed = None
        if not last:
            self.norm, self.head = None, None
        return self

    def stage_forward(self, inputs: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """This stage's part: tokens (first stage) or the previous stage's hidden states in;
        the loss (last stage, with ``targets``) or hidden states out."""
        tp, vocab = self.tp, self.spec.vocab_size
        if self.first:
            x = self.embed(inputs) if tp.size == 1 else parallel_embedding(inputs, self.embed.weight, tp, vocab)
        else:
            x = inputs
        for block in self.blocks:
            x = block(x)
        if not self.last:
            return x
        x = copy_to_group(self.norm(x), tp, "head")
        logits = x @ self.embed.weight.T if self.head is None else self.head(x)
        logits, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        return F.cross_entropy(logits, targets) if tp.size == 1 else parallel_cross_entropy(logits, targets, tp, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean next-token cross-entropy of the whole model (one stage holds all of it)."""
        return self.stage_forward(tokens, targets)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
