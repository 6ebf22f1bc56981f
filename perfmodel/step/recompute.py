"""What selective recompute of named modules reruns in backward (``perfmodel.plan.recompute``).

Per layer and microbatch on one GPU, ``rerun`` gives the seconds, the FLOPs and the kernels of the
forward work the plan's modules repeat inside backward (``core_attn``'s rerun, attention's forward, and
``moe``'s, the MoE layer's MLP, ``perfmodel.step.compute`` prices from the layer's own times):

* ``layernorm``: the two norms, memory-bound, each reading and writing its ``h``-wide rows in the
  compute dtype (sequence-split under sequence parallelism), one kernel each;
* ``moe_act``: the routed experts' activation over the busiest rank's rows (``expert_load`` per
  dispatched copy), reading the up projection's output (``expert_up_width``, split over etp) and
  writing ``moe_ffn_hidden_size``, one kernel;
* ``mla_up_proj``: the query and key-value up projections (the GEMMs Megatron-Core's
  MLASelfAttention runs after its down projections), in the recipe's forward dtype, and RoPE over
  the query and key rope parts (a memory-bound kernel);
* ``mlp``: a dense layer's MLP up and down GEMMs and its activation pass.

GEMMs are timed as ``perfmodel.step.compute`` times the layer's (``Device.gemm_time_s``, the recipe's
forward dtype), memory-bound passes at the streaming bandwidth plus the GEMM shape model's fixed time
per kernel (``compute.kernel_fixed_s``'s rule, repeated here: this module sits below compute).
"""
from __future__ import annotations

from typing import NamedTuple

from perfmodel.dtypes import DTYPE_BYTES
from perfmodel.plan.precision import recipe
from perfmodel.plan.recompute import NORMS


class Rerun(NamedTuple):
    seconds: float = 0.0
    gemm_s: float = 0.0      # of seconds: GEMMs
    flops: float = 0.0
    kernels: int = 0


def _fixed_s(dev) -> float:
    return dev.gemm_shape.fixed_s if dev.gemm_shape is not None else 0.0


def _gemms(plan, dev, shapes) -> tuple[float, float]:
    """(seconds, FLOPs) of forward GEMMs (m, n, k) in the plan's recipe's forward dtype."""
    rec, dt = recipe(plan.precision), plan.compute_dtype
    dtype = rec.gemm_dtype("fprop", dt) if rec.is_low else dt
    return (sum(dev.gemm_time_s(m, n, k, dtype) for m, n, k in shapes),
            sum(2.0 * m * n * k for m, n, k in shapes))


def _memory(plan, dev, elements: float, kernels: int) -> Rerun:
    """A memory-bound pass over ``elements`` elements read and written in the compute dtype."""
    seconds = elements * DTYPE_BYTES[plan.compute_dtype] / dev.stream_Bps + kernels * _fixed_s(dev)
    return Rerun(seconds, 0.0, 0.0, kernels)


def _gemm_rerun(plan, dev, shapes, act_elements: float = 0.0, act_kernels: int = 0) -> Rerun:
    seconds, flops = _gemms(plan, dev, shapes)
    act = _memory(plan, dev, act_elements, act_kernels)
    return Rerun(seconds + act.seconds, seconds, flops, len(shapes) + act_kernels)


def _module(name: str, model, plan, dev, moe: bool) -> Rerun:
    if not _applies(name, model, moe):
        return Rerun()
    T, h, tp = plan.local_seq * plan.mbs, model.hidden_size, plan.tp
    sp = tp if plan.sequence_parallel else 1
    if name == "layernorm":
        return _memory(plan, dev, NORMS * 2.0 * T * h / sp, NORMS)
    if name == "moe_act":
        rows = T * model.expert_copies * model.expert_load
        return _memory(plan, dev, rows * (model.expert_up_width + model.moe_ffn_hidden_size) / plan.etp, 1)
    if name == "mla_up_proj":
        shapes = [(T, model.q_width / tp, model.q_lora_rank)] if model.q_lora_rank else []
        shapes.append((T, model.num_heads * (model.qk_nope_head_dim + model.v_head_dim) / tp, model.kv_lora_rank))
        rope = 2.0 * T * model.num_heads * model.qk_rope_head_dim * 2 / tp    # q and k rope parts, read and written
        return _gemm_rerun(plan, dev, shapes, rope, 1)
    if name == "mlp":
        shapes = [(T, model.mlp_up_width / tp, h), (T, h, model.ffn_hidden_size / tp)]
        return _gemm_rerun(plan, dev, shapes, T * (model.mlp_up_width + model.ffn_hidden_size) / tp, 1)
    raise ValueError(name)


# kernels each module's rerun issues (its GEMMs and memory-bound passes, as ``_module`` times them)
MODULE_KERNELS = {"layernorm": NORMS, "moe_act": 1, "mla_up_proj": 3, "mlp": 3}


def _applies(name: str, model, moe: bool) -> bool:
    """Whether ``name``'s rerun is this module's to price on a layer (``core_attn`` and ``moe`` are
    ``perfmodel.step.compute``'s: attention's forward, the MoE layer's MLP from its split)."""
    return {"moe_act": moe, "mla_up_proj": model.is_mla, "mlp": not moe}.get(name, name not in ("core_attn", "moe"))


def rerun_kernels(model, plan, moe: bool) -> int:
    """Kernels one layer's named modules (``core_attn`` and ``moe`` aside) issue again in backward."""
    if plan.recompute != "selective":
        return 0
    return sum(MODULE_KERNELS[n] - (n == "mla_up_proj" and not model.q_lora_rank)
               for n in _named(plan) if _applies(n, model, moe))


def _named(plan) -> tuple:
    """The plan's modules, ``moe_act`` left to ``moe`` where both are named (the layer reruns whole)."""
    mods = plan.recompute_modules
    return tuple(n for n in mods if not (n == "moe_act" and "moe" in mods))


def rerun(model, plan, dev, moe: bool) -> Rerun:
    """The forward work one layer's named modules rerun in backward (module doc; ``core_attn`` and ``moe``
    not included); nothing where the plan is not selective."""
    if plan.recompute != "selective":
        return Rerun()
    parts = [_module(name, model, plan, dev, moe) for name in _named(plan)]
    return Rerun(*(sum(p[i] for p in parts) for i in range(4)))
