"""The step phases a training run measures, named as perfmodel declares them (``perfmodel.phases``,
``perfmodel.axes.PHASES``): one name per quantity, in the step records and on both sides of
``realrun validate --training``.

A step record holds, in seconds: ``compute_s`` (the forward and backward passes, the collectives
inside them taken out), the phase of every axis it reports (``Axis.phase``: the axis's exposed
communication, its compression kernels taken out; axes that share a phase, dp and zero, ep and
ep_combine, share one number), ``compression_s`` (every reported axis's kernels) and
``optimizer_s``; beside them ``step_s``, ``forward_s``, ``backward_s`` and ``<axis>_kernel_s``
(``TIMES``). The axes a record reports (``reported_axes``): every axis that is not ``optional``
(dp, zero, tp, pp: zeros in a plan without them), and the optional ones (ep, ep_combine, cp) where
the run's plan carries their traffic.

What a run cannot tell apart it measures inside another phase: a declared ``Phase.measured_in``
(the pipeline bubble inside the pp transfers' waits, the overlap slowdown inside the optimizer);
a phase only some engines produce (``Phase.engines``: the event engine's link contention) is a
model's account of time a run spends inside whichever phase the sharing slows, so no run measures
it. ``MEASURED`` is what is left, in report order.

Validation compares the two sides after ``compared``: each declared phase folded into the phase a
run measures it in, and the kernels of the axes of DP's phase (dp and zero: ``DP_PHASE_AXES``)
moved from compression into DP's phase, because the trainer times them inside its reduction
(``realrun.train.data_parallel``) while perfmodel prices them apart; the predicted and measured
columns then differ only by their prefix.

Records and results files written before these names (``compress_s``, ``dp_comm_s``, no
``compute_s``, no ep or cp columns) read through ``upgraded`` (``RENAMED``, the one alias table).
"""
from __future__ import annotations

from perfmodel.axes import AXES, PHASES, REPORTED, active_axes
from perfmodel.phases import COMPRESSION, COMPUTE, OPTIMIZER

MEASURED = tuple(p.name for p in PHASES if not p.measured_in and not p.engines)   # what a run measures
AXIS_PHASES = tuple(dict.fromkeys(a.phase.name for a in AXES.values()))            # the axes' own phases
OPTIONAL = tuple(p.name for p in PHASES if p.optional)   # only in some plans: 0 where a file lacks them
TIMES = ("step_s", "forward_s", "backward_s")            # a record's times beside its phases
DP_PHASE = AXES["dp"].phase.name
DP_PHASE_AXES = tuple(name for name, axis in AXES.items() if axis.phase.name == DP_PHASE)   # dp, zero
RENAMED = {"compress_s": COMPRESSION.name, "dp_comm_s": DP_PHASE}   # keys of older records -> today's


def reported_axes(cfg, model) -> tuple[str, ...]:
    """The axes a step record of ``cfg`` (a TrainConfig, or any plan ``perfmodel.axes`` reads)
    reports, in ``perfmodel.axes`` order (module doc)."""
    active = active_axes(cfg, model)
    return tuple(name for name in AXES if name in REPORTED or name in active)


def record_phases(axes) -> tuple[str, ...]:
    """The phases a step record of the reported ``axes`` holds, in report order."""
    own = {AXES[a].phase.name for a in axes}
    return tuple(p for p in MEASURED if p in own or p not in AXIS_PHASES)


def phase_of(axis: str) -> str:
    return AXES[axis].phase.name


def step_phases(forward_s: float, backward_s: float, optimizer_s: float, exposed: dict, kernels: dict) -> dict:
    """A step's phases, in report order: ``forward_s`` and ``backward_s`` its compute, ``exposed``
    {phase: communication seconds, kernels out}, ``kernels`` {axis: its compression seconds}."""
    values = {COMPUTE.name: forward_s + backward_s, **exposed, COMPRESSION.name: sum(kernels.values()),
              OPTIMIZER.name: optimizer_s}
    return {p: values[p] for p in MEASURED if p in values}


def compared(phases: dict, kernels: dict) -> dict:
    """{phase: seconds} of ``MEASURED`` from a step's breakdown (``phases``, by declared name; a
    phase it lacks is 0) and its kernel seconds per axis (``kernels``): each phase folded into the
    one a run measures it in, DP's axes' kernels moved from compression into DP's phase (module doc)."""
    out = dict.fromkeys(MEASURED, 0.0)
    for phase in PHASES:
        into = phase.measured_in or phase.name
        if into in out:
            out[into] += phases.get(phase.name, 0.0)
    moved = sum(kernels.get(axis, 0.0) for axis in DP_PHASE_AXES)
    out[DP_PHASE] += moved
    out[COMPRESSION.name] = max(0.0, out[COMPRESSION.name] - moved)
    return out


def upgraded(record: dict, prefixes: tuple = ("",)) -> dict:
    """``record`` (a step record, or with ``prefixes`` a results row such as ``measured_...``) with
    the keys older files wrote under their names today (``RENAMED``); an older step record's
    ``compute_s`` from its forward and backward seconds."""
    out = dict(record)
    for prefix in prefixes:
        for old, new in RENAMED.items():
            if prefix + old in out and prefix + new not in out:
                out[prefix + new] = out.pop(prefix + old)
    if "" in prefixes and COMPUTE.name not in out and "forward_s" in out and "backward_s" in out:
        out[COMPUTE.name] = out["forward_s"] + out["backward_s"]
    return out


__all__ = ["DP_PHASE", "DP_PHASE_AXES", "MEASURED", "OPTIONAL", "RENAMED", "TIMES", "compared", "record_phases",
           "reported_axes", "step_phases", "upgraded"]
