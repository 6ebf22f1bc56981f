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

Context parallelism: a GPU holds seq / cp tokens; its attention scores its queries against
every key of the sequence, cp blocks of (seq / cp)^2 (the load-balanced causal split gives every
GPU the same work). A MoE layer's MLP is a router GEMM (tokens x experts x h), the shared
experts (a dense MLP of their total width) and the routed experts as a grouped GEMM: the GPU's
experts / ep experts, each taking its share of the tokens' top-k copies times the expert load
(``ModelSpec.expert_load``: the most loaded expert sets the layer's time), widths split over tp.

Small work: every kernel a layer runs is counted (``layer_kernels``). On the GPU each non-GEMM
kernel adds the fixed time per kernel of the device's GEMM shape model (``kernel_fixed_s``; a
GEMM's is in its shape model, ``catalogs.GemmShape``). On the host (where the device has
``host_op_s``) the framework spends ``host_op_s`` to issue each kernel, TP collectives included;
the host runs ahead of the GPU (launches are asynchronous), so an operation takes the longer of
its GPU time and its host time, not their sum (``host_fwd_s``, ``host_bwd_s``; the engine
applies the floor after adding the operation's TP collectives, which the host issues too).
"""
from __future__ import annotations

from dataclasses import dataclass

from perfmodel.devices import Device
from perfmodel.plan.parallel import DTYPE_BYTES, ParallelPlan
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
    attention_fwd_s: float = 0.0  # one forward's attention scores and values (what cp's ring hides behind)
    attention_bwd_s: float = 0.0  # the backward's (recompute not included): fused twice the forward's
    host_fwd_s: float = 0.0      # host seconds to issue the forward's kernels (0: not modelled)
    host_bwd_s: float = 0.0      # host seconds to issue the backward's kernels, recompute included


# Kernels of one layer's forward in Megatron-LM with its fused kernels: per GEMM of
# ``layer_gemms`` one, flash attention one, and six memory-bound ones (two norms, the bias and
# activation, two bias-dropout-residual adds, the Q/K/V layout copy). Backward runs two kernels
# for each forward one (input gradient and weight or parameter gradient, as for the GEMMs).
ATTENTION_KERNELS = 1
MEMORY_KERNELS = 6
BACKWARD_KERNELS_PER_FORWARD = 2
EMBEDDING_KERNELS = 2          # token lookup, position add
ACTIVATION_BYTES = 2           # per element moved: activation_bytes' convention (Korthikanti: 2-byte activations)
# Eager kernels (the plan's ``kernels``), ring attention (realrun/train/context_parallel.py): every
# score block is in memory and each elementwise operation a pass over it. Accesses per score,
# counted in that code: forward scale (read, write), causal mask (2), the running max (1), minus it
# (2), exp (2), the row sum (1); backward, the scores recomputed: scale, mask, minus the log-sum-exp,
# exp (2 each), dP minus delta (2), P times it (3), times the scale (2).
UNFUSED_FWD_ACCESSES, UNFUSED_BWD_ACCESSES = 10, 15
# Its products per block: forward QK^T and PV; backward, the scores recomputed (QK^T), dO V^T,
# dS K, dS^T Q and P^T dO (the same code): five where a backward that keeps P runs four.
EAGER_RING_BWD_PRODUCTS, RING_FWD_PRODUCTS = 5, 2
# Eager kernels, a MoE layer's permutation (realrun/train/moe.py), accesses per element of a
# dispatched row, forward (backward twice, as all memory-bound work here): the token copies gathered
# (read, write) and written into their zeroed expert queues (zero, read, write), the combine's rows
# gathered (2), weighted (2) and added into their tokens (1), and with ep > 1 the expert-major layout
# in and out of the experts (2 x read, write: ``EAGER_LAYOUT_ACCESSES``). The activation traffic
# every MoE layer is charged already moves the dispatched copies once each way (2 of these, as
# Megatron-Core's fused permute and unpermute do), so eager kernels add the rest.
EAGER_PERMUTE_ACCESSES, EAGER_LAYOUT_ACCESSES = 10 - 2, 4
LOSS_KERNELS = 4               # the fused cross-entropy's passes over the logits


def layer_gemms(model: ModelSpec, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """(m, n, k) of one layer's forward GEMMs on one GPU: QKV, attention output, MLP up (and
    gate), MLP down, each split over TP (what calibration times, with their backward)."""
    T, h, tp = plan.local_seq * plan.mbs, model.hidden_size, plan.tp
    return [(T, (h + 2 * model.kv_dim) / tp, h), (T, h, h / tp),
            (T, model.mlp_up_width / tp, h), (T, h, model.ffn_hidden_size / tp)]


def moe_gemms(model: ModelSpec, plan: ParallelPlan, load: float = 1.0) -> list[tuple[float, float, float, int]]:
    """(m, n, k, times) of a MoE layer's MLP GEMMs on one GPU: router, shared experts, and each of
    its experts / ep routed experts' up and down projections at ``load`` times its fair share."""
    T, h, tp = plan.local_seq * plan.mbs, model.hidden_size, plan.tp
    local = model.num_experts // plan.ep
    m = T * model.moe_top_k * load / local
    shared = model.moe_shared_experts
    out = [(T, model.num_experts, h, 1)]
    if shared:
        out += [(T, shared * model.expert_up_width / tp, h, 1), (T, h, shared * model.moe_ffn_hidden_size / tp, 1)]
    return out + [(m, model.expert_up_width / tp, h, local), (m, h, model.moe_ffn_hidden_size / tp, local)]


def layer_kernels(model: ModelSpec, plan: ParallelPlan, moe: bool = False) -> dict[str, int]:
    """Kernels of one layer's forward by kind (``gemm``, ``attention``, ``memory``, ``collective``);
    collectives: TP's two all-reduces (all-gather and reduce-scatter pairs with sequence
    parallelism) and, in a MoE layer, the two ep all-to-alls."""
    gemm = len(layer_gemms(model, plan))
    memory = MEMORY_KERNELS
    collective = (4 if plan.sequence_parallel else 2) if plan.tp > 1 else 0
    if moe:
        gemm = 2 + sum(times for *_, times in moe_gemms(model, plan))
        memory += 2                                   # token permute and unpermute
        collective += 2 if plan.ep > 1 else 0
    return {"gemm": gemm, "attention": ATTENTION_KERNELS, "memory": memory, "collective": collective}


def kernel_fixed_s(dev: Device) -> float:
    """GPU seconds every kernel costs beyond its work, in a stream of back-to-back kernels: the
    fixed time of the device's GEMM shape model (fitted on GEMMs timed in such a loop); 0 where the
    device has none (its table's efficiencies hold the GEMMs' fixed time; the others' is not known)."""
    return dev.gemm_shape.fixed_s if dev.gemm_shape is not None else 0.0


def _launch_s(model: ModelSpec, plan: ParallelPlan, dev: Device, moe: bool = False) -> tuple[float, float]:
    """(fixed GPU seconds of one layer's forward memory-bound kernels, of its attention kernels)."""
    k = layer_kernels(model, plan, moe)
    return k["memory"] * kernel_fixed_s(dev), k["attention"] * kernel_fixed_s(dev)


def host_times_s(model: ModelSpec, plan: ParallelPlan, dev: Device, layers: int, first: bool, last: bool,
                 moe_layers: int = 0) -> tuple[float, float]:
    """(forward, backward) host seconds to issue one microbatch's kernels on a stage."""
    if dev.host_op_s <= 0:
        return 0.0, 0.0
    dense, moe = layer_kernels(model, plan), layer_kernels(model, plan, True) if moe_layers else None

    def count(k: dict | None, n: int) -> tuple[int, int]:
        if k is None or n == 0:
            return 0, 0
        compute = k["gemm"] + k["attention"] + k["memory"]
        return n * (compute + k["collective"]), n * (BACKWARD_KERNELS_PER_FORWARD * compute + k["collective"])
    (f0, b0), (f1, b1) = count(dense, layers - moe_layers), count(moe, moe_layers)
    ends = EMBEDDING_KERNELS * first + (1 + LOSS_KERNELS) * last
    recompute = {"none": 0, "selective": layers * ATTENTION_KERNELS, "full": f0 + f1}[plan.recompute]
    fwd = f0 + f1 + ends
    bwd = b0 + b1 + BACKWARD_KERNELS_PER_FORWARD * ends + recompute
    return fwd * dev.host_op_s, bwd * dev.host_op_s


def attention_heads(model: ModelSpec, plan: ParallelPlan) -> float:
    """Sequences x heads of one microbatch on one GPU: each an s x s x head_dim score GEMM and
    a value GEMM."""
    return plan.mbs * model.num_heads / plan.tp


def activation_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes of one layer's activations that memory-bound work moves (Korthikanti et al. 2023)."""
    T, h, tp = plan.local_seq * plan.mbs, model.hidden_size, plan.tp
    return T * h * (10.0 / (tp if plan.sequence_parallel else 1) + 24.0 / tp)


def score_elements(model: ModelSpec, plan: ParallelPlan) -> float:
    """Attention scores one GPU computes per layer and microbatch: its queries against every key
    of the sequence (cp blocks of (seq / cp)^2 under cp; a masked block is computed whole)."""
    return attention_heads(model, plan) * plan.local_seq * plan.seq


def _attention(model: ModelSpec, plan: ParallelPlan, dev: Device) -> tuple[float, float, float]:
    """(fwd s, bwd s, FLOPs) of one layer's attention scores and values (cp blocks under cp):
    the batched GEMMs (backward: twice forward), and with eager kernels under cp the ring's
    recomputed scores (``EAGER_RING_BWD_PRODUCTS``) and its elementwise work over every score
    (``eager_score_s``)."""
    heads, dt = attention_heads(model, plan), plan.compute_dtype
    if plan.cp == 1:
        attn = 2 * heads * dev.table_gemm_time_s(plan.seq, plan.seq, model.head_dim, dt)
    else:
        attn = 2 * heads * plan.cp * dev.table_gemm_time_s(plan.local_seq, plan.local_seq, model.head_dim, dt)
    fwd, bwd = attn, 2 * attn
    if plan.kernels == "eager" and plan.cp > 1:   # the ring's blocks; whole-sequence attention is fused
        fwd_s, bwd_s = eager_score_s(dev)
        bwd = attn * EAGER_RING_BWD_PRODUCTS / RING_FWD_PRODUCTS
        fwd, bwd = fwd + score_elements(model, plan) * fwd_s, bwd + score_elements(model, plan) * bwd_s
    return fwd, bwd, 2 * heads * 2.0 * plan.local_seq * plan.seq * model.head_dim


def eager_score_s(dev: Device) -> tuple[float, float]:
    """(forward, backward) seconds per score of eager attention beyond its GEMMs: measured where
    the device has it (``Device.eager_score_s``, ``realrun calibrate``: exp and the masked fill
    are not streaming passes on a CPU, and every operation has its dispatch), split as the
    counted accesses split; else the counted accesses at the streaming rate."""
    accesses = UNFUSED_FWD_ACCESSES + UNFUSED_BWD_ACCESSES
    per = dev.eager_score_s if dev.eager_score_s is not None else accesses * ACTIVATION_BYTES / dev.stream_Bps
    return per * UNFUSED_FWD_ACCESSES / accesses, per * UNFUSED_BWD_ACCESSES / accesses


def permute_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes one MoE layer's forward permutation moves on a GPU beyond its activation traffic:
    with eager kernels ``EAGER_PERMUTE_ACCESSES`` (and with ep > 1 ``EAGER_LAYOUT_ACCESSES``) per
    element of the rows it dispatches (``ModelSpec.dispatched_rows``; padded, its capacity's);
    fused kernels none."""
    if plan.kernels != "eager":
        return 0.0
    accesses = EAGER_PERMUTE_ACCESSES + (EAGER_LAYOUT_ACCESSES if plan.ep > 1 else 0)
    return accesses * model.dispatched_rows(plan.routed_tokens) * model.hidden_size * ACTIVATION_BYTES


def _layer(model: ModelSpec, plan: ParallelPlan, dev: Device) -> tuple[float, float, float, float, float]:
    """(GEMM fwd s, attention fwd s, memory-bound fwd s, GEMM fwd FLOPs, attention bwd s) of one layer."""
    dt, shapes = plan.compute_dtype, layer_gemms(model, plan)
    gemm = sum(dev.gemm_time_s(m, n, k, dt) for m, n, k in shapes)
    flops = sum(2.0 * m * n * k for m, n, k in shapes)
    attn, attn_bwd, flops_attn = _attention(model, plan, dev)
    launch_memory, launch_attn = _launch_s(model, plan, dev)
    memory = 2.0 * activation_bytes(model, plan) / dev.stream_Bps + launch_memory
    return gemm, attn + launch_attn, memory, flops + flops_attn, attn_bwd + 2 * launch_attn


def _moe_layer(model: ModelSpec, plan: ParallelPlan, dev: Device) -> tuple[float, float, float, float, float]:
    """``_layer`` of a MoE layer: attention as a dense layer's, its MLP as ``moe_gemms`` (timed at
    the expert load, FLOPs counted balanced), memory-bound work over its activations and the
    permutation of its dispatched rows."""
    dt = plan.compute_dtype
    shapes = layer_gemms(model, plan)[:2]
    gemm = sum(dev.gemm_time_s(m, n, k, dt) for m, n, k in shapes)
    gemm += sum(times * dev.gemm_time_s(m, n, k, dt) for m, n, k, times in moe_gemms(model, plan, model.expert_load))
    flops = sum(2.0 * m * n * k for m, n, k in shapes)
    flops += sum(times * 2.0 * m * n * k for m, n, k, times in moe_gemms(model, plan))
    attn, attn_bwd, flops_attn = _attention(model, plan, dev)
    kept = model.moe_activation_bytes_per_layer(plan.mbs, plan.local_seq, plan.tp, plan.sequence_parallel,
                                                "selective")
    launch_memory, launch_attn = _launch_s(model, plan, dev, moe=True)
    memory = (2.0 * kept + permute_bytes(model, plan)) / dev.stream_Bps + launch_memory
    return gemm, attn + launch_attn, memory, flops + flops_attn, attn_bwd + 2 * launch_attn


def _ends(model: ModelSpec, plan: ParallelPlan, dev: Device, first: bool, last: bool) -> tuple[float, float]:
    """(fwd s, FLOPs) of the embedding (first stage) and LM head + loss (last stage)."""
    T, h, dt = plan.local_seq * plan.mbs, model.hidden_size, plan.compute_dtype
    fwd = flops = 0.0
    launch = kernel_fixed_s(dev)
    if first:
        fwd += 2.0 * T * h * DTYPE_BYTES[dt] / dev.stream_Bps + EMBEDDING_KERNELS * launch
    if last:
        V = model.vocab_size / plan.tp
        fwd += dev.gemm_time_s(T, V, h, dt) + 3.0 * T * V * 4 / dev.stream_Bps + LOSS_KERNELS * launch
        flops += 2.0 * T * V * h
    return fwd, flops


def stage_compute(model: ModelSpec, plan: ParallelPlan, dev: Device, layers: int, first: bool,
                  last: bool, moe_layers: int = 0) -> StageCompute:
    """One microbatch on a stage of ``layers`` layers, ``moe_layers`` of them MoE layers."""
    dense = _layer(model, plan, dev)
    moe = _moe_layer(model, plan, dev) if moe_layers else None

    def total(fn, times: int = 1) -> float:
        """Sum of ``times x fn(layer)`` over the stage's layers (dense and MoE)."""
        if moe is None:
            return layers * times * fn(dense)
        return (layers - moe_layers) * times * fn(dense) + moe_layers * times * fn(moe)
    end_fwd, end_flops = _ends(model, plan, dev, first, last)
    fwd = total(lambda x: x[0] + x[1] + x[2]) + end_fwd
    recompute = {"none": lambda: 0.0, "selective": lambda: total(lambda x: x[1]),
                 "full": lambda: total(lambda x: x[0] + x[1] + x[2])}[plan.recompute]()
    bwd = total(lambda x: 2 * x[0] + x[4] + 2 * x[2]) + 2 * end_fwd + recompute
    attn_flops = 2 * 2.0 * plan.mbs * model.num_heads / plan.tp * (plan.seq * plan.local_seq) * model.head_dim
    extra = {"none": lambda x: 0.0, "selective": lambda x: attn_flops, "full": lambda x: x[3]}[plan.recompute]
    hw_flops = 3 * (total(lambda x: x[3]) + end_flops) + total(extra)
    head = _head_gemm_s(model, plan, dev) if last else 0.0
    runs = {"none": 3, "selective": 3, "full": 4}[plan.recompute]        # forward, backward x2, recompute
    rerun = plan.recompute in ("selective", "full")                      # attention's forward again
    gemm_s = total(lambda x: x[0], runs) + 3 * head
    attention_s = total(lambda x: x[1] * (2 if rerun else 1) + x[4])
    host_fwd, host_bwd = host_times_s(model, plan, dev, layers, first, last, moe_layers)
    return StageCompute(fwd_s=fwd, bwd_s=bwd, recompute_s=recompute, hardware_flops=hw_flops, gemm_s=gemm_s,
                        attention_s=attention_s, memory_bound_s=fwd + bwd - gemm_s - attention_s,
                        attention_fwd_s=total(lambda x: x[1]), attention_bwd_s=total(lambda x: x[4]),
                        host_fwd_s=host_fwd, host_bwd_s=host_bwd)


def _head_gemm_s(model: ModelSpec, plan: ParallelPlan, dev: Device) -> float:
    return dev.gemm_time_s(plan.local_seq * plan.mbs, model.vocab_size / plan.tp, model.hidden_size,
                           plan.compute_dtype)


def optimizer_time_s(params_per_gpu: float, dev: Device) -> float:
    """Adam with fp32 master weights, memory-bound: reads master, grad, m, v (16 B), writes
    master, m, v and the bf16 copy (14 B) per parameter."""
    return 30.0 * params_per_gpu / dev.stream_Bps
