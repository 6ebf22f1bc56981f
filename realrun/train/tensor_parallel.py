"""Tensor parallelism as Megatron-LM does it (Shoeybi et al. 2019), on realrun.comm.

Each layer's QKV projection and first MLP matrix are column-parallel (a rank holds the rows
of its heads, and of its share of the MLP width), the attention output projection and the
second MLP matrix row-parallel (the matching columns); their biases are added after the
reduction. Two autograd operators carry the communication: ``f`` (identity forward, all-reduce
of the input gradient backward) before a column-parallel pair, ``g`` (all-reduce forward,
identity backward) after the row-parallel one. Every all-reduce goes through realrun.comm with
the spec the policy's ``tp`` axis gives its size, keyed per layer and direction (error feedback
per tensor where the spec says ``ef(...)``). Embedding, norms and the LM head are replicated:
their gradients come out identical on every rank of a TP group, so only DP reduces them.
Not here yet: vocabulary-parallel embedding and loss, sequence parallelism.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from realrun.comm import Comm, CommStats
from realrun.train.accuracy import RelativeError


class TensorParallel:
    """One rank's view of its TP group: size, index, the collectives and what they cost."""

    def __init__(self, size: int, rank: int, comm: Comm | None, axis):
        self.size, self.rank, self.comm, self.axis = size, rank, comm, axis
        self.stats = CommStats()
        self.seconds = {"fwd": 0.0, "bwd": 0.0}
        self.error: RelativeError | None = None   # set on measured steps: each sum against the exact one

    def reduce(self, x: torch.Tensor, key: str, phase: str) -> torch.Tensor:
        if self.size == 1:
            return x
        exact = None
        if self.error is not None:   # uncounted, before the clock starts
            exact = x.detach().clone()
            dist.all_reduce(exact, group=self.comm.group)
        start = time.perf_counter()
        codec = self.axis.codec_for(x.numel() * x.element_size())
        out = self.comm.allreduce(x.contiguous(), codec, key=key, stats=self.stats).view_as(x)
        self.seconds[phase] += time.perf_counter() - start
        if exact is not None:
            self.error.add(out, exact)
        return out

    def take(self) -> tuple[float, float, CommStats]:
        """(forward seconds, backward seconds, stats) since the last call, then reset."""
        out = (self.seconds["fwd"], self.seconds["bwd"], self.stats)
        self.stats, self.seconds = CommStats(), {"fwd": 0.0, "bwd": 0.0}
        return out


class _F(torch.autograd.Function):
    """Megatron's f: the input as it is forward, its gradient summed over the group backward."""

    @staticmethod
    def forward(ctx, x, tp, key):
        ctx.tp, ctx.key = tp, key
        return x

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.reduce(grad, ctx.key, "bwd"), None, None


class _G(torch.autograd.Function):
    """Megatron's g: the partial outputs summed over the group forward, the gradient as it is backward."""

    @staticmethod
    def forward(ctx, x, tp, key):
        return tp.reduce(x, key, "fwd")

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def copy_to_group(x, tp: TensorParallel, key: str):
    return x if tp.size == 1 else _F.apply(x, tp, key)


def reduce_from_group(x, tp: TensorParallel, key: str):
    return x if tp.size == 1 else _G.apply(x, tp, key)


def shard_rows(weight: torch.Tensor, parts: list[int], size: int, rank: int) -> torch.Tensor:
    """Rows of a column-parallel weight (or its bias): each of the ``parts`` (row blocks such as
    Q, K, V, or gate and up) split in ``size`` and this rank's piece of each, in order."""
    pieces, start = [], 0
    for n in parts:
        step = n // size
        pieces.append(weight[start + rank * step:start + (rank + 1) * step])
        start += n
    return torch.cat(pieces)


def shard_cols(weight: torch.Tensor, size: int, rank: int) -> torch.Tensor:
    step = weight.shape[1] // size
    return weight[:, rank * step:(rank + 1) * step]
