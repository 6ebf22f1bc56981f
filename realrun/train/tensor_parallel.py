"""Tensor parallelism as Megatron-LM does it (Shoeybi et al. 2019), on realrun.comm.

Each layer's QKV projection and first MLP matrix are column-parallel (a rank holds the rows
of its heads, and of its share of the MLP width), the attention output projection and the
second MLP matrix row-parallel (the matching columns); their biases are added after the
reduction. Two autograd operators carry the communication: ``f`` (identity forward, all-reduce
of the input gradient backward) before a column-parallel pair, ``g`` (all-reduce forward,
identity backward) after the row-parallel one. Every all-reduce goes through realrun.comm with
the spec the policy's ``tp`` axis gives its size, keyed per layer and direction (error feedback
per tensor where the spec says ``ef(...)``). Norms are replicated: their gradients come out
identical on every rank of a TP group, so only DP reduces them.

The vocabulary is split too (Megatron's VocabParallelEmbedding and vocab-parallel cross
entropy): a rank holds ``vocab / tp`` rows of the embedding (and of an untied head); a lookup
zeroes the tokens outside its rows and ``g`` sums the partial embeddings; the head computes
this rank's slice of the logits from ``f``'s input, and the loss is formed from three sums of
per-token numbers over the group (the logits' max, the sum of exponentials, the target's
logit), so no rank ever holds a whole row of logits. Those three are plain all-reduces (a
maximum cannot go through a compressed sum; they are 3 floats per token). Not here yet:
sequence parallelism.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from perfmodel.collectives.record import busbw_factor
from realrun.comm import Comm, CommStats
from realrun.train.accuracy import RelativeError
from realrun.train.runtime import AxisTiming, meter, value


class TensorParallel:
    """One rank's view of its TP group: size, index, the collectives and what they cost (the tp
    axis's ``realrun.train.runtime.AxisRuntime``)."""

    axis_names = ("tp",)

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

    def exact_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """A plain all-reduce of a few numbers per token (the loss's max and sums), timed as
        forward TP communication and counted as what a ring rank sends."""
        start = time.perf_counter()
        dist.all_reduce(t, op=op, group=self.comm.group)
        self.seconds["fwd"] += time.perf_counter() - start
        nbytes = t.numel() * t.element_size()
        self.stats.bytes_in += nbytes
        self.stats.bytes_out += int(nbytes * busbw_factor("allreduce", self.size))   # what a ring rank sends
        return t

    def start_step(self, measure: bool) -> None:
        self.error = meter(measure, self.size)

    def take(self) -> AxisTiming:
        """What the reductions cost since the last call (and their error on a measured step), then reset."""
        out = AxisTiming(forward_s=self.seconds["fwd"], backward_s=self.seconds["bwd"], stats={"tp": self.stats},
                         errors={"tp": value(self.error)})
        self.stats, self.seconds, self.error = CommStats(), {"fwd": 0.0, "bwd": 0.0}, None
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


def vocab_range(vocab: int, tp: TensorParallel) -> tuple[int, int]:
    """This rank's rows [start, end) of the vocabulary."""
    step = vocab // tp.size
    return tp.rank * step, (tp.rank + 1) * step


def parallel_embedding(tokens: torch.Tensor, weight: torch.Tensor, tp: TensorParallel, vocab: int) -> torch.Tensor:
    """Embeddings of ``tokens`` from this rank's rows of the table, summed over the group."""
    start, end = vocab_range(vocab, tp)
    mine = (tokens >= start) & (tokens < end)
    local = torch.nn.functional.embedding((tokens - start).clamp(0, end - start - 1), weight)
    return reduce_from_group(local * mine.unsqueeze(-1), tp, "embedding")


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits split by vocabulary over the group."""

    @staticmethod
    def forward(ctx, logits, targets, tp, start):
        width = logits.shape[1]
        peak = tp.exact_reduce(logits.detach().max(dim=-1).values.clone(), dist.ReduceOp.MAX)
        exp = (logits.detach() - peak[:, None]).exp()
        total = tp.exact_reduce(exp.sum(dim=-1))
        local = targets - start
        mine = (local >= 0) & (local < width)
        picked = torch.where(mine, logits.detach().gather(1, local.clamp(0, width - 1)[:, None])[:, 0],
                             torch.zeros((), dtype=logits.dtype, device=logits.device))
        target_logit = tp.exact_reduce(picked.clone())
        ctx.save_for_backward(exp / total[:, None], local, mine)
        return ((total.log() + peak) - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, local, mine = ctx.saved_tensors
        out = softmax.clone()
        rows = torch.nonzero(mine)[:, 0]
        out[rows, local[rows]] -= 1.0
        return out * (grad / softmax.shape[0]), None, None, None


def parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, tp: TensorParallel, vocab: int):
    """The loss from this rank's slice of the logits (rows x vocab / tp) and all targets."""
    start, _ = vocab_range(vocab, tp)
    return _VocabParallelCrossEntropy.apply(logits, targets, tp, start)
