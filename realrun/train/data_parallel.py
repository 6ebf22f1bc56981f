"""Data parallelism after the passes: the gradient reductions of a step and its optimizer step,
the dp and zero axes' runtime (``realrun.train.runtime.AxisRuntime``).

The tied embedding's gradient is summed between the first and last pipeline stage; then the dense
gradients are reduced over the replicas (dp x cp ranks) bucket by bucket (``DEFAULT_BUCKET_BYTES``,
in reverse parameter order as DDP builds them) through ``realrun.comm`` with the spec the policy's
``dp`` axis gives the bucket's size (``ef(...)`` keeps one residual per bucket), averaged, and
AdamW steps; with ZeRO-1, a reduce-scatter, a sharded step and an all-gather under the ``zero``
spec (``realrun.train.zero``; the routed experts, reduced over their group, step unsharded beside
it). Under expert parallelism the routed experts' gradients reduce over
the expert-data-parallel group (dp / ep ranks) instead. The reduction runs after the backward
pass, not overlapped with it (DDP's overlap needs its reducer; a prediction of these runs must
assume the same). Its seconds, the optimizer's apart, are the dp phase's, the dp and zero kernels
inside them (``realrun.train.phases``).

A recipe policy (``perfmodel.compression.recipes``) changes what is reduced: a gradient recipe
(``powersgd``, ``loco``) reduces its first ``warmup_steps`` steps uncompressed (PowerSGD's
``start_powerSGD_iter``); a momentum recipe (``onebit-adam``, ``zero-one-adam``) leaves the gradients
to its optimizer (``realrun.train.onebit.CompressedAdam``, ``reduces``), which averages the momentum
or the accumulated update itself; the tied embedding's sum between pipeline ends stays uncompressed
there (the dp spec is the momentum's).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from perfmodel.compression.policy import AxisPolicy
from realrun.comm import Comm, CommStats
from realrun.train.accuracy import RelativeError
from realrun.train.clock import now
from realrun.train.runtime import ReductionTiming, meter, value


def buckets(params: list, bucket_bytes: int) -> list[list]:
    """Parameters grouped into buckets of about ``bucket_bytes``, last parameters first (their
    gradients are ready first in backward, as DDP orders them)."""
    out, current, size = [], [], 0
    for p in reversed(params):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            out.append(current)
            current, size = [], 0
    return out + ([current] if current else [])


def sync_gradients(groups, comm: Comm, axis, world: int, stats: CommStats, error: RelativeError | None) -> None:
    """Sum every bucket's gradients over the ranks under the dp policy, then average. With an
    ``error`` meter, also the exact sum (uncounted) to measure the compressed one against."""
    for i, params in enumerate(groups):
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        exact = None
        if error is not None:
            exact = flat.clone()
            dist.all_reduce(exact, group=comm.group)
        codec = axis.codec_for(flat.numel() * flat.element_size())
        summed = comm.allreduce(flat, codec, key=f"bucket{i}", stats=stats, inplace=codec.is_none)
        if exact is not None:
            error.add(summed, exact)
        summed /= world
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(summed[offset:offset + n].view_as(p.grad))
            offset += n


_UNCOMPRESSED = AxisPolicy()


class DataParallel:
    """This rank's gradient reductions (module doc): over ``comm`` (the dp x cp replicas), the
    embedding's between its pipeline's ends (``embed_comm``, None off them), the experts' over
    ``expert_comm`` (None where ep = 1 or the group is this rank alone), under the policy's
    ``axis`` (dp); ``zero``: the ShardedOptimizer of ZeRO-1, or None."""

    axis_names = ("dp", "zero")

    def __init__(self, comm: Comm, axis, replicas: int, dp: int, groups: list, expert_groups: list,
                 embed_comm: Comm | None = None, expert_comm: Comm | None = None, zero=None, device=None,
                 recipe=None, warmup_steps: int = 0):
        self.comm, self.axis, self.replicas, self.dp = comm, axis, replicas, dp
        self.recipe, self.warmup_steps, self.steps_done = recipe, warmup_steps, 0
        self.groups, self.expert_groups = groups, expert_groups
        self.embed_comm, self.expert_comm, self.zero, self.device = embed_comm, expert_comm, zero, device
        self.error: RelativeError | None = None
        self._reset()

    def _reset(self) -> None:
        self.seconds, self.stats, self.gather_stats = 0.0, CommStats(), CommStats()

    def start_step(self, measure: bool) -> None:
        self.error = meter(measure, self.replicas)
        if self.error is not None:
            self.comm.track_contraction()

    def step(self, model, opt) -> float:
        """Reduce the step's gradients and step ``opt`` (the ZeRO optimizer itself under ZeRO-1);
        returns the optimizer's seconds (the reductions' are this runtime's)."""
        t = now(self.device)
        self.steps_done += 1
        self.sync_embedding(model)
        if getattr(opt, "reduces", False):   # a momentum recipe's optimizer reduces over the replicas itself
            self.sync_expert_gradients()
            optim = opt.step(self.stats, self.error)
            self.seconds += now(self.device) - t - optim
            return optim
        if self.zero is not None:   # the experts' reduction; reduce-scatter, sharded update, all-gather
            self.sync_expert_gradients()
            optim = self.zero.step(self.stats, self.gather_stats, self.error)
            self.seconds += now(self.device) - t - optim
            return optim
        if self.replicas > 1:
            sync_gradients(self.groups, self.comm, self.gradient_axis(), self.replicas, self.stats, self.error)
        self.sync_expert_gradients()
        self.seconds += now(self.device) - t
        t = now(self.device)
        opt.step()
        return now(self.device) - t

    def gradient_axis(self):
        """The spec the gradients reduce under this step: the dp axis's, or none in a recipe's
        warm-up (``steps_done`` counts this step) and under a momentum recipe (module doc)."""
        if self.recipe is not None and (self.recipe.compresses != "gradient" or self.steps_done <= self.warmup_steps):
            return _UNCOMPRESSED
        return self.axis

    def take(self) -> ReductionTiming:
        """The reductions' seconds and statistics since the last call (their error and error
        feedback's contraction on a measured step; zero's error is not measured), then reset."""
        out = ReductionTiming(apart_s=self.seconds, stats={"dp": self.stats, "zero": self.gather_stats},
                              errors={"dp": value(self.error), "zero": None},
                              contraction=self.comm.take_contraction() if self.error is not None else None)
        self._reset()
        self.error = None
        return out

    def sync_embedding(self, model) -> None:
        """Tied embeddings across a pipeline: the first stage's embedding and the last stage's
        head are one matrix, so their gradients are summed between the two (Megatron-LM's
        embedding group), a gradient reduction under the dp spec."""
        if self.embed_comm is None or model.embed is None:
            return
        grad = model.embed.weight.grad
        codec = self.gradient_axis().codec_for(grad.numel() * grad.element_size())
        grad.copy_(self.embed_comm.allreduce(grad, codec, key="embedding", stats=self.stats))

    def sync_expert_gradients(self) -> None:
        """The routed experts' gradients under expert parallelism: each already sums what its ep
        group's tokens sent it, so a sum over the expert-data-parallel group (dp / ep ranks,
        under the dp spec) makes the whole batch's, averaged over dp as the dense ones are."""
        if self.expert_comm is not None:
            sync_gradients(self.expert_groups, self.expert_comm, self.gradient_axis(), self.dp, self.stats, self.error)
            return
        for params in self.expert_groups:
            for p in params:
                p.grad /= self.dp


__all__ = ["DataParallel", "buckets", "sync_gradients"]
