"""A decoder-only transformer built from the model description perfmodel uses (``ModelSpec``).

Per layer, in perfmodel's parameter layout (``ModelSpec.layer_params``): a fused QKV
projection (h -> h + 2 kv) and an output projection, an MLP (h -> f, or 2f gate and up for
swiglu, then f -> h), two norms (layernorm with bias, or rmsnorm), and biases on every linear
layer for layernorm models. Token embedding, a final norm and the LM head (tied to the
embedding or not). Positions are rotary (RoPE, Su et al. 2021): no parameters, so the count
equals ``ModelSpec.params`` exactly (a test checks several shapes). Attention is causal,
``torch.nn.functional.scaled_dot_product_attention``, grouped-query where num_kv_heads <
num_heads.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from perfmodel.workload import ModelSpec

ROPE_BASE = 10000.0   # the RoPE paper's base


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "layernorm":
        return nn.LayerNorm(spec.hidden_size)
    return nn.RMSNorm(spec.hidden_size, eps=1e-5)


def rope(x: torch.Tensor, base: float = ROPE_BASE) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` (batch, heads, seq, dim) by position-dependent angles."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim)
    angles = torch.arange(seq, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, kv, bias = spec.hidden_size, spec.kv_dim, spec.biased
        self.spec = spec
        self.norm1, self.norm2 = _norm(spec), _norm(spec)
        self.qkv = nn.Linear(h, h + 2 * kv, bias=bias)
        self.out = nn.Linear(h, h, bias=bias)
        self.fc1 = nn.Linear(h, spec.mlp_up_width, bias=bias)
        self.fc2 = nn.Linear(spec.ffn_hidden_size, h, bias=bias)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        s, b, t = self.spec, x.shape[0], x.shape[1]
        q, k, v = self.qkv(x).split([s.hidden_size, s.kv_dim, s.kv_dim], dim=-1)
        q = q.view(b, t, s.num_heads, s.head_dim).transpose(1, 2)
        k = k.view(b, t, s.num_kv_heads, s.head_dim).transpose(1, 2)
        v = v.view(b, t, s.num_kv_heads, s.head_dim).transpose(1, 2)
        if s.num_kv_heads != s.num_heads:   # grouped-query attention: each KV head serves a group
            rep = s.num_heads // s.num_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, s.hidden_size))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        up = self.fc1(x)
        if self.spec.activation == "swiglu":
            gate, up = up.chunk(2, dim=-1)
            return self.fc2(F.silu(gate) * up)
        return self.fc2(F.gelu(up))

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
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.num_layers))
        self.norm = _norm(spec)
        self.head = None if spec.tied_embeddings else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self._init(generator)

    def _init(self, generator: torch.Generator) -> None:
        """GPT-2's initialization: N(0, 0.02), output projections scaled by 1/sqrt(2L); zero biases."""
        scaled = 0.02 / math.sqrt(2 * self.spec.num_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                continue
            std = scaled if name.endswith(("out.weight", "fc2.weight")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=generator) * std)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return x @ self.embed.weight.T if self.head is None else self.head(x)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
