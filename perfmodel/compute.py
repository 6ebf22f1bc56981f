"""Compute time of one microbatch on one pipeline stage (per GPU).

GEMMs go through the GPU's measured efficiency table (``catalogs.Device.efficiency``):
per layer QKV, attention output, MLP up (x2 for SwiGLU) and down, each split over TP;
attention scores and values as batched s x s x head_dim GEMMs (flash attention: no s x s
tensor in memory). Backward costs two forwards of GEMMs (input and weight gradients).
Memory-bound work (norms, activations, dropout, residuals) moves the layer's activations
(Korthikanti et al. 2023: 10 sbh replicated + 24 sbh TP-split bytes) once each way forward
and twice backward at the measured streaming bandwidth. The first stage adds the embedding,
the last the LM head GEMM and a cross-entropy pass over fp32 logits. Recompute: ``full``
reruns the layer forward inside backward, ``selective`` reruns attention scores and values.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfmodel.catalogs import Device
from perfmodel.plan import DTYPE_BYTES, ParallelPlan
from perfmodel.workload import ModelSpec


@dataclass(frozen=True, kw_only=True)
class StageCompute:
    fwd_s: float
    bwd_s: float          # including recompute
    recompute_s: float    # the part of bwd_s that is recomputation
    hardware_flops: float  # FLOPs executed per microbatch on this GPU, recompute included
    gemm_s: float = 0.0          # of fwd_s + bwd_s: the layers' GEMMs and the LM head's
    attention_s: float = 0.0     # of fwd_s + bwd_s: attention scores and values (flash: no s x s in memory)
    memory_bound_s: float = 0.0  # of fwd_s + bwd_s: norms, activation, residuals, embedding, loss


def layer_gemms(model: ModelSpec, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """(m, n, k) of one layer's forward GEMMs on one GPU: QKV, attention output, MLP up (and
    gate), MLP down, each split over TP (what calibration times, with their backward)."""
    T, h, tp = plan.seq * plan.mbs, model.hidden_size, plan.tp
    return [(T, (h + 2 * model.kv_dim) / tp, h), (T, h, h / tp),
            (T, model.mlp_up_width / tp, h), (T, h, model.ffn_hidden_size / tp)]


def attention_heads(model: ModelSpec, plan: ParallelPlan) -> float:
    """Sequences x heads of one microbatch on one GPU: each an s x s x head_dim score GEMM and
    a value GEMM."""
    return plan.mbs * model.num_heads / plan.tp


def activation_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes of one layer's activations that memory-bound work moves (Korthikanti et al. 2023)."""
    T, h, tp = plan.seq * plan.mbs, model.hidden_size, plan.tp
    return T * h * (10.0 / (tp if plan.sequence_parallel else 1) + 24.0 / tp)


def _layer(model: ModelSpec, plan: ParallelPlan, dev: Device) -> tuple[float, float, float, float]:
    """(GEMM fwd s, attention fwd s, memory-bound fwd s, GEMM fwd FLOPs) of one layer."""
    dt, shapes = plan.compute_dtype, layer_gemms(model, plan)
    gemm = sum(dev.gemm_time_s(m, n, k, dt) for m, n, k in shapes)
    flops = sum(2.0 * m * n * k for m, n, k in shapes)
    heads = attention_heads(model, plan)
    attn = 2 * heads * dev.gemm_time_s(plan.seq, plan.seq, model.head_dim, dt)
    flops_attn = 2 * heads * 2.0 * plan.seq * plan.seq * model.head_dim
    memory = 2.0 * activation_bytes(model, plan) / dev.stream_Bps
    return gemm, attn, memory, flops + flops_attn


def _ends(model: ModelSpec, plan: ParallelPlan, dev: Device, first: bool, last: bool) -> tuple[float, float]:
    """(fwd s, FLOPs) of the embedding (first stage) and LM head + loss (last stage)."""
    T, h, dt = plan.seq * plan.mbs, model.hidden_size, plan.compute_dtype
    fwd = flops = 0.0
    if first:
        fwd += 2.0 * T * h * DTYPE_BYTES[dt] / dev.stream_Bps
    if last:
        V = model.vocab_size / plan.tp
        fwd += dev.gemm_time_s(T, V, h, dt) + 3.0 * T * V * 4 / dev.stream_Bps
        flops += 2.0 * T * V * h
    return fwd, flops


def stage_compute(model: ModelSpec, plan: ParallelPlan, dev: Device, layers: int, first: bool,
                  last: bool) -> StageCompute:
    gemm, attn, memory, flops = _layer(model, plan, dev)
    layer_fwd = gemm + attn + memory
    end_fwd, end_flops = _ends(model, plan, dev, first, last)
    fwd = layers * layer_fwd + end_fwd
    recompute = {"none": 0.0, "selective": layers * attn, "full": layers * layer_fwd}[plan.recompute]
    bwd = layers * (2 * (gemm + attn) + 2 * memory) + 2 * end_fwd + recompute
    attn_flops = 2 * 2.0 * plan.mbs * model.num_heads / plan.tp * plan.seq ** 2 * model.head_dim
    extra = {"none": 0.0, "selective": attn_flops, "full": flops}[plan.recompute]
    hw_flops = 3 * (layers * flops + end_flops) + layers * extra
    head = _head_gemm_s(model, plan, dev) if last else 0.0
    runs = {"none": 3, "selective": 3, "full": 4}[plan.recompute]        # forward, backward x2, recompute
    attn_runs = 4 if plan.recompute in ("selective", "full") else 3
    gemm_s = layers * runs * gemm + 3 * head
    attention_s = layers * attn_runs * attn
    return StageCompute(fwd_s=fwd, bwd_s=bwd, recompute_s=recompute, hardware_flops=hw_flops, gemm_s=gemm_s,
                        attention_s=attention_s, memory_bound_s=fwd + bwd - gemm_s - attention_s)


def _head_gemm_s(model: ModelSpec, plan: ParallelPlan, dev: Device) -> float:
    return dev.gemm_time_s(plan.seq * plan.mbs, model.vocab_size / plan.tp, model.hidden_size, plan.compute_dtype)


def optimizer_time_s(params_per_gpu: float, dev: Device) -> float:
    """Adam with fp32 master weights, memory-bound: reads master, grad, m, v (16 B), writes
    master, m, v and the bf16 copy (14 B) per parameter."""
    return 30.0 * params_per_gpu / dev.stream_Bps
