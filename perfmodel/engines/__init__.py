"""Engines: what times a step, behind one interface, looked up by name.

An engine takes a ``StepInputs`` (the model, the validated plan, where it runs, the policy) and
returns a ``StepTiming`` (the breakdown, the tally of wire bytes, errors and kernels, the
per-stage times the trace draws, and its simulation if it ran one). ``analytical`` prices every
event in closed forms and runs the pipeline schedule operation by operation; ``des`` runs the
same stage costs as events with link sharing (``perfmodel.simulate``) and reports the
difference as ``contention_s``. Adding an engine is one module in this package that registers
itself (``register``); ``engine_for`` and ``engine_names`` import every module here.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cache
from typing import Protocol

from topologies import InputError


@dataclass(frozen=True, eq=False)
class Env:
    """Where the step runs: the built cluster, its (calibrated) device, the profile if any."""

    built: object
    dev: object
    calib: object
    overlap_slowdown: float


@dataclass(frozen=True, eq=False)
class StepInputs:
    """What an engine times: the workload, the validated plan, where, under which policy."""

    model: object
    plan: object
    env: Env
    policy: object


@dataclass(eq=False)
class StepTiming:
    """An engine's answer (module doc): ``stage_events`` every stage's CommEvents, ``simulation``
    and ``simulated_events`` what the des engine ran (None and 0 analytical)."""

    breakdown: object
    tally: object
    stages: list
    stage_events: list
    simulation: object = None
    simulated_events: int = 0


class Engine(Protocol):
    name: str

    def time_step(self, step: StepInputs) -> StepTiming: ...


ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    ENGINES[engine.name] = engine
    return engine


def engine_for(name: str) -> Engine:
    """The engine called ``name``; an unknown name is an InputError naming the choices."""
    _load()
    if name not in ENGINES:
        raise InputError("engine", name, " or ".join(ENGINES))
    return ENGINES[name]


def engine_names() -> tuple[str, ...]:
    """The names of the registered engines, analytical first: the choices a CLI's ``--engine`` offers."""
    _load()
    return tuple(ENGINES)


@cache
def _load() -> None:
    """Import every module of this package once: each engine registers itself (analytical first)."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__))
    for name in ["analytical"] + [n for n in names if n != "analytical"]:
        importlib.import_module(f"{__name__}.{name}")
