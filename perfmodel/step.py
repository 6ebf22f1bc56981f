"""The analytical step time: events costed on the fabric, a pipeline schedule, DP overlap.

Per stage s and microbatch: ``T_s = fwd + bwd (recompute included) + TP comm + PP send/recv
+ compression kernels + ZeRO-3 exposed gathers``. With m microbatches the pipeline runs
``m T_max + (sum_s T_s - T_max) / V`` (1F1B and GPipe: fill and drain pass every stage once;
interleaving with V virtual stages divides that bubble by V, Narayanan et al. SC21; for
uniform stages this is the familiar (m + p - 1) T). DP buckets become ready evenly through
the last backward of stage 0 (which ends the pipeline) and run back to back on their own
stream; only the tail after that backward is exposed. Compute that runs beside the DP
traffic is slowed by ``overlap_slowdown`` (a fraction of the overlapped time: SMs and
memory bandwidth taken by communication and compression kernels; 0.1 is an assumption
until calibrated). ZeRO parameter all-gathers after the optimizer step and the tied-embedding
all-reduce are exposed. Kernel time of compressed collectives on the critical path is
charged to ``compression_s`` first (the rest of the collective to its axis).
"""
from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_OVERLAP_SLOWDOWN = 0.1


@dataclass
class StageTime:
    """Per-microbatch seconds of one stage, by kind."""

    compute: float = 0.0
    tp: float = 0.0
    pp: float = 0.0
    compression: float = 0.0
    zero3: float = 0.0
    bwd: float = 0.0          # the backward part (for the DP overlap window)
    hardware_flops: float = 0.0   # FLOPs executed per microbatch, recompute included (not time)

    @property
    def total(self) -> float:
        return self.compute + self.tp + self.pp + self.compression + self.zero3


@dataclass
class Breakdown:
    compute_s: float = 0.0
    tp_comm_s: float = 0.0
    pp_comm_s: float = 0.0
    dp_comm_exposed_s: float = 0.0
    compression_s: float = 0.0
    bubble_s: float = 0.0
    optimizer_s: float = 0.0
    overlap_slowdown_s: float = 0.0

    @property
    def total(self) -> float:
        return sum(vars(self).values())


def split_kernel(record) -> tuple[float, float]:
    """(communication s, kernel s) of a collective record; kernel time is charged first."""
    kernel = min(record.kernel_time_s, record.time_s)
    return record.time_s - kernel, kernel


def overlap_buckets(runs, window: float) -> tuple[float, float]:
    """(exposed tail, overlapped busy time) of bucket runs on one stream against a backward
    window ending at ``window``. A run is (first ready s, spacing s, count, duration s): its
    buckets are ready at first + k spacing and run in order, each after the previous finished.
    Closed form per run: finish = max(previous finish + n d, first + n d + max(0, (n-1)(r-d)))."""
    finish, busy = 0.0, 0.0
    for first, spacing, count, dur in runs:
        late = first + count * dur + max(0.0, (count - 1) * (spacing - dur))
        finish = max(finish + count * dur, late)
        busy += count * dur
    exposed = max(0.0, finish - window)
    return exposed, busy - exposed


def pipeline_time(stages: list[StageTime], microbatches: int, virtual: int) -> tuple[float, float, int]:
    """(pipeline seconds, bubble seconds, bottleneck stage index)."""
    totals = [s.total for s in stages]
    worst = max(range(len(stages)), key=totals.__getitem__)
    bubble = (sum(totals) - totals[worst]) / virtual
    return microbatches * totals[worst] + bubble, bubble, worst


@dataclass
class Tally:
    """Wire bytes per axis and tier, per rank per step; and the error of each axis."""

    wire: dict = field(default_factory=dict)
    error: dict = field(default_factory=dict)
    algorithms: dict = field(default_factory=dict)

    def add(self, event, record, count: float) -> None:
        """Count ``record`` ``count`` times for ``event`` (events of one name share an entry)."""
        axis = self.wire.setdefault(event.axis, {})
        for tier, nbytes in record.wire_bytes.items():
            axis[tier] = axis.get(tier, 0.0) + nbytes * count
        self.error[event.axis] = max(self.error.get(event.axis, 0.0), record.error_estimate)
        self.algorithms[event.name] = f"{record.op}:{record.algorithm}:{record.compressor}"
