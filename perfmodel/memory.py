"""Memory per GPU: weights, gradients, optimizer states (ZeRO), activations, reserve.

Mixed-precision Adam (Rajbhandari et al., SC20, section 3): compute-dtype weights, gradients
in ``grad_dtype``, and 12 bytes of optimizer state per parameter (fp32 master, momentum,
variance). ZeRO-1 shards the optimizer states over DP, ZeRO-2 the gradients too, ZeRO-3 the
weights too. Activations per layer from Korthikanti et al. 2023 (``workload``) times the
microbatches a stage holds: 1F1B holds min(pp - stage, m) (stage 0 the most), GPipe all m,
interleaving (1 + (pp - 1) / (pp V)) times 1F1B's (Narayanan et al. 2021). The last stage adds
fp32 logits for the loss. ``RESERVE_BYTES`` covers the CUDA context, NCCL buffers and allocator
fragmentation: an assumption of 2 GiB.
"""
from __future__ import annotations

from functools import lru_cache

from perfmodel.axes import AXES
from perfmodel.dtypes import DTYPE_BYTES
from perfmodel.plan import ParallelPlan
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


def stage_params(model: ModelSpec, plan: ParallelPlan, layers: int, first: bool, last: bool) -> float:
    """Parameters held by one GPU of a stage (TP-split, before ZeRO sharding)."""
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
    params = stage_params(model, plan, layers, first, last)
    out = {
        "weights": params * DTYPE_BYTES[plan.compute_dtype] / shards(plan, "weights"),
        "hpz_secondary": params * DTYPE_BYTES[plan.compute_dtype] / hpz_ranks if plan.hpz else 0.0,
        "gradients": params * DTYPE_BYTES[plan.grad_dtype] / shards(plan, "gradients"),
        "optimizer": params * OPTIMIZER_BYTES / shards(plan, "optimizer"),
        "activations": layers * in_flight(plan, stage) * model.activation_bytes_per_layer(
            plan.mbs, plan.seq, plan.tp, plan.sequence_parallel, plan.recompute),
        "logits": (plan.mbs * plan.seq * model.vocab_size * 4 / plan.tp) if last else 0.0,
        "reserve": float(RESERVE_BYTES),
    }
    out["total"] = sum(out.values())
    return out


def peak_memory(model: ModelSpec, plan: ParallelPlan, hpz_ranks: int = 1) -> dict:
    """The stage with the largest total (the one that must fit)."""
    layers = plan.stage_layers(model.num_layers)
    per_stage = [memory_per_gpu(model, plan, s, n, hpz_ranks) for s, n in enumerate(layers)]
    return max(per_stage, key=lambda d: d["total"])
