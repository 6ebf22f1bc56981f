"""The communication of one training step as events.

Each ``CommEvent`` says what moves (op, bytes), on which axis and groups (one group and
all groups that communicate at the same time, so link sharing is priced), how many times
per step, and where it sits: ``critical`` (inside every microbatch of a stage: TP and PP),
``overlap`` (during the last backward, e.g. DP buckets, ready at ``ready_at`` in [0, 1] of
it), ``zero3`` (per layer, prefetched behind that layer's compute) or ``tail`` (after
the backward: ZeRO parameter all-gather, tied embeddings).

Volumes: TP, per layer and microbatch, two all-reduces of s b h activations forward and two
backward (with sequence parallelism each becomes an all-gather plus a reduce-scatter);
full recompute repeats the forward ones; the vocabulary-parallel embedding (first stage,
forward) and LM head (last stage, backward) add one each. PP sends s b h / tp per microbatch per boundary each
way (Megatron's scatter-gather: the receiver all-gathers over NVLink), V times with
interleaving. DP all-reduces the stage's gradients in buckets; ZeRO-1/2 reduce-scatter them
and all-gather updated parameters after the step (one reduction per step, as Megatron's
distributed optimizer; ZeRO-2 differs in memory); ZeRO-3 all-gathers each layer's
parameters before its forward and backward and reduce-scatters its gradients, every
microbatch; with hpZ (ZeRO++) the backward gathers stay inside the node, from a secondary
partition the forward gather fills. Tied embeddings all-reduce their gradient between the first and last stage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from perfmodel.dtypes import DTYPE_BYTES
from perfmodel.mesh import Mesh
from perfmodel.plan import ParallelPlan
from perfmodel.workload import ModelSpec


@dataclass(frozen=True, kw_only=True)
class CommEvent:
    name: str
    axis: str            # a perfmodel.axes name: dp, zero, tp, pp
    op: str
    nbytes: int
    dtype: str
    group: tuple
    concurrent: tuple
    count: float         # times per step (per rank of the bottleneck stage)
    where: str           # critical, overlap, zero3, tail
    phase: str = ""      # fwd, bwd, step
    ready_at: float = 1.0   # overlap: when the first of ``count`` equal buckets is ready (fraction)
    spacing: float = 0.0    # overlap: fraction between consecutive buckets of the run


def tp_events(model: ModelSpec, plan: ParallelPlan, mesh: Mesh, layers: int) -> list[CommEvent]:
    if plan.tp == 1:
        return []
    size = plan.seq * plan.mbs * model.hidden_size * DTYPE_BYTES[plan.compute_dtype]
    group, concurrent = mesh.group_of("tp"), mesh.groups["tp"]
    per_mb = plan.microbatches * layers
    fwd_repeats = 2 if plan.recompute == "full" else 1
    ops = ("allgather", "reduce_scatter") if plan.sequence_parallel else ("allreduce", "allreduce")
    out = []
    for phase, repeats in (("fwd", 1), ("bwd", 1), ("recompute", fwd_repeats - 1)):
        for i, op in enumerate(ops):
            if repeats:
                out.append(CommEvent(name=f"tp.{op}.{phase}.{i}", axis="tp", op=op, nbytes=size,
                                     dtype=plan.compute_dtype, group=group, concurrent=concurrent,
                                     count=per_mb * repeats, where="critical",
                                     phase="fwd" if phase == "fwd" else "bwd"))
    return out


def vocab_events(model: ModelSpec, plan: ParallelPlan, mesh: Mesh, first: bool, last: bool) -> list[CommEvent]:
    """The vocabulary-parallel ends of a TP group (Megatron): the first stage sums the partial
    embeddings of every microbatch (forward), the last stage sums the gradient of the head's
    input (backward); s b h activations each. The loss's three per-token sums (12 bytes a
    token, uncompressed) are left out: a layer's four all-reduces move 8h bytes a token in
    bf16, so they are 1.2% of one layer's TP bytes at h = 128 and less for wider models."""
    if plan.tp == 1:
        return []
    size = plan.seq * plan.mbs * model.hidden_size * DTYPE_BYTES[plan.compute_dtype]
    group, concurrent = mesh.group_of("tp"), mesh.groups["tp"]
    ends = (("embedding", "fwd", first), ("head", "bwd", last))
    return [CommEvent(name=f"tp.allreduce.{name}", axis="tp", op="allreduce", nbytes=size, dtype=plan.compute_dtype,
                      group=group, concurrent=concurrent, count=plan.microbatches, where="critical", phase=phase)
            for name, phase, here in ends if here]


def pp_events(model: ModelSpec, plan: ParallelPlan, mesh: Mesh) -> list[CommEvent]:
    if plan.pp == 1:
        return []
    size = plan.seq * plan.mbs * model.hidden_size * DTYPE_BYTES[plan.compute_dtype] // plan.tp
    pairs = mesh.stage_pairs(0)
    count = plan.microbatches * plan.virtual_stages
    return [CommEvent(name=f"pp.sendrecv.{phase}", axis="pp", op="sendrecv", nbytes=size,
                      dtype=plan.compute_dtype, group=pairs[0], concurrent=pairs, count=count,
                      where="critical", phase=phase) for phase in ("fwd", "bwd")]


def _dp_group(mesh: Mesh) -> tuple:
    return mesh.group_of("dp"), mesh.groups["dp"]


def gradient_buckets(stage_params: float, plan: ParallelPlan, mesh: Mesh) -> list[CommEvent]:
    """The dp axis outside ZeRO-3: the stage's gradients in buckets during the last backward,
    all-reduced (ZeRO 0) or reduce-scattered (ZeRO 1, 2)."""
    if plan.dp == 1:
        return []
    group, concurrent = _dp_group(mesh)
    grad_bytes = int(stage_params) * DTYPE_BYTES[plan.grad_dtype]
    op = "allreduce" if plan.zero == 0 else "reduce_scatter"
    full, rest = divmod(grad_bytes, plan.bucket_bytes)
    share = plan.bucket_bytes / max(grad_bytes, 1)
    return [CommEvent(name=f"dp.{op}.buckets", axis="dp", op=op, nbytes=size, dtype=plan.grad_dtype, group=group,
                      concurrent=concurrent, count=count, where="overlap", phase="bwd", ready_at=first,
                      spacing=share)
            for size, count, first in ((plan.bucket_bytes, full, share), (rest, 1 if rest else 0, 1.0)) if count]


def parameter_gather(stage_params: float, plan: ParallelPlan, mesh: Mesh) -> list[CommEvent]:
    """The zero axis under ZeRO 1 and 2: the updated parameters all-gathered after the step."""
    if plan.dp == 1 or plan.zero not in (1, 2):
        return []
    group, concurrent = _dp_group(mesh)
    return [CommEvent(name="zero.allgather.params", axis="zero", op="allgather",
                      nbytes=int(stage_params) * DTYPE_BYTES[plan.compute_dtype], dtype=plan.compute_dtype,
                      group=group, concurrent=concurrent, count=1, where="tail", phase="step")]


def _zero3(ctx: StageContext, axis: str) -> list[CommEvent]:
    """ZeRO-3, every layer and microbatch: its parameters gathered before forward and backward
    (zero axis; with hpZ the backward gathers read the secondary partition inside the node, the
    dp group's ranks on this host) and its gradients reduce-scattered (dp axis)."""
    plan, mesh = ctx.plan, ctx.mesh
    if plan.dp == 1:
        return []
    group, concurrent = _dp_group(mesh)
    layer_params = int(ctx.model.layer_params() / plan.tp)
    per = plan.microbatches * ctx.layers
    if axis == "dp":
        return [CommEvent(name="dp.reduce_scatter.bwd", axis="dp", op="reduce_scatter",
                          nbytes=layer_params * DTYPE_BYTES[plan.grad_dtype], dtype=plan.grad_dtype, group=group,
                          concurrent=concurrent, count=per, where="zero3", phase="bwd")]
    bwd_groups = mesh.node_groups("dp", ctx.gpus_per_host) if plan.hpz else concurrent
    bwd_group = next(g for g in bwd_groups if group[0] in g)
    nbytes = layer_params * DTYPE_BYTES[plan.compute_dtype]
    return [CommEvent(name=f"zero.allgather.{phase}", axis="zero", op="allgather", nbytes=nbytes,
                      dtype=plan.compute_dtype, group=g, concurrent=c, count=per, where="zero3", phase=phase)
            for phase, g, c in (("fwd", group, concurrent), ("bwd", bwd_group, bwd_groups))]


def tied_embedding_events(model: ModelSpec, plan: ParallelPlan, mesh: Mesh) -> list[CommEvent]:
    if not model.tied_embeddings or plan.pp == 1:
        return []
    pairs = mesh.first_last_pairs()
    size = math.ceil(model.embedding_params() / plan.tp) * DTYPE_BYTES[plan.grad_dtype]
    return [CommEvent(name="dp.allreduce.tied_embedding", axis="dp", op="allreduce", nbytes=size,
                      dtype=plan.grad_dtype, group=pairs[0], concurrent=pairs, count=1, where="tail",
                      phase="step")]


@dataclass(frozen=True, kw_only=True)
class StageContext:
    """One pipeline stage of a plan, as the axes' event generators see it (``perfmodel.axes``)."""

    model: ModelSpec
    plan: ParallelPlan
    mesh: Mesh
    stage: int
    layers: int
    gpus_per_host: int = 1

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.plan.pp - 1

    @cached_property
    def stage_params(self) -> float:
        """Parameters one GPU of this stage holds (``perfmodel.memory.stage_params``)."""
        from perfmodel.memory import stage_params   # memory reads the axes, which read this module

        return stage_params(self.model, self.plan, self.layers, self.first, self.last)


def tensor_parallel_events(ctx: StageContext) -> list[CommEvent]:
    """The tp axis: every layer's collectives, and the vocabulary-parallel ends on the first and
    last stage."""
    return (tp_events(ctx.model, ctx.plan, ctx.mesh, ctx.layers)
            + vocab_events(ctx.model, ctx.plan, ctx.mesh, ctx.first, ctx.last))


def pipeline_events(ctx: StageContext) -> list[CommEvent]:
    """The pp axis: activations to the next stage and gradients to the previous one."""
    return pp_events(ctx.model, ctx.plan, ctx.mesh)


def gradient_events(ctx: StageContext) -> list[CommEvent]:
    """The dp axis: the stage's gradient reduction; on the first stage, the tied embedding's sum."""
    own = _zero3(ctx, "dp") if ctx.plan.zero == 3 else gradient_buckets(ctx.stage_params, ctx.plan, ctx.mesh)
    return own + (tied_embedding_events(ctx.model, ctx.plan, ctx.mesh) if ctx.first else [])


def gather_events(ctx: StageContext) -> list[CommEvent]:
    """The zero axis: ZeRO's parameter gathers of the stage."""
    return _zero3(ctx, "zero") if ctx.plan.zero == 3 else parameter_gather(ctx.stage_params, ctx.plan, ctx.mesh)
