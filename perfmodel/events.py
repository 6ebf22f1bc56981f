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

Context parallelism (cp) shortens every per-GPU activation to seq / cp tokens. Mixture of experts
with expert parallelism (ep): every MoE layer of every microbatch all-to-alls its tokens' top-k
copies (t k h activations, t the GPU's tokens; under the plan's routing the busiest rank's rows of
an uneven all-to-all, ``perfmodel.plan.routing.dispatch_rows``) to the experts' ranks (``ep``: the dispatch) and
the experts' outputs back (``ep_combine``: the combine), forward; backward the gradients go the
same two ways (the combine's gradient is a dispatch towards the experts, the dispatch's a
combine towards the tokens: DeepEP's naming, and DeepSeek-V3's FP8 dispatch and BF16 combine
in both passes); full recompute repeats the forward pair. The expert layers have their own groups
(Megatron-Core's MoE parallel folding, ``perfmodel.plan.mesh``): the all-to-alls run over the folded
ep groups; with expert tensor parallelism (etp > 1) the dispatched rows are all-gathered over etp
after the dispatch and reduce-scattered before the combine (Megatron-Core's all-to-all dispatcher:
"A2A(EP) -> AG(TP)", "RS(TP) -> A2A(EP)"), etp times the a2a's rows each, on the ``tp`` axis over
the etp groups, mirrored backward. Where the experts are laid out apart from the dense weights
(ep > 1 or etp other than tp) their gradients reduce over the expert-data-parallel group (``edp``)
in their own buckets after the dense ones, which reduce over dp x cp, and ZeRO gathers them over
edp: after the step at ZeRO-1/2, per layer at ZeRO-3 (torchtitan's FSDP2 with expert parallelism:
experts sharded over ep, then over edp). cp's keys and values go round a ring (``context_events``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfmodel.dtypes import DTYPE_BYTES
from perfmodel.plan.mesh import Groups, Mesh
from perfmodel.plan.parallel import ParallelPlan
from perfmodel.plan.recompute import reruns_attention, reruns_experts
from perfmodel.plan.routing import dispatch_rows
from perfmodel.workload import ModelSpec

if TYPE_CHECKING:   # the generators read a stage through it; it reads memory, which reads the axes
    from perfmodel.stage import StageContext


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
    where: str           # critical, attention (cp's ring, beside attention), overlap, zero3, tail
    phase: str = ""      # fwd, bwd, step
    ready_at: float = 1.0   # overlap: when the first of ``count`` equal buckets is ready (fraction)
    spacing: float = 0.0    # overlap: fraction between consecutive buckets of the run


def tp_events(model: ModelSpec, plan: ParallelPlan, mesh: Mesh, layers: int) -> list[CommEvent]:
    """Every layer's collectives over tp (module doc)."""
    if plan.tp == 1:
        return []
    size = plan.local_seq * plan.mbs * model.hidden_size * DTYPE_BYTES[plan.compute_dtype]
    group, concurrent = mesh.group_of("tp"), mesh.groups["tp"]
    per_mb = plan.microbatches * layers
    fwd_repeats = 2 if plan.recompute == "full" else 1
    # a hybrid model's layer has one mixer (perfmodel.workload.HYBRID_SYMBOLS): one all-reduce, not two
    ops = ("allgather", "reduce_scatter") if plan.sequence_parallel else \
        ("allreduce",) if model.is_hybrid else ("allreduce", "allreduce")
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
    size = plan.local_seq * plan.mbs * model.hidden_size * DTYPE_BYTES[plan.compute_dtype]
    group, concurrent = mesh.group_of("tp"), mesh.groups["tp"]
    ends = (("embedding", "fwd", first), ("head", "bwd", last))
    return [CommEvent(name=f"tp.allreduce.{name}", axis="tp", op="allreduce", nbytes=size, dtype=plan.compute_dtype,
                      group=group, concurrent=concurrent, count=plan.microbatches, where="critical", phase=phase)
            for name, phase, here in ends if here]


def pp_events(model: ModelSpec, plan: ParallelPlan, mesh: Mesh) -> list[CommEvent]:
    if plan.pp == 1:
        return []
    size = plan.local_seq * plan.mbs * model.hidden_size * DTYPE_BYTES[plan.compute_dtype] // plan.tp
    pairs = mesh.stage_pairs(0)
    count = plan.microbatches * plan.virtual_stages
    return [CommEvent(name=f"pp.sendrecv.{phase}", axis="pp", op="sendrecv", nbytes=size,
                      dtype=plan.compute_dtype, group=pairs[0], concurrent=pairs, count=count,
                      where="critical", phase=phase) for phase in ("fwd", "bwd")]


def _dp_group(mesh: Mesh) -> tuple:
    return mesh.group_of("dp"), mesh.groups["dp"]


def gradient_buckets(stage_params: float, plan: ParallelPlan, mesh: Mesh) -> list[CommEvent]:
    """The dp axis outside ZeRO-3: the stage's gradients in buckets during the last backward,
    all-reduced (ZeRO 0) or reduce-scattered (ZeRO 1, 2), over dp x cp ranks."""
    group, concurrent = _dp_group(mesh)
    if len(group) == 1:
        return []
    grad_bytes = int(stage_params) * DTYPE_BYTES[plan.grad_dtype]
    op = "allreduce" if plan.zero == 0 else "reduce_scatter"
    full, rest = divmod(grad_bytes, plan.bucket_bytes)
    share = plan.bucket_bytes / max(grad_bytes, 1)
    return [CommEvent(name=f"dp.{op}.buckets", axis="dp", op=op, nbytes=size, dtype=plan.grad_dtype, group=group,
                      concurrent=concurrent, count=count, where="overlap", phase="bwd", ready_at=first,
                      spacing=share)
            for size, count, first in ((plan.bucket_bytes, full, share), (rest, 1 if rest else 0, 1.0)) if count]


def _bucket_run(name: str, nbytes: int, total: int, offset: int, plan: ParallelPlan, groups: Groups) -> list:
    """Buckets of ``nbytes`` of a stage's ``total`` gradient bytes, the first ``offset`` bytes of
    which become ready before them (readiness as a fraction of the last backward)."""
    if len(groups[0]) == 1 or not nbytes:
        return []
    op = "allreduce" if plan.zero == 0 else "reduce_scatter"
    full, rest = divmod(nbytes, plan.bucket_bytes)
    share = plan.bucket_bytes / total
    return [CommEvent(name=f"dp.{op}.{name}", axis="dp", op=op, nbytes=size, dtype=plan.grad_dtype, group=groups[0],
                      concurrent=groups, count=count, where="overlap", phase="bwd", ready_at=first, spacing=share)
            for size, count, first in ((plan.bucket_bytes, full, offset / total + share),
                                       (rest, 1 if rest else 0, (offset + nbytes) / total)) if count]


def expert_gradient_buckets(ctx: StageContext) -> list[CommEvent]:
    """With ep > 1: the dense gradients' buckets over dp x cp, then the routed experts' over
    their expert-data-parallel group (Megatron-Core's expert-dp); readiness spread over the
    backward in that order."""
    plan, mesh = ctx.plan, ctx.mesh
    dense, experts = (int(p) * DTYPE_BYTES[plan.grad_dtype] for p in ctx.param_split)
    total = max(dense + experts, 1)
    return (_bucket_run("buckets", dense, total, 0, plan, mesh.groups["dp"])
            + _bucket_run("expert_buckets", experts, total, dense, plan, mesh.groups["edp"]))


def parameter_gather(stage_params: float, plan: ParallelPlan, mesh: Mesh, kind: str = "dp",
                     name: str = "params") -> list[CommEvent]:
    """The zero axis under ZeRO 1 and 2: the updated parameters all-gathered after the step, over
    the groups of ``kind`` (dp: the dense ones over dp x cp; edp: the experts apart)."""
    groups = mesh.groups[kind]
    if len(groups[0]) == 1 or plan.zero not in (1, 2) or not int(stage_params):
        return []
    return [CommEvent(name=f"zero.allgather.{name}", axis="zero", op="allgather",
                      nbytes=int(stage_params) * DTYPE_BYTES[plan.compute_dtype], dtype=plan.compute_dtype,
                      group=groups[0], concurrent=groups, count=1, where="tail", phase="step")]


def _zero3(ctx: StageContext, axis: str) -> list[CommEvent]:
    """ZeRO-3, every layer and microbatch: its parameters gathered before forward and backward
    (zero axis; with hpZ the backward gathers read the secondary partition inside the node, the
    dp group's ranks on this host) and its gradients reduce-scattered (dp axis). With the experts
    apart (``ParallelPlan.experts_apart``), a layer's dense parameters over dp x cp and its routed
    experts' (a GPU's ep x etp share) over edp, each its own collective (``.experts`` in the name;
    FSDP2 shards them as two parameter groups)."""
    plan, model = ctx.plan, ctx.model
    if not ctx.layers:
        return []
    if model.is_moe and plan.experts_apart:
        dense, experts = (p / ctx.layers for p in _layer_split(ctx))
        parts = (("", dense, "dp"), (".experts", experts, "edp"))
    else:
        layer = sum(model.stage_layer_params(ctx.start, ctx.layers)) / ctx.layers if model.is_moe or model.is_hybrid \
            else model.layer_params()
        parts = (("", layer / plan.tp, "dp"),)
    return [e for suffix, params, kind in parts for e in _zero3_part(ctx, axis, int(params), kind, suffix)]


def _layer_split(ctx: StageContext) -> tuple[float, float]:
    """(dense, routed-expert) parameters of the stage's layers on one GPU (its ends left out)."""
    plan, model = ctx.plan, ctx.model
    dense, routed = model.stage_layer_params(ctx.start, ctx.layers)
    return dense / plan.tp, routed / (plan.ep * plan.etp)


def _zero3_part(ctx: StageContext, axis: str, layer_params: int, kind: str, suffix: str) -> list[CommEvent]:
    """``_zero3``'s events of one part of a layer's parameters over the groups of ``kind``."""
    plan, mesh = ctx.plan, ctx.mesh
    concurrent = mesh.groups[kind]
    group = concurrent[0]
    if len(group) == 1 or not layer_params:
        return []
    per = plan.microbatches * ctx.layers
    if axis == "dp":
        return [CommEvent(name=f"dp.reduce_scatter.bwd{suffix}", axis="dp", op="reduce_scatter",
                          nbytes=layer_params * DTYPE_BYTES[plan.grad_dtype], dtype=plan.grad_dtype, group=group,
                          concurrent=concurrent, count=per, where="zero3", phase="bwd")]
    bwd_groups = mesh.node_groups(kind, ctx.gpus_per_host) if plan.hpz else concurrent
    bwd_group = next(g for g in bwd_groups if group[0] in g)
    nbytes = layer_params * DTYPE_BYTES[plan.compute_dtype]
    return [CommEvent(name=f"zero.allgather.{phase}{suffix}", axis="zero", op="allgather", nbytes=nbytes,
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


def expert_tp_events(ctx: StageContext) -> list[CommEvent]:
    """The routed experts' tensor parallelism over etp in every MoE layer of the stage (module
    doc): forward the dispatched rows all-gathered after the dispatch and reduce-scattered before
    the combine, backward the reverse; a recompute of the experts (full, or selective with moe) repeats
    the forward pair. Each moves etp x
    the rows a rank dispatches (the gathered array, ``nbytes`` as nccl-tests count it)."""
    plan, model = ctx.plan, ctx.model
    if plan.etp == 1 or not ctx.moe_layers:
        return []
    size = plan.etp * _dispatch_bytes(model, plan)
    group, concurrent = ctx.mesh.group_of("etp"), ctx.mesh.groups["etp"]
    per = plan.microbatches * ctx.moe_layers
    runs = [("fwd", "fwd", ("allgather", "reduce_scatter")), ("bwd", "bwd", ("allgather", "reduce_scatter"))]
    if reruns_experts(plan):
        runs.append(("recompute", "bwd", ("allgather", "reduce_scatter")))
    return [CommEvent(name=f"tp.{op}.experts.{name}", axis="tp", op=op, nbytes=size, dtype=plan.compute_dtype,
                      group=group, concurrent=concurrent, count=per, where="critical", phase=phase)
            for name, phase, ops in runs for op in ops]


def tensor_parallel_events(ctx: StageContext) -> list[CommEvent]:
    """The tp axis: every layer's collectives, the routed experts' over etp, and the
    vocabulary-parallel ends on the first and last stage."""
    return (tp_events(ctx.model, ctx.plan, ctx.mesh, ctx.layers) + expert_tp_events(ctx)
            + vocab_events(ctx.model, ctx.plan, ctx.mesh, ctx.first, ctx.last))


def pipeline_events(ctx: StageContext) -> list[CommEvent]:
    """The pp axis: activations to the next stage and gradients to the previous one."""
    return pp_events(ctx.model, ctx.plan, ctx.mesh)


def gradient_events(ctx: StageContext) -> list[CommEvent]:
    """The dp axis: the stage's gradient reduction; on the first stage, the tied embedding's sum."""
    if ctx.plan.zero == 3:
        own = _zero3(ctx, "dp")
    elif ctx.plan.experts_apart and ctx.moe_layers:
        own = expert_gradient_buckets(ctx)
    else:
        own = gradient_buckets(ctx.stage_params, ctx.plan, ctx.mesh)
    return own + (tied_embedding_events(ctx.model, ctx.plan, ctx.mesh) if ctx.first else [])


def gather_events(ctx: StageContext) -> list[CommEvent]:
    """The zero axis: ZeRO's parameter gathers of the stage (the experts apart over edp)."""
    plan = ctx.plan
    if plan.zero == 3:
        return _zero3(ctx, "zero")
    if not (plan.experts_apart and ctx.moe_layers):
        return parameter_gather(ctx.stage_params, plan, ctx.mesh)
    dense, experts = ctx.param_split
    return (parameter_gather(dense, plan, ctx.mesh)
            + parameter_gather(experts, plan, ctx.mesh, "edp", "expert_params"))


def _alltoall_events(ctx: StageContext, axis: str, kind: str) -> list[CommEvent]:
    """One kind (dispatch or combine) of every MoE layer's all-to-all on the stage."""
    plan, model = ctx.plan, ctx.model
    if plan.ep == 1 or not ctx.moe_layers:
        return []
    size = _dispatch_bytes(model, plan)
    group, concurrent = ctx.mesh.group_of("ep"), ctx.mesh.groups["ep"]
    per = plan.microbatches * ctx.moe_layers
    repeats = (("fwd", "fwd", 1), ("bwd", "bwd", 1)) + ((("recompute", "bwd", 1),) if reruns_experts(plan) else ())
    return [CommEvent(name=f"{axis}.alltoall.{kind}.{name}", axis=axis, op="alltoall", nbytes=size,
                      dtype=plan.compute_dtype, group=group, concurrent=concurrent, count=per * n, where="critical",
                      phase=phase) for name, phase, n in repeats]


def _dispatch_bytes(model: ModelSpec, plan: ParallelPlan) -> int:
    """Bytes one MoE layer's dispatch (and its combine) moves on a rank per microbatch: the rows of the
    busiest rank of the all-to-all under the plan's routing (``perfmodel.plan.routing.dispatch_rows``:
    every token copy balanced, capacity rows padded, a histogram's uneven splits) of the experts' width: h, or a
    LatentMoE's latent width (Megatron-Core's MoELayer projects the tokens before the dispatch: the dispatcher only
    sees latent-dim tensors, megatron/core/transformer/moe/moe_layer.py @ d98e8a64dd lines 423-428, 488-490)."""
    return int(dispatch_rows(model, plan)) * model.expert_width * DTYPE_BYTES[plan.compute_dtype]


def dispatch_events(ctx: StageContext) -> list[CommEvent]:
    """The ep axis: every MoE layer's dispatch (tokens towards their experts), both passes."""
    return _alltoall_events(ctx, "ep", "dispatch")


def combine_events(ctx: StageContext) -> list[CommEvent]:
    """The ep_combine axis: every MoE layer's combine (expert outputs towards their tokens)."""
    return _alltoall_events(ctx, "ep_combine", "combine")


def context_events(ctx: StageContext) -> list[CommEvent]:
    """The cp axis: ring attention as Megatron-Core's context parallelism runs it (Transformer
    Engine's ``p2p`` mode; Liu et al. 2023, Ring Attention). Each sequence is cut into 2 cp
    chunks and GPU i keeps chunks i and 2 cp - 1 - i, so causal attention costs every GPU the
    same. Per layer and microbatch, cp - 1 ring steps each pass the GPU's K and V block
    (2 x seq / cp x kv_dim / tp values) to the next rank while attention computes on the block
    it holds (``where='attention'``: overlapped with that compute). Backward passes K, V and
    their gradients (twice the bytes); a recompute that reruns attention (full, or selective with
    core_attn) repeats the forward ring."""
    plan, model = ctx.plan, ctx.model
    if plan.cp == 1:
        return []
    block = 2 * plan.local_seq * plan.mbs * model.kv_dim // plan.tp * DTYPE_BYTES[plan.compute_dtype]
    pairs = ctx.mesh.ring_pairs("cp")
    per = plan.microbatches * ctx.layers * (plan.cp - 1)
    runs = (("fwd", "fwd", block), ("bwd", "bwd", 2 * block))
    if reruns_attention(plan):
        runs += (("recompute", "bwd", block),)
    return [CommEvent(name=f"cp.sendrecv.kv.{name}", axis="cp", op="sendrecv", nbytes=size, dtype=plan.compute_dtype,
                      group=pairs[0], concurrent=pairs, count=per, where="attention", phase=phase)
            for name, phase, size in runs]
