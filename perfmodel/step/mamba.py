"""A Mamba-2 mixer layer of a hybrid model: its parameters, GEMMs, chunked SSD scan, kernels and kept activations.

Hybrid models (``ModelSpec.hybrid_layer_pattern``; docs/predict.md, Hybrid layer patterns) stack layers of one
mixer each, as Megatron-Core's hybrid stack builds them (megatron/core/models/hybrid/hybrid_layer_specs.py @
NVIDIA/Megatron-LM d98e8a64dd, ``hybrid_stack_spec``): a Mamba layer (``M``) is a ``MambaLayer`` whose mixer is
``MambaMixer`` (megatron/core/ssm/mamba_mixer.py @ d98e8a64dd, ``__init__`` lines 174-470), with

* ``in_proj``, a ``TELayerNormColumnParallelLinear`` (the layer's RMSNorm fused in) from the hidden size to
  ``z, x, B, C, dt``: ``2 d_inner + 2 n_groups d_state + n_heads`` (lines 281-308; d_inner = n_heads x head_dim,
  or expand x hidden where n_heads is not given, lines 245-251), column-parallel: each part split over tp
  (tp must divide n_heads and n_groups, lines 259-274);
* ``conv1d``, a depthwise causal convolution of ``d_conv`` taps over ``x, B, C`` (d_inner + 2 n_groups d_state
  channels) with a bias (lines 321-351);
* ``dt_bias``, ``A_log`` and ``D``, one each per head (D per head: ``D_has_hdim`` False, lines 376-420);
* a gated RMSNorm over d_inner (``RMSNormGated``, group size d_inner / n_groups, lines 422-432);
* ``out_proj``, a ``TERowParallelLinear`` from d_inner back to the hidden size (lines 436-448).

Its scan is the chunked state-space-duality (SSD) algorithm of Mamba-2 (Dao and Gu, arXiv 2405.21060, section 6,
"Hardware-efficient algorithm for SSD models"), run in training by ``mamba_split_conv1d_scan_combined``
(mamba_ssm/ops/triton/ssd_combined.py; Megatron's ``ssm_training``, mamba_mixer.py lines 680-730: conv1d, the
scan and the z gate in one autograd function, the RMSNorm after it). Over chunks of ``Q = chunk_size`` tokens it
computes, per chunk, (1) the intra-chunk output, a Q x Q "attention" ``C B^T`` per group and its masked product
with ``X`` per head, (2) each chunk's final state ``B^T X`` (d_state x head_dim per head), (3) the inter-chunk
recurrence over those states, and (4) the states' contribution to the outputs ``C h``. Its forward FLOPs per token
(``ssd_flops_per_token``): ``2 Q d_state`` per group for ``C B^T``, and per head ``2 Q head_dim`` for step (1)'s
product with X, ``2 d_state head_dim`` each for steps (2) and (4) (step (3), a scan over T/Q states, and the
elementwise decay terms are left out: under 1% of these). Full Q x Q blocks are counted, as Megatron counts causal
attention's full s x s.

Cost model of the scan (``ssd_s``): its products are batched GEMMs over every chunk and head of the microbatch, one
Triton grid each, so each is priced as one GEMM of its aggregate shape at the device's cube-root efficiency
table (``Device.table_gemm_time_s``, what flash attention's batched products use), never faster than the traffic
it must move at ``SSD_BANDWIDTH_FRACTION`` of the streaming bandwidth (what the Triton kernels were measured to
reach over it on an H100): the layer's x, B, C, dt read and y written (2 bytes an element), the chunk
states (n_heads x head_dim x d_state elements a chunk: ``_chunk_state_fwd`` writes them in fp32, ``_state_passing_fwd``
reads them and writes them in the activations' dtype, ``_chunk_scan_fwd`` reads those: ``STATE_BYTES`` an element)
and ``C B^T`` (Q x Q a chunk and group, written by ``_bmm_chunk_fwd`` in fp32 and read back: ``CB_BYTES``)
(mamba_ssm/ops/triton/ssd_combined.py, ``_mamba_chunk_scan_combined_fwd``). Backward
(``_mamba_chunk_scan_combined_bwd``) first recomputes the forward's cumulative sums, ``C B^T``, the chunk states and
their passing, then runs the gradients' products: ``SSD_BACKWARD_PASSES`` forwards' worth (a recompute and two, as a
GEMM's dgrad and wgrad), the conv1d rerun inside it (the fused function recomputes its output).

Memory-bound work beside the scan: the conv1d reads and writes its channels, the gated norm
reads y and writes its output, and the residual add: what the layer keeps (``kept_bytes``) moved once each way,
as every other layer's memory-bound work is priced (``perfmodel.step.compute``). Kernels per forward
(``MAMBA_KERNELS``): in_proj (with its norm), the combined function's kernels (``SCAN_KERNELS``), the gated
norm, out_proj and the bias-dropout-add.

Activations kept for backward (``kept_bytes``, per token, 2-byte elements): the layer input kept for the norm and
the norm's output for in_proj's wgrad (2 + 2 bytes a hidden element) and the residual's dropout mask (1), as
Korthikanti counts a transformer layer's (whole, or sequence-split with sequence parallelism); TP-split, what
``MambaSplitConv1dScanCombinedFn`` saves (the in_proj output ``zxBCdt`` and the scan output), the gated norm's
input and out_proj's input (d_inner each).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.errors import InputError

if TYPE_CHECKING:
    from perfmodel.devices import Device
    from perfmodel.plan.parallel import ParallelPlan
    from perfmodel.workload import ModelSpec

# Megatron-Core's MambaMixer defaults and TransformerConfig's (megatron/core/ssm/mamba_mixer.py lines 174-195:
# d_conv 4, expand 2, chunk_size 128; megatron/core/transformer/transformer_config.py @ d98e8a64dd lines 1259-1270:
# mamba_state_dim 128, mamba_head_dim 64, mamba_num_groups 8, mamba_num_heads None)
DEFAULTS = {"mamba_state_dim": 128, "mamba_head_dim": 64, "mamba_num_heads": 0, "mamba_num_groups": 8,
            "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 128}
# Bytes an element of the chunk states moves in the scan's forward: chunk_state writes it in fp32 (states_in_fp32),
# state_passing reads it and writes it in the activations' dtype (out_dtype C.dtype), chunk_scan reads that: 4 + 4 +
# 2 + 2; C B^T's elements are written in fp32 by bmm_chunk and read by chunk_scan: 4 + 4
# (mamba_ssm/ops/triton/ssd_combined.py, _mamba_chunk_scan_combined_fwd)
STATE_BYTES, CB_BYTES = 12, 8
# The backward in forwards' worth: the forward's states recomputed (1) and the gradients' products (2)
SSD_BACKWARD_PASSES = 3
# Of the streaming bandwidth, what the scan's Triton kernels reach over the traffic above: measured forward
# throughput of mamba_chunk_scan_combined on one H100 (vLLM pull request #27299, comment of 2025-10-25, the
# "Original" column: 1.21e7 - 1.29e7 tokens/s at 4K - 16K tokens, 1.07e7 - 1.18e7 at 32K - 256K, for 128 heads of
# 64, one group, d_state 128) against this module's traffic bound for that shape (2.18e7 tokens/s on h100-sxm): the
# median, 1.18e7 / 2.18e7
SSD_BANDWIDTH_FRACTION = 0.54
# Kernels of the combined scan's forward: chunk_cumsum, the conv1d, chunk_state, state_passing, bmm_chunk (C B^T)
# and chunk_scan (the same file); backward runs two per forward one, as every kernel here
SCAN_KERNELS = 6
# The rest of a Mamba layer's forward: in_proj (its norm fused), the gated RMSNorm, out_proj, the bias-dropout-add
GEMM_KERNELS, MEMORY_KERNELS = 2, 2


def inner(model: ModelSpec) -> int:
    """d_inner: n_heads x head_dim (mamba_mixer.py lines 245-251)."""
    return heads(model) * model.mamba_head_dim


def heads(model: ModelSpec) -> int:
    """The mixer's heads: ``mamba_num_heads``, or expand x hidden / head_dim where it is 0."""
    return model.mamba_num_heads or model.mamba_expand * model.hidden_size // model.mamba_head_dim


def in_proj_width(model: ModelSpec) -> int:
    """in_proj's output: z and x (d_inner each), B and C (n_groups x d_state each), dt (one per head)."""
    return 2 * inner(model) + 2 * model.mamba_num_groups * model.mamba_state_dim + heads(model)


def conv_channels(model: ModelSpec) -> int:
    """The conv1d's channels: x, B and C."""
    return inner(model) + 2 * model.mamba_num_groups * model.mamba_state_dim


def layer_params(model: ModelSpec) -> int:
    """One Mamba layer: its norm (fused into in_proj), in_proj, conv1d (weights and bias), A_log, D and dt_bias
    (one per head each), the gated norm and out_proj (no linear biases: Megatron asserts ``not bias``)."""
    h, d = model.hidden_size, inner(model)
    norm = (2 if model.biased else 1) * h
    conv = conv_channels(model) * (model.mamba_d_conv + 1)
    return norm + h * in_proj_width(model) + conv + 3 * heads(model) + d + d * h


def ssd_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of one layer's chunked SSD scan per token (module doc)."""
    q, n, p = model.mamba_chunk_size, model.mamba_state_dim, model.mamba_head_dim
    return 2.0 * q * n * model.mamba_num_groups + heads(model) * (2.0 * q * p + 4.0 * n * p)


def kept_bytes(model: ModelSpec) -> tuple[float, float]:
    """Bytes per token a Mamba layer keeps for backward, as (whole or sequence-split, TP-split) (module doc)."""
    return 5.0 * model.hidden_size, 2.0 * in_proj_width(model) + 6.0 * inner(model)


def gemms(model: ModelSpec, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """(m, n, k) of a Mamba layer's projections on one GPU: in_proj (column-parallel, its output over tp) and
    out_proj (row-parallel, its input over tp)."""
    T, h, tp = plan.local_seq * plan.mbs, model.hidden_size, plan.tp
    return [(T, in_proj_width(model) / tp, h), (T, h, inner(model) / tp)]


def ssd_products(model: ModelSpec, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """The scan's products on one GPU as aggregate GEMMs (m, n, k) over its chunks and its tp share of the heads
    and groups: C B^T (Q x Q over d_state, per group), its masked product with X (Q x head_dim over Q), the chunk
    states B^T X (d_state x head_dim over Q) and the states' outputs C h (Q x head_dim over d_state), per head."""
    T, tp = plan.local_seq * plan.mbs, plan.tp
    q, n, p = model.mamba_chunk_size, model.mamba_state_dim, model.mamba_head_dim
    groups, per_head = T * model.mamba_num_groups / tp, T * heads(model) / tp
    return [(groups, q, n), (per_head, p, q), (per_head / q * n, p, q), (per_head, p, n)]


def ssd_traffic_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes the scan's forward must move on one GPU: x, B, C and dt read, y written (2 bytes each), the chunk
    states (``STATE_BYTES`` an element) and C B^T (``CB_BYTES``)."""
    T, tp, q = plan.local_seq * plan.mbs, plan.tp, model.mamba_chunk_size
    states = T / q * heads(model) * model.mamba_head_dim * model.mamba_state_dim
    cb = T * q * model.mamba_num_groups
    return (2.0 * T * (conv_channels(model) + heads(model) + inner(model)) + STATE_BYTES * states + CB_BYTES * cb) / tp


def ssd_s(model: ModelSpec, plan: ParallelPlan, dev: Device) -> tuple[float, float, float]:
    """(forward s, backward s, forward FLOPs) of one layer's scan on one GPU per microbatch (module doc)."""
    dt = plan.compute_dtype
    products = sum(dev.table_gemm_time_s(m, n, k, dt) for m, n, k in ssd_products(model, plan))
    fwd = max(products, ssd_traffic_bytes(model, plan) / (dev.stream_Bps * SSD_BANDWIDTH_FRACTION))
    flops = plan.local_seq * plan.mbs * ssd_flops_per_token(model) / plan.tp
    return fwd, SSD_BACKWARD_PASSES * fwd, flops


def kernels() -> dict[str, int]:
    """Kernels of one Mamba layer's forward by kind (``gemm``, ``attention``: the scan's, ``memory``)."""
    return {"gemm": GEMM_KERNELS, "attention": SCAN_KERNELS, "memory": MEMORY_KERNELS}


def check_tp(model: ModelSpec, tp: int) -> None:
    """Refuse a tp that does not divide the mixer's heads and groups (Megatron asserts it, lines 259-274)."""
    for key, value in (("mamba heads", heads(model)), ("mamba_num_groups", model.mamba_num_groups)):
        if value % tp:
            raise InputError("tp", tp, f"a divisor of {model.name}'s {key} {value} (Megatron-Core's MambaMixer "
                             "gives every tensor-parallel rank whole heads and groups)")
