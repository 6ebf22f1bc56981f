"""The benchmark configuration: typed, validated, serialised in one place.

A ``BenchConfig`` crosses the process boundary to every rank as JSON (``to_json`` /
``from_json``); its cases are ``BenchCase`` (size, compressor, algorithm). ``BenchConfig.grid``
builds the usual sizes x compressors x algorithms product; validation and calibration pass
their own case lists.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from perfmodel.compression import compile_spec
from realrun.comm.names import RUNTIME_ALGORITHMS, OP_TIMEOUT_S
from topologies import bounds
from topologies.errors import InputError

BENCH_OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall")
BACKENDS = ("gloo", "nccl")
RUN_TIMEOUT_S = 1800.0


@dataclass(frozen=True, kw_only=True)
class BenchCase:
    """One timed collective: ``size_bytes`` of float32 under ``compressor`` with ``algorithm``."""

    size_bytes: int
    compressor: str
    algorithm: str = "auto"

    def __post_init__(self):
        if isinstance(self.size_bytes, bool) or not isinstance(self.size_bytes, int) or self.size_bytes < 4:
            raise InputError("size_bytes", self.size_bytes, "an integer >= 4 (one float32)")
        compile_spec(self.compressor)
        if self.algorithm != "auto" and self.algorithm not in RUNTIME_ALGORITHMS:
            raise InputError("algorithm", self.algorithm, "auto or one of " + ", ".join(RUNTIME_ALGORITHMS))


def _positive(field_name: str, value, low=1, high=math.inf):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InputError(field_name, value, f"a number from {low} to {high}")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Everything a rank needs to run a collective benchmark (module doc)."""

    op: str
    cases: tuple[BenchCase, ...]
    backend: str = "gloo"
    iters: int = 5
    warmup: int = 1
    world: int = 2                    # local ranks started by run_collectives (a launcher sets its own)
    threads: int = 1                  # CPU threads per local rank
    op_timeout_s: float = OP_TIMEOUT_S
    timeout_s: float = RUN_TIMEOUT_S
    extra: dict = field(default_factory=dict, compare=False)   # free-form provenance, carried as is

    def __post_init__(self):
        if self.op not in BENCH_OPS:
            raise InputError("op", self.op, "one of " + ", ".join(BENCH_OPS))
        if self.backend not in BACKENDS:
            raise InputError("backend", self.backend, "one of " + ", ".join(BACKENDS))
        if not self.cases:
            raise InputError("cases", [], "at least one (size, compressor, algorithm)")
        _positive("iters", self.iters)
        _positive("warmup", self.warmup, 0)
        _positive("world", self.world, 1, 64)
        object.__setattr__(self, "threads", bounds.check("threads", self.threads))
        _positive("op_timeout_s", self.op_timeout_s, 1, 86400)
        _positive("timeout_s", self.timeout_s, 1, 7 * 86400)

    @classmethod
    def grid(cls, *, op: str, sizes, compressors, algorithms=("auto",), **settings) -> BenchConfig:
        """sizes x compressors x algorithms (algorithms apply to allreduce only)."""
        algs = list(algorithms) if op == "allreduce" else ["auto"]
        cases = tuple(BenchCase(size_bytes=s, compressor=c, algorithm=a) for s in sizes for c in compressors
                      for a in algs)
        return cls(op=op, cases=cases, **settings)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchConfig:
        raw = json.loads(text)
        raw["cases"] = tuple(BenchCase(**c) for c in raw["cases"])
        return cls(**raw)

    def with_backend(self, backend: str) -> BenchConfig:
        return BenchConfig(**{**self.__dict__, "backend": backend})
