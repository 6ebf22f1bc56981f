"""What a published compression recipe does beyond its per-axis specs: warm-up, what it compresses,
where its error is fed back, and the optimizer changes that come with it.

A policy preset (``perfmodel.compression.policy``) says which spec each axis uses; five presets are
recipes whose reference implementations do more than that, and this module says what, with the
reference's defaults and where each comes from:

* ``powersgd`` (Vogels et al., NeurIPS 2019; PyTorch's ``torch/distributed/algorithms/ddp_comm_hooks/
  powerSGD_hook.py``, ``PowerSGDState``): rank-1 factors (``matrix_approximation_rank=1``), error
  feedback and warm start on (``use_error_feedback``, ``warm_start``), the plain all-reduce before
  ``start_powerSGD_iter`` (default 1000 steps; its docstring: "start with 10% of total training
  steps", the share used here).
* ``loco`` (Xie et al. 2024, arXiv 2407.04480; DeepSpeed's ``all_to_all_loco_quant_reduce``): 4-bit
  gradients whose error is fed back as a moving average (``err_beta`` 0.8) kept in 8 bits and reset
  every ``reset_T`` = 1024 steps; no warm-up.
* ``onebit-adam`` (Tang et al. 2021, arXiv 2102.02888; DeepSpeed's ``deepspeed/runtime/fp16/onebit/
  adam.py`` and ``deepspeed/runtime/comm/nccl.py`` ``compressed_allreduce``): Adam with uncompressed
  gradients for ``freeze_step`` steps (the tutorial: "15-25% of the total training steps", 15% here),
  then Adam's variance frozen and each worker's *momentum* (not its gradient) averaged by a 1-bit
  all-reduce: sign and one scale per chunk, an all-to-all then an all-gather, the error fed back on
  the worker (before the all-to-all) and on the server (before the all-gather).
* ``zero-one-adam`` (Lu et al. 2022, arXiv 2202.06009; DeepSpeed's ``zoadam.py``): no uncompressed
  warm-up; the variance is updated, with an uncompressed gradient all-reduce, only on steps whose
  interval doubles every ``var_update_scaler`` = 16 updates (the other steps reduce the gradient in
  1 bit) until ``var_freeze_step``; after it the workers take local steps and synchronise their
  accumulated update in 1 bit every ``local_step_interval`` steps, an interval that doubles every
  ``local_step_scaler`` = 32678 steps up to ``local_step_clipper`` = 16. ``var_freeze`` is a share of the
  run (default 1: never, the tutorial's advice: "setting it to a sufficiently large number (larger than
  the total number of steps) ... still enjoys the non-trivial communication reduction").

* ``sdp4bit`` (Jia et al., NeurIPS 2024, arXiv 2410.15526; its Megatron-LM fork's ``megatron/
  quantization_helper.py``): no warm-up, no optimizer change; its mechanisms are its two specs (``tlq`` on
  the gradients' reduce-scatter, ``qwd`` on the parameter all-gather). It runs Megatron's distributed
  optimizer (``--use-distributed-optimizer``, the README's scripts): ZeRO stages 1 and 2, where every rank
  holds the whole bf16 weights that the gathered differences are added to (``dequantize_add_bf16``), so the
  previous weights qWD needs cost no memory beyond the plan's own (state 0); under ZeRO-3 they would be a
  whole second copy of the weights on every rank, and the recipe is refused there (as at ZeRO-0, which has no
  parameter all-gather).

``Recipe.run_time`` is the time to reach the uncompressed run's loss: the warm-up share ``w`` of the
steps at the uncompressed step time, the rest at the compressed one times the convergence model's
steps inflation ``k`` (``perfmodel.explore.convergence``), so ``w t_none + (1 - w) k t_compressed``
per uncompressed step (and ``w + (1 - w) k`` steps). Given the run's length, ``Recipe.modes`` says what
each step does (realrun's optimizer runs that list), and ``convergence.record_cost(..., steps=N)``
prices a 0/1 Adam run step by step, its local steps without their synchronisation. What is
approximated is in ``APPROXIMATIONS`` (and docs/policies.md): the variance freeze costs no steps;
without the run's length 0/1 Adam's few uncompressed variance steps (16 per doubling of the
interval, about 200 of a 100k-step run) are not charged and its local steps are not credited (every
step priced with its 1-bit synchronisation: an upper bound on its time); realrun runs all of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from topologies.errors import InputError

COMPRESSES = ("gradient", "momentum")


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """A recipe's mechanisms beyond its specs (module doc), each with the reference's default."""

    name: str
    compresses: str = "gradient"      # what its dp spec is applied to: the gradient, or Adam's momentum
    warmup: float = 0.0               # share of the run's steps before compression starts (uncompressed)
    server_feedback: bool = True      # error fed back on the server side of the two-phase all-reduce too
    variance_freeze: bool = False     # Adam's second moment frozen once compression starts
    var_update_scaler: int = 0        # 0/1 Adam: variance updates per doubling of their interval (0: no schedule)
    local_step_scaler: int = 0        # 0/1 Adam: steps per doubling of the synchronisation interval (0: every step)
    local_step_clipper: int = 1       # 0/1 Adam: the largest synchronisation interval
    var_freeze: float = 1.0           # 0/1 Adam: share of the run after which the variance is frozen (1: never)
    worker_state_bytes: float = 0.0   # bytes per parameter every worker keeps (its error; 0/1 Adam's accumulator)
    server_state_bytes: float = 0.0   # bytes per parameter of the server's error, kept for its 1/dp chunk
    zero_stages: tuple = (0, 1, 2, 3)  # the ZeRO stages its reference runs under
    source: str = ""

    def __post_init__(self):
        if self.compresses not in COMPRESSES:
            raise InputError(f"{self.name}.compresses", self.compresses, " or ".join(COMPRESSES))
        for name, high, why in (("warmup", 1.0, "[0, 1)"), ("var_freeze", 1.0 + 1e-12, "(0, 1]; 1: never")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < high \
                    or (name == "var_freeze" and value == 0):
                raise InputError(f"policy.{name}", value, f"a share of the run's steps in {why}")
        for name, low in (("var_update_scaler", 0), ("local_step_scaler", 0), ("local_step_clipper", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 1 << 30:
                raise InputError(f"policy.{name}", value, f"an integer from {low} to 2^30")

    def state_bytes(self, dp: int) -> float:
        """Bytes per parameter of the recipe's state on one GPU of a dp group of ``dp``: the worker's
        whole, the server's for its chunk (what ``perfmodel.plan.memory`` is to charge)."""
        return self.worker_state_bytes + self.server_state_bytes / max(dp, 1)

    def check_zero(self, zero: int) -> None:
        """Refuse a ZeRO stage its reference does not run (one line naming why)."""
        if zero not in self.zero_stages:
            why = {"powersgd": "PyTorch's PowerSGD is a DDP communication hook",
                   "onebit-adam": "DeepSpeed's engine.py: '1bit-Adam is not compatible with ZeRO'",
                   "zero-one-adam": "DeepSpeed's engine.py: '0/1 Adam is not compatible with ZeRO'",
                   "sdp4bit": "its reference runs Megatron's distributed optimizer; its weight differences are added "
                              "to the whole weights each rank holds, which ZeRO-3 does not keep and ZeRO-0 "
                              "does not gather"}.get(self.name, "")
            raise InputError("zero", zero, f"{' or '.join(map(str, self.zero_stages))} with policy {self.name} ({why})")

    def warmup_steps(self, steps: int) -> int:
        """Uncompressed steps at the start of a run of ``steps`` (the share, rounded up)."""
        return min(steps, math.ceil(self.warmup * steps - 1e-9))

    def modes(self, steps: int) -> list[str]:
        """What each step of a run of ``steps`` does (entry t-1 for step t): ``exact`` (uncompressed
        gradients: a warm-up step, or 0/1 Adam's variance update), ``gradient`` (the gradient under
        the dp spec), ``momentum`` (1-bit Adam's momentum under it), ``sync`` (0/1 Adam: a local step,
        then the accumulated update under it) or ``local`` (0/1 Adam: no communication)."""
        if self.var_update_scaler:   # 0/1 Adam (zoadam.py)
            freeze = math.ceil(self.var_freeze * steps - 1e-9) if self.var_freeze < 1 else steps
            return (["exact" if v else "gradient" for v in variance_steps(freeze, self.var_update_scaler)]
                    + ["sync" if s else "local"
                       for s in sync_steps(steps - freeze, self.local_step_scaler, self.local_step_clipper)])
        warm = self.warmup_steps(steps)
        return ["exact"] * warm + ["momentum" if self.compresses == "momentum" else "gradient"] * (steps - warm)

    def steps_inflation(self, compressed: float) -> float:
        """The run's steps over the uncompressed run's: warm-up steps as they are, the rest
        inflated by ``compressed`` (the convergence model's factor of the compressed part)."""
        return self.warmup + (1.0 - self.warmup) * compressed

    def run_time(self, uncompressed_s: float, compressed_s: float, compressed: float) -> float:
        """Seconds per uncompressed step of progress (module doc): ``w t_none + (1 - w) k t``."""
        return self.warmup * uncompressed_s + (1.0 - self.warmup) * compressed * compressed_s

    def with_items(self, items: dict) -> Recipe:
        """This recipe with ``items`` ({field: text}) from policy items (``warmup=0.05``), checked."""
        out = {}
        for key, text in items.items():
            kind = type(getattr(self, key))
            try:
                out[key] = float(text) if kind is float else int(text)
            except ValueError:
                raise InputError(f"policy.{key}", text, "a number") from None
        return replace(self, **out)


# bytes per parameter of error state: DeepSpeed's fp32 worker_error (corrected_tensor_size) and
# server_error (server_chunk_size = corrected_tensor_size / dp); LoCo's int8 errors with one fp32 scale
# per 256 values (realrun's ErrorFeedbackTransform.STATE_BLOCK; DeepSpeed's groups are a row or a column)
_FP32 = 4.0
_INT8 = 1 + 4 / 256

RECIPES = {
    "powersgd": Recipe(name="powersgd", warmup=0.10, server_feedback=False,
                       worker_state_bytes=_FP32, zero_stages=(0,),
                       source="PyTorch powerSGD_hook.py PowerSGDState: matrix_approximation_rank=1, "
                              "use_error_feedback, warm_start, start_powerSGD_iter (10% of the steps, its docstring)"),
    "loco": Recipe(name="loco", worker_state_bytes=_INT8, server_state_bytes=_INT8,
                   source="DeepSpeed coalesced_collectives.py all_to_all_loco_quant_reduce: int4, "
                          "err_beta=0.8, reset_T=1024, error kept in int8 (zeropp_loco_param)"),
    "onebit-adam": Recipe(name="onebit-adam", compresses="momentum", warmup=0.15, variance_freeze=True,
                          worker_state_bytes=_FP32, server_state_bytes=_FP32, zero_stages=(0,),
                          source="DeepSpeed onebit/adam.py (freeze_step; tutorial: 15-25% of the steps) and "
                                 "comm/nccl.py compressed_allreduce (sign, worker and server error)"),
    "zero-one-adam": Recipe(name="zero-one-adam", compresses="momentum", variance_freeze=True,
                            var_update_scaler=16, local_step_scaler=32678, local_step_clipper=16,
                            var_freeze=1.0, worker_state_bytes=2 * _FP32, server_state_bytes=_FP32,
                            zero_stages=(0,),
                            source="DeepSpeed onebit/zoadam.py: var_freeze_step, var_update_scaler=16, "
                                   "local_step_scaler=32678, local_step_clipper=16 (momentum_accumulator: 4 B more)"),
    "sdp4bit": Recipe(name="sdp4bit", server_feedback=False, zero_stages=(1, 2),
                      source="SDP4Bit megatron/quantization_helper.py QuantizationHelper (wq_group_size=2048, "
                             "gq_group_size_inter=128, hadamard_order=5) under --use-distributed-optimizer; the "
                             "previous weights are the model's own bf16 weights (dequantize_add_bf16): no state"),
}

# the policy items a recipe takes (``onebit-adam,warmup=0.2``): its fields that a user tunes
ITEMS = ("warmup", "var_freeze", "var_update_scaler", "local_step_scaler", "local_step_clipper")
assert set(ITEMS) <= {f.name for f in fields(Recipe)}

APPROXIMATIONS = {
    "powersgd": "the bucket as one sqrt(N) x sqrt(N) matrix (PyTorch: each tensor its own matrix, 1-D tensors "
                "and those compressing less than 2x (min_compression_rate) sent uncompressed)",
    "loco": "the moving average, int8 state and reset priced and inflated as plain error feedback; the "
            "two-phase all-reduce (or ZeRO's reduce-scatter) instead of DeepSpeed's hierarchical all-to-all",
    "onebit-adam": "the momentum's contraction taken as the gradient's; the variance freeze costs no steps; "
                   "commpress's sign carries mean|x| per 2048 values (DeepSpeed: the RMS of each chunk)",
    "zero-one-adam": "as onebit-adam; without the run's length its ~16 uncompressed variance steps per doubling "
                     "are not charged and its local steps not credited (each step priced with its 1-bit "
                     "synchronisation; record_cost(..., steps=N) prices both); realrun runs both",
    "sdp4bit": "qWD's error scaled by rms(dw)/rms(w) measured on the small GPT only (quantizers.DEFAULT_WEIGHT_DELTA, "
               "0.01; it falls with the learning rate); the chunked "
               "pipelining of the two all-to-alls not priced (back to back); on one node its error is still "
               "both tiers'",
}


def recipe_of(preset: str) -> Recipe | None:
    """The recipe of preset ``preset`` (None: a preset that is only its specs)."""
    return RECIPES.get(preset)


def variance_steps(steps: int, scaler: int) -> list[bool]:
    """0/1 Adam's variance-update steps (DeepSpeed's zoadam.py): step ``t`` (1-based) updates the
    variance when ``t % interval == 0``; the interval doubles every ``scaler`` updates. Entry t-1 of
    the list says whether step t does (every step where ``scaler`` is 0)."""
    out, interval, counter = [], 1, 0
    for t in range(1, steps + 1):
        update = scaler == 0 or t % interval == 0
        out.append(update)
        if update and scaler:
            counter += 1
            if counter == scaler:
                counter, interval = 0, interval * 2
    return out


def sync_steps(steps: int, scaler: int, clipper: int) -> list[bool]:
    """0/1 Adam's synchronisations after the variance freeze (zoadam.py): local step ``t`` (1-based)
    synchronises when ``t % interval == 0``; the interval doubles every ``scaler`` steps up to
    ``clipper`` (every step where ``scaler`` is 0)."""
    out, interval, counter = [], 1, 0
    for t in range(1, steps + 1):
        out.append(t % interval == 0)
        if scaler:
            counter += 1
            if counter == scaler:
                counter, interval = 0, min(clipper, interval * 2)
    return out
