"""Pipeline schedules, operation by operation, and the time they take.

``stage_ops`` lists what one stage runs: ("F", i) / ("B", i) for microbatch i (GPipe: every
forward, then every backward; 1F1B: ``pp - s - 1`` warm-up forwards on stage s, then one
forward and one backward alternately, then the remaining backwards). realrun's trainer runs
exactly these lists.

``run_schedule`` times them. Between two operations a stage makes one exchange, as Megatron's
``send_forward_recv_backward`` and realrun's ``Comm.exchange`` do: it sends what the previous
operation produced and receives what the next one needs, both posted together, and goes on
when both are done. A transfer starts once its sender and its receiver have both posted it
(a rendezvous: NCCL's and gloo's point-to-point messages of this size) and its directed link
is free (messages on one link go in order), and takes the transfer time of its direction.
This is an exact evaluation of the schedule's dependency graph, not a closed form: with free
transfers it gives the familiar ``(m + p - 1)`` stage times for uniform stages; with costly
ones it charges a transfer where a stage waits for it, not once per microbatch and again in
the bubble (docs/design.md, Pipeline timeline). Cost grows with stages x microbatches.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b")


def stage_ops(name: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The operations of ``stage`` in order (module doc)."""
    m = microbatches
    if name == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


@dataclass(frozen=True)
class StageCost:
    """Per-microbatch seconds of one stage: its forward and backward operations (compute and
    whatever else blocks the stage: TP collectives, kernels) and its outgoing transfers
    (activation to the next stage, gradient to the previous one)."""

    fwd: float
    bwd: float
    send_fwd: float = 0.0
    send_bwd: float = 0.0


@dataclass(frozen=True)
class Timeline:
    end_s: float               # when the last stage finishes its last operation
    busy_s: tuple              # per stage: seconds in operations
    finish_s: tuple            # per stage: when its last exchange completed
    ops: tuple = ()            # (stage, "F" or "B", microbatch, start s, end s)
    transfers: tuple = ()      # ("act" or "grad", microbatch, from stage, to stage, start s, end s)


def exchanges(name: str, s: int, p: int, m: int) -> list[tuple[list, tuple | None]]:
    """Per operation: (transfers of the exchange before it, the operation); a last exchange
    with the final send and None. A transfer is (kind, microbatch, from stage, to stage)."""
    out, pending = [], None
    for kind, i in stage_ops(name, s, p, m):
        recv = None
        if kind == "F" and s > 0:
            recv = ("act", i, s - 1, s)
        elif kind == "B" and s < p - 1:
            recv = ("grad", i, s + 1, s)
        out.append(([t for t in (pending, recv) if t], (kind, i)))
        pending = ("act", i, s, s + 1) if kind == "F" and s < p - 1 else \
            ("grad", i, s, s - 1) if kind == "B" and s > 0 else None
    out.append(([pending] if pending else [], None))
    return out


def run_schedule(name: str, stages: list[StageCost], microbatches: int) -> Timeline:
    """Time ``microbatches`` through ``stages`` under schedule ``name`` (module doc)."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule {name!r}: one of {', '.join(SCHEDULES)}")
    p, m = len(stages), microbatches
    plans = [exchanges(name, s, p, m) for s in range(p)]
    pos, clock, busy = [0] * p, [0.0] * p, [0.0] * p
    posted: dict = {}      # transfer -> {stage: time it posted it}
    done: dict = {}        # transfer -> end time
    ops, moved = [], []
    link_free: dict = {}   # (from, to) -> time the link is next free
    waiting = set(range(p))
    while waiting:
        progressed = False
        for s in sorted(waiting):
            transfers, op = plans[s][pos[s]]
            for t in transfers:
                posted.setdefault(t, {}).setdefault(s, clock[s])
            if not all(t in done or len(posted[t]) == 2 for t in transfers):
                continue
            for t in transfers:
                if t not in done:
                    kind, _, src, dst = t
                    cost = stages[src].send_fwd if kind == "act" else stages[src].send_bwd
                    start = max(max(posted[t].values()), link_free.get((src, dst), 0.0))
                    done[t] = link_free[(src, dst)] = start + cost
                    moved.append((*t, start, start + cost))
            clock[s] = max([clock[s]] + [done[t] for t in transfers])
            if op is not None:
                d = stages[s].fwd if op[0] == "F" else stages[s].bwd
                ops.append((s, op[0], op[1], clock[s], clock[s] + d))
                clock[s] += d
                busy[s] += d
            pos[s] += 1
            if pos[s] == len(plans[s]):
                waiting.discard(s)
            progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {name} deadlocks on {p} stages x {m} microbatches")
    return Timeline(end_s=max(clock), busy_s=tuple(busy), finish_s=tuple(clock), ops=tuple(ops),
                    transfers=tuple(moved))
