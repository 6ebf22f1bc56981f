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


def dp_events(stage_params: float, layer_params: float, plan: ParallelPlan, mesh: Mesh,
              layers: int, gpus_per_host: int = 1) -> list[CommEvent]:
    """DP and ZeRO events of a stage. With hpZ (ZeRO-3), backward gathers read the secondary
    partition inside the node: the dp group's ranks on this host (``gpus_per_host``)."""
    if plan.dp == 1:
        return []
    group, concurrent = mesh.group_of("dp"), mesh.groups["dp"]
    grad_bytes = int(stage_params) * DTYPE_BYTES[plan.grad_dtype]
    param_bytes = int(stage_params) * DTYPE_BYTES[plan.compute_dtype]
    if plan.zero == 3:
        layer_grad = int(layer_params) * DTYPE_BYTES[plan.grad_dtype]
        layer_param = int(layer_params) * DTYPE_BYTES[plan.compute_dtype]
        per = plan.microbatches * layers
        bwd_groups = mesh.node_groups("dp", gpus_per_host) if plan.hpz else concurrent
        bwd_group = next(g for g in bwd_groups if group[0] in g)
        return [CommEvent(name="zero.allgather.fwd", axis="zero", op="allgather", nbytes=layer_param,
                          dtype=plan.compute_dtype, group=group, concurrent=concurrent, count=per,
                          where="zero3", phase="fwd"),
                CommEvent(name="zero.allgather.bwd", axis="zero", op="allgather", nbytes=layer_param,
                          dtype=plan.compute_dtype, group=bwd_group, concurrent=bwd_groups, count=per,
                          where="zero3", phase="bwd"),
                CommEvent(name="dp.reduce_scatter.bwd", axis="dp", op="reduce_scatter", nbytes=layer_grad,
                          dtype=plan.grad_dtype, group=group, concurrent=concurrent, count=per,
                          where="zero3", phase="bwd")]
    axis, op = "dp", "allreduce" if plan.zero == 0 else "reduce_scatter"   # gradients: the dp axis at every stage
    full, rest = divmod(grad_bytes, plan.bucket_bytes)
    share = plan.bucket_bytes / max(grad_bytes, 1)
    out = []
    for size, count, first in ((plan.bucket_bytes, full, share), (rest, 1 if rest else 0, 1.0)):
        if count:
            out.append(CommEvent(name=f"{axis}.{op}.buckets", axis=axis, op=op, nbytes=size,
                                 dtype=plan.grad_dtype, group=group, concurrent=concurrent, count=count,
                                 where="overlap", phase="bwd", ready_at=first, spacing=share))
    if plan.zero in (1, 2):
        out.append(CommEvent(name="zero.allgather.params", axis="zero", op="allgather", nbytes=param_bytes,
                             dtype=plan.compute_dtype, group=group, concurrent=concurrent, count=1,
                             where="tail", phase="step"))
    return out


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

    def stage_params(self) -> float:
        from perfmodel.memory import stage_params

        return stage_params(self.model, self.plan, self.layers, self.first, self.last)


def _data_parallel(ctx: StageContext) -> list[CommEvent]:
    """``dp_events`` of the stage: per-layer shards under ZeRO-3, the stage's buckets otherwise."""
    plan, layer = ctx.plan, ctx.model.layer_params() / ctx.plan.tp
    params = layer * ctx.layers if plan.zero == 3 else ctx.stage_params()
    return dp_events(params, layer if plan.zero == 3 else 0, plan, ctx.mesh, ctx.layers, ctx.gpus_per_host)


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
    own = [e for e in _data_parallel(ctx) if e.axis == "dp"]
    return own + (tied_embedding_events(ctx.model, ctx.plan, ctx.mesh) if ctx.first else [])


def gather_events(ctx: StageContext) -> list[CommEvent]:
    """The zero axis: ZeRO's parameter gathers of the stage."""
    return [e for e in _data_parallel(ctx) if e.axis == "zero"]
