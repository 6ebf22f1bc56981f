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
the bubble (docs/design.md, Pipeline timeline). Cost grows with stages x microbatches, so
a schedule is listed and timed one by one up to ``topologies.bounds``' ``schedule_operations``
(InputError past it); a step time of a longer one comes from a shorter one where its steady
part repeats (``settled``: each extra micro-batch then moves the end by one shift).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from topologies import bounds
from topologies.errors import InputError

SCHEDULES = ("gpipe", "1f1b", "interleaved")
BLOCKING = ("gpipe", "1f1b")   # exchanges wait for sends too (realrun's, Megatron's send_*_recv_*)


def stage_ops(name: str, stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[tuple]:
    """The operations of ``stage`` in order (module doc); ``chunks``: V of ``interleaved``."""
    m = microbatches
    check_operations(stages, m, chunks)
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
    (activation to the next stage, gradient to the previous one). Interleaved, a microbatch runs V
    chunks and sends V times: each chunk's operation and transfer takes 1/V of these."""

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
    out, pending, last = [], None, p * chunks - 1
    for op in stage_ops(name, s, p, m, chunks):
        kind, i = op[0], op[1]
        here = op[2] * p + s if len(op) > 2 else s            # virtual stage
        if kind == "F":
            recv = _transfer("act", i, here - 1, s, p, chunks) if here > 0 else None
        else:
            recv = _transfer("grad", i, here + 1, s, p, chunks) if here < last else None
        out.append(((pending, recv) if pending and recv else (pending,) if pending else (recv,) if recv else (), op))
        pending = _transfer("act", i, here, (here + 1) % p, p, chunks) if kind == "F" and here < last \
            else _transfer("grad", i, here, (here - 1) % p, p, chunks) if kind == "B" and here > 0 else None
    out.append(((pending,) if pending else (), None))
    return tuple(out)


def _transfer(kind: str, i: int, sender: int, to: int, p: int, chunks: int):
    """The transfer from virtual stage ``sender`` to stage ``to``; None inside one GPU (p = 1)."""
    src = sender % p
    if src == to:
        return None
    return (kind, i, src, to) + ((sender // p,) if chunks > 1 else ())


def run_schedule(name: str, stages: list[StageCost], microbatches: int, chunks: int = 1,
                 record: bool = True) -> Timeline:
    """Time ``microbatches`` through ``stages`` under schedule ``name`` (module doc); ``record``:
    keep every operation and transfer (a trace needs them, a step time does not). Cached:
    policies that change only what runs after the pipeline (gradients, ZeRO-1/2 gathers) give
    the same stage costs, and a search meets them many times. Without ``record``, a schedule of
    more than ``EXACT_OPERATIONS`` operations is timed on fewer micro-batches and extrapolated where
    it has settled into a repeating pattern (``settled``); every other one operation by operation,
    at most ``topologies.bounds`` ``schedule_operations`` of them (InputError past it)."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule {name!r}: one of {', '.join(SCHEDULES)}")
    stages = tuple(stages)
    if record or len(stages) * microbatches * chunks <= EXACT_OPERATIONS:
        return _run_schedule(name, stages, microbatches, chunks, record)
    return _extrapolated(name, stages, microbatches, chunks)


EXACT_OPERATIONS = 2**16     # stages x micro-batches x chunks always timed one by one (~1 s; published runs ~3e4)


def check_operations(p: int, m: int, chunks: int) -> None:
    """Refuse a schedule of more operations (stages x micro-batches x chunks) than ``topologies.bounds``'s
    ``schedule_operations`` (each is listed, and timed one by one unless the schedule settles)."""
    most = int(bounds.bound("schedule_operations")[2])
    if p * m * chunks > most:
        raise InputError("microbatches", m, f"at most {most // (p * chunks)} micro-batches (gbs / (mbs x dp)) on "
                         f"{p} stages x {chunks} chunks: a schedule is listed operation by operation up to {most} "
                         "operations (past them only the analytical engine's step time, and only of a schedule "
                         "that settles into a repeating pattern)")


# Extrapolation (``settled``). The schedule's values (each stage's clock after each step, each
# transfer's end) are max-plus functions of earlier ones: the max of some plus one time. In the
# steady part of a stage's steps (1F1B: after its warm-up forwards, one forward and one backward
# per micro-batch; interleaved: p micro-batches of V chunks; GPipe: its forwards, then its
# backwards, two such parts) one more micro-batch inserts one more *period* of steps, with the
# same operations and transfers, its micro-batches numbered on. Where the values of the last
# ``WINDOW`` periods (every stage's, every transfer's) are those of c periods earlier plus one
# shift per part, they stay so in every later period (a max-plus map commutes with adding a
# constant, and the steps after a window depend only on the window); a longer schedule is then
# this one with whole cycles of c periods inserted, each moving what follows by the shift. A
# map that is max-plus is non-expansive, so a window equal to within ``TOLERANCE`` of a shift keeps
# every later cycle so too: the extrapolated times are those of the schedule to that tolerance.
WINDOW = 4                   # periods compared: more than a step's reach into earlier periods
MARGIN = 2                   # periods left out at the end of each steady part (its cool-down reaches in)
MAX_CYCLE = 4                # periods c after which the values repeat, tried from 1
TOLERANCE = 1e-9             # a shift's agreement, relative to the shift


@lru_cache(maxsize=1024)
def _extrapolated(name: str, stages: tuple, m: int, chunks: int) -> Timeline:
    """``run_schedule`` of ``m`` micro-batches from a settled shorter one (comment above), else timed."""
    p = len(stages)
    period = p if name == "interleaved" else 1                 # micro-batches per period
    periods = WINDOW + MARGIN + MAX_CYCLE + 2
    most = bounds.bound("schedule_operations")[2] // 2
    while True:
        trial = _aligned(m, _warm(name, p, chunks) + periods * period, period)
        if trial >= m or p * trial * chunks > most:
            break
        found = settled(name, stages, trial, chunks)
        if found:
            trial = _aligned(m, trial, found[0] * period)           # whole cycles to insert
            found = settled(name, stages, trial, chunks)
            if found and (m - trial) % (found[0] * period) == 0:
                cycle = found[0] * period
                return _insert(_run_schedule(name, stages, trial, chunks, False), stages, chunks,
                               (m - trial) // cycle, cycle, sum(found[1]))
        periods *= 2
    return _run_schedule(name, stages, m, chunks, False)


def _aligned(m: int, least: int, step: int) -> int:
    """The smallest count >= ``least`` micro-batches that differs from ``m`` by whole ``step``s."""
    return least + (m - least) % step


def _warm(name: str, p: int, chunks: int) -> int:
    """Micro-batches the first stage's warm-up forwards span (the longest warm-up)."""
    if name == "interleaved":
        return -(-(2 * (p - 1) + (chunks - 1) * p) // chunks)
    return p - 1 if name == "1f1b" else 0


def _insert(base: Timeline, stages: tuple, chunks: int, cycles: int, microbatches: int, shift: float) -> Timeline:
    """``base`` with ``cycles`` cycles of ``microbatches`` micro-batches inserted, each moving the end by ``shift``."""
    finish = tuple(f + cycles * shift for f in base.finish_s)
    busy = tuple(b + cycles * microbatches * chunks * (st.fwd / chunks + st.bwd / chunks)
                 for b, st in zip(base.busy_s, stages))
    return Timeline(end_s=max(finish), busy_s=busy, finish_s=finish)


def steady_parts(name: str, s: int, p: int, m: int, chunks: int = 1) -> list[tuple[int, int, int]]:
    """Stage ``s``'s steady parts (comment above) as (first step, steps per period, whole periods)."""
    if name == "gpipe":
        return [(0, 1, m), (m, 1, m)]
    if name == "1f1b":
        warm = min(p - s - 1, m)
        return [(warm, 2, m - warm)]
    warm = min(m * chunks, 2 * (p - s - 1) + (chunks - 1) * p)
    return [(warm, 2 * p * chunks, (m * chunks - warm) // (p * chunks))]


def settled(name: str, stages: tuple, m: int, chunks: int = 1):
    """(c, shift of each steady part) where the last ``WINDOW`` periods of ``m`` micro-batches' schedule
    repeat those c periods earlier plus the part's shift (comment above); None where they do not."""
    p = len(stages)
    _, clocks, done = _simulate(name, stages, m, chunks, False, True)
    plans = _compiled(name, p, m, chunks)[0]
    parts = [steady_parts(name, s, p, m, chunks) for s in range(p)]
    for cycle in range(1, MAX_CYCLE + 1):
        shifts = [_shift([(plans[s], clocks[s], parts[s][k]) for s in range(p)], done, cycle)
                  for k in range(len(parts[0]))]
        if None not in shifts:
            return cycle, shifts
    return None


def _shift(rows: list, done: list, cycle: int) -> float | None:
    """The one shift by which every stage's values in the window repeat ``cycle`` periods later, or None."""
    end = min(count for _, _, (_, _, count) in rows) - MARGIN
    if end - cycle - WINDOW < 0:
        return None
    shift = None
    for steps, clock, (first, width, _) in rows:
        for k in range(first + (end - cycle - WINDOW) * width, first + (end - cycle) * width):
            later = k + cycle * width
            pairs = [(clock[k], clock[later])] + [(done[a], done[b]) for a, b in zip(steps[k][0], steps[later][0])]
            for before, after in pairs:
                if shift is None:
                    shift = after - before
                if abs(after - before - shift) > TOLERANCE * abs(shift):
                    return None
    return shift


@lru_cache(maxsize=256)
def _compiled(name: str, p: int, m: int, chunks: int) -> tuple:
    """The schedule's exchanges with transfers numbered: per stage its steps (transfer ids,
    awaited ids, operation code 0/1/2 for none/F/B, operation); per transfer (src, dst, kind
    0/1 for act/grad) and its tuple."""
    ids: dict = {}
    blocking = name in BLOCKING
    plans = []
    for s in range(p):
        steps = []
        for transfers, op in exchanges(name, s, p, m, chunks):
            tids = tuple([ids.setdefault(t, len(ids)) for t in transfers])
            awaited = tids if blocking else tuple([i for t, i in zip(transfers, tids) if t[3] == s])
            steps.append((tids, awaited, 0 if op is None else 1 if op[0] == "F" else 2, op))
        plans.append(tuple(steps))
    keys = tuple(ids)
    return tuple(plans), tuple((t[2], t[3], 0 if t[0] == "act" else 1) for t in keys), keys


def drive(plans, pos: list, advance, wake: set, deadlock: str) -> None:
    """Advance the stages in turn, each as far as it can (``advance(s)`` False: it waits on a
    peer), the lowest woken stage first (``advance`` wakes the peers it posts to), until none
    can; RuntimeError(``deadlock``) if a stage is left with steps it cannot take."""
    while wake:
        s = min(wake)
        wake.discard(s)
        while pos[s] < len(plans[s]) and advance(s):
            pass
    if any(pos[s] < len(plans[s]) for s in range(len(plans))):
        raise RuntimeError(deadlock)


@lru_cache(maxsize=4096)
def _run_schedule(name: str, stages: tuple, microbatches: int, chunks: int, record: bool) -> Timeline:
    return _simulate(name, stages, microbatches, chunks, record, False)[0]


def _simulate(name: str, stages: tuple, microbatches: int, chunks: int, record: bool, keep: bool) -> tuple:
    """(Timeline, each stage's clock after each of its steps, each transfer's end): the last two
    only with ``keep`` (else empty)."""
    p, m = len(stages), microbatches
    plans, links, keys = _compiled(name, p, m, chunks)
    sent = [-1.0] * len(links)        # when the sender posted each transfer
    taken = [-1.0] * len(links)       # when the receiver did
    done = [-1.0] * len(links)        # when it ended
    link_free = [[0.0] * p for _ in range(p)]   # messages on one directed link go in order
    send = [(st.send_fwd / chunks, st.send_bwd / chunks) for st in stages]   # a microbatch's sends, one per chunk
    run = [(0.0, st.fwd / chunks, st.bwd / chunks) for st in stages]
    pos, clock, busy = [0] * p, [0.0] * p, [0.0] * p
    ops, moved, clocks = [], [], [[] for _ in range(p)] if keep else None
    wake = set(range(p))     # stages that may advance: all at first, then those a peer posted to

    def advance(s: int) -> bool:
        """Run stage ``s``'s next exchange and operation if what it waits for is there."""
        tids, awaited, code, op = plans[s][pos[s]]
        now = clock[s]
        for t in tids:
            src, dst, _ = links[t]
            if src == s:
                if sent[t] < 0:
                    sent[t] = now
                    if taken[t] >= 0:
                        wake.add(dst)       # the receiver may be waiting for this
            elif taken[t] < 0:
                taken[t] = now
                if sent[t] >= 0:
                    wake.add(src)
        for t in awaited:
            if done[t] < 0 and (sent[t] < 0 or taken[t] < 0):
                return False
        for t in tids:
            if done[t] < 0 and sent[t] >= 0 and taken[t] >= 0:
                src, dst, kind = links[t]
                start = max(sent[t], taken[t], link_free[src][dst])
                done[t] = link_free[src][dst] = start + send[src][kind]
                if record:
                    moved.append((*keys[t], start, done[t]))
        for t in awaited:
            if done[t] > now:
                now = done[t]
        if code:
            d = run[s][code]
            if record:
                ops.append((s, op[0], op[1], now, now + d) + tuple(op[2:]))
            now += d
            busy[s] += d
        clock[s] = now
        pos[s] += 1
        if keep:
            clocks[s].append(now)
        return True

    drive(plans, pos, advance, wake, f"schedule {name} deadlocks on {p} stages x {m} microbatches")
    timeline = Timeline(end_s=max(clock), busy_s=tuple(busy), finish_s=tuple(clock), ops=tuple(ops),
                        transfers=tuple(moved))
    return timeline, clocks or (), done if keep else ()
