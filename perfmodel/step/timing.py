"""The analytical step time: events costed on the fabric, a pipeline schedule, DP overlap.

Per stage and microbatch, a forward and a backward operation each take their compute, their
TP collectives, their compression kernels and (ZeRO-3) their exposed gathers; the stage's
activation and gradient transfers are priced apart (``send_fwd``, ``send_bwd``, with their
kernels). GPipe and 1F1B are timed operation by operation (``perfmodel.step.schedule``; many plans
of one shape at once as that schedule's fixed graph, ``perfmodel.step.makespan``): a transfer costs
where a stage waits for it; for uniform stages and free transfers the familiar
``(m + p - 1) T``); interleaving with V virtual stages too (for uniform stages and free
transfers it gives ``m T + (p - 1) T / V``, Narayanan et al. SC21; tested). DP buckets become ready
evenly through the last backward of stage 0 (which ends the pipeline) and run back to back
on their own stream; only the tail after that backward is exposed. Compute that runs beside
the DP traffic is slowed by ``overlap_slowdown`` (a fraction of the overlapped time: SMs and
memory bandwidth taken by communication and compression kernels; 0.1 is an assumption until
calibrated). ZeRO parameter all-gathers after the optimizer step and the tied-embedding
all-reduce are exposed. Kernel time of compressed collectives on the critical path is
charged to ``compression_s`` first (the rest of the collective to its axis).
"""
from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

import numpy as np

from perfmodel.axes import ISSUE_ORDER, PHASE_NAMES, PHASES
from perfmodel.phases import Phase
from perfmodel.step.makespan import makespans
from perfmodel.step.schedule import EXACT_OPERATIONS, StageCost, run_schedule

DEFAULT_OVERLAP_SLOWDOWN = 0.1
# Compression kernels run on the GPU that computes. Beside compute (a DP bucket during backward,
# a ZeRO-3 gather during the previous layer) they are charged this fraction of their own time
# as compute they displace: 1.0, because the kernels are memory-bound at the rate they were
# measured alone and so are the layers' memory-bound parts; a lossy spec never costs 0 s.
KERNEL_SM_SHARE = 1.0


@dataclass
class StageTime:
    """Per-microbatch seconds of one stage, by kind; ``comm_s``: the wire seconds of each axis
    whose events sit on the critical path ({axis: seconds}: tp and pp)."""

    compute: float = 0.0
    comm_s: dict = field(default_factory=dict)
    compression: float = 0.0
    zero3: float = 0.0
    bwd: float = 0.0          # the backward part (for the DP overlap window)
    fwd_op: float = 0.0       # the forward operation: compute, TP, kernels, exposed gathers
    bwd_op: float = 0.0       # the backward operation, likewise
    pp_kernel: float = 0.0    # kernels of the stage's transfers (also in ``compression``)
    send_fwd: float = 0.0     # activation to the next stage, kernels included
    send_bwd: float = 0.0     # gradient to the previous stage, kernels included
    hardware_flops: float = 0.0   # FLOPs executed per microbatch, recompute included (not time)
    zero3_layers: tuple = ()  # ZeRO-3: (layers, fwd and bwd compute per layer, gather fwd, bwd, reduce-scatter)
    compute_parts: tuple = (0.0, 0.0, 0.0, 0.0)   # of ``compute``: GEMMs, attention, memory-bound, host-bound wait
    inner_fwd: float = 0.0    # of fwd_op: ep all-to-alls and cp's exposed ring (the trace draws them)
    inner_bwd: float = 0.0    # of bwd_op, likewise
    nic_fwd: float = 0.0      # of inner_fwd: all-to-alls whose ep group spans nodes (the des engine's NIC flows)
    nic_bwd: float = 0.0      # of inner_bwd, likewise
    ep_fwd: float = 0.0       # of fwd_op: the MoE all-to-alls' seconds, kernels included (before any overlap)
    ep_bwd: float = 0.0       # of bwd_op, likewise
    ep_kernel: float = 0.0    # of compression: the all-to-alls' kernels (both operations)
    ep_tax: float = 0.0       # compute slowed by the SMs of hidden all-to-alls (perfmodel.step.expert_overlap)
    ep_hidden: float = 0.0    # all-to-all seconds hidden behind another micro-batch's compute, per micro-batch
    ep_pair_s: float = 0.0    # of them, what one paired forward and backward hide together (the des engine's flow)
    ep_pair_nic: bool = False  # whether the all-to-alls cross nodes (their hidden flow on the NIC)

    def comm(self, axis: str) -> float:
        return self.comm_s.get(axis, 0.0)

    def add_comm(self, axis: str, seconds: float) -> None:
        self.comm_s[axis] = self.comm_s.get(axis, 0.0) + seconds

    @property
    def total(self) -> float:
        seconds = self.compute
        for axis in ISSUE_ORDER:           # the same sum, in the same order, whatever axes exist
            seconds += self.comm(axis)
        return seconds + self.compression + self.zero3 + self.ep_tax


class _Seconds:
    """What a ``Breakdown`` does besides holding its parts (below)."""

    @property
    def total(self) -> float:
        """The step's seconds: its parts added in ``PHASES``' order."""
        return sum(vars(self).values())

    def __getitem__(self, phase: Phase | str) -> float:
        return getattr(self, _key(phase))

    def __setitem__(self, phase: Phase | str, seconds: float) -> None:
        setattr(self, _key(phase), seconds)

    def add(self, phase: Phase | str, seconds: float) -> None:
        """Charge ``seconds`` more to ``phase`` (a Phase or its name)."""
        self[phase] += seconds

    def as_dict(self) -> dict:
        """{phase name: seconds}, every phase, in ``PHASES``' order (StepRecord.breakdown)."""
        return dict(vars(self))


def _key(phase: Phase | str) -> str:
    name = phase.name if isinstance(phase, Phase) else phase
    if name not in PHASE_NAMES:
        raise KeyError(f"{name!r} is no step phase (perfmodel.axes.PHASE_NAMES: {', '.join(PHASE_NAMES)})")
    return name


# One step's seconds by phase: a float field per phase of ``perfmodel.axes.PHASES`` (the fixed
# phases of ``perfmodel.phases`` and one per axis, declared on it), 0 unless charged; read and
# charged by phase (``b[TP_PHASE]``, ``b.add(COMPRESSION, s)``) or by name (``b.tp_comm_s``).
Breakdown = make_dataclass("Breakdown", [(p.name, float, field(default=0.0)) for p in PHASES], bases=(_Seconds,),
                           namespace={"__module__": __name__, "__doc__": "One step's seconds by phase "
                                      "(``perfmodel.axes.PHASES``: a float field each, 0 unless charged)."})


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


def pipeline_time(stages: list[StageTime], microbatches: int, virtual: int,
                  schedule: str = "1f1b") -> tuple[float, float, int]:
    """(pipeline seconds, bubble seconds, bottleneck stage index): the schedule timed operation
    by operation (interleaving with ``virtual`` chunks per stage too; ``pipeline_spans``). The
    bottleneck is the busiest stage; the bubble is what its idle time holds beyond its own
    transfers (see ``exposed_pp``)."""
    end, busy = pipeline_spans([stages], microbatches, virtual, schedule)
    return pipeline_from(stages, microbatches, end[0], busy[0])


def pipeline_spans(batch: list, microbatches: int, virtual: int, schedule: str = "1f1b") -> tuple[list, list]:
    """For plans of one shape (each a list of StageTimes, as many stages, the same microbatches,
    chunks and schedule): (pipeline seconds per plan, busy seconds per plan and stage), one
    evaluation of the schedule's graph for the distinct ones (``perfmodel.step.makespan``; one distinct
    plan: the operation loop, ``run_schedule``, cheaper there and the same to the last bit)."""
    rows: dict = {}
    index = [rows.setdefault(tuple(x for s in stages for x in (s.fwd_op, s.bwd_op, s.send_fwd, s.send_bwd)),
                             len(rows)) for stages in batch]
    name = "interleaved" if virtual > 1 else schedule
    stages = len(batch[0])
    if len(rows) == 1 or stages * microbatches * virtual > EXACT_OPERATIONS:
        # one plan: the operation loop is cheaper than deriving the graph (same numbers); a long
        # schedule: the loop extrapolates its steady state, the graph would be built per micro-batch
        timed = [run_schedule(name, [StageCost(*row[i:i + 4]) for i in range(0, len(row), 4)], microbatches,
                              virtual, record=False) for row in rows]
        return [timed[i].end_s for i in index], [list(timed[i].busy_s) for i in index]
    times = np.array(list(rows), dtype=float).reshape(len(rows), -1, 4)
    end, busy, _ = makespans(name, microbatches, times[..., 0], times[..., 1], times[..., 2], times[..., 3], virtual)
    end, busy = end.tolist(), busy.tolist()
    return [end[i] for i in index], [busy[i] for i in index]


def pipeline_from(stages: list[StageTime], microbatches: int, end: float, busy: list) -> tuple[float, float, int]:
    """``pipeline_time`` from the pipeline's seconds and each stage's busy seconds: the busiest
    stage (ties: the larger total, then the first), its bubble."""
    most = max(busy)
    worst = [i for i, b in enumerate(busy) if b == most]
    worst = worst[0] if len(worst) == 1 else max(worst, key=lambda i: stages[i].total)
    idle = max(0.0, end - busy[worst])
    return end, idle - exposed_pp(stages[worst], microbatches, idle)[0], worst


def zero3_forward(layers: int, compute: float, gather: float) -> float:
    """Seconds of one forward operation under ZeRO-3 with one layer of prefetch: a layer's
    parameter gather (``gather`` seconds) runs on the communication stream, issued when the
    previous layer starts computing (the first one before it); a layer computes once its gather
    is done and the previous layer is (DeepSpeed's prefetch; the event engine runs the same)."""
    return zero3_backward(layers, compute, gather, 0.0)


def zero3_backward(layers: int, compute: float, gather: float, reduce: float) -> float:
    """Seconds of one backward operation under ZeRO-3: layers in reverse, each waiting for its
    gathered parameters (the next one's gather issued as it starts), each followed by the
    reduce-scatter of its gradients (``reduce`` seconds); gathers and reduce-scatters share one
    stream in the order they are issued; the operation ends when the last one has. With
    ``reduce`` 0 it is the forward operation (``zero3_forward``)."""
    comm = ready = gather                     # the first layer's gather, issued with the operation
    t = 0.0
    for layer in range(layers):
        start = max(t, ready)
        if layer + 1 < layers:
            comm = ready = max(start, comm) + gather      # the next layer's, issued as this one starts
        t = start + compute
        if reduce:
            comm = max(t, comm) + reduce                   # this layer's gradients, as it ends
    return max(t, comm)


def exposed_pp(stage: StageTime, microbatches: int, idle: float) -> tuple[float, float]:
    """(pp seconds, pp kernel seconds) of ``idle`` seconds of a stage outside its operations:
    its own transfers' kernels first, then their wire time, the rest is bubble."""
    idle = max(0.0, idle)
    kernel = min(idle, microbatches * stage.pp_kernel)
    return kernel + min(idle - kernel, microbatches * stage.comm("pp")), kernel


@dataclass
class Tally:
    """Wire bytes per axis and tier, per rank per step; and the error of each axis."""

    wire: dict = field(default_factory=dict)
    error: dict = field(default_factory=dict)
    algorithms: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)   # {axis: {"critical_s", "beside_compute_s"}}

    def copy(self) -> Tally:
        return Tally(wire={a: dict(t) for a, t in self.wire.items()}, error=dict(self.error),
                     algorithms=dict(self.algorithms), kernels={a: dict(k) for a, k in self.kernels.items()})

    def add_kernel(self, axis: str, seconds: float, beside_compute: bool = False) -> None:
        """Kernel seconds per step charged on ``axis``: on the critical path, or beside compute."""
        if seconds <= 0:
            return
        kind = self.kernels.setdefault(axis, {"critical_s": 0.0, "beside_compute_s": 0.0})
        kind["beside_compute_s" if beside_compute else "critical_s"] += seconds

    def add(self, event, record, count: float) -> None:
        """Count ``record`` ``count`` times for ``event`` (events of one name share an entry)."""
        axis = self.wire.setdefault(event.axis, {})
        for tier, nbytes in record.wire_bytes.items():
            axis[tier] = axis.get(tier, 0.0) + nbytes * count
        self.error[event.axis] = max(self.error.get(event.axis, 0.0), record.error_estimate)
        self.algorithms[event.name] = f"{record.op}:{record.algorithm}:{record.compressor}"
