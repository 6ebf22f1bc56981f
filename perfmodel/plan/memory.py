"""Memory per GPU: weights, gradients, optimizer states (ZeRO), activations, reserve.

Mixed-precision Adam (Rajbhandari et al., SC20, section 3): compute-dtype weights, gradients
in ``grad_dtype``, and 12 bytes of optimizer state per parameter (fp32 master, momentum,
variance). ZeRO-1 shards the optimizer states over DP, ZeRO-2 the gradients too, ZeRO-3 the
weights too. Activations per layer from Korthikanti et al. 2023 (``workload``) times the
microbatches a stage holds: 1F1B holds min(pp - stage, m) (stage 0 the most), GPipe all m,
interleaving (1 + (pp - 1) / (pp V)) times 1F1B's (Narayanan et al. 2021). The last stage adds
fp32 logits for the loss. ``RESERVE_BYTES`` covers the CUDA context, NCCL buffers and allocator
fragmentation: an assumption of 2 GiB.

Mixture of experts: a GPU holds its 1/ep share of every MoE layer's routed experts, each split
over etp (expert tensor parallelism, tp by default as Megatron-Core's), and all of the rest split
over tp; ZeRO (every stage, ZeRO-3 as torchtitan's FSDP2 with expert parallelism) shards the expert
part over its expert-data-parallel group (edp = tp x cp x dp / (etp x ep) ranks: Megatron-Core's
MoE parallel folding), the dense part over dp x cp. Context parallelism divides the activations
(seq / cp tokens a GPU).

Precision (``perfmodel.plan.precision``): a low-precision recipe keeps its layers' weights
quantized (Transformer Engine caches them across microbatches): per parameter its copies (two
where the GEMMs need a transposed or column-wise one, ``Recipe.copies_on``) at its bytes per
element with scales (``low_precision_weights``); with an fp8 parameter gather (Megatron's
``--fp8-param-gather``, ``fp8_params``) those copies are the parameters and the compute-dtype
weights of the low layers go. A Linear saves its input for the wgrad quantized (one copy), not
in bf16, so the layers' GEMM inputs (Korthikanti's QKV and MLP-up inputs, 2 sbh each, and the
MLP-down input, 8 sbh, TP-split) shrink to the recipe's bytes; the attention output, which flash
attention keeps in bf16 for its own backward, is saved a second time, quantized
(``low_precision_activation_delta``). Master weights, gradients and optimizer states do not change.

ZeRO-3 (``zero3_gathered``): beyond its shards a GPU holds the parameters it has gathered for the unit
computing and for the one prefetched behind it, and the unit's unsharded gradients until their
reduce-scatter. PyTorch FSDP's rate limiter holds "only two consecutive FSDP instances (the current
instance running computation and the next instance whose all-gather is prefetched)"
(torch/distributed/fsdp/fully_sharded_data_parallel.py, ``limit_all_gathers``, default True; FSDP2 and
Megatron-FSDP prefetch one unit likewise); DeepSpeed prefetches ``stage3_prefetch_bucket_size`` parameters
(5e7; the stack's ``zero3_prefetch_params``, ``perfmodel.plan.framework``). A unit is a transformer layer
or the stage's embedding or head, whichever is largest (DeepSpeed's units are submodules: the layer is
an upper bound). Parameters below DeepSpeed's ``stage3_param_persistence_threshold`` (1e5: norms,
biases) stay gathered: a layer's norms are well under 0.1% of it, not charged.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from perfmodel.axes import AXES
from perfmodel.dtypes import DTYPE_BYTES
from perfmodel.plan.framework import framework_profile
from perfmodel.plan.parallel import ParallelPlan
from perfmodel.plan.precision import recipe
from perfmodel.plan.recompute import NORMS, dropped_bytes
from perfmodel.plan.routing import loaded
from perfmodel.step import mamba
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
    if not model.is_moe and not model.mtp_layers and not model.is_hybrid:
        return _dense_stage_params(model, plan, layers, first, last), 0.0
    dense, routed = model.stage_layer_params(start, layers)     # the MTP modules with the layers that end the model
    ends = _dense_stage_params(model, plan, 0, first, last)
    return dense / shards(plan, "params") + ends, routed / shards(plan, "expert_params")


def _dense_stage_params(model: ModelSpec, plan: ParallelPlan, layers: int, first: bool, last: bool) -> float:
    params = layers * model.layer_params()
    if first:
        params += model.embedding_params()
    if last:
        params += model.head_params() + model.hidden_size * (2 if model.biased else 1)
        # a copy of the embedding: tied to the head, or for the MTP modules' next-token embedding (Megatron-Core's
        # GPTModel builds it where pre_process or mtp_process: megatron/core/models/gpt/gpt_model.py)
        if (model.tied_embeddings or model.mtp_layers) and not first:
            params += model.embedding_params()
    return params / shards(plan, "params")


# DualPipe keeps two copies of the model parameters (DeepSeek-V3 report, arXiv 2412.19437, section 3.2.1 and
# Table 2, 'Parameter 2x'): the weights (and their quantized copies) twice; gradients and optimizer states once
DUALPIPE_COPIES = 2


def in_flight(plan: ParallelPlan, stage: int) -> float:
    m = plan.microbatches
    if plan.schedule == "gpipe":
        return m
    if plan.ep_overlap == "dualpipe":   # DeepSeek-V3 report Table 2: PP + 1 micro-batches' activations
        return min(plan.pp + 1, m)
    held = min(plan.pp - stage, m)
    if plan.schedule == "interleaved":
        held *= 1 + (plan.pp - 1) / (plan.pp * plan.virtual_stages)
    return held


def memory_per_gpu(model: ModelSpec, plan: ParallelPlan, stage: int, layers: int, hpz_ranks: int = 1,
                   arch: str = "", fp8_params: bool = False, feedback: float = 0.0) -> dict:
    """Bytes per GPU of pipeline ``stage`` by kind, and their ``total``. With hpZ, the secondary
    copy of the weights is partitioned over ``hpz_ranks`` (the dp group's ranks in a node). ``arch``:
    the GPU's architecture (whether per-tensor FP8 keeps a transposed weight copy); ``fp8_params``:
    an fp8 parameter gather (module doc); ``feedback``: a compression recipe's state in bytes per
    parameter the GPU holds (``Recipe.state_bytes``: its error-feedback buffers, 0/1 Adam's
    accumulator), charged as ``error_feedback``."""
    first, last = stage == 0, stage == plan.pp - 1
    start = plan.stage_first_layer(stage, model.num_layers)
    dense, experts = stage_param_split(model, plan, layers, first, last, start)
    params = dense + experts

    def sharded(kind: str, per_param: float) -> float:
        if not experts:
            return params * per_param / shards(plan, kind)
        return per_param * (dense / shards(plan, kind) + experts / expert_shards(plan, kind))
    low = low_precision_params(model, plan, layers, first, last, start)
    quantized = low_precision_weights(plan, low, arch)
    copies = DUALPIPE_COPIES if plan.ep_overlap == "dualpipe" else 1
    out = {
        "weights": copies * (sharded("weights", DTYPE_BYTES[plan.compute_dtype])
                             - (fp8_params and recipe(plan.precision).eight_bit) * low * DTYPE_BYTES[plan.compute_dtype]
                             / shards(plan, "weights")),
        "low_precision_weights": copies * quantized,
        "hpz_secondary": params * DTYPE_BYTES[plan.compute_dtype] / hpz_ranks if plan.hpz else 0.0,
        "zero3_gathered": zero3_gathered(model, plan, layers, first, last, params, fp8_params),
        "error_feedback": params * feedback,
        "gradients": sharded("gradients", DTYPE_BYTES[plan.grad_dtype]),
        "optimizer": sharded("optimizer", OPTIMIZER_BYTES),
        "activations": _activations(model, plan, layers, start, in_flight(plan, stage))
        + (in_flight(plan, stage) * _mtp_activations(model, plan) if last else 0.0),
        # fp32 logits of the loss, and of each MTP module's loss
        "logits": plan.mbs * plan.local_seq * model.vocab_size * 4 / plan.tp * (1 + model.mtp_layers) if last else 0.0,
        "reserve": float(RESERVE_BYTES),
    }
    out["total"] = sum(out.values())
    return out


def zero3_gathered(model: ModelSpec, plan: ParallelPlan, layers: int, first: bool, last: bool,
                   params: float, fp8_params: bool = False) -> float:
    """Bytes ZeRO-3 holds beyond its shards on a GPU of a stage of ``layers`` layers holding ``params``
    parameters before sharding (module doc): the unit computing and the one prefetched (a whole unit, or
    the stack's ``zero3_prefetch_params`` where it prefetches by count) in the compute dtype, and the
    unit's gradients in the gradient dtype; with an fp8 parameter gather (``fp8_params``) into an 8-bit
    recipe a layer arrives at the recipe's weight bytes. 0 below ZeRO-3 or where nothing is sharded."""
    if plan.zero != 3 or shards(plan, "weights") == 1 or not layers:
        return 0.0
    ends = _dense_stage_params(model, plan, 0, first, last)    # the embedding and the head: a unit each
    rec, wide = recipe(plan.precision), DTYPE_BYTES[plan.compute_dtype]
    layer = ((params - ends) / layers, rec.stored_bytes("weight") if fp8_params and rec.eight_bit else wide)
    unit, width = max(layer, (ends / max(1, first + last), wide), key=lambda u: u[0] * u[1])
    ahead = framework_profile(plan.framework).zero3_prefetch_params
    prefetch = min(ahead, unit) if ahead else unit
    return (unit + prefetch) * width + unit * DTYPE_BYTES[plan.grad_dtype]


def _mtp_activations(model: ModelSpec, plan: ParallelPlan) -> float:
    """What the multi-token-prediction modules keep for backward per microbatch (the last stage's)."""
    return model.mtp_activation_bytes(plan.mbs, plan.local_seq, plan.tp, plan.sequence_parallel, plan.recompute)


def expert_shards(plan: ParallelPlan, kind: str) -> int:
    """ZeRO's sharding of the routed experts' ``kind`` (weights, gradients, optimizer): over their
    expert-data-parallel group (``perfmodel.axes``' ``expert_`` kinds)."""
    return shards(plan, "expert_" + kind)


def _activations(model: ModelSpec, plan: ParallelPlan, layers: int, start: int, held: float) -> float:
    """Bytes the ``held`` microbatches of a stage's layers keep for backward (MoE layers their own,
    at the busiest expert-parallel rank's rows under the plan's routing: ``perfmodel.plan.routing.
    loaded``; a low precision's layers ``low_precision_activation_delta`` more, a negative number)."""
    if model.is_moe:
        model = loaded(model, plan)
    if model.is_hybrid:
        return held * _hybrid_activations(model, plan, layers, start)
    selective = plan.recompute == "selective"     # kept as without recompute, less what the modules drop
    args = (plan.mbs, plan.local_seq, plan.tp, plan.sequence_parallel, "none" if selective else plan.recompute)
    moe = model.moe_layers_in(start, layers) if model.is_moe else 0
    rec = recipe(plan.precision)
    stored = rec.stored_bytes("activation") if rec.is_low else 2.0
    kept = (layers - moe) * (model.activation_bytes_per_layer(*args)
                             - selective * dropped_bytes(model, plan, False, stored))
    if moe:
        kept += moe * (model.moe_activation_bytes_per_layer(*args) - selective * dropped_bytes(model, plan, True, stored))
    if rec.is_low:
        first, last = start == 0, start + layers >= model.num_layers
        low = layers - rec.high_layers(layers, first, last)
        delta = (layers - moe) * low_precision_activation_delta(model, plan)
        if moe:
            delta += moe * low_precision_activation_delta(model, plan, True)
        kept += low * delta / layers
    return held * kept


def _hybrid_activations(model: ModelSpec, plan: ParallelPlan, layers: int, start: int) -> float:
    """Bytes one microbatch of a hybrid model's stage keeps for backward: each of its layers its symbol's
    (``ModelSpec.hybrid_activation_bytes``; under selective recompute less what the named modules drop from it,
    ``_hybrid_dropped``), a low precision's layers ``low_precision_activation_delta`` more."""
    selective = plan.recompute == "selective"
    args = (plan.mbs, plan.local_seq, plan.tp, plan.sequence_parallel, "none" if selective else plan.recompute)
    kinds = {k: n for k, n in model.kinds_in(start, layers).items() if n}
    rec = recipe(plan.precision)
    stored = rec.stored_bytes("activation") if rec.is_low else 2.0
    kept = sum(n * (model.hybrid_activation_bytes(k, *args) - selective * _hybrid_dropped(model, plan, k, stored))
               for k, n in kinds.items())
    if rec.is_low and layers:
        first, last = start == 0, start + layers >= model.num_layers
        low = (layers - rec.high_layers(layers, first, last)) / layers
        kept += low * sum(n * low_precision_activation_delta(model, plan, k == "E", k) for k, n in kinds.items())
    return kept


def _hybrid_dropped(model: ModelSpec, plan: ParallelPlan, symbol: str, stored: float) -> float:
    """Bytes a hybrid model's layer of ``symbol`` no longer keeps under the plan's named modules, each as
    ``perfmodel.plan.recompute.dropped_bytes`` counts it, on a layer of one mixer and one norm: ``core_attn`` an
    attention layer's softmax statistics, ``layernorm`` its norm's input (one of a transformer layer's ``NORMS``),
    ``moe_act`` a MoE layer's experts' activation inputs, ``mlp`` an MLP layer's."""
    mods, moe = plan.recompute_modules, symbol == "E"

    def one(module: str) -> float:
        return dropped_bytes(model, replace(plan, recompute_modules=(module,)), moe, stored)
    args = (plan.mbs, plan.local_seq, plan.tp, plan.sequence_parallel)
    out = one("layernorm") / NORMS if "layernorm" in mods else 0.0
    if "core_attn" in mods and symbol == "*":
        attention = model.hybrid_activation_bytes
        out += attention("*", *args, "none") - attention("*", *args, "selective")
    if ("moe_act" in mods and moe) or ("mlp" in mods and symbol == "-"):
        out += one("moe_act" if moe else "mlp")
    return out


def low_precision_activation_delta(model: ModelSpec, plan: ParallelPlan, moe: bool = False, symbol: str = "") -> float:
    """Bytes one low-precision layer keeps for backward beyond a bf16 one's (module doc): its GEMM
    inputs at the recipe's bytes per element instead of 2 (Korthikanti's counts: QKV and MLP-up
    inputs 2 sbh each, sequence-split with sequence parallelism, MLP-down input 8 sbh TP-split; a
    MoE layer's QKV input and its dispatched copies' expert inputs), and the attention output
    saved once more, quantized. Nothing with full recompute (only the layer's input is kept). A hybrid
    model's layer of ``symbol`` its one mixer's: a Mamba layer's in_proj and out_proj inputs, attention's
    QKV input and its output, an MLP's, a MoE MLP's copies (a LatentMoE's routed copies latent-wide)."""
    if plan.recompute == "full":
        return 0.0
    rec = recipe(plan.precision)
    s, b, h, tp = plan.local_seq, plan.mbs, model.hidden_size, plan.tp
    sp = tp if plan.sequence_parallel else 1
    q = rec.stored_bytes("activation")
    saved = (1 - q / 2)                              # of each 2-byte element a GEMM input keeps
    if model.is_moe:
        copies = (model.moe_top_k * model.expert_width + model.moe_shared_experts * h) / h
        experts = 2.0 * copies / sp + model.expert_copies * model.expert_load * 2.0 * model.moe_ffn_hidden_size / h / tp
    resaved = q / tp                                 # the attention output, saved once more
    if symbol == "M":
        inputs, resaved = 2.0 / sp + 2.0 * mamba.inner(model) / h / tp, 0.0
    elif symbol == "*":
        inputs = 2.0 / sp
    elif symbol == "-":
        inputs, resaved = 2.0 / sp + 8.0 / tp, 0.0
    elif symbol == "E":
        inputs, resaved = experts, 0.0
    elif moe:
        inputs = 2.0 / sp + experts
    else:
        inputs = 4.0 / sp + 8.0 / tp
    return s * b * h * (resaved - inputs * saved)


def peak_memory(model: ModelSpec, plan: ParallelPlan, hpz_ranks: int = 1, arch: str = "",
                fp8_params: bool = False, feedback: float = 0.0) -> dict:
    """The stage with the largest total (the one that must fit)."""
    layers = plan.stage_layers(model.num_layers)
    per_stage = [memory_per_gpu(model, plan, s, n, hpz_ranks, arch, fp8_params, feedback)
                 for s, n in enumerate(layers)]
    return max(per_stage, key=lambda d: d["total"])


def low_precision_params(model: ModelSpec, plan: ParallelPlan, layers: int, first: bool, last: bool,
                         start: int = 0) -> float:
    """Parameters of a stage's transformer layers that run the plan's low precision, on one GPU
    (the embedding and LM head, and the layers the recipe keeps in bf16, do not; 0 in a high
    precision)."""
    rec = recipe(plan.precision)
    if not rec.is_low or layers == 0:
        return 0.0
    dense, experts = stage_param_split(model, plan, layers, first, last, start)
    body = dense - _dense_stage_params(model, plan, 0, first, last) + experts
    return body * (layers - rec.high_layers(layers, first, last)) / layers


def low_precision_weights(plan: ParallelPlan, low_params: float, arch: str) -> float:
    """Bytes of the quantized weight copies of ``low_params`` parameters (sharded as the weights)."""
    rec = recipe(plan.precision)
    return low_params * rec.copies_on(arch) * rec.stored_bytes("weight") / shards(plan, "weights")
