"""A software stack's costs on a pipeline stage beyond Megatron-Core's fused kernels.

``stack_compute`` takes a stage's ``StageCompute`` (``perfmodel.step.compute``: Megatron-Core with
Transformer Engine) and adds what the plan's ``FrameworkProfile`` (``perfmodel.plan.framework``)
says its stack does more, per layer and microbatch, on the GPU and on the host:

* eager memory-bound work: ``eager_traffic`` more passes over the layer's activation bytes
  (``compute.activation_bytes``, Korthikanti's count, which the fused kernels move twice forward)
  and ``eager_kernels`` more kernels, each with the device's fixed time per kernel
  (``compute.kernel_fixed_s``); backward twice the forward's, as ``compute`` counts memory-bound work;
* attention scores in memory (a stack without flash attention): ``score_accesses_fwd`` / ``_bwd``
  accesses of two bytes per score (``compute.score_elements``);
* ZeRO-3's copies around its collectives (FSDP2's all-gather copy-out and reduce-scatter copy-in):
  ``zero3_copy_bytes_fwd`` / ``_bwd`` per parameter of the layer on this GPU;
* gradient accumulation outside the weight-gradient GEMMs: ``grad_accum_bytes`` per parameter of
  the stage on this GPU after every microbatch's backward (Megatron-Core accumulates into its fp32
  main gradients inside the GEMMs);
* recompute: ``full`` reruns all of the above forward work; the stack's ``selective`` reruns its
  eager work and ``selective_gemm_fraction`` of the layer's forward GEMMs (torchtitan's per-op
  policy saves every other matmul), attention only where ``selective_attention``;
* host: the extra kernels at the device's ``host_op_s`` (already scaled by the stack,
  ``FrameworkProfile.device``) and ``layer_host_us`` per layer and operation (module hooks);
* communication: ``stack_event``, a pipeline transfer as the stack sends it; ``prefetched``, the
  share of a layer's ZeRO-3 gather the stack issues ahead of it.

The engine then takes the longer of each operation's GPU and host time (``engines.analytical``,
``_host_floor``), charges ``microbatch_host_s`` per microbatch as time the GPU waits, and
``step_host_s`` once per step. Every function is pure; a neutral profile (megatron-core's) returns
its input unchanged.
"""
from __future__ import annotations

from dataclasses import replace

from perfmodel.plan.memory import stage_params
from perfmodel.step.compute import (ACTIVATION_BYTES, BACKWARD_KERNELS_PER_FORWARD, StageCompute, activation_bytes,
                                    kernel_fixed_s, layer_gemms, score_elements, attention_flops)


def stack_compute(profile, sc: StageCompute, model, plan, dev, layers: int, first: bool = False,
                  last: bool = False) -> StageCompute:
    """``sc`` of a stage of ``layers`` layers (``first`` and ``last``: whether it holds the
    embedding and the LM head) with the stack's extra GPU and host seconds (module doc)."""
    if profile.neutral or layers == 0:
        return sc
    gpu_fwd, gpu_bwd = layer_gpu_s(profile, model, plan, dev)
    gemm, gemm_flops = _rerun_gemm(profile, model, plan, dev)
    kept = plan.recompute == "selective" and not profile.selective_attention
    attention = sc.attention_fwd_s if kept else 0.0          # the attention compute reruns that the stack keeps
    attention_flops = _attention_flops(model, plan) * layers if kept else 0.0
    rerun = layers * (recompute_s(profile, model, plan, dev, gpu_fwd) + gemm) - attention
    accumulate = grad_accum_s(profile, model, plan, dev, layers, first, last)
    fwd, bwd = sc.fwd_s + layers * gpu_fwd, sc.bwd_s + layers * gpu_bwd + rerun + accumulate
    host_fwd, host_bwd = layer_host_s(profile, plan, dev)
    gemm_s, attention_s = sc.gemm_s + layers * gemm, sc.attention_s - attention
    return replace(sc, fwd_s=fwd, bwd_s=bwd, recompute_s=sc.recompute_s + rerun,
                   hardware_flops=sc.hardware_flops + layers * gemm_flops - attention_flops,
                   gemm_s=gemm_s, attention_s=attention_s, memory_bound_s=fwd + bwd - gemm_s - attention_s,
                   host_fwd_s=sc.host_fwd_s + layers * host_fwd, host_bwd_s=sc.host_bwd_s + layers * host_bwd)


def layer_gpu_s(profile, model, plan, dev) -> tuple[float, float]:
    """(forward, backward) GPU seconds one layer spends beyond the fused kernels: eager passes and
    kernels, scores in memory, ZeRO-3 copies."""
    eager = profile.eager_traffic * activation_bytes(model, plan) / dev.stream_Bps
    eager += profile.eager_kernels * kernel_fixed_s(dev)
    scores = score_elements(model, plan) * ACTIVATION_BYTES / dev.stream_Bps
    copy_fwd, copy_bwd = zero3_copy_s(profile, model, plan, dev)
    fwd = eager + profile.score_accesses_fwd * scores + copy_fwd
    bwd = 2 * eager + profile.score_accesses_bwd * scores + copy_bwd
    return fwd, bwd


def zero3_copy_s(profile, model, plan, dev) -> tuple[float, float]:
    """(forward, backward) seconds of ZeRO-3's copies of one layer's parameters on this GPU (0
    without ZeRO-3 or without data parallelism to shard over)."""
    if plan.zero != 3 or plan.dp == 1:
        return 0.0, 0.0
    params = model.layer_params() / plan.tp
    return (profile.zero3_copy_bytes_fwd * params / dev.stream_Bps,
            profile.zero3_copy_bytes_bwd * params / dev.stream_Bps)


def grad_accum_s(profile, model, plan, dev, layers: int, first: bool, last: bool) -> float:
    """Seconds per microbatch to accumulate a stage's gradients apart from their GEMMs
    (``grad_accum_bytes`` per parameter this GPU holds on the stage)."""
    if not profile.grad_accum_bytes:
        return 0.0
    return profile.grad_accum_bytes * stage_params(model, plan, layers, first, last) / dev.stream_Bps


def recompute_s(profile, model, plan, dev, gpu_fwd: float) -> float:
    """Memory-bound GPU seconds of one layer's recomputation beyond what ``compute`` reruns:
    ``full`` reruns the extra forward work; the stack's ``selective`` its eager work (its GEMMs:
    ``_rerun_gemm``), and its scores in memory only where it reruns attention."""
    copy_fwd = zero3_copy_s(profile, model, plan, dev)[0]
    scores = score_elements(model, plan) * ACTIVATION_BYTES / dev.stream_Bps * profile.score_accesses_fwd
    if plan.recompute == "full":
        return gpu_fwd
    if plan.recompute != "selective":
        return 0.0
    eager = gpu_fwd - copy_fwd - scores
    return eager + (scores if profile.selective_attention else 0.0)


def _rerun_gemm(profile, model, plan, dev) -> tuple[float, float]:
    """(seconds, FLOPs) of the forward GEMMs of one layer the stack's selective recompute reruns."""
    if plan.recompute != "selective" or not profile.selective_gemm_fraction:
        return 0.0, 0.0
    shapes = layer_gemms(model, plan)
    seconds = sum(dev.gemm_time_s(m, n, k, plan.compute_dtype) for m, n, k in shapes)
    flops = sum(2.0 * m * n * k for m, n, k in shapes)
    return profile.selective_gemm_fraction * seconds, profile.selective_gemm_fraction * flops


def _attention_flops(model, plan) -> float:
    """One layer's forward attention FLOPs (scores and values), as ``compute`` counts them."""
    return attention_flops(model, plan)


def layer_host_s(profile, plan, dev) -> tuple[float, float]:
    """(forward, backward) host seconds one layer spends beyond the fused kernels' launches: its
    extra kernels at the device's host seconds per kernel, and the stack's hooks per operation
    (a recomputed forward issues its kernels and hooks again)."""
    hook = profile.layer_host_us * 1e-6
    kernels = profile.eager_kernels * dev.host_op_s
    fwd = kernels + hook
    bwd = BACKWARD_KERNELS_PER_FORWARD * kernels + hook
    if plan.recompute == "full":
        bwd += fwd
    elif plan.recompute == "selective":
        bwd += kernels
    return fwd, bwd


def stack_event(profile, plan, event):
    """The event as the stack sends it: a pipeline transfer of the whole activation from every TP
    rank where the stack has no scatter-gather (``FrameworkProfile.pp_full_activation``: DeepSpeed's
    pipeline engine), tp times the scattered slice ``perfmodel.events`` sizes."""
    if event.axis != "pp" or not profile.pp_full_activation or plan.tp == 1:
        return event
    return replace(event, nbytes=event.nbytes * plan.tp)


def prefetched(profile, model, plan) -> float:
    """The fraction of a layer's ZeRO-3 gather issued ahead of it: all of it (one layer of
    prefetch, FSDP2's and the model's default), or the stack's prefetch bucket over the layer's
    parameters on this GPU (DeepSpeed's ``stage3_prefetch_bucket_size``)."""
    if not profile.zero3_prefetch_params:
        return 1.0
    return min(1.0, profile.zero3_prefetch_params / (model.layer_params() / plan.tp))


def microbatch_host_s(profile) -> float:
    """Seconds per microbatch the GPU waits for the stack's host (a synchronising call)."""
    return profile.microbatch_host_ms * 1e-3


def step_host_s(profile) -> float:
    """Host seconds per step beyond the optimizer's GPU time (launch, checks, logging)."""
    return profile.step_host_ms * 1e-3
