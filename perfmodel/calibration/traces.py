"""Calibrate from PyTorch profiler traces: ``perfmodel calibrate --from-file torch-trace:PATH``.

A trace is the Chrome trace JSON that ``torch.profiler`` writes (``export_chrome_trace`` or
``tensorboard_trace_handler``, ``.json`` or ``.json.gz``; a folder: every trace in it, one per
rank). Read here with the standard library: the format is the Chrome Trace Event Format (complete
``"ph": "X"`` events with ``ts`` and ``dur`` in microseconds; PyTorch's fields from Kineto's
``output_json.cpp``: ``cat`` ``cpu_op`` with ``args["Input Dims"]`` under ``record_shapes``,
``user_annotation`` for ``record_function`` spans and ``ProfilerStep#N``, ``kernel`` with
``args["External id"]`` naming the operator that launched it). HolisticTraceAnalysis reads the
same files but builds its analyses on GPU kernel streams and needs pandas; a CPU trace of realrun
has no kernel at all, and what is fitted here is a per-shape sum.

What a trace gives, per step (``ProfilerStep#N`` spans, or realrun's ``commpress.step``, which
leaves evaluation out):

- **GEMMs by shape** (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm`` and their
  ``Input Dims``): FLOPs over time per cube-root size, the device's GEMM efficiency table
  (``perfmodel.calibration.fit.fit_compute``, as realrun's compute records are fitted).
- **Attention** (operators named ``*scaled_dot_product*``, ``*flash_attention*``,
  ``*efficient_attention*``; forward and backward): its score and value GEMMs' FLOPs over time.
- **Memory-bound work**: a step's forward and backward less its GEMMs and attention (on a CPU
  trace the framework's dispatch between operators included, as it is in the step); fitted as
  the streaming rate at which perfmodel's memory-bound bytes of the traced model and plan take
  that time (two predictions at two rates give the bytes and the fixed part: the model's own
  count). This needs the model and plan: realrun's traces carry them (``commpress`` metadata,
  ``realrun.train.profiling``); a user's trace takes ``--model`` and the plan flags, else this
  part is left out and said so.
- **Exposed communication** and the **optimizer step** (``Optimizer.step#...`` spans), reported
  beside the fit, not fitted: their costs come from the collective fit and the streaming rate.

On a GPU trace (``kernel`` events present) each class's time is its kernels' (matched to the
operator by ``External id``), communication is the NCCL kernels (``nccl`` in the name), and the
exposed part is their time outside every compute kernel of the step; the step is the time its
kernels cover (compute kernels' union plus the exposed communication), and the rest of its span,
where the GPU waited on the host, is reported as ``idle_s``.
"""
from __future__ import annotations

import bisect
import gzip
import json
import os
import statistics
from dataclasses import dataclass, field

from perfmodel.calibration.measurements import UserFile, make_record
from topologies import bounds
from topologies.errors import InputError

KIND = "torch-trace"
STEP_SPANS = ("commpress.step", "ProfilerStep#")   # realrun's step span first, else the profiler's
OPTIMIZER_PREFIX = "Optimizer.step#"
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm")
ATTENTION_WORDS = ("scaled_dot_product", "flash_attention", "efficient_attention", "flash_attn", "cudnn_attention")
COMM_PREFIXES = ("c10d::", "gloo:", "nccl", "record_param_comms")   # "nccl": nccl: operators, ncclDevKernel_*
METADATA_KEY = "commpress"      # realrun.train.profiling writes the run's model and plan here
US = 1e-6


@dataclass
class Op:
    """One complete event: name, start and duration (microseconds), thread, its args."""
    name: str
    ts: float
    dur: float
    tid: object
    args: dict
    cls: str = ""        # gemm, attention, comm, optimizer or "" (classified with its ancestors)
    size: int = 1        # operators recorded inside it, itself included (each paid the profiler's callbacks)


@dataclass
class Step:
    """What one step spent, seconds: its span, GEMMs, attention, communication (exposed), optimizer."""
    span_s: float
    gemm_s: float = 0.0
    attention_s: float = 0.0
    comm_s: float = 0.0
    optimizer_s: float = 0.0
    profiler_s: float = 0.0    # what recording cost the step (a CPU trace that says its unprofiled step)
    idle_s: float = 0.0        # a GPU trace: the step's span no kernel ran in (the GPU waited on the host)
    ops: dict = field(default_factory=dict)   # {class: operators recorded} ("" the memory-bound rest)

    @property
    def compute_s(self) -> float:
        return self.span_s - self.comm_s - self.optimizer_s

    @property
    def memory_s(self) -> float:
        """The rest of forward and backward: memory-bound operators and the dispatch between them
        (what recording cost is out of every part, ``median_step``)."""
        return self.compute_s - self.gemm_s - self.attention_s


@dataclass
class Trace:
    """A trace's steps, its GEMM and attention shapes ({key: [calls, seconds, flops]}), whether it
    timed GPU kernels, and its ``commpress`` metadata (None in a user's trace)."""
    path: str
    steps: list = field(default_factory=list)
    gemms: dict = field(default_factory=dict)
    attention: dict = field(default_factory=dict)
    gpu: bool = False
    metadata: dict | None = None


def trace_files(path: str) -> list[str]:
    """The trace files of ``path``: itself, or a folder's ``*.json`` / ``*.json.gz`` (sorted)."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith((".json", ".json.gz")))
        if not files:
            raise InputError("from-file", f"{KIND}:{path}", "a folder holding PyTorch profiler traces (*.json, "
                             "*.json.gz)")
        return files
    if not os.path.isfile(path):
        raise InputError("from-file", f"{KIND}:{path}", "an existing PyTorch profiler trace or a folder of them")
    return [path]


def load(path: str) -> dict:
    """The JSON of one trace file (gzip by its name); one line where it is not a Chrome trace."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError("from-file", f"{KIND}:{path}", f"a Chrome trace JSON file ({type(e).__name__}: {e})") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError("from-file", f"{KIND}:{path}", "a Chrome trace JSON object with a traceEvents list "
                         "(torch.profiler's export_chrome_trace)")
    return data


def read_trace(path: str) -> Trace:
    """The steps and shapes of one trace file."""
    data = load(path)
    events = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
              and isinstance(e.get("dur"), (int, float)) and isinstance(e.get("ts"), (int, float))]
    spans, threads = _step_spans(events)
    if not spans:
        raise InputError("from-file", f"{KIND}:{path}", "a trace with step spans (ProfilerStep#N: torch.profiler "
                         "with a schedule and prof.step() after each step; or realrun train --profile)")
    meta = data.get(METADATA_KEY)
    if isinstance(meta, str):
        meta = json.loads(meta)
    ops = [Op(e["name"], float(e["ts"]), float(e["dur"]), (e.get("pid"), e.get("tid")), e.get("args") or {})
           for e in events if e.get("cat") in ("cpu_op", "user_annotation", "gpu_user_annotation")]
    _classify(ops)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    out = Trace(path, gpu=bool(kernels), metadata=meta if isinstance(meta, dict) else None)
    out.steps = [Step(dur * US) for _, dur in spans]
    if kernels:
        _gpu_steps(out, spans, ops, kernels)
    else:   # the training thread's operators (a backend's worker threads overlap it: their waits are not its time)
        _cpu_steps(out, spans, [o for o in ops if o.tid in threads])
        _run_comm(out)
    return out


def _step_spans(events: list) -> tuple[list[tuple[float, float]], set]:
    """(start, duration) of every step span, by start, and the threads they run on: realrun's
    where present, else ProfilerStep#N."""
    for prefix in STEP_SPANS:
        chosen = [e for e in events if str(e.get("name", "")).startswith(prefix)
                  and e.get("cat") in ("user_annotation", "cpu_op", None)]
        if chosen:
            return sorted((float(e["ts"]), float(e["dur"])) for e in chosen), {(e.get("pid"), e.get("tid"))
                                                                               for e in chosen}
    return [], set()


def _run_comm(out: Trace) -> None:
    """A realrun trace's communication as the run measured it (``recorded_comm_s``, one per recorded
    step: its collectives run on its transport's threads and record no operator), where it gives
    one number per step."""
    measured = (out.metadata or {}).get("recorded_comm_s")
    if isinstance(measured, list) and len(measured) == len(out.steps):
        for step, seconds in zip(out.steps, measured):
            if isinstance(seconds, (int, float)) and seconds >= 0:
                step.comm_s = float(seconds)


def _classify(ops: list[Op]) -> None:
    """Each operator's class, from itself and the operators it runs inside (per thread): inside
    attention is attention (a math-path attention's own GEMMs), inside a GEMM is that GEMM, inside the
    optimizer step is the optimizer; an operator that is none of these keeps ``""``."""
    by_thread: dict = {}
    for op in ops:
        by_thread.setdefault(op.tid, []).append(op)
    for thread in by_thread.values():
        thread.sort(key=lambda o: (o.ts, -o.dur))
        stack: list[Op] = []
        for op in thread:
            while stack and op.ts >= stack[-1].ts + stack[-1].dur:
                stack.pop()
            outer = stack[-1].cls if stack else ""
            op.cls = outer or _own_class(op.name)
            stack.append(op)


def _own_class(name: str) -> str:
    if name.startswith(OPTIMIZER_PREFIX):
        return "optimizer"
    if any(w in name for w in ATTENTION_WORDS):
        return "attention"
    if name in GEMM_OPS:
        return "gemm"
    if name.startswith(COMM_PREFIXES):
        return "comm"
    return ""


def _step_of(spans: list, starts: list, ts: float) -> int | None:
    """The index of the step span holding time ``ts`` (None: outside every step); ``starts``: the
    spans' starts, in order."""
    i = bisect.bisect_right(starts, ts) - 1
    return i if i >= 0 and ts <= spans[i][0] + spans[i][1] else None


def _top(ops: list[Op]) -> list[Op]:
    """Each class's outermost operators: an operator whose enclosing operator has its class is
    inside it (``_classify`` gives an enclosed operator its encloser's class). Counts each
    operator's ``size`` on the way."""
    by_thread: dict = {}
    for op in ops:
        by_thread.setdefault(op.tid, []).append(op)
    out = []
    for thread in by_thread.values():
        stack: list[Op] = []
        for op in sorted(thread, key=lambda o: (o.ts, -o.dur)):
            while stack and op.ts >= stack[-1].ts + stack[-1].dur:
                stack.pop()
            if op.cls and (not stack or stack[-1].cls != op.cls):
                out.append(op)
            for outer in stack:
                outer.size += 1
            stack.append(op)
    return out


def _cpu_steps(out: Trace, spans: list, ops: list[Op]) -> None:
    """A CPU trace: each class's outermost operators' durations per step, every step's operators
    counted per class (``Step.ops``); shapes from their dims."""
    top, starts = _top(ops), [s for s, _ in spans]
    for op in ops:
        i = _step_of(spans, starts, op.ts)
        if i is not None and not op.name.startswith(STEP_SPANS):
            counts = out.steps[i].ops
            counts[op.cls] = counts.get(op.cls, 0) + 1
    for op in top:
        i = _step_of(spans, starts, op.ts)
        if i is None:
            continue
        _add_time(out.steps[i], op.cls, op.dur * US)
        _add_shape(out, op, op.dur * US)


def _gpu_steps(out: Trace, spans: list, ops: list[Op], kernels: list) -> None:
    """A GPU trace: kernels matched to their operator by External id; compute classes are their
    kernels' time, communication the part of the NCCL kernels' time no compute kernel covers."""
    by_id = {}
    for op in sorted(ops, key=lambda o: o.dur, reverse=True):   # the innermost operator of an id wins
        ext = op.args.get("External id")
        if ext is not None:
            by_id[ext] = op
    per_step: dict = {}
    starts = [s for s, _ in spans]
    for k in kernels:
        args = k.get("args") or {}
        op = by_id.get(args.get("External id"))
        name = str(k.get("name", ""))
        cls = "comm" if "nccl" in name.lower() else (op.cls if op is not None else "")
        i = _step_of(spans, starts, op.ts) if op is not None else _step_of(spans, starts, float(k["ts"]))
        if i is None:
            continue
        start, end = float(k["ts"]), float(k["ts"]) + float(k["dur"])
        per_step.setdefault(i, []).append((cls, start, end))
        if cls in ("gemm", "attention") and op is not None:
            _add_shape(out, op, (end - start) * US)
    for i, kernels_of in per_step.items():
        step = out.steps[i]
        compute = [(s, e) for c, s, e in kernels_of if c != "comm"]
        for cls, s, e in kernels_of:
            if cls in ("gemm", "attention", "optimizer"):
                _add_time(step, cls, (e - s) * US)
        comm = [(s, e) for c, s, e in kernels_of if c == "comm"]
        step.comm_s = (_length(comm) - _length(_intersect(_union(comm), _union(compute)))) * US
        busy = _length(compute) * US
        # the step is what its kernels took (the GPU runs behind the CPU's span); the rest of the
        # span the GPU waited on the host (reported, not fitted: perfmodel's host time is the stack's)
        step.idle_s = max(0.0, step.span_s - busy - step.comm_s)
        step.span_s = busy + step.comm_s


def _add_time(step: Step, cls: str, seconds: float) -> None:
    if cls == "gemm":
        step.gemm_s += seconds
    elif cls == "attention":
        step.attention_s += seconds
    elif cls == "comm":
        step.comm_s += seconds
    elif cls == "optimizer":
        step.optimizer_s += seconds


def _add_shape(out: Trace, op: Op, seconds: float) -> None:
    """Add one GEMM or attention call at its shape (nothing where the trace recorded no shapes)."""
    dims = op.args.get("Input Dims")
    if op.cls == "gemm" and op.name in GEMM_OPS:
        shape = gemm_shape(op.name, dims)
        table = out.gemms
    elif op.cls == "attention":
        shape = attention_shape(op.name, dims)
        table = out.attention
    else:
        return
    if shape is None:
        return
    key, flops = shape
    entry = table.setdefault(key, [0, 0.0, 0.0, 0])
    entry[0] += 1
    entry[1] += seconds
    entry[2] += flops
    entry[3] += op.size


def gemm_shape(name: str, dims) -> tuple[tuple, float] | None:
    """((m, n, k), FLOPs) of a GEMM operator from its input dims (batched: m over the batch)."""
    try:
        if name in ("aten::mm", "aten::_scaled_mm"):
            (m, k), (_, n) = dims[0], dims[1]
            batch = 1
        elif name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            batch = 1
        else:   # bmm, baddbmm: [b, m, k] x [b, k, n] (baddbmm's input first)
            a, b = (dims[0], dims[1]) if name == "aten::bmm" else (dims[1], dims[2])
            (batch, m, k), (_, _, n) = a, b
    except (TypeError, ValueError, IndexError):
        return None
    if min(m, n, k, batch) <= 0:
        return None
    return (int(batch * m), int(n), int(k)), 2.0 * batch * m * n * k


def attention_shape(name: str, dims) -> tuple[tuple, float] | None:
    """((heads x batch, queries, keys, head_dim), FLOPs) of an attention operator: forward its two
    GEMMs (scores, values), backward twice that (``_backward`` in the name; queries from its output
    gradient's dims, laid out [batch, heads, seq, head_dim] as PyTorch's SDPA takes them)."""
    try:
        q, k = dims[0], dims[1]
        if len(q) != 4 or len(k) != 4:
            return None
        b, h, t, d = q
        n = k[2]
    except (TypeError, ValueError, IndexError):
        return None
    if min(b, h, t, d, n) <= 0:
        return None
    passes = 2.0 if "backward" in name else 1.0
    return (int(b * h), int(t), int(n), int(d)), passes * 2.0 * 2.0 * b * h * t * n * d


def _union(intervals: list) -> list:
    out: list = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _intersect(a: list, b: list) -> list:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals: list) -> float:
    return sum(e - s for s, e in _union(intervals))


def profiler_cost(trace: Trace) -> float:
    """Seconds recording cost each operator: on a CPU trace whose metadata gives the run's
    unprofiled step (``realrun train --profile``), the recorded steps' median excess over it spread
    evenly over their median count of operators (the profiler's callbacks run per operator); else 0."""
    plain = (trace.metadata or {}).get("unprofiled_step_s")
    if trace.gpu or not isinstance(plain, (int, float)) or plain <= 0:
        return 0.0
    span = statistics.median(s.span_s for s in trace.steps)
    ops = statistics.median(sum(s.ops.values()) for s in trace.steps)
    return (span - plain) / ops if span > plain and ops else 0.0


def median_step(trace: Trace) -> Step:
    """The median of each of a trace's step quantities (a step of medians), each part less what
    recording its operators cost (``profiler_cost`` per operator; the total in ``profiler_s``)."""
    steps, cost = trace.steps, profiler_cost(trace)

    def part(name: str, cls: str | None = None) -> float:
        left = [getattr(s, name) - cost * (sum(s.ops.values()) if cls is None else s.ops.get(cls, 0)) for s in steps]
        return max(0.0, statistics.median(left))

    step = Step(part("span_s"), part("gemm_s", "gemm"), part("attention_s", "attention"), part("comm_s", "comm"),
                part("optimizer_s", "optimizer"), idle_s=statistics.median(s.idle_s for s in steps))
    step.profiler_s = cost * statistics.median(sum(s.ops.values()) for s in steps)
    return step


def shape_records(trace: Trace, device: str) -> list[dict]:
    """Compute records (``perfmodel.calibration.measurements``) of the trace's GEMM and attention
    shapes: per shape the mean call (its FLOPs, its seconds), as ``fit_compute`` reads realrun's."""
    out, cost = [], profiler_cost(trace)
    for (m, n, k), (calls, seconds, flops, ops) in sorted(trace.gemms.items()):
        seconds -= cost * ops
        if seconds > 0 and _within(m, n, k):
            out.append(make_record("compute", op="gemm", device=device, m=m, n=n, k=k, flops=flops / calls,
                                   bytes=0.0, time_s=seconds / calls, calls=calls, source=KIND))
    for (heads, t, n, d), (calls, seconds, flops, ops) in sorted(trace.attention.items()):
        seconds -= cost * ops
        if seconds > 0 and _within(t, n, d):
            out.append(make_record("compute", op="attention", device=device, m=t, n=n, k=d, heads=heads,
                                   flops=flops / calls, bytes=0.0, time_s=seconds / calls, calls=calls, source=KIND))
    return out


def _within(*dims) -> bool:
    low, high = bounds.bound("gemm_size")[1:3]
    return all(low <= d <= high for d in dims)


def memory_record(step: Step, device: str, predict_with) -> dict | None:
    """The elementwise record of a trace's memory-bound work: perfmodel's memory-bound bytes of the
    traced job (one step, one rank; ``predict_with(calibration)`` predicts it: two predictions at two
    streaming rates give the bytes and the fixed part, the seconds being bytes over the rate plus a
    fixed part) and the measured seconds less that fixed part. None where the measured time is not
    above the fixed part or the device is not in the catalog."""
    from perfmodel.calibration.profile import SCHEMA, from_profile
    from perfmodel.devices import gpu_catalog

    if device not in gpu_catalog():
        return None
    s0 = gpu_catalog()[device].stream_Bps

    def memory_s(rate: float) -> float:
        calib = from_profile({"schema": SCHEMA, "devices": {device: {"stream_TBps": rate / 1e12}}},
                             f"<{KIND} stream>")
        return predict_with(calib).compute_detail["memory_bound_s"]

    t0, t1 = memory_s(s0), memory_s(2 * s0)
    moved = 2.0 * s0 * (t0 - t1)          # bytes: t(s) = bytes / s + fixed
    fixed = 2.0 * t1 - t0
    seconds = step.memory_s - fixed
    if moved < 1 or seconds <= 0:
        return None
    return make_record("compute", op="elementwise", device=device, m=1, n=1, k=1, flops=0.0, bytes=round(moved),
                       time_s=seconds, source=KIND)


def job_predictor(cluster: str, model: str, plan: dict):
    """``predict_with(calibration)`` of ``model`` under ``plan`` (``perfmodel.prediction.predict``'s
    keywords, ``gpus`` among them) on ``cluster``."""
    from perfmodel.prediction import predict

    def predict_with(calibration):
        return predict(model, cluster, **plan, allow_oom=True, calibration=calibration)

    return predict_with


def read(path: str, cluster: str | None, model: str | None = None, plan: dict | None = None):
    """A ``perfmodel.calibration.userfiles.UserFile`` of the traces at ``path``: the compute records
    of every trace (``shape_records``, ``memory_record``), what each did not contain a line each, and
    ``about`` (ranks, device, the median step's parts: ``steps``)."""
    from topologies import build_cluster

    if cluster is None:
        raise InputError("cluster", None, f"--cluster NAME with --from-file {KIND}: the cluster the trace ran on "
                         "(a one-rank realrun train on this machine: emulated:hosts=1)")
    device = build_cluster(cluster).gpu_model
    out = UserFile(path, KIND)
    traces = [read_trace(f) for f in trace_files(path)]
    out.about = {"op": "trace", "world": len(traces), "hosts": None, "devices": [device],
                 "steps": [_step_dict(t, median_step(t)) for t in traces]}
    for t in traces:
        out.records += shape_records(t, device)
        _memory(out, t, cluster, device, model, plan)
    if not out.records:
        raise InputError("from-file", f"{KIND}:{path}", "a trace with operator shapes (torch.profiler "
                         "record_shapes=True) of GEMMs or attention")
    if not any(t.gemms for t in traces):
        out.missing.append("no GEMM with its input dims (record_shapes=True): the GEMM table is not fitted")
    if not any(t.attention for t in traces):
        out.missing.append("no attention operator (scaled_dot_product / flash attention) with its dims")
    for t in traces:
        if not t.gpu and "unprofiled_step_s" not in (t.metadata or {}):
            out.missing.append(f"{os.path.basename(t.path)}: a CPU trace without the run's unprofiled step: its "
                               "operators' times include the profiler's own cost (realrun train --profile records it)")
    return out


def _memory(out, trace: Trace, cluster: str, device: str, model: str | None, plan: dict | None) -> None:
    """Add the trace's memory-bound record, or say why there is none."""
    meta = trace.metadata or {}
    model = model or meta.get("model")
    if plan is None and "plan" in meta:
        plan = {**meta["plan"], "gpus": meta.get("world", 1)}
    name = os.path.basename(trace.path)
    if model is None or plan is None:
        out.missing.append(f"{name}: no model and plan (realrun train --profile writes them; give --model or --from, "
                           "and --plan): the memory-bound streaming rate is not fitted")
        return
    record = memory_record(median_step(trace), device, job_predictor(cluster, model, plan))
    if record is None:
        out.missing.append(f"{name}: its memory-bound time is not above perfmodel's fixed kernel time for "
                           "that work: the streaming rate is not fitted")
        return
    out.records.append(record)


def _step_dict(trace: Trace, step: Step) -> dict:
    """The median step's parts, seconds (what ``perfmodel calibrate`` prints per trace)."""
    return {"file": os.path.basename(trace.path), "steps": len(trace.steps), "gpu": trace.gpu,
            "step_s": step.span_s, "gemm_s": step.gemm_s, "attention_s": step.attention_s,
            "memory_s": step.memory_s, "comm_s": step.comm_s, "optimizer_s": step.optimizer_s,
            "profiler_s": step.profiler_s, "idle_s": step.idle_s}
