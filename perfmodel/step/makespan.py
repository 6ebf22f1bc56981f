"""A pipeline schedule's time without the operation loop: its graph, derived once, on arrays of plans.

``schedule.run_schedule`` steps every stage through its exchanges and operations. What it decides
(which transfer a stage waits for, in which order a directed link carries its messages) depends
only on the shape (schedule, stages p, microbatches m, chunks V), never on the times: each value
it computes is the max of values computed before plus one time (a forward, a backward, a
transfer), so the step is the longest path of a fixed graph, a max-plus linear function of the
stages' times. ``program`` replays ``run_schedule`` once per shape on node numbers instead of
seconds and keeps that graph (cached): node = max(its inputs) + one coefficient, numbered by
depth. ``makespans`` evaluates it for N plans at once with numpy, one depth at a time (a few
array operations per depth, none per plan or operation), and each node performs the same
floating-point operations as ``run_schedule`` does, so the two agree to the last bit (tested by
hypothesis on random stage times). Times must be >= 0 (a max with the start, 0, is dropped).
Link sharing between transfers is not a max-plus function of the times: the event engine
(``perfmodel.simulate``) stays the reference for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from perfmodel.step.schedule import SCHEDULES, _compiled

@dataclass(frozen=True, eq=False)
class Program:
    """The graph of one shape: nodes by depth (node 0 is the start, 0 s); per depth a slice of
    nodes, their inputs (k x w node numbers, padded by repeating the first) and coefficient rows
    (0: none; 1 + s forward, 1 + p + s backward, 1 + 2p + s activation send, 1 + 3p + s gradient
    send of stage s); the node of each stage's last exchange; each stage's operations as
    forward (True) or backward, in order (their seconds are summed as run_schedule sums them)."""

    p: int
    chunks: int
    nodes: int
    depths: tuple
    last: np.ndarray
    forward_ops: np.ndarray


@lru_cache(maxsize=512)
def program(name: str, p: int, m: int, chunks: int = 1) -> Program:
    """The graph of schedule ``name`` on ``p`` stages x ``m`` microbatches (module doc)."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule {name!r}: one of {', '.join(SCHEDULES)}")
    plans, links, _ = _compiled(name, p, m, chunks)
    graph = _Graph()
    clock, ops = _replay(plans, links, p, graph), [[] for _ in range(p)]
    for s in range(p):
        ops[s] = [code == 1 for _, _, code, _ in plans[s] if code]
    return graph.freeze(p, chunks, clock, np.array(ops, dtype=bool).reshape(p, -1))


class _Graph:
    """Nodes as they are made: inputs, coefficient row, depth; a node that would only add 0 to
    one input is that input."""

    def __init__(self) -> None:
        self.inputs, self.coef, self.depth = [()], [0], [0]

    def node(self, inputs, coef: int) -> int:
        ins = tuple(dict.fromkeys([i for i in inputs if i]))      # the start (0) never exceeds a time >= 0
        if not ins:
            ins = (0,)
        if coef == 0 and len(ins) == 1:
            return ins[0]
        self.inputs.append(ins)
        self.coef.append(coef)
        self.depth.append(1 + max(map(self.depth.__getitem__, ins)))
        return len(self.coef) - 1

    def freeze(self, p: int, chunks: int, clock: list, forward_ops: np.ndarray) -> Program:
        depth = np.array(self.depth)
        order = np.argsort(depth, kind="stable")       # node 0 (depth 0) stays first
        number = np.empty_like(order)
        number[order] = np.arange(len(order))
        bounds = np.searchsorted(depth[order], np.arange(1, depth.max() + 2))
        width = max(map(len, self.inputs))
        lengths = np.fromiter(map(len, self.inputs), dtype=np.int64, count=len(self.inputs))
        padded = number[np.array([i + i[:1] * (width - len(i)) if i else (0,) * width for i in self.inputs])]
        coefs = np.array(self.coef)         # inputs padded by repeating the first (node 0 has none)
        depths = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            if hi <= lo:
                continue
            old = order[lo:hi]
            k = int(lengths[old].max())
            depths.append((int(lo), int(hi), padded[old, :k].T.copy(), coefs[old]))
        return Program(p=p, chunks=chunks, nodes=len(order), depths=tuple(depths),
                       last=number[np.array(clock)], forward_ops=forward_ops)


def _replay(plans, links, p: int, graph: _Graph) -> list:
    """``run_schedule``'s loop with node numbers for seconds (None: not posted or not done): a
    woken stage runs its steps until one waits for a transfer its peer has not posted."""
    n = len(links)
    sent, taken, done = [None] * n, [None] * n, [None] * n
    link_free = [0] * (p * p)                      # per directed link (src p + dst): its last transfer
    link_of = [src * p + dst for src, dst, _ in links]
    row_of = [1 + (2 + kind) * p + src for src, _, kind in links]
    node = graph.node
    pos, clock = [0] * p, [0] * p
    wake = set(range(p))
    while wake:
        s = min(wake)
        wake.discard(s)
        steps, k, now = plans[s], pos[s], clock[s]
        while k < len(steps):
            tids, awaited, code, _ = steps[k]
            for t in tids:
                src, dst, _ = links[t]
                if src == s:
                    if sent[t] is None:
                        sent[t] = now
                        if taken[t] is not None:
                            wake.add(dst)
                elif taken[t] is None:
                    taken[t] = now
                    if sent[t] is not None:
                        wake.add(src)
            if not _ready(awaited, sent, taken, done):
                break
            for t in tids:
                if done[t] is None and sent[t] is not None and taken[t] is not None:
                    link = link_of[t]
                    done[t] = link_free[link] = node((sent[t], taken[t], link_free[link]), row_of[t])
            now = node((now, *[done[t] for t in awaited]), 1 + (code - 1) * p + s if code else 0)
            k += 1
        pos[s], clock[s] = k, now
    if any(pos[s] < len(plans[s]) for s in range(p)):
        raise RuntimeError(f"schedule deadlocks on {p} stages x {len(plans[0])} steps")
    return clock


def _ready(awaited, sent, taken, done) -> bool:
    """Whether every awaited transfer is done or posted by both ends (a loop: faster than all())."""
    for t in awaited:  # noqa: SIM110
        if done[t] is None and (sent[t] is None or taken[t] is None):
            return False
    return True


def makespans(name: str, microbatches: int, fwd, bwd, send_fwd, send_bwd, chunks: int = 1):
    """For N plans of p stages (arrays N x p of per-microbatch seconds, as ``StageCost``):
    (end s (N), busy s (N x p), each stage's finish s (N x p)), equal to ``run_schedule``'s
    ``end_s``, ``busy_s`` and ``finish_s`` for each plan."""
    fwd, bwd = np.asarray(fwd, dtype=float), np.asarray(bwd, dtype=float)
    n, p = fwd.shape
    prog = program(name, p, microbatches, chunks)
    run_f, run_b = fwd / chunks, bwd / chunks
    coef = np.concatenate([np.zeros((1, n)), run_f.T, run_b.T, np.asarray(send_fwd, dtype=float).T / chunks,
                           np.asarray(send_bwd, dtype=float).T / chunks])   # a microbatch's sends, one per chunk
    groups = -(-n // max(_MIN_COLUMNS, _BUFFER_BYTES // (8 * prog.nodes)))
    width = -(-n // groups)
    values = np.empty((prog.nodes, min(width, n)))     # one buffer, reused by each group of plans
    finish = np.concatenate([_evaluate(prog, coef[:, lo:lo + width], values) for lo in range(0, n, width)],
                            axis=1).T
    return finish.max(axis=1), _busy(prog.forward_ops, run_f, run_b), finish


_BUFFER_BYTES = 256 << 20     # the node values of a group of plans: a big graph's are evaluated a group at a time
_MIN_COLUMNS = 128            # (each column is one plan's, independent of the others; the numbers are the same)


def _evaluate(prog: Program, coef: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """Each stage's finish (p x k) for the k plans of ``coef``'s columns, ``buffer`` holding the nodes."""
    values = buffer[:, :coef.shape[1]]
    values[0] = 0.0
    for lo, hi, ins, rows in prog.depths:
        acc = values[ins[0]]
        for more in ins[1:]:
            np.maximum(acc, values[more], out=acc)
        np.add(acc, coef[rows], out=values[lo:hi])
    return values[prog.last]


def _busy(forward_ops: np.ndarray, run_f: np.ndarray, run_b: np.ndarray) -> np.ndarray:
    """Each stage's operation seconds summed one by one in its order (as ``run_schedule``)."""
    out = np.zeros(run_f.shape)
    for is_f in forward_ops.T:                 # the k-th operation of every stage
        out += np.where(is_f, run_f, run_b)
    return out
