"""Pipeline schedules, operation by operation, and the time they take.

``stage_ops`` lists what one stage runs: ("F", i) / ("B", i) for microbatch i (GPipe: every
forward, then every backward; 1F1B: ``pp - s - 1`` warm-up forwards on stage s, then one
forward and one backward alternately, then the remaining backwards). realrun's trainer runs
exactly these lists. Interleaved 1F1B (Narayanan et al. SC21, as Megatron-LM's
``forward_backward_pipelining_with_interleaving`` orders it) gives each stage V model chunks,
chunk c of stage s being virtual stage ``c p + s``; its operations are ("F", i, c) / ("B", i, c):
forwards walk microbatches in groups of p through chunk 0, then chunk 1, ...; backwards the
same through the chunks in reverse; ``2 (p - s - 1) + (V - 1) p`` warm-up forwards, then
alternation. Each chunk operation takes 1/V of the stage's time; every chunk boundary is a
transfer (the last stage's chunk c sends to the first stage's chunk c + 1).

``run_schedule`` times them. Between two operations a stage makes one exchange, as Megatron's
``send_forward_recv_backward`` and realrun's ``Comm.exchange`` do: it sends what the previous
operation produced and receives what the next one needs, both posted together, and goes on
when both are done (under interleaving a stage waits only for what it receives: its sends
are posted and left, as Megatron's batched isend/irecv of that schedule; waiting for both
deadlocks its order). A transfer starts once its sender and its receiver have both posted it
(a rendezvous: NCCL's and gloo's point-to-point messages of this size) and its directed link
is free (messages on one link go in order), and takes the transfer time of its direction.
This is an exact evaluation of the schedule's dependency graph, not a closed form: with free
transfers it gives the familiar ``(m + p - 1)`` stage times for uniform stages; with costly
ones it charges a transfer where a stage waits for it, not once per microbatch and again in
the bubble (docs/design.md, Pipeline timeline). Cost grows with stages x microbatches.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

SCHEDULES = ("gpipe", "1f1b", "interleaved")
BLOCKING = ("gpipe", "1f1b")   # exchanges wait for sends too (realrun's, Megatron's send_*_recv_*)


def stage_ops(name: str, stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[tuple]:
    """The operations of ``stage`` in order (module doc); ``chunks``: V of ``interleaved``."""
    m = microbatches
    if name == "interleaved":
        return _interleaved_ops(stage, stages, m, chunks)
    if name == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def _interleaved_ops(s: int, p: int, m: int, v: int) -> list[tuple[str, int, int]]:
    if m % p:
        raise ValueError(f"interleaving needs microbatches ({m}) divisible by stages ({p})")

    def unit(k: int, forward: bool) -> tuple[int, int]:
        group, pos = divmod(k, p * v)
        chunk = pos // p
        return group * p + pos % p, chunk if forward else v - 1 - chunk

    total = m * v
    warm = min(total, 2 * (p - s - 1) + (v - 1) * p)
    ops = [("F", *unit(k, True)) for k in range(warm)]
    for k in range(total - warm):
        ops += [("F", *unit(warm + k, True)), ("B", *unit(k, False))]
    return ops + [("B", *unit(k, False)) for k in range(total - warm, total)]


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
    ops: tuple = ()            # (stage, "F" or "B", microbatch, start s, end s[, chunk])
    transfers: tuple = ()      # ("act" or "grad", microbatch, from stage, to stage[, chunk], start s, end s)


@lru_cache(maxsize=1024)
def exchanges(name: str, s: int, p: int, m: int, chunks: int = 1) -> tuple:
    """Per operation: (transfers of the exchange before it, the operation); a last exchange
    with the final send and None. A transfer is (kind, microbatch, from stage, to stage), with
    the sending chunk appended under interleaving. Cached (the same shapes recur)."""
    out, pending = [], None
    for op in stage_ops(name, s, p, m, chunks):
        kind, i = op[0], op[1]
        here = (op[2] if len(op) > 2 else 0) * p + s            # virtual stage
        recv = None
        if kind == "F" and here > 0:
            recv = _transfer("act", i, here - 1, s, p, chunks)
        elif kind == "B" and here < p * chunks - 1:
            recv = _transfer("grad", i, here + 1, s, p, chunks)
        out.append((tuple(t for t in (pending, recv) if t), op))
        pending = _transfer("act", i, here, (here + 1) % p, p, chunks) if kind == "F" and here < p * chunks - 1 \
            else _transfer("grad", i, here, (here - 1) % p, p, chunks) if kind == "B" and here > 0 else None
    out.append(((pending,) if pending else (), None))
    return tuple(out)


def _transfer(kind: str, i: int, sender: int, to: int, p: int, chunks: int):
    """The transfer from virtual stage ``sender`` to stage ``to``; None inside one GPU (p = 1)."""
    src = sender % p
    if src == to:
        return None
    return (kind, i, src, to) + ((sender // p,) if chunks > 1 else ())


def run_schedule(name: str, stages: list[StageCost], microbatches: int, chunks: int = 1) -> Timeline:
    """Time ``microbatches`` through ``stages`` under schedule ``name`` (module doc). Cached:
    policies that change only what runs after the pipeline (gradients, ZeRO-1/2 gathers) give
    the same stage costs, and a search meets them many times."""
    return _run_schedule(name, tuple(stages), microbatches, chunks)


@lru_cache(maxsize=4096)
def _run_schedule(name: str, stages: tuple, microbatches: int, chunks: int) -> Timeline:
    if name not in SCHEDULES:
        raise ValueError(f"schedule {name!r}: one of {', '.join(SCHEDULES)}")
    p, m = len(stages), microbatches
    plans = [exchanges(name, s, p, m, chunks) for s in range(p)]
    blocking = name in BLOCKING
    pos, clock, busy = [0] * p, [0.0] * p, [0.0] * p
    posted: dict = {}      # transfer -> {stage: time it posted it}
    done: dict = {}        # transfer -> end time
    ops, moved = [], []
    link_free: dict = {}   # (from, to) -> time the link is next free
    waiting = set(range(p))

    def advance(s: int) -> bool:
        """Run stage ``s``'s next exchange and operation if what it waits for is there."""
        transfers, op = plans[s][pos[s]]
        for t in transfers:
            posted.setdefault(t, {}).setdefault(s, clock[s])
        awaited = [t for t in transfers if blocking or t[3] == s]
        if not all(t in done or len(posted[t]) == 2 for t in awaited):
            return False
        for t in transfers:
            if t not in done and len(posted[t]) == 2:
                kind, _, src, dst = t[:4]
                cost = stages[src].send_fwd if kind == "act" else stages[src].send_bwd
                start = max(max(posted[t].values()), link_free.get((src, dst), 0.0))
                done[t] = link_free[(src, dst)] = start + cost
                moved.append((*t, start, start + cost))
        clock[s] = max([clock[s]] + [done[t] for t in awaited])
        if op is not None:
            d = (stages[s].fwd if op[0] == "F" else stages[s].bwd) / chunks
            ops.append((s, op[0], op[1], clock[s], clock[s] + d) + tuple(op[2:]))
            clock[s] += d
            busy[s] += d
        pos[s] += 1
        return True

    while waiting:      # each stage runs as far as it can (messages on a link still match in order)
        progressed = False
        for s in sorted(waiting):
            while pos[s] < len(plans[s]) and advance(s):
                progressed = True
            if pos[s] == len(plans[s]):
                waiting.discard(s)
        if not progressed:
            raise RuntimeError(f"schedule {name} deadlocks on {p} stages x {m} microbatches")
    return Timeline(end_s=max(clock), busy_s=tuple(busy), finish_s=tuple(clock), ops=tuple(ops),
                    transfers=tuple(moved))
