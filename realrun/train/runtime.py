"""One interface for every parallel runtime of a training step: tensor (``tensor_parallel``),
context (``context_parallel``), expert (``moe``), pipeline (``pipeline``) and data parallelism
with ZeRO (``data_parallel``) each answer ``AxisRuntime``, and the trainer loops over them.

A runtime carries the traffic of one or more ``perfmodel.axes`` axes (``axis_names``: ep also
ep_combine, dp also zero; the axes of one runtime share their step phase). ``start_step(measure)``
opens a step (on a ``measure`` step each of its axes gets an error meter: the exact result beside
the compressed one, uncounted); ``take()`` closes it, returning its ``AxisTiming`` and starting
afresh (evaluation's passes are taken and dropped the same way).

Seconds a timing holds: ``forward_s`` and ``backward_s``, spent in its collectives inside the
passes (the pipeline's forward and backward timers include them: the step's compute is those timers
minus every runtime's); ``apart_s``, in collectives outside the passes (the pipeline's transfers
between them, the gradient reduction after them). Its phase's exposed seconds are all three minus
its axes' compression kernels (``exposed``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from realrun.train.accuracy import RelativeError
from realrun.train.phases import phase_of


@dataclass
class AxisTiming:
    """What one runtime spent and moved in a step (module doc)."""

    forward_s: float = 0.0     # in its collectives inside the forward passes
    backward_s: float = 0.0    # inside the backward passes
    apart_s: float = 0.0       # outside the passes
    stats: dict = field(default_factory=dict)    # {axis: CommStats}: payload bytes and kernel seconds
    errors: dict = field(default_factory=dict)   # {axis: measured relative error, None where not measured}

    @property
    def seconds(self) -> float:
        return self.forward_s + self.backward_s + self.apart_s

    def kernels(self) -> dict:
        """{axis: compression and decompression seconds}."""
        return {axis: st.compress_s + st.decompress_s for axis, st in self.stats.items()}


@dataclass
class RoutingTiming(AxisTiming):
    """Expert parallelism's timing, with the MoE layers' token assignments routed and dropped."""

    routed: int = 0
    dropped: int = 0


@dataclass
class ReductionTiming(AxisTiming):
    """Data parallelism's timing, with error feedback's contraction on the steps that measure
    (``Comm.take_contraction``; None elsewhere)."""

    contraction: float | None = None


@runtime_checkable
class AxisRuntime(Protocol):
    """A parallel runtime of the step (module doc)."""

    axis_names: tuple[str, ...]

    def start_step(self, measure: bool) -> None: ...

    def take(self) -> AxisTiming: ...


def meter(measure: bool, size: int):
    """A fresh error meter on a ``measure`` step of a group of more than one rank, else None."""
    return RelativeError() if measure and size > 1 else None


def value(error) -> float | None:
    return error.value() if error is not None else None


def exposed(timings: list[AxisTiming], axes) -> tuple[dict, dict]:
    """({phase: exposed seconds}, {axis: kernel seconds}) of the runtimes' ``timings`` over the
    reported ``axes``: each runtime's seconds minus its kernels, never below 0."""
    phases, kernels = {}, {}
    for t in timings:
        mine = {axis: s for axis, s in t.kernels().items() if axis in axes}
        if not mine:
            continue
        phase = phase_of(next(iter(mine)))
        phases[phase] = phases.get(phase, 0.0) + max(0.0, t.seconds - sum(mine.values()))
        kernels.update(mine)
    return phases, kernels


__all__ = ["AxisRuntime", "AxisTiming", "ReductionTiming", "RoutingTiming", "exposed", "meter", "value"]
