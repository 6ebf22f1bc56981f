"""The predicted step as a timeline: Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing).

One process per pipeline stage (its ranks are alike: one is drawn), tracks ``compute`` (the
forward and backward operations of every microbatch, TP collectives and kernels inside them),
``send ->`` and ``send <-`` (activation and gradient transfers, each with a flow arrow to the
receiving stage), and after the pipeline ``after backward`` on stage 0: the exposed gradient
reduction, parameter gathers and the optimizer, as the analytical breakdown prices them. The
operations are those ``perfmodel.step.schedule.run_schedule`` timed (GPipe, 1F1B, interleaved 1F1B
with each model chunk's operations and transfers named by chunk). From the event engine
(``--engine des``) also a ``gradient buckets`` track, ZeRO-3's per-layer gathers and
reduce-scatters (one layer of prefetch) and counters of the busiest links (flows
sharing each stage's NIC over time). With expert or context parallelism an ``all-to-all, K/V
ring`` track shows, inside each operation, the seconds its MoE all-to-alls and cp's exposed
ring take (from the event engine: the simulated NIC flows of cross-node all-to-alls); with an
expert overlap (``--ep-overlap``) the event engine's ``hidden all-to-alls`` track shows each paired
forward and backward's all-to-alls running beside their compute (``SimResult.hidden_comm``).
``perfmodel.report.timeline`` draws the same events as a PNG.
"""
from __future__ import annotations

import json

from perfmodel.axes import DP
from perfmodel.phases import OPTIMIZER, OVERLAP_SLOWDOWN
from perfmodel.step.schedule import StageCost, run_schedule
from topologies.clikit import atomic_write

US = 1e6
COMPUTE, SEND_NEXT, SEND_PREV, AFTER, BUCKETS, LAYERS, INNER, HIDDEN = 0, 1, 2, 3, 4, 5, 6, 7
TRACKS = {COMPUTE: "compute", SEND_NEXT: "send ->", SEND_PREV: "send <-", AFTER: "after backward",
          BUCKETS: "gradient buckets", LAYERS: "ZeRO-3 gathers, reduce-scatters", INNER: "all-to-all, K/V ring",
          HIDDEN: "hidden all-to-alls"}
# the step phases drawn on stage 0 after the pipeline ("after backward"), in this order, with their slices' names
AFTER_PIPELINE = {DP.phase: "gradient reduction and gathers (exposed)", OPTIMIZER: "optimizer",
                  OVERLAP_SLOWDOWN: "compute slowed by overlapped traffic"}


def trace_events(stages, plan, breakdown: dict, label: str = "", first_pid: int = 0, sim=None) -> list[dict]:
    """Trace events of one step (``stages``: the step model's per-stage times; ``sim``: the event
    engine's run, whose operations, transfers and gradient buckets are drawn instead); its
    processes are numbered from ``first_pid`` (several steps, e.g. one per policy, in one trace)."""
    return [_offset(e, first_pid) for e in _events(stages, plan, breakdown, label, sim)]


def _offset(event: dict, first_pid: int) -> dict:
    return {**event, "pid": event["pid"] + first_pid} if first_pid else event


def _events(stages, plan, breakdown: dict, label: str, sim=None) -> list[dict]:
    if sim is None:
        costs = [StageCost(fwd=s.fwd_op, bwd=s.bwd_op, send_fwd=s.send_fwd, send_bwd=s.send_bwd) for s in stages]
        timeline = run_schedule(plan.schedule, costs, plan.microbatches, plan.virtual_stages)
    else:
        timeline = sim
    events = _names(len(stages), label, any(st.inner_fwd or st.inner_bwd for st in stages),
                    bool(getattr(timeline, "hidden_comm", ())))
    for s, kind, mb, start, end, *chunk in timeline.ops:
        args = {"microbatch": mb, "stage": s, **({"chunk": chunk[0]} if chunk else {})}
        events.append(_slice(s, COMPUTE, f"{'forward' if kind == 'F' else 'backward'} mb{mb}{_chunk(chunk)}",
                             start, end, args))
    for n, (kind, mb, src, dst, *chunk, start, end) in enumerate(timeline.transfers):
        track = SEND_NEXT if kind == "act" else SEND_PREV
        name = f"{'activation' if kind == 'act' else 'gradient'} mb{mb}{_chunk(chunk)} -> stage {dst}"
        events.append(_slice(src, track, name, start, end, {"microbatch": mb, "to_stage": dst}))
        events.append({"ph": "s", "id": n, "name": "p2p", "cat": "pp", "pid": src, "tid": track, "ts": start * US})
        events.append({"ph": "f", "bp": "e", "id": n, "name": "p2p", "cat": "pp", "pid": dst, "tid": COMPUTE,
                       "ts": end * US})
    events += _inner_slices(stages, timeline, sim, plan.virtual_stages)
    for s, index, ready, start, end in getattr(timeline, "buckets", ()):
        events.append(_slice(s, BUCKETS, f"gradient bucket {index}", start, end, {"ready_s": ready}))
    for s, mb, start, end in getattr(timeline, "hidden_comm", ()):   # des: a pair's all-to-alls beside its compute
        events.append(_slice(s, HIDDEN, f"hidden all-to-alls (pair with mb{mb})", start, end, {"microbatch": mb}))
    for s, kind, layer, mb, start, end in getattr(timeline, "layer_comm", ()):
        events.append(_slice(s, LAYERS, f"{kind} layer {layer} mb{mb}", start, end, {"layer": layer, "microbatch": mb}))
    events += _link_counters(getattr(timeline, "link_flows", {}))
    t = timeline.end_s
    for phase, name in AFTER_PIPELINE.items():
        if sim is not None and phase is DP.phase:   # the simulated span holds the buckets
            continue
        if breakdown.get(phase.name, 0.0) > 0:
            events.append(_slice(0, AFTER, name, t, t + breakdown[phase.name], {}))
            t += breakdown[phase.name]
    return events


def _inner_slices(stages, timeline, sim, virtual: int) -> list[dict]:
    """Each operation's all-to-all and K/V ring seconds, at its end (the simulated NIC flows
    where the event engine ran them; an interleaved chunk's operation 1 / V of them)."""
    flows = {(s, kind, mb): (start, end) for s, kind, mb, start, end in getattr(sim, "op_comm", ())}
    out = []
    for s, kind, mb, start, end, *_ in timeline.ops:
        seconds = (stages[s].inner_fwd if kind == "F" else stages[s].inner_bwd) / virtual
        if seconds <= 0:
            continue
        begin, finish = flows.get((s, kind, mb), (max(start, end - seconds), end))
        name = f"{'forward' if kind == 'F' else 'backward'} mb{mb}: all-to-all / K/V ring"
        out.append(_slice(s, INNER, name, begin, finish, {"microbatch": mb, "seconds_alone": seconds}))
    return out


def _chunk(chunk: list) -> str:
    """`` chunk c`` for an operation or transfer of interleaving's model chunk c."""
    return f" chunk {chunk[0]}" if chunk else ""


def _link_counters(link_flows: dict) -> list[dict]:
    """Counter tracks of the busiest simulated links: flows sharing each over time (a stage's
    NIC ``out`` and ``in``; more than one flow means each gets a share)."""
    out = []
    for (direction, stage), samples in link_flows.items():
        name = f"NIC {direction} flows"
        out += [{"ph": "C", "name": name, "pid": stage, "ts": t * US, "args": {"flows": n}} for t, n in samples]
    return out


def _names(stages: int, label: str, inner: bool = False, hidden: bool = False) -> list[dict]:
    """Each stage's process and its tracks' names (the all-to-all and hidden all-to-all tracks
    only where they have slices)."""
    out = []
    for s in range(stages):
        out.append({"ph": "M", "name": "process_name", "pid": s, "args": {"name": f"stage {s}" + (f" ({label})"
                                                                                              if label else "")}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": s, "args": {"sort_index": s}})
        for tid, name in TRACKS.items():
            if (tid == INNER and not inner) or (tid == HIDDEN and not hidden):
                continue
            out.append({"ph": "M", "name": "thread_name", "pid": s, "tid": tid, "args": {"name": name}})
    return out


def _slice(pid: int, tid: int, name: str, start: float, end: float, args: dict) -> dict:
    return {"ph": "X", "name": name, "cat": TRACKS[tid], "pid": pid, "tid": tid, "ts": start * US,
            "dur": max(0.0, end - start) * US, "args": args}


def write_trace(path: str, events: list[dict]) -> None:
    """The Chrome trace JSON (``traceEvents``, microseconds), written atomically."""
    text = json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})
    atomic_write(path, lambda h: h.write(text.encode()))
