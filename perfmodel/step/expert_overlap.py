"""Overlapped expert communication: the MoE all-to-alls of one micro-batch hidden behind another's compute.

Three schedules (``ParallelPlan.ep_overlap``):

* ``none``: each MoE layer's dispatch and combine sit on the critical path of its own operation.
* ``batch``: Megatron-Core's batch-level overlap (``--overlap-moe-expert-parallel-comm`` with
  ``--delay-wgrad-compute``; Megatron-LM ``megatron/core/pipeline_parallel/combined_1f1b.py`` and
  ``megatron/core/models/gpt/fine_grained_callables.py``): in the steady 1F1B phase a stage runs the
  forward of one micro-batch and the backward of another as one combined operation, layer by layer,
  the all-to-alls of each on a communication stream while the other computes. Per such pair it hides
  ``min(ep_fwd + ep_bwd, compute_fwd + compute_bwd)`` (``hidden_per_pair``). The warm-up
  forwards and cool-down backwards have no partner: of a stage's ``n`` operations of each kind
  (``m`` micro-batches x ``V`` chunks) ``n - warm`` are paired (``warm``: the stage's warm-up
  forwards, where ``perfmodel.step.schedule.steady_parts`` starts its steady part), one fewer on the
  last stage, whose first steady forward is the very micro-batch and chunk of the backward after it
  (Megatron-Core pairs a forward with the previous backward). Megatron-Core runs it on pp 1
  (``combined_1f1b_schedule_for_no_pipelining``, ``pipeline_parallel/schedules.py``) or interleaved 1F1B
  (``transformer/transformer_config.py`` asserts virtual stages where pp > 1); the plan refuses the rest.
  Per layer the pair is three segments on two streams (``models/common/model_chunk_schedule_plan.py``:
  comm ``combine_bwd | dispatch_fwd, dispatch_bwd | combine_fwd`` against compute ``attention_fwd |
  mlp_bwd, mlp_bwd_dw, mlp_fwd | attention_bwd``), and each segment hides its own all-to-alls up to its
  own compute (``segment_hidden``: a combine longer than the attention beside it stays exposed however
  long the experts' GEMMs are), from the stage's MoE layers' split (``StageCompute.moe_split``: the
  attention block, GEMMs and scores, against the rest of the layer) and the all-to-alls' split between
  dispatch and combine (their seconds on the stage). Megatron-LM @ d98e8a64dd.
* ``dualpipe``: DeepSeek's DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, section 3.2.1):
  micro-batches fed from both ends of the pipeline, every forward chunk paired with a backward
  chunk (all of them: the pairing above with fraction 1, each pair hiding up to its totals,
  ``hidden_per_pair``: the report rearranges the chunk's components so that "both all-to-all and PP
  communication can be fully hidden"), the pipeline's bubble the report's Table 2
  ``(PP/2 - 1)(F&B + B - 3W)`` (``F&B`` a paired forward and backward, ``B`` a backward, ``W`` its
  weight-gradient part: half the backward's GEMM seconds, wgrad and dgrad GEMMs having the same
  FLOPs), and Table 2's memory: two copies of the parameters, ``PP + 1`` micro-batches of
  activations (``perfmodel.plan.memory``). Needs an even pp >= 2 and an even number of micro-batches
  (the report: "only requires that the pipeline stages and micro-batches be divisible by 2").

Hidden all-to-all seconds are not free: their kernels take streaming multiprocessors from the
compute they run beside (``ParallelPlan.ep_kernels``), a tax of ``SMs taken / SMs of the GPU`` of
the hidden seconds charged as ``overlap_slowdown``: DeepEP's normal kernels 24 SMs (the DeepEP
README's ``Buffer.set_num_sms(24)``, its H800 training/prefill setting), NVIDIA's HybridEP 32 SMs
(Megatron-Bridge sets ``moe_hybridep_num_sms = 32`` for every hybridep recipe:
``src/megatron/bridge/perf_recipes/_common.py`` line 88, ``perf_recipes/deepseek/common.py`` line 59
@ 067f987df0), DeepEP's low-latency kernels none (the README: a hook-based overlap "without
occupying any SM"); NCCL's all-to-all the engine's ``overlap_slowdown`` (the same assumption as the
DP buckets' NCCL kernels beside backward). The kernels' choice changes only this tax: the
all-to-all's own seconds are the collective model's.
"""
from __future__ import annotations

from dataclasses import replace

from perfmodel.step.schedule import steady_parts
# SMs each kernel family keeps while it runs (module doc for the sources); None: the engine's overlap_slowdown
KERNEL_SMS = {"nccl": None, "deepep": 24, "hybridep": 32, "deepep-ll": 0}
# SMs per GPU by catalog device (NVIDIA H100 whitepaper: 132 on H100/H200/H800 SXM5; Blackwell: 148 on B200
# and GB200's B200; Blackwell Ultra: 160 on B300 and GB300); other devices: their GEMM shape model's count
DEVICE_SMS = {"h100-sxm": 132, "h200-sxm": 132, "h800-sxm": 132, "b200": 148, "gb200": 148, "b300": 160,
              "gb300": 160}
DEFAULT_SMS = 132


def device_sms(dev) -> int:
    """Streaming multiprocessors of one GPU of ``dev`` (``DEVICE_SMS``, else its GEMM shape's count)."""
    if dev.key in DEVICE_SMS:
        return DEVICE_SMS[dev.key]
    shape = getattr(dev, "gemm_shape", None)
    return shape.sm_count if shape is not None else DEFAULT_SMS


def sm_tax(kernels: str, dev, overlap_slowdown: float) -> float:
    """The fraction by which compute beside a hidden all-to-all slows (module doc)."""
    sms = KERNEL_SMS[kernels]
    if sms is None:
        return overlap_slowdown
    return sms / device_sms(dev)


def paired_fraction(plan, stage: int) -> float:
    """Of ``stage``'s forward (and backward) operations, the fraction paired with one of the other
    kind (module doc): 0 without overlap or under GPipe, 1 under DualPipe."""
    if plan.ep_overlap == "none" or plan.schedule == "gpipe":
        return 0.0
    if plan.ep_overlap == "dualpipe":
        return 1.0
    n = plan.microbatches * plan.virtual_stages
    warm = steady_parts(plan.schedule, stage, plan.pp, plan.microbatches, plan.virtual_stages)[0][0]
    last = stage == plan.pp - 1         # its first steady forward is the backward's own micro-batch and chunk
    return max(0, n - warm - last) / n


def hidden_per_pair(ep_fwd: float, ep_bwd: float, compute_fwd: float, compute_bwd: float) -> tuple[float, float]:
    """(forward's, backward's) all-to-all seconds one forward-backward pair hides. The pair runs on two
    streams, layer by layer interleaved (Megatron-Core's ``combined_1f1b``: a layer's forward attention and
    the other micro-batch's backward MLP on the compute stream while a dispatch or combine is on the
    communication stream; DeepSeek-V3's Figure 4 likewise): the pair's all-to-alls hide behind the pair's
    compute up to its seconds, ``min(ep_fwd + ep_bwd, compute_fwd + compute_bwd)``, split between the two
    sides in proportion to their all-to-all seconds."""
    total = ep_fwd + ep_bwd
    hidden = min(total, compute_fwd + compute_bwd)
    return (hidden * ep_fwd / total, hidden * ep_bwd / total) if total > 0 else (0.0, 0.0)


def segment_hidden(split: tuple, ep_fwd: float, ep_bwd: float, dispatch_share: float) -> tuple[float, float]:
    """(forward's, backward's) all-to-all seconds one Megatron-Core forward-backward pair hides, segment by
    segment (module doc): per MoE layer the backward's combine behind the forward's attention block, both
    dispatches behind both MLPs, the forward's combine behind the backward's attention block; ``split`` is
    ``StageCompute.moe_split`` and ``dispatch_share`` the dispatch's part of each direction's seconds."""
    n, att_fwd, mlp_fwd, att_bwd, mlp_bwd = split[:5]
    total = ep_fwd + ep_bwd
    if n <= 0 or total <= 0:
        return 0.0, 0.0
    d_fwd, c_fwd = ep_fwd * dispatch_share / n, ep_fwd * (1 - dispatch_share) / n
    d_bwd, c_bwd = ep_bwd * dispatch_share / n, ep_bwd * (1 - dispatch_share) / n
    per_layer = min(c_bwd, att_fwd / n) + min(d_fwd + d_bwd, (mlp_fwd + mlp_bwd) / n) + min(c_fwd, att_bwd / n)
    hidden = n * per_layer
    return hidden * ep_fwd / total, hidden * ep_bwd / total


def _pair_hidden(st, sc, plan) -> tuple[float, float]:
    """A pair's hidden seconds: by segments under ``batch`` where the stage has MoE layers, by the pair's totals
    under ``dualpipe``."""
    if plan.ep_overlap == "batch" and sc.moe_split:
        dispatch, combine = st.comm("ep"), st.comm("ep_combine")
        share = dispatch / (dispatch + combine) if dispatch + combine > 0 else 0.5
        return segment_hidden(sc.moe_split, st.ep_fwd, st.ep_bwd, share)
    return hidden_per_pair(st.ep_fwd, st.ep_bwd, sc.fwd_s, sc.bwd_s)


def apply(st, sc, plan, stage: int, dev, overlap_slowdown: float):
    """``st`` (a StageTime whose ``ep_fwd``/``ep_bwd`` hold its operations' all-to-all seconds, kernels
    included) with the plan's overlap: per operation the average hidden seconds (paired fraction x a
    pair's) taken out of the operations and of the ep phases and their kernels (in proportion: the
    forward's and backward's all-to-alls carry the same bytes), the SM tax of them added (``ep_tax``,
    charged as overlap_slowdown); ``ep_pair_s``: a pair's hidden seconds (the des engine runs them)."""
    f = paired_fraction(plan, stage)
    total = st.ep_fwd + st.ep_bwd
    if f <= 0.0 or total <= 0.0:
        return st
    h_fwd, h_bwd = _pair_hidden(st, sc, plan)
    hidden_fwd, hidden_bwd = f * h_fwd, f * h_bwd
    tax = sm_tax(plan.ep_kernels, dev, overlap_slowdown)
    st = replace(st, comm_s=dict(st.comm_s))
    left = 1.0 - (hidden_fwd + hidden_bwd) / total
    left = 0.0 if left < 1e-12 else left            # all of it hidden: exactly none left (no rounding residue)
    for axis in ("ep", "ep_combine"):
        if st.comm(axis):
            st.comm_s[axis] *= left
    st.compression -= st.ep_kernel * (1.0 - left)
    st.ep_tax = tax * (hidden_fwd + hidden_bwd)
    st.fwd_op += (tax - 1.0) * hidden_fwd
    st.bwd_op += (tax - 1.0) * hidden_bwd
    st.bwd += (tax - 1.0) * hidden_bwd
    st.inner_fwd -= hidden_fwd
    st.inner_bwd -= hidden_bwd
    st.nic_fwd *= 1.0 - hidden_fwd / st.ep_fwd if st.ep_fwd else 1.0
    st.nic_bwd *= 1.0 - hidden_bwd / st.ep_bwd if st.ep_bwd else 1.0
    st.ep_hidden = hidden_fwd + hidden_bwd
    st.ep_pair_s = h_fwd + h_bwd
    return st


def dualpipe_span(stages: list, microbatches: int) -> tuple[list, list]:
    """(pipeline seconds, busy seconds per stage) of DualPipe (module doc, DeepSeek-V3 Table 2): every
    stage busy ``m (F + B)`` with its all-to-alls hidden, and the bubble ``(PP/2 - 1)(F&B + B - 3W)``
    of the busiest stage's per-micro-batch seconds."""
    m, p = microbatches, len(stages)
    busy = [m * (s.fwd_op + s.bwd_op) for s in stages]
    worst = stages[max(range(p), key=busy.__getitem__)]
    f_and_b, b, w = worst.fwd_op + worst.bwd_op, worst.bwd_op, weight_grad_s(worst)
    bubble = max(0.0, (p / 2 - 1) * (f_and_b + b - 3 * w))
    return max(busy) + bubble, busy


def weight_grad_s(st) -> float:
    """``W`` of Table 2: a backward's weight-gradient seconds, half its GEMM seconds."""
    gemm = st.compute_parts[0]
    total = max(st.fwd_op + st.bwd_op, 1e-30)
    return 0.5 * gemm * st.bwd_op / total
