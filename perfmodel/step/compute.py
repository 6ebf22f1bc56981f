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
GPU the same work). A MoE layer's MLP is a router GEMM (tokens x experts x h) and its score and
top-k kernels, the shared experts (a dense MLP of their total width) and the routed experts as
grouped GEMMs (``grouped_gemm_s``: a GEMM per expert, as Transformer Engine runs them), widths
split over etp: the GPU's experts / ep experts, each with the rows the plan's routing gives it on the busiest
expert-parallel rank (``perfmodel.plan.routing.expert_rows``: balanced, padded to capacity or a
measured histogram; that rank sets the layer's time), and the permutation of its dispatched rows.

Small work: every kernel a layer runs is counted (``layer_kernels``). On the GPU each non-GEMM
kernel adds the fixed time per kernel of the device's GEMM shape model (``kernel_fixed_s``; a
GEMM's is in its shape model, ``catalogs.GemmShape``). On the host (where the device has
``host_op_s``) the framework spends ``host_op_s`` to issue each kernel, TP collectives included;
the host runs ahead of the GPU (launches are asynchronous), so an operation takes the longer of
its GPU time and its host time, not their sum (``host_fwd_s``, ``host_bwd_s``; the engine
applies the floor after adding the operation's TP collectives, which the host issues too).

Precision (``perfmodel.plan.precision``): a low-precision recipe runs the layers' GEMMs (fprop,
dgrad, wgrad, each as the recipe says) in its kernel, at that kernel's peak and efficiency
(``Device.gemm_time_s``); attention's products, the embedding and the LM head stay in the compute
dtype, and so do the layers the recipe keeps in bf16. Its quantization is memory-bound work
(``quantize_s``): per microbatch every GEMM's input in forward (again in a full recompute) and its
output gradient in backward, and per step (cached across microbatches, Transformer Engine's
``is_first_microbatch``) its weight, each at the recipe's bytes per element
(``Recipe.quantize_bytes``) over the streaming bandwidth times the recipe's quantize efficiency,
plus ``kernel_fixed_s`` per kernel; with sequence parallelism the column-parallel inputs and
row-parallel output gradients are quantized on their sequence shard, before the all-gather. Its
amax reductions are small all-reduces (``small_allreduce_s``): per layer over tp for the
sequence-parallel tensors of current scaling and NVFP4, per model chunk over dp x tp x cp for
delayed scaling's amax history. The FLOPs (``hardware_flops``) are the same in every precision.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from perfmodel.devices import Device, protocol_table
from perfmodel.plan.parallel import DTYPE_BYTES, ParallelPlan
from perfmodel.plan import routing
from perfmodel.step import mamba
from perfmodel.plan.precision import Recipe, recipe
from perfmodel.plan.recompute import reruns_attention
from perfmodel.step.recompute import Rerun, rerun, rerun_kernels
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
    moe_split: tuple = ()        # the stage's MoE layers (_moe_split): count, attention and MLP s fwd and bwd, ...


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
# A MoE router's work beyond its GEMM, per (token, expert) score, forward (backward twice, as all
# memory-bound work here): Megatron-Core's TopKRouter.routing (megatron/core/transformer/moe/router.py)
# with the fused router kernels (--moe-router-fusion: Transformer Engine's fused top-k with score function,
# and the aux loss's scores) reads the fp32 logits twice and writes the fp32 probabilities and scores and
# two bool routing maps: 4 + 4 + 4 + 1 + 4 + 1 bytes, in two kernels.
ROUTER_BYTES_PER_SCORE, ROUTER_KERNELS = 18, 2
LOSS_KERNELS = 4               # the fused cross-entropy's passes over the logits


# How Megatron-Core splits each GEMM over tp: column-parallel (its output split; with sequence
# parallelism its input all-gathered, so quantized on its sequence shard before the gather), row-parallel
# (its input split, its output reduce-scattered: its output gradient quantized on the shard), or
# duplicated (the whole weight on every rank: MLA's down projections, Transformer Engine's TELinear with
# parallel_mode 'duplicated', run on the rank's sequence shard with sequence parallelism, on every token
# without: megatron/core/transformer/multi_latent_attention.py, MLASelfAttention._qkv_down_projection).
COLUMN, ROW, DUPLICATED = "column", "row", "duplicated"
MLP_KINDS = (COLUMN, ROW)


def attention_gemms(model: ModelSpec, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """(m, n, k) of one layer's attention projections on one GPU, split over tp as ``attention_kinds``
    says: QKV (the heads' queries and the kv heads' keys and values) and the output projection. MLA
    (Megatron-Core's MLASelfAttention, gpt_layer_specs' Transformer Engine spec: linear_q_down_proj and
    linear_kv_down_proj ``backend.linear()``, the up projections ``column_parallel``): the query's down
    projection to q_lora_rank and up projection to the heads' queries (or one projection where q_lora_rank
    is 0), the keys' and values' down projection to kv_lora_rank + qk_rope_head_dim and up projection to
    the heads' no-rope keys and values, and the output projection."""
    T, h, tp = plan.local_seq * plan.mbs, model.hidden_size, plan.tp
    if not model.is_mla:
        return [(T, (model.q_width + 2 * model.kv_dim) / tp, h), (T, h, model.out_width / tp)]
    shard = T / (tp if plan.sequence_parallel else 1)          # the tokens a duplicated GEMM runs on
    rank, heads_kv = model.q_lora_rank, model.num_heads * (model.qk_nope_head_dim + model.v_head_dim)
    query = [(shard, rank, h), (T, model.q_width / tp, rank)] if rank else [(T, model.q_width / tp, h)]
    kv = [(shard, model.kv_lora_rank + model.qk_rope_head_dim, h), (T, heads_kv / tp, model.kv_lora_rank)]
    return query + kv + [(T, h, model.out_width / tp)]


def attention_kinds(model: ModelSpec) -> tuple[str, ...]:
    """How each of ``attention_gemms`` is split over tp (``COLUMN``, ``ROW``, ``DUPLICATED``)."""
    if not model.is_mla:
        return COLUMN, ROW
    return ((DUPLICATED, COLUMN) if model.q_lora_rank else (COLUMN,)) + (DUPLICATED, COLUMN, ROW)


def layer_gemms(model: ModelSpec, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """(m, n, k) of one dense layer's forward GEMMs on one GPU: the attention's (``attention_gemms``),
    then MLP up (and gate) and MLP down, each split over TP (what calibration times, with their backward)."""
    T, h, tp = plan.local_seq * plan.mbs, model.hidden_size, plan.tp
    return attention_gemms(model, plan) + [(T, model.mlp_up_width / tp, h), (T, h, model.ffn_hidden_size / tp)]


def layer_kinds(model: ModelSpec) -> tuple[str, ...]:
    """How each of ``layer_gemms`` is split over tp."""
    return attention_kinds(model) + MLP_KINDS


def moe_gemms(model: ModelSpec, plan: ParallelPlan, load: float = 1.0) -> list[tuple[float, float, float, int]]:
    """(m, n, k, times) of a MoE layer's MLP GEMMs on one GPU: the router on the tokens it routes (its
    sequence shard with sequence parallelism: Megatron-Core's router weight is sequence-parallel), the
    shared experts (a dense MLP over tp), and each of its experts / ep routed experts' up and down
    projections at ``load`` times its fair share of the expert tokens (``ParallelPlan.expert_tokens``:
    gathered over etp), widths split over etp. A LatentMoE (``moe_latent_size``) projects the tokens to the
    latent width and back (``fc1_latent_proj``, ``fc2_latent_proj``: duplicated TELinears on the rank's tokens,
    its sequence shard with sequence parallelism; after the shared experts here), and its experts take and
    give latent-wide rows."""
    T, h, tp, etp = plan.local_seq * plan.mbs, model.hidden_size, plan.tp, plan.etp
    local, width = model.num_experts // plan.ep, model.expert_width
    m = plan.expert_tokens * model.moe_top_k * load / local
    shared = model.moe_shared_experts
    out = [(plan.routed_tokens, model.num_experts, h, 1)]
    if shared:
        out += [(T, shared * model.expert_up_width / tp, h, 1), (T, h, shared * model.moe_ffn_hidden_size / tp, 1)]
    if model.moe_latent_size:
        shard = T / (tp if plan.sequence_parallel else 1)
        out += [(shard, width, h, 1), (shard, h, width, 1)]
    return out + [(m, model.expert_up_width / etp, width, local), (m, width, model.moe_ffn_hidden_size / etp, local)]


def moe_dense_kinds(model: ModelSpec) -> tuple[str, ...]:
    """How a MoE MLP's GEMMs between its router and its routed experts (``moe_gemms``) are split over tp: the
    shared experts as an MLP, a LatentMoE's projections duplicated."""
    return MLP_KINDS * bool(model.moe_shared_experts) + (DUPLICATED, DUPLICATED) * bool(model.moe_latent_size)


# Memory-bound kernels of a hybrid model's one-mixer layers (``perfmodel.workload.HYBRID_SYMBOLS``; a Mamba layer's
# are perfmodel.step.mamba's): attention's norm, Q/K/V layout copy and bias-dropout-add; an MLP's norm, activation and
# bias-dropout-add; a MoE layer's norm and bias-dropout-add (its permutation and router kernels as a MoE layer's)
HYBRID_MEMORY_KERNELS = {"*": 3, "-": 3, "E": 2}


def hybrid_gemms(model: ModelSpec, plan: ParallelPlan, symbol: str) -> tuple[list, tuple[str, ...]]:
    """(m, n, k) of the GEMMs of a hybrid model's layer of ``symbol`` on one GPU but a MoE layer's router and
    routed experts, and how each is split over tp: a Mamba-2 mixer's projections
    (``perfmodel.step.mamba.gemms``), attention's (``attention_gemms``), an MLP's, a MoE MLP's shared experts and
    latent projections."""
    if symbol == "M":
        return mamba.gemms(model, plan), MLP_KINDS
    if symbol == "*":
        return attention_gemms(model, plan), attention_kinds(model)
    if symbol == "-":
        return layer_gemms(model, plan)[-2:], MLP_KINDS
    return [(m, n, k) for m, n, k, _ in moe_gemms(model, plan)[1:-2]], moe_dense_kinds(model)


def layer_kernels(model: ModelSpec, plan: ParallelPlan, moe: bool = False, symbol: str = "") -> dict[str, int]:
    """Kernels of one layer's forward by kind (``gemm``, ``attention``, ``memory``, ``collective``);
    collectives: TP's two all-reduces (all-gather and reduce-scatter pairs with sequence
    parallelism) and, in a MoE layer, the two ep all-to-alls. A hybrid model's layer of ``symbol``
    (one mixer): one TP all-reduce (pair), a Mamba layer's kernels ``perfmodel.step.mamba.kernels``
    (its scan's under ``attention``)."""
    if symbol:
        return _hybrid_kernels(model, plan, symbol)
    gemm = len(layer_gemms(model, plan))
    memory = MEMORY_KERNELS
    collective = (4 if plan.sequence_parallel else 2) if plan.tp > 1 else 0
    if moe:
        gemm = len(attention_gemms(model, plan)) + len(moe_gemms(model, plan))   # a grouped GEMM a routed projection
        memory += 2 + ROUTER_KERNELS                  # token permute and unpermute, the router's scores
        collective += 2 if plan.ep > 1 else 0
    return {"gemm": gemm, "attention": ATTENTION_KERNELS, "memory": memory, "collective": collective}


def _hybrid_kernels(model: ModelSpec, plan: ParallelPlan, symbol: str) -> dict[str, int]:
    """``layer_kernels`` of a hybrid model's layer of ``symbol``."""
    collective = (2 if plan.sequence_parallel else 1) if plan.tp > 1 else 0
    if symbol == "M":
        return {**mamba.kernels(), "collective": collective}
    gemms = len(hybrid_gemms(model, plan, symbol)[0])
    out = {"gemm": gemms, "attention": ATTENTION_KERNELS * (symbol == "*"), "memory": HYBRID_MEMORY_KERNELS[symbol],
           "collective": collective}
    if symbol == "E":
        out["gemm"] += 3                                 # the router and the two routed grouped GEMMs
        out["memory"] += 2 + ROUTER_KERNELS              # token permute and unpermute, the router's scores
        out["collective"] += 2 if plan.ep > 1 else 0
    return out


def kernel_fixed_s(dev: Device) -> float:
    """GPU seconds every kernel costs beyond its work, in a stream of back-to-back kernels: the
    fixed time of the device's GEMM shape model (fitted on GEMMs timed in such a loop); 0 where the
    device has none (its table's efficiencies hold the GEMMs' fixed time; the others' is not known)."""
    return dev.gemm_shape.fixed_s if dev.gemm_shape is not None else 0.0


def _launch_s(model: ModelSpec, plan: ParallelPlan, dev: Device, moe: bool = False,
              symbol: str = "") -> tuple[float, float]:
    """(fixed GPU seconds of one layer's forward memory-bound kernels, of its attention kernels)."""
    k = layer_kernels(model, plan, moe, symbol)
    return k["memory"] * kernel_fixed_s(dev), k["attention"] * kernel_fixed_s(dev)


def host_times_s(model: ModelSpec, plan: ParallelPlan, dev: Device, layers: int, first: bool, last: bool,
                 moe_layers: int = 0) -> tuple[float, float]:
    """(forward, backward) host seconds to issue one microbatch's kernels on a stage (a low
    precision's quantize kernels and amax reductions included, ``quantize_kernels``)."""
    if dev.host_op_s <= 0:
        return 0.0, 0.0
    f0 = b0 = f1 = b1 = 0.0
    for low, high, moe, symbol in _stage_kinds(model, plan, layers, first, last, moe_layers):
        if low + high == 0:
            continue
        k, n = layer_kernels(model, plan, moe, symbol), low + high
        compute = k["gemm"] + k["attention"] + k["memory"]
        f0 += n * (compute + k["collective"])
        b0 += n * (BACKWARD_KERNELS_PER_FORWARD * compute + k["collective"])
    ends = EMBEDDING_KERNELS * first + (1 + LOSS_KERNELS) * last
    qf, qb, q_recompute = _stage_quantize_kernels(model, plan, layers, first, last, moe_layers)
    recompute = {"none": 0, "selective": _selective_kernels(model, plan, layers, moe_layers),
                 "full": f0 + f1 + q_recompute}[plan.recompute]
    fwd = f0 + f1 + ends + qf
    bwd = b0 + b1 + BACKWARD_KERNELS_PER_FORWARD * ends + recompute + qb
    return fwd * dev.host_op_s, bwd * dev.host_op_s


def _selective_kernels(model: ModelSpec, plan: ParallelPlan, layers: int, moe_layers: int) -> int:
    """Kernels a stage's selective recompute issues again: attention's (``core_attn``; a hybrid model's
    attention layers') and the named modules' (``perfmodel.step.recompute``)."""
    attending = layers * model.attention_layers / model.num_layers if model.is_hybrid else layers
    attention = attending * ATTENTION_KERNELS if reruns_attention(plan) else 0
    experts = _moe_mlp_kernels(model, plan) if moe_layers and "moe" in plan.recompute_modules else 0
    return attention + (layers - moe_layers) * rerun_kernels(model, plan, False) \
        + moe_layers * (rerun_kernels(model, plan, True) + experts)


def _stage_kinds(model: ModelSpec, plan: ParallelPlan, layers: int, first: bool, last: bool,
                 moe_layers: int) -> list[tuple[float, float, bool, str]]:
    """(low-precision count, compute-dtype count, MoE, hybrid symbol) of each kind of layer a stage holds: dense
    and MoE layers (``_low_layers``), or a hybrid model's layers by symbol: its ``moe_layers`` E layers and the
    rest in the model's proportions of M, * and - layers (exact for a stage holding its share of each, as the
    windowed layers' attention is priced), each kind's low-precision share the stage's."""
    rec = recipe(plan.precision)
    if not model.is_hybrid:
        dense_low, moe_low = _low_layers(rec, layers, first, last, moe_layers)
        return [(dense_low, layers - moe_layers - dense_low, False, ""), (moe_low, moe_layers - moe_low, True, "")]
    low = (layers - rec.high_layers(layers, first, last)) / layers if rec.is_low and layers else 0.0
    kinds = model.kinds_in(0, model.num_layers)
    rest, other = model.num_layers - kinds["E"], layers - moe_layers
    counts = {k: moe_layers if k == "E" else (other * n / rest if rest else 0.0) for k, n in kinds.items()}
    return [(n * low, n * (1 - low), k == "E", k) for k, n in counts.items()]


def _stage_quantize_kernels(model: ModelSpec, plan: ParallelPlan, layers: int, first: bool, last: bool,
                            moe_layers: int) -> tuple[float, float, float]:
    """(forward, backward, a full recompute's) quantize kernels and amax reductions of a stage's
    low-precision layers per microbatch (0 in a high precision)."""
    rec = recipe(plan.precision)
    kinds = _stage_kinds(model, plan, layers, first, last, moe_layers)
    if sum(low for low, *_ in kinds) == 0:
        return 0.0, 0.0, 0.0
    fwd = bwd = again = 0.0
    for n, _, moe, symbol in kinds:
        if n:
            f, b, r = quantize_kernels(model, plan, moe, symbol)
            fwd, bwd, again = fwd + n * f, bwd + n * b, again + n * r
    chunk = plan.virtual_stages * (rec.amax_reduction == "autocast")
    return fwd + chunk, bwd + chunk, again


def attention_heads(model: ModelSpec, plan: ParallelPlan) -> float:
    """Sequences x heads of one microbatch on one GPU: each a queries x keys x qk score GEMM and
    a queries x keys x v value GEMM (qk = v = head_dim but under MLA)."""
    return plan.mbs * model.num_heads / plan.tp


def activation_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes of one layer's activations that memory-bound work moves (Korthikanti et al. 2023): what
    the layer keeps for backward but the softmax statistics (``ModelSpec.activation_bytes_per_layer``:
    10 sbh whole or sequence-split, 24 sbh TP-split for multi-head attention; the attention's part from
    its shapes)."""
    return model.activation_bytes_per_layer(plan.mbs, plan.local_seq, plan.tp, plan.sequence_parallel, "selective")


def score_elements(model: ModelSpec, plan: ParallelPlan) -> float:
    """Attention scores one GPU computes per layer and microbatch: its queries against every key
    of the sequence (cp blocks of (seq / cp)^2 under cp; a masked block is computed whole), or of
    its window in a windowed layer (the mean over the model's layers, ``ModelSpec.score_keys``)."""
    return attention_heads(model, plan) * plan.local_seq * model.score_keys(plan.seq)


def attention_flops(model: ModelSpec, plan: ParallelPlan) -> float:
    """Forward FLOPs of one layer's attention scores and values on one GPU per microbatch: 2 x queries
    x keys x (qk + v) per sequence and head (the mean over the model's layers where some are windowed)."""
    return attention_heads(model, plan) * 2.0 * plan.local_seq * model.score_keys(plan.seq) \
        * (model.score_dim + model.value_dim)


def _products_s(model: ModelSpec, plan: ParallelPlan, dev: Device, keys: int) -> float:
    """Seconds of one microbatch's QK^T and AV products in a layer whose queries see ``keys`` keys: per
    sequence and head a queries x keys x qk and a queries x keys x v GEMM; under cp, with every key of
    the sequence, cp blocks of (seq / cp)^2, with a window one block of its keys."""
    heads, dt, qk, v = attention_heads(model, plan), plan.compute_dtype, model.score_dim, model.value_dim
    if plan.cp == 1:
        return heads * (dev.table_gemm_time_s(plan.seq, keys, qk, dt) + dev.table_gemm_time_s(plan.seq, keys, v, dt))
    if keys < plan.seq:
        local = plan.local_seq
        return heads * (dev.table_gemm_time_s(local, keys, qk, dt) + dev.table_gemm_time_s(local, keys, v, dt))
    blocks = dev.table_gemm_time_s(plan.local_seq, plan.local_seq, qk, dt) \
        + dev.table_gemm_time_s(plan.local_seq, plan.local_seq, v, dt)
    return heads * plan.cp * blocks


def _attention(model: ModelSpec, plan: ParallelPlan, dev: Device) -> tuple[float, float, float]:
    """(fwd s, bwd s, FLOPs) of one layer's attention scores and values (cp blocks under cp):
    the batched GEMMs (backward: twice forward; where some layers attend within a window, the mean
    over the model's layers of full and windowed ones, exact for a stage holding the model's share of
    each), and with eager kernels under cp the ring's recomputed scores (``EAGER_RING_BWD_PRODUCTS``)
    and its elementwise work over every score (``eager_score_s``)."""
    attn = _products_s(model, plan, dev, plan.seq)
    windowed = model.window_layers
    if windowed:
        near = _products_s(model, plan, dev, min(plan.seq, model.sliding_window))
        attn = ((model.num_layers - windowed) * attn + windowed * near) / model.num_layers
    fwd, bwd = attn, 2 * attn
    if plan.fp8_attention:
        fwd, bwd = _fp8_attention_s(model, plan, dev, fwd, bwd)
    if plan.kernels == "eager" and plan.cp > 1:   # the ring's blocks; whole-sequence attention is fused
        fwd_s, bwd_s = eager_score_s(dev)
        bwd = attn * EAGER_RING_BWD_PRODUCTS / RING_FWD_PRODUCTS
        fwd, bwd = fwd + score_elements(model, plan) * fwd_s, bwd + score_elements(model, plan) * bwd_s
    return fwd, bwd, attention_flops(model, plan)


# FP8 attention (Transformer Engine's fp8_dot_product_attention, cuDNN's fused FP8 kernels): its products run
# FP8_ATTENTION_SPEEDUP times faster than in bf16, the ratio FlashAttention-3 reports on H100 (Shah et al. 2024,
# arXiv 2407.08608, abstract: FP16 up to 740 TFLOPS, FP8 close to 1.2 PFLOPS), not the tensor cores' 2x: the
# softmax's exponentials and the kernel's data movement do not speed up. Its casts are memory-bound passes: Q, K
# and V to FP8 before the forward, the output and its gradient before the backward (read 2 bytes, write 1).
FP8_ATTENTION_SPEEDUP = 1200.0 / 740.0
FP8_CAST_BYTES = 3


def _fp8_attention_s(model: ModelSpec, plan: ParallelPlan, dev: Device, fwd: float, bwd: float
                     ) -> tuple[float, float]:
    """(forward, backward) seconds of attention whose products run in FP8: the products sped up by
    ``FP8_ATTENTION_SPEEDUP``, plus the casts of its inputs (Q, K, V forward; O and dO backward)."""
    tokens, heads = plan.local_seq * FP8_CAST_BYTES, attention_heads(model, plan)
    kv_heads = plan.mbs * model.num_kv_heads / plan.tp
    cast_fwd = tokens * (heads * model.score_dim + kv_heads * (model.score_dim + model.value_dim)) / dev.stream_Bps
    cast_bwd = tokens * heads * 2 * model.value_dim / dev.stream_Bps
    return fwd / FP8_ATTENTION_SPEEDUP + cast_fwd, bwd / FP8_ATTENTION_SPEEDUP + cast_bwd


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
    element of the rows the busiest rank dispatches and takes back (``routing.dispatch_rows``; padded,
    its capacity's; a LatentMoE's rows latent-wide, ``ModelSpec.expert_width``); fused kernels none."""
    if plan.kernels != "eager":
        return 0.0
    accesses = EAGER_PERMUTE_ACCESSES + (EAGER_LAYOUT_ACCESSES if plan.ep > 1 else 0)
    return accesses * routing.dispatch_rows(model, plan) * model.expert_width * ACTIVATION_BYTES


def router_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes a MoE layer's router moves beyond its GEMM in one forward on a GPU: ``ROUTER_BYTES_PER_SCORE``
    per score of the tokens it routes (``ParallelPlan.routed_tokens``) and the experts."""
    return ROUTER_BYTES_PER_SCORE * plan.routed_tokens * model.num_experts


def grouped_gemm_s(dev: Device, rows, n: float, k: float, dtype: str) -> float:
    """One grouped GEMM of experts with ``rows`` rows each, sharing n and k, as Transformer Engine's
    GroupedLinear runs it (``general_grouped_gemm``, ``nvte_multi_tensor_gemm``: transformer_engine/common/
    gemm/cublaslt_gemm.cu): a cuBLAS GEMM per expert (``multi_stream_cublas_gemm``; CUTLASS's grouped GEMM
    only on Hopper with ``NVTE_USE_CUTLASS_GROUPED_GEMM``, which Megatron-Bridge's recipes do not set),
    each at its own shape's efficiency (``Device.gemm_time_s``) and never faster than reading its n x k
    weights; an expert without rows runs none. The 4 compute streams the GEMMs are spread over are not
    modelled (they overlap one GEMM's launch and tail with the next one's: small experts run a little
    faster than this sum), nor Megatron-Core's fused grouped MLP of the Transformer Engine op fuser (one
    grid over every expert's tiles), which some recent Blackwell recipes turn on."""
    kernel = dev.gemm_kernels.get(dtype)
    weights = n * k * (kernel.element_bytes if kernel is not None else DTYPE_BYTES.get(dtype, 2)) / dev.stream_Bps
    return sum(max(dev.gemm_time_s(m, n, k, dtype), weights) for m in rows if m > 0)


def _expert_times(model: ModelSpec, plan: ParallelPlan, dev: Device, rec: Recipe) -> tuple[float, float]:
    """(forward, backward) seconds of a MoE layer's routed experts on the busiest expert-parallel rank:
    their up and down projections as grouped GEMMs (``grouped_gemm_s``) of the rows the routing gives
    them (``routing.expert_rows``, averaged over a histogram's layers); backward the dgrad and the wgrad,
    each of the forward's volume, each GEMM in the dtype the recipe runs it in (as ``_gemm_times``)."""
    layers = routing.expert_rows(model, plan)
    widths = [(n, k) for _, n, k, _ in moe_gemms(model, plan)[-2:]]

    def run(gemm: str) -> float:
        dtype = rec.gemm_dtype(gemm, plan.compute_dtype)
        return sum(grouped_gemm_s(dev, rows, n, k, dtype) for rows in layers for n, k in widths) / len(layers)
    return run("fprop"), run("dgrad") + run("wgrad")


class LayerTimes(NamedTuple):
    """One layer's seconds (and forward FLOPs) per microbatch on one GPU."""

    gemm_fwd: float
    attention_fwd: float
    memory_fwd: float          # memory-bound work of the forward (the backward's is twice it)
    flops: float               # forward FLOPs: GEMMs and attention
    attention_bwd: float
    gemm_bwd: float            # dgrad and wgrad
    quantize_fwd: float = 0.0  # a low precision's: the GEMMs' inputs (and their amax reductions)
    quantize_bwd: float = 0.0  # the output gradients'
    quantize_weights: float = 0.0   # the weights', once per step
    attention_flops: float = 0.0    # of flops: attention's scores and values (what selective recompute reruns)
    scan_fwd: float = 0.0      # a Mamba layer's SSD scan (perfmodel.step.mamba.ssd_s), its kernels' fixed time in
    scan_bwd: float = 0.0      # its backward's
    moe: float = 0.0           # 1 for a MoE layer (a count when summed over a stage's layers)
    attention_block_fwd: float = 0.0   # of a MoE layer's forward: its attention GEMMs and scores and values
    attention_block_bwd: float = 0.0   # of its backward (perfmodel.step.expert_overlap's segments)
    attention_block_gemm: float = 0.0  # of attention_block_fwd: the GEMMs
    attention_block_flops: float = 0.0  # of flops: the attention block's (GEMMs, scores and values)


def _kept_bytes(model: ModelSpec, plan: ParallelPlan, symbol: str, moe: bool = False) -> float:
    """Bytes one layer keeps for backward (the memory-bound work moves them once each way): a dense layer's
    (``activation_bytes``), a MoE layer's, or a hybrid model's layer of ``symbol``; experts at the busiest rank's
    load (``routing.loaded``)."""
    if moe:
        model = routing.loaded(model, plan)
    args = (plan.mbs, plan.local_seq, plan.tp, plan.sequence_parallel, "selective")
    if symbol:
        return model.hybrid_activation_bytes(symbol, *args)
    return model.moe_activation_bytes_per_layer(*args) if moe else activation_bytes(model, plan)


def _layer(model: ModelSpec, plan: ParallelPlan, dev: Device, rec: Recipe, symbol: str = "") -> LayerTimes:
    """One dense layer's times: its GEMMs in ``rec``'s dtypes (``_gemm_times``), attention, its
    memory-bound work and its quantization; a hybrid model's attention (``*``) or MLP (``-``) layer its
    one mixer's."""
    gemms = hybrid_gemms(model, plan, symbol)[0] if symbol else layer_gemms(model, plan)
    shapes = [(m, n, k, 1) for m, n, k in gemms]
    gemm, gemm_bwd = _gemm_times(shapes, plan, dev, rec)
    flops = sum(2.0 * m * n * k for m, n, k, _ in shapes)
    attn, attn_bwd, flops_attn = _attention(model, plan, dev) if symbol in ("", "*") else (0.0, 0.0, 0.0)
    launch_memory, launch_attn = _launch_s(model, plan, dev, symbol=symbol)
    memory = 2.0 * _kept_bytes(model, plan, symbol) / dev.stream_Bps + launch_memory
    q = quantize_s(model, plan, dev, rec, symbol=symbol)
    return LayerTimes(gemm, attn + launch_attn, memory, flops + flops_attn, attn_bwd + 2 * launch_attn, gemm_bwd, *q,
                      attention_flops=flops_attn)


def _moe_layer(model: ModelSpec, plan: ParallelPlan, dev: Device, rec: Recipe, symbol: str = "") -> LayerTimes:
    """``_layer`` of a MoE layer: attention as a dense layer's, its MLP as ``moe_gemms`` (the routed
    experts as grouped GEMMs of the busiest rank's rows, ``_expert_times``; FLOPs counted balanced; the
    router in the compute dtype), memory-bound work over its activations (the experts' at the busiest
    rank's load, ``routing.loaded``), the router's scores and the permutation of its dispatched rows; a
    hybrid model's MoE layer (``E``) its MLP alone."""
    attention = [] if symbol else [(m, n, k, 1) for m, n, k in attention_gemms(model, plan)]
    router, *dense = moe_gemms(model, plan)[:-2]
    block, block_bwd = _gemm_times(attention, plan, dev, rec)
    gemm, gemm_bwd = _gemm_times(dense, plan, dev, rec)
    gemm, gemm_bwd = gemm + block, gemm_bwd + block_bwd
    routed, routed_bwd = _expert_times(model, plan, dev, rec)
    gemm += dev.gemm_time_s(*router[:3], plan.compute_dtype) + routed
    gemm_bwd += 2 * dev.gemm_time_s(*router[:3], plan.compute_dtype) + routed_bwd
    flops = sum(2.0 * m * n * k for m, n, k, _ in attention)
    flops += sum(times * 2.0 * m * n * k for m, n, k, times in moe_gemms(model, plan))
    attn, attn_bwd, flops_attn = (0.0, 0.0, 0.0) if symbol else _attention(model, plan, dev)
    launch_memory, launch_attn = _launch_s(model, plan, dev, moe=True, symbol=symbol)
    kept = _kept_bytes(model, plan, symbol, moe=True)
    memory = (2.0 * kept + permute_bytes(model, plan) + router_bytes(model, plan)) / dev.stream_Bps + launch_memory
    q = quantize_s(model, plan, dev, rec, moe=True, symbol=symbol)
    return LayerTimes(gemm, attn + launch_attn, memory, flops + flops_attn, attn_bwd + 2 * launch_attn, gemm_bwd, *q,
                      attention_flops=flops_attn, moe=1.0, attention_block_fwd=block + attn + launch_attn,
                      attention_block_bwd=block_bwd + attn_bwd + 2 * launch_attn, attention_block_gemm=block,
                      attention_block_flops=sum(2.0 * m * n * k for m, n, k, _ in attention) + flops_attn)


def _mamba_layer(model: ModelSpec, plan: ParallelPlan, dev: Device, rec: Recipe) -> LayerTimes:
    """A hybrid model's Mamba-2 layer (``M``, perfmodel.step.mamba): its projections as GEMMs in ``rec``'s dtypes,
    its SSD scan (``mamba.ssd_s``, with its kernels' fixed time), the memory-bound work over what it keeps and its
    quantization."""
    mamba.check_tp(model, plan.tp)
    shapes = [(m, n, k, 1) for m, n, k in mamba.gemms(model, plan)]
    gemm, gemm_bwd = _gemm_times(shapes, plan, dev, rec)
    scan, scan_bwd, scan_flops = mamba.ssd_s(model, plan, dev)
    launch_memory, launch_scan = _launch_s(model, plan, dev, symbol="M")
    memory = 2.0 * _kept_bytes(model, plan, "M") / dev.stream_Bps + launch_memory
    flops = sum(2.0 * m * n * k for m, n, k, _ in shapes) + scan_flops
    q = quantize_s(model, plan, dev, rec, symbol="M")
    return LayerTimes(gemm, 0.0, memory, flops, 0.0, gemm_bwd, *q, scan_fwd=scan + launch_scan,
                      scan_bwd=scan_bwd + 2 * launch_scan)


def _hybrid_layer(model: ModelSpec, plan: ParallelPlan, dev: Device, rec: Recipe, symbol: str) -> LayerTimes:
    """A hybrid model's layer of ``symbol``: ``_mamba_layer``, ``_moe_layer``'s MLP or ``_layer``'s mixer."""
    if symbol == "M":
        return _mamba_layer(model, plan, dev, rec)
    return (_moe_layer if symbol == "E" else _layer)(model, plan, dev, rec, symbol)


def _gemm_times(shapes: list, plan: ParallelPlan, dev: Device, rec: Recipe) -> tuple[float, float]:
    """(forward, backward) seconds of (m, n, k, times) GEMMs: backward is the dgrad and the wgrad,
    each of the forward's volume (two forwards in the compute dtype), each in the dtype the
    recipe runs it in."""
    dt = plan.compute_dtype
    if not rec.is_low:
        fwd = sum(times * dev.gemm_time_s(m, n, k, dt) for m, n, k, times in shapes)
        return fwd, 2 * fwd
    fwd = sum(times * dev.gemm_time_s(m, n, k, rec.gemm_dtype("fprop", dt)) for m, n, k, times in shapes)
    bwd = sum(times * (dev.gemm_time_s(m, n, k, rec.gemm_dtype("dgrad", dt))
                       + dev.gemm_time_s(m, n, k, rec.gemm_dtype("wgrad", dt))) for m, n, k, times in shapes)
    return fwd, bwd


def quantized_elements(model: ModelSpec, plan: ParallelPlan, moe: bool = False,
                       symbol: str = "") -> dict[str, list[float]]:
    """Elements of each quantized tensor of one layer per microbatch on one GPU, by operand:
    ``activation`` (each GEMM's input), ``gradient`` (its output gradient), ``weight`` (its weight,
    quantized once per step). A MoE layer's router stays in the compute dtype; its routed experts'
    inputs are the rows of the busiest rank's experts (``routing.rank_load``), each grouped GEMM's input
    and output gradient quantized as one tensor (Transformer Engine's GroupedLinear quantizes them in one
    ``split_quantize``), its weights one per expert. A hybrid model's layer of ``symbol``: its GEMMs
    (``hybrid_gemms``), an E layer's routed experts as a MoE layer's."""
    sp = plan.tp if plan.sequence_parallel else 1
    gemms, kinds = hybrid_gemms(model, plan, symbol) if symbol else (layer_gemms(model, plan), layer_kinds(model))
    routed = moe_gemms(model, plan, routing.rank_load(model, plan))[-2:] if moe else []
    if moe and not symbol:
        attention = len(attention_kinds(model))
        gemms = gemms[:attention] + hybrid_gemms(model, plan, "E")[0]
        kinds = kinds[:attention] + moe_dense_kinds(model)
    out = {"activation": [m * k / (sp if kind == COLUMN else 1) for (m, n, k), kind in zip(gemms, kinds, strict=True)],
           "gradient": [m * n / (sp if kind == ROW else 1) for (m, n, k), kind in zip(gemms, kinds)],
           "weight": [n * k for m, n, k in gemms]}
    for m, n, k, times in routed:
        out["activation"].append(times * m * k)
        out["gradient"].append(times * m * n)
        out["weight"] += [n * k] * times
    return out


def quantize_s(model: ModelSpec, plan: ParallelPlan, dev: Device, rec: Recipe,
               moe: bool = False, symbol: str = "") -> tuple[float, float, float]:
    """(forward, backward, per-step weight) seconds of one layer's quantization in ``rec``: each
    tensor's elements times the recipe's bytes per element over the streaming bandwidth times its
    quantize efficiency, ``kernel_fixed_s`` per kernel, and the sequence-parallel amax all-reduces
    over tp (``amax_reductions``); all 0 in a high precision."""
    if not rec.is_low:
        return 0.0, 0.0, 0.0
    rate = dev.stream_Bps * rec.quantize_efficiency
    fixed = kernel_fixed_s(dev)
    elements = quantized_elements(model, plan, moe, symbol)
    amax = amax_reductions(plan, rec, moe, symbol) * small_allreduce_s(plan.tp, "nvlink")

    def part(operand: str) -> float:
        tensors = elements[operand]
        return (sum(tensors) * rec.quantize_bytes(operand, dev.arch) / rate
                + len(tensors) * rec.quantize_kernels(operand) * fixed)
    return part("activation") + amax, part("gradient") + amax, part("weight")


def amax_reductions(plan: ParallelPlan, rec: Recipe, moe: bool = False, symbol: str = "") -> int:
    """Amax all-reduces over tp in one layer's forward (the same in its backward): its
    column-parallel inputs with sequence parallelism, where the recipe scales per tensor from the
    current amax (current scaling, NVFP4's global scale): QKV and MLP up; a MoE layer's QKV; a hybrid
    model's layer its one mixer's (in_proj, QKV or MLP up), none in an E layer."""
    if rec.amax_reduction != "sequence-parallel" or not plan.sequence_parallel or plan.tp == 1:
        return 0
    if symbol:
        return int(symbol != "E")
    return 1 if moe else 2


def quantize_kernels(model: ModelSpec, plan: ParallelPlan, moe: bool = False,
                     symbol: str = "") -> tuple[float, float, float]:
    """(forward, backward, a recompute's) kernels one low-precision layer adds per microbatch: a
    quantize (and its amax pass, Hadamard transform) per input, per output gradient and, once a
    step, per weight; and its amax all-reduces."""
    rec = recipe(plan.precision)
    if not rec.is_low:
        return 0.0, 0.0, 0.0
    n = {op: len(v) for op, v in quantized_elements(model, plan, moe, symbol).items()}
    amax = amax_reductions(plan, rec, moe, symbol)
    inputs = n["activation"] * rec.quantize_kernels("activation") + amax
    weights = n["weight"] * rec.quantize_kernels("weight") / plan.microbatches
    return inputs + weights, n["gradient"] * rec.quantize_kernels("gradient") + amax, inputs


def small_allreduce_s(ranks: int, tier_class: str) -> float:
    """Seconds of an all-reduce of a few bytes (amaxes) over ``ranks``: NCCL's LL protocol on
    ``tier_class`` (catalog/protocols.toml), its base latency and a tree's 2 ceil(log2 ranks) steps."""
    if ranks <= 1:
        return 0.0
    ll = protocol_table()[tier_class]["LL"]
    return ll.base_s + 2 * math.ceil(math.log2(ranks)) * ll.step_s


def _low_layers(rec: Recipe, layers: int, first: bool, last: bool, moe_layers: int) -> tuple[int, int]:
    """(dense, MoE) layers of a stage that run the low precision: none in a high one; the recipe's
    bf16 layers taken from the dense ones first (the ends of MoE models are dense)."""
    if not rec.is_low:
        return 0, 0
    high = rec.high_layers(layers, first, last)
    dense = layers - moe_layers
    return max(0, dense - high), moe_layers - max(0, high - dense)


def _layer_groups(model: ModelSpec, plan: ParallelPlan, dev: Device, layers: int, first: bool, last: bool,
                  moe_layers: int) -> list[tuple[int, LayerTimes]]:
    """(count, LayerTimes) of a stage's kinds of layer: dense and MoE, each in the plan's precision
    and, where the recipe keeps some in bf16 (all of them in a high precision), in the compute dtype;
    only the kinds the stage has are timed."""
    rec, high = recipe(plan.precision), recipe(plan.compute_dtype)
    out = []
    for low, rest, moe, symbol in _stage_kinds(model, plan, layers, first, last, moe_layers):
        for n, r in ((low, rec), (rest, high)):
            if n:
                times = _hybrid_layer(model, plan, dev, r, symbol) if symbol else \
                    (_moe_layer if moe else _layer)(model, plan, dev, r)
                out.append((n, times))
    return out


def _chunk_amax_s(plan: ParallelPlan, rec: Recipe, low: int) -> float:
    """Delayed scaling's amax-history all-reduce over dp x tp x cp, once per model chunk's forward
    (and once per its backward) in a microbatch, on a stage with ``low`` low-precision layers."""
    if rec.amax_reduction != "autocast" or low == 0:
        return 0.0
    ranks = plan.dp * plan.tp * plan.cp
    return plan.virtual_stages * small_allreduce_s(ranks, "net" if plan.dp * plan.cp > 1 else "nvlink")


def _ends(model: ModelSpec, plan: ParallelPlan, dev: Device, first: bool, last: bool) -> tuple[float, float]:
    """(fwd s, FLOPs) of the embedding (first stage) and LM head + loss (last stage), and on the last
    stage the multi-token-prediction modules (``_mtp``): the stage's backward takes twice them all."""
    fwd = flops = 0.0
    if first:
        fwd += _embedding_s(model, plan, dev)
    if last:
        head_s, head_flops = _head(model, plan, dev)
        mtp_s, mtp_flops = _mtp(model, plan, dev)
        fwd, flops = fwd + head_s + mtp_s, flops + head_flops + mtp_flops
    return fwd, flops


def _embedding_s(model: ModelSpec, plan: ParallelPlan, dev: Device) -> float:
    """Seconds of one microbatch's token embedding: its rows read and written, and its kernels."""
    T, dt = plan.local_seq * plan.mbs, plan.compute_dtype
    return 2.0 * T * model.hidden_size * DTYPE_BYTES[dt] / dev.stream_Bps + EMBEDDING_KERNELS * kernel_fixed_s(dev)


def _head(model: ModelSpec, plan: ParallelPlan, dev: Device) -> tuple[float, float]:
    """(fwd s, FLOPs) of one microbatch's LM head GEMM and its loss over fp32 logits."""
    T, h, V = plan.local_seq * plan.mbs, model.hidden_size, model.vocab_size / plan.tp
    fwd = dev.gemm_time_s(T, V, h, plan.compute_dtype) + 3.0 * T * V * 4 / dev.stream_Bps \
        + LOSS_KERNELS * kernel_fixed_s(dev)
    return fwd, 2.0 * T * V * h


# A multi-token-prediction module's memory-bound passes over a token's hidden state beside its layer, its
# projection and its LM head (Megatron-Core's MultiTokenPredictionLayer._concat_embeddings and _postprocess):
# the next tokens' embedding (``_embedding_s``), then the enorm, hnorm and final_layernorm (a read and a write
# of h each) and the concatenation of the two normed halves (2h read and written): 5 passes of h, in 4 kernels.
MTP_PASSES, MTP_KERNELS = 5, 4


def _mtp_layer(model: ModelSpec, plan: ParallelPlan, dev: Device) -> LayerTimes:
    """The times of a multi-token-prediction module's layer: of the kind of the model's last layer,
    in the plan's precision."""
    layer = _moe_layer if model.mtp_moe_layers else _layer
    return layer(model, plan, dev, recipe(plan.precision))


def _mtp(model: ModelSpec, plan: ParallelPlan, dev: Device) -> tuple[float, float]:
    """(fwd s, FLOPs) of one microbatch's multi-token-prediction modules (none: 0): each the next tokens'
    embedding, its norms, the column-parallel 2h x h projection, a layer (``_mtp_layer``: its forward with
    its quantization, the weights' once a step) and one more pass of the LM head and loss."""
    if not model.mtp_layers:
        return 0.0, 0.0
    T, h, dt = plan.local_seq * plan.mbs, model.hidden_size, plan.compute_dtype
    x = _mtp_layer(model, plan, dev)
    head_s, head_flops = _head(model, plan, dev)
    proj = dev.gemm_time_s(T, h / plan.tp, 2 * h, dt)
    memory = MTP_PASSES * 2.0 * T * h * DTYPE_BYTES[dt] / dev.stream_Bps + MTP_KERNELS * kernel_fixed_s(dev)
    layer = x.gemm_fwd + x.attention_fwd + x.memory_fwd + x.quantize_fwd + x.quantize_weights / plan.microbatches
    fwd = _embedding_s(model, plan, dev) + memory + proj + layer + head_s
    return model.mtp_layers * fwd, model.mtp_layers * (x.flops + 2.0 * T * h / plan.tp * 2 * h + head_flops)


def stage_compute(model: ModelSpec, plan: ParallelPlan, dev: Device, layers: int, first: bool,
                  last: bool, moe_layers: int = 0) -> StageCompute:
    """One microbatch on a stage of ``layers`` layers, ``moe_layers`` of them MoE layers."""
    groups = _layer_groups(model, plan, dev, layers, first, last, moe_layers)

    def total(fn) -> float:
        """Sum of ``fn(layer)`` over the stage's layers (dense and MoE, low and high precision)."""
        return sum(n * fn(x) for n, x in groups)
    rec = recipe(plan.precision)
    end_fwd, end_flops = _ends(model, plan, dev, first, last)
    amax = _chunk_amax_s(plan, rec, sum(low for low, *_ in _stage_kinds(model, plan, layers, first, last, moe_layers)))
    weights = total(lambda x: x.quantize_weights) / plan.microbatches     # cached across microbatches
    forward = total(lambda x: x.gemm_fwd + x.attention_fwd + x.scan_fwd + x.memory_fwd + x.quantize_fwd)
    fwd = forward + end_fwd + weights + amax
    attention_again = reruns_attention(plan)                             # attention's forward again
    modules = _modules_rerun(model, plan, dev, layers, moe_layers, groups)   # selective's named modules
    recompute = {"none": lambda: 0.0, "selective": lambda: attention_again * total(lambda x: x.attention_fwd)
                 + modules.seconds, "full": lambda: forward}[plan.recompute]()
    bwd = total(lambda x: x.gemm_bwd + x.attention_bwd + x.scan_bwd + 2 * x.memory_fwd + x.quantize_bwd) \
        + 2 * end_fwd + recompute + amax
    extra = {"none": lambda x: 0.0, "selective": lambda x: x.attention_flops * attention_again,
             "full": lambda x: x.flops}[plan.recompute]
    hw_flops = 3 * (total(lambda x: x.flops) + end_flops) + total(extra) + modules.flops
    head = _head_gemm_s(model, plan, dev) if last else 0.0
    full = plan.recompute == "full"                                      # the GEMMs' forward again
    gemm_s = total(lambda x: x.gemm_fwd * (1 + full) + x.gemm_bwd) + 3 * head + modules.gemm_s
    attention_s = total(lambda x: x.attention_fwd * (2 if attention_again else 1) + x.attention_bwd
                        + x.scan_fwd * (1 + full) + x.scan_bwd)
    host_fwd, host_bwd = host_times_s(model, plan, dev, layers, first, last, moe_layers)
    return StageCompute(fwd_s=fwd, bwd_s=bwd, recompute_s=recompute, hardware_flops=hw_flops, gemm_s=gemm_s,
                        attention_s=attention_s, memory_bound_s=fwd + bwd - gemm_s - attention_s,
                        attention_fwd_s=total(lambda x: x.attention_fwd),
                        attention_bwd_s=total(lambda x: x.attention_bwd), host_fwd_s=host_fwd, host_bwd_s=host_bwd,
                        moe_split=_moe_split(groups))


def _moe_split(groups: list) -> tuple:
    """(count, attention fwd, MLP fwd, attention bwd, MLP bwd, MLP GEMM fwd, MLP FLOPs) of a stage's MoE layers
    per microbatch (seconds; ``StageCompute.moe_split``: the compute each segment of Megatron-Core's expert
    overlap hides behind, and what a ``moe`` recompute reruns); () without MoE layers."""
    moe = [(n, x) for n, x in groups if x.moe]
    if not moe:
        return ()
    fwd = sum(n * (x.gemm_fwd + x.attention_fwd + x.scan_fwd + x.memory_fwd + x.quantize_fwd) for n, x in moe)
    bwd = sum(n * (x.gemm_bwd + x.attention_bwd + x.scan_bwd + 2 * x.memory_fwd + x.quantize_bwd) for n, x in moe)
    att_fwd, att_bwd = (sum(n * getattr(x, f) for n, x in moe) for f in ("attention_block_fwd", "attention_block_bwd"))
    gemm = sum(n * (x.gemm_fwd - x.attention_block_gemm) for n, x in moe)
    flops = sum(n * (x.flops - x.attention_block_flops) for n, x in moe)
    return sum(n for n, _ in moe), att_fwd, fwd - att_fwd, att_bwd, bwd - att_bwd, gemm, flops


def _modules_rerun(model: ModelSpec, plan: ParallelPlan, dev: Device, layers: int, moe_layers: int,
                   groups: list) -> Rerun:
    """What a stage's selective recompute of named modules reruns per microbatch (``perfmodel.step.
    recompute``; MoE layers at the busiest expert-parallel rank's rows, ``routing.loaded``; ``moe``: the MoE
    layers' MLPs from their own times, ``_moe_split``)."""
    dense = rerun(model, plan, dev, False)
    moe = rerun(routing.loaded(model, plan), plan, dev, True) if moe_layers else Rerun()
    n = layers - moe_layers
    out = Rerun(*(n * a + moe_layers * b for a, b in zip(dense, moe)))
    split = _moe_split(groups) if plan.recompute == "selective" and "moe" in plan.recompute_modules else ()
    if split:
        out = Rerun(out.seconds + split[2], out.gemm_s + split[5], out.flops + split[6],
                    out.kernels + split[0] * _moe_mlp_kernels(model, plan))
    return out


def _moe_mlp_kernels(model: ModelSpec, plan: ParallelPlan) -> int:
    """Forward kernels of a MoE layer but its attention block's (what a ``moe`` recompute issues again)."""
    k = layer_kernels(model, plan, True)     # less attention's GEMMs and its half of the memory-bound kernels
    return k["gemm"] - len(attention_gemms(model, plan)) + k["memory"] - MEMORY_KERNELS // 2


def _head_gemm_s(model: ModelSpec, plan: ParallelPlan, dev: Device) -> float:
    """Forward GEMM seconds of the last stage's ends: the LM head, and per multi-token-prediction module
    its projection, its layer's GEMMs and one more LM head."""
    T, h, dt = plan.local_seq * plan.mbs, model.hidden_size, plan.compute_dtype
    head = dev.gemm_time_s(T, model.vocab_size / plan.tp, h, dt)
    if not model.mtp_layers:
        return head
    mtp = head + dev.gemm_time_s(T, h / plan.tp, 2 * h, dt) + _mtp_layer(model, plan, dev).gemm_fwd
    return head + model.mtp_layers * mtp


def optimizer_time_s(params_per_gpu: float, dev: Device) -> float:
    """Adam with fp32 master weights, memory-bound: reads master, grad, m, v (16 B), writes
    master, m, v and the bf16 copy (14 B) per parameter."""
    return 30.0 * params_per_gpu / dev.stream_Bps
