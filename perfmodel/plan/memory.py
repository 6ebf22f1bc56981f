"""Memory per GPU: weights, gradients, optimizer states (ZeRO), activations, reserve.

Mixed-precision Adam (Rajbhandari et al., SC20, section 3): compute-dtype weights, gradients
in ``grad_dtype``, and 12 bytes of optimizer state per parameter (fp32 master, momentum,
variance). ZeRO-1 shards the optimizer states over DP, ZeRO-2 the gradients too, ZeRO-3 the
weights too. Activations per layer from Korthikanti et al. 2023 (``workload``) times the
microbatches a stage holds: 1F1B holds min(pp - stage, m) (stage 0 the most), GPipe all m,
interleaving (1 + (pp - 1) / (pp V)) times 1F1B's (Narayanan et al. 2021). The last stage adds
fp32 logits for the loss. ``RESERVE_BYTES`` covers the CUDA context, NCCL buffers and allocator
fragmentation: an assumption of 2 GiB.

Mixture of experts: a GPU holds its 1/ep share of every MoE layer's routed experts (split over
tp too: expert tensor parallelism equal to tp, Megatron-Core's default) and all of the rest;
ZeRO shards the expert part over its expert-data-parallel group (dp x cp / ep ranks), the
dense part over dp x cp. Context parallelism divides the activations (seq / cp tokens a GPU).
"""
from __future__ import annotations

from functools import lru_cache

from perfmodel.axes import AXES
from perfmodel.dtypes import DTYPE_BYTES
from perfmodel.plan.parallel import ParallelPlan
from perfmodel.workload import ModelSpec

OPTIMIZER_BYTES = 12
RESERVE_BYTES = 2 * 2**30


@lru_cache(maxsize=4096)
def shards(plan: ParallelPlan, kind: str) -> int:
    """How many ways the axes' declarations (``Axis.memory``) split memory of ``kind`` (cached:
    every stage of every plan asks)."""
    ways = 1
    for axis in AXES.values():
        ways *= axis.memory(plan).get(kind, 1)
    return ways


def stage_params(model: ModelSpec, plan: ParallelPlan, layers: int, first: bool, last: bool, start: int = 0) -> float:
    """Parameters held by one GPU of a stage (TP-split, its share of the experts, before ZeRO
    sharding); ``start`` is the stage's first layer (which of its layers are MoE)."""
    dense, experts = stage_param_split(model, plan, layers, first, last, start)
    return dense + experts


def stage_param_split(model: ModelSpec, plan: ParallelPlan, layers: int, first: bool, last: bool,
                      start: int = 0) -> tuple[float, float]:
    """(dense, routed-expert) parameters one GPU of a stage holds (``stage_params``'s two parts)."""
    if not model.is_moe:
        return _dense_stage_params(model, plan, layers, first, last), 0.0
    dense, routed = model.stage_layer_params(start, layers)
    ends = _dense_stage_params(model, plan, 0, first, last)
    return dense / shards(plan, "params") + ends, routed / shards(plan, "expert_params")


def _dense_stage_params(model: ModelSpec, plan: ParallelPlan, layers: int, first: bool, last: bool) -> float:
    params = layers * model.layer_params()
    if first:
        params += model.embedding_params()
    if last:
        params += model.head_params() + model.hidden_size * (2 if model.biased else 1)
        if model.tied_embeddings and not first:
            params += model.embedding_params()
    return params / shards(plan, "params")


def in_flight(plan: ParallelPlan, stage: int) -> float:
    m = plan.microbatches
    if plan.schedule == "gpipe":
        return m
    held = min(plan.pp - stage, m)
    if plan.schedule == "interleaved":
        held *= 1 + (plan.pp - 1) / (plan.pp * plan.virtual_stages)
    return held


def memory_per_gpu(model: ModelSpec, plan: ParallelPlan, stage: int, layers: int, hpz_ranks: int = 1) -> dict:
    """Bytes per GPU of pipeline ``stage`` by kind, and their ``total``. With hpZ, the secondary
    copy of the weights is partitioned over ``hpz_ranks`` (the dp group's ranks in a node)."""
    first, last = stage == 0, stage == plan.pp - 1
    start = plan.stage_first_layer(stage, model.num_layers)
    dense, experts = stage_param_split(model, plan, layers, first, last, start)
    params = dense + experts

    def sharded(kind: str, per_param: float) -> float:
        if not experts:
            return params * per_param / shards(plan, kind)
        return per_param * (dense / shards(plan, kind) + experts / expert_shards(plan, kind))
    out = {
        "weights": sharded("weights", DTYPE_BYTES[plan.compute_dtype]),
        "hpz_secondary": params * DTYPE_BYTES[plan.compute_dtype] / hpz_ranks if plan.hpz else 0.0,
        "gradients": sharded("gradients", DTYPE_BYTES[plan.grad_dtype]),
        "optimizer": sharded("optimizer", OPTIMIZER_BYTES),
        "activations": _activations(model, plan, layers, start, in_flight(plan, stage)),
        "logits": (plan.mbs * plan.local_seq * model.vocab_size * 4 / plan.tp) if last else 0.0,
        "reserve": float(RESERVE_BYTES),
    }
    out["total"] = sum(out.values())
    return out


def expert_shards(plan: ParallelPlan, kind: str) -> int:
    """ZeRO's sharding of the routed experts: over the expert-data-parallel group, ep times
    smaller than the dense parameters' (``shards``)."""
    ways = shards(plan, kind)
    return max(1, ways // plan.ep) if ways > 1 else ways


def _activations(model: ModelSpec, plan: ParallelPlan, layers: int, start: int, held: float) -> float:
    """Bytes the ``held`` microbatches of a stage's layers keep for backward (MoE layers their own)."""
    args = (plan.mbs, plan.local_seq, plan.tp, plan.sequence_parallel, plan.recompute)
    if not model.is_moe:
        return layers * held * model.activation_bytes_per_layer(*args)
    moe = model.moe_layers_in(start, layers)
    return held * ((layers - moe) * model.activation_bytes_per_layer(*args)
                   + moe * model.moe_activation_bytes_per_layer(*args))


def peak_memory(model: ModelSpec, plan: ParallelPlan, hpz_ranks: int = 1) -> dict:
    """The stage with the largest total (the one that must fit)."""
    layers = plan.stage_layers(model.num_layers)
    per_stage = [memory_per_gpu(model, plan, s, n, hpz_ranks) for s, n in enumerate(layers)]
    return max(per_stage, key=lambda d: d["total"])
