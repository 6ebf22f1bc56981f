"""Calibrate from the files users already have: nccl-tests output and training logs.

``perfmodel calibrate --from-file KIND:PATH`` (docs/calibrate-from-files.md). Each reader returns
what it read and, one line each, what the file did not contain; a file with nothing usable is
one ``InputError`` naming the file, the line and what was expected.

**nccl-tests** (``nccl-tests:PATH``; ``nccl-tests.OP:PATH`` names the op where the file does not).
The formats are those of NVIDIA/nccl-tests v2.19.6 (a0b82b2), ``src/util.cu``:
``writeDeviceReport`` (lines 622-735: the ``# nThread N nGpus G ...`` header, one
``#  Rank R Group G Pid P on HOST device D [BUS] NAME`` line per rank; JSON ``config`` with
``nthreads``, ``ngpus`` and ``devices``, one entry per process as ``parseRankInfo`` reads only a
process's first line), ``writeResultHeader`` (739-766: ``time`` or, with ``-C``, ``cputime``;
per-iteration columns ``i_min i_max i_p99 i_cv%`` with ``-I``), ``writeBenchmarkLinePreamble``
and ``writeBenchmarkLineBody`` (454-524: ``size count type redop root`` then out-of-place and
in-place ``time algbw busbw #wrong``, ``N/A`` without validation; JSON ``results[]`` with
``out_of_place``/``in_place`` {``time``, ``alg_bw``, ``bus_bw``, ``nwrong``}).  ``-J FILE.json``
exists from v2.17.3 on (``src/common.cu`` 1189, 1294; JSON ``version`` 3 in v2.19.6); booleans are
written as the strings ``"true"``/``"false"`` (``jsonBool``, util.cu 273). The time is the mean
over ``iters`` of an iteration, averaged over ranks (``-a 1``, the default; common.cu 119, 772-783),
where realrun's ``time_s`` is the median of the slowest rank: a record says so (``timing``).
``size`` is the whole array (all-gather: the gathered output; common.cu ``max(sendBytes,
expectedBytes)``), as realrun's ``size_bytes``. Each row becomes an uncompressed collective record
(``perfmodel.calibration.measurements``) with the out-of-place time.

**Training logs** (``megatron-log``, ``torchtitan-log``, ``deepspeed-log``): the step lines of
Megatron-LM core_v0.15.3 ``megatron/training/training.py`` 1592-1598 (``iteration N/M | ...
elapsed time per iteration (ms): T |``, the mean over the log interval), torchtitan v0.2.2
``torchtitan/components/metrics.py`` ``MetricsProcessor.log`` (line 396: ``step: N  loss: ...
tps: T  ...``, tokens per second per device over the log interval; step seconds = global tokens
per step / (GPUs x tps)) and DeepSpeed
v0.19.5 ``deepspeed/utils/timer.py`` 264-272 (``global_step=N, RunningAvgSamplesPerSec=..,
CurrSamplesPerSec=S``: the step's seconds = ``train_batch_size`` / S) and 141-151 (with
``wall_clock_breakdown``, ``time (ms) | fwd: F | bwd: B | ... | step: O``: F + B + O, the global
timers of ``deepspeed/runtime/engine.py`` 224-227). The first ``WARMUP_STEPS`` steps are
skipped. A step time checks a prediction (``check_step``); it is not fitted.
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
from dataclasses import dataclass, field

import numpy as np

from perfmodel.calibration.measurements import UserFile, make_record
from perfmodel.collectives.fabric import PAIR
from perfmodel.collectives.record import busbw_factor
from perfmodel.collectives.runtime import PRICED_OPS
from topologies.errors import InputError

# nccl-tests binaries -> commpress op names (src/*.cu of the tests; hypercube and the v-variants have no op here)
NCCL_TESTS_OPS = {"all_reduce_perf": "allreduce", "all_gather_perf": "allgather",
                  "reduce_scatter_perf": "reduce_scatter", "alltoall_perf": "alltoall", "sendrecv_perf": "sendrecv",
                  "broadcast_perf": "broadcast", "reduce_perf": "reduce", "gather_perf": "gather",
                  "scatter_perf": "scatter"}
LOG_KINDS = ("megatron-log", "torchtitan-log", "deepspeed-log")
KINDS = ("nccl-tests", "torch-trace", *LOG_KINDS)
# steps dropped at the start of a log: the first carries the CUDA context, NCCL communicator set-up,
# the allocator's growth and any compilation (Megatron logs it alone for that reason, training.py
# "We log to stdout after the first iteration ... to document initialization overhead"); DeepSpeed's
# ThroughputTimer skips its first 2 steps too (start_step=2, deepspeed/utils/timer.py)
WARMUP_STEPS = 2
WITHIN = 2.0   # a measured busbw agrees with the fit within 2 standard errors of one point
TIMING = "mean over iterations, averaged over ranks (nccl-tests -a 1)"




def split_spec(text: str) -> tuple[str, str, str | None]:
    """(kind, path, op or None) of ``KIND:PATH`` (``nccl-tests.OP:PATH`` names the op)."""
    kind, sep, path = text.partition(":")
    kind, _, op = kind.partition(".")
    if not sep or not path or kind not in KINDS:
        raise InputError("from-file", text, "KIND:PATH with KIND one of " + ", ".join(KINDS))
    if op and kind != "nccl-tests":
        raise InputError("from-file", text, f"{kind}:PATH (an op is named for nccl-tests only)")
    return kind, path, op or None


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as err:
        raise InputError("from-file", path, f"a readable file ({err.strerror})") from None
    except UnicodeDecodeError:
        raise InputError("from-file", path, "a text file (nccl-tests output or a training log)") from None


# ---------------------------------------------------------------- nccl-tests

RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$")
HEADER = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s.*?iters:\s*(\d+)\s+agg iters")
TEST_NAME = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
ROW = re.compile(r"^\s*\d+\s+\d+\s+\S+\s+\S+\s+-?\d+\s")   # size count type redop root ...
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d$|^\d\d:\d\d:\d\d$")


def read_nccl_tests(path: str, op: str | None = None, cluster: str | None = None) -> UserFile:
    """The collective records of an nccl-tests stdout or ``-J`` JSON file (module doc)."""
    text = _read_text(path)
    if text.lstrip().startswith("{"):
        return _nccl_json(path, text, op, cluster)
    return _nccl_stdout(path, text, op, cluster)


def _op_of(path: str, program: str | None, op: str | None, out: UserFile, where: str) -> str:
    """The commpress op: named, else the test's program name, else the file name; refused if none."""
    if op:
        return _known_op(path, op)
    for name in (os.path.basename(program or ""), os.path.basename(path)):
        for binary, found in NCCL_TESTS_OPS.items():
            if binary in name or binary.removesuffix("_perf").replace("_", "") in name.replace("_", ""):
                if not program:
                    out.missing.append(f"op: no '# Collective test starting' line (nccl-tests before 2.17); "
                                       f"{found} from the file name")
                return found
    raise InputError(f"{path}:{where}", program or os.path.basename(path),
                     "the op: a '# Collective test starting: all_reduce_perf' line, a file named after the test, "
                     "or nccl-tests.OP:PATH (OP " + ", ".join(sorted(set(NCCL_TESTS_OPS.values()))) + ")")


def _known_op(path: str, op: str) -> str:
    if op not in NCCL_TESTS_OPS.values():
        raise InputError(f"{path}: op", op, ", ".join(sorted(set(NCCL_TESTS_OPS.values()))))
    return op


def _nccl_stdout(path: str, text: str, op: str | None, cluster: str | None) -> UserFile:
    out = UserFile(path, "nccl-tests")
    ranks, hosts, devices, header, program, per_iter, time_name, rows = {}, set(), set(), None, None, False, None, []
    other = 0
    for number, line in enumerate(text.splitlines(), 1):
        if m := RANK_LINE.match(line):
            ranks[int(m[1])] = m[2]
            hosts.add(m[2])
            devices.add(m[3].strip())
        elif m := HEADER.match(line):
            if header:
                raise InputError(f"{path}:{number}", "a second '# nThread' header", "one nccl-tests run per file "
                                 "(split the file; give each with its own --from-file)")
            header = (int(m[1]), int(m[2]), int(m[3]))
        elif m := TEST_NAME.match(line):
            program = m[1]
        elif line.startswith("#") and " size " in f" {line} " and "count" in line:
            per_iter, time_name = "i_min" in line, line.split()[6]
        elif ROW.match(line):
            rows.append((number, line))
        elif line.strip() and not line.startswith("#"):
            other += 1
    if time_name == "cputime":
        raise InputError(f"{path}: time column", "cputime", "the collective's time (nccl-tests run without -C)")
    if not rows:
        raise InputError(f"{path}:{len(text.splitlines())}", "no result rows", "nccl-tests' table: size count type "
                         "redop root, then time algbw busbw #wrong out-of-place and in-place")
    op = _op_of(path, program, op, out, "1")
    world = _world_stdout(path, ranks, header, out)
    if other:
        out.missing.append(f"{other} other lines (not nccl-tests' header or table: NCCL_DEBUG output?) ignored")
    iters = header[2] if header else None
    out.about = {"op": op, "world": world, "hosts": len(hosts) or None, "devices": sorted(devices),
                 "program": program}
    group = 8 if per_iter else 4
    for number, line in rows:
        parsed = _row(path, number, line, group)
        _add(out, op, world, iters, cluster, f"{path}:{number}", parsed)
    return _finish(out)


def _world_stdout(path, ranks: dict, header, out: UserFile) -> int:
    if ranks:
        if header and header[0] * header[1] > len(ranks):
            out.missing.append(f"ranks: {len(ranks)} '#  Rank' lines for nThread x nGpus = {header[0] * header[1]} "
                               "per process (a rank line cut at nccl-tests' 2048-character buffer?): world "
                               f"{len(ranks)}")
        return len(ranks)
    if header:
        out.missing.append(f"world: no '#  Rank' lines; nThread x nGpus = {header[0] * header[1]} taken (one process)")
        return header[0] * header[1]
    raise InputError(f"{path}:1", "no header", "'# nThread N nGpus G ...' and '#  Rank R ... on HOST device D' lines "
                     "(the world size)")


def _row(path: str, number: int, line: str, group: int) -> dict:
    """{size, count, type, redop, out: (time_us, busbw, wrong) or None, in: ...} of one table row."""
    tokens = line.split()
    while tokens and TIMESTAMP.match(tokens[-1]):
        tokens.pop()
    body = tokens[5:]
    try:
        size, count = int(tokens[0]), int(tokens[1])
        sets = [(float(body[i]), float(body[i + 2]), None if body[i + 3] == "N/A" else float(body[i + 3]))
                for i in range(0, len(body), group)]
    except (ValueError, IndexError):
        raise InputError(f"{path}:{number}", line.strip()[:60], "a result row: size count type redop root, then "
                         "time algbw busbw #wrong (out-of-place, in-place)") from None
    if len(body) not in (group, 2 * group):
        raise InputError(f"{path}:{number}", line.strip()[:60], f"{2 * group} columns after 'root' "
                         f"({group} out-of-place, {group} in-place); got {len(body)}")
    return {"size": size, "count": count, "type": tokens[2], "redop": tokens[3],
            "out": sets[0] if len(sets) == 2 else None, "in": sets[-1]}


def _nccl_json(path: str, text: str, op: str | None, cluster: str | None) -> UserFile:
    out = UserFile(path, "nccl-tests")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}", err.msg, "nccl-tests -J JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise InputError(f"{path}: results", None, "nccl-tests -J JSON: an object with a 'results' list")
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    args = doc.get("args") if isinstance(doc.get("args"), list) else []
    op = _op_of(path, args[0] if args else None, op, out, "args")
    devices = config.get("devices") if isinstance(config.get("devices"), list) else []
    try:
        world = len(devices) * int(config["nthreads"]) * int(config["ngpus"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{path}: config", None, "nthreads, ngpus and devices (the world size)") from None
    if world < 1:
        raise InputError(f"{path}: config.devices", devices, "one entry per process (the world size)")
    if doc.get("version") != 3:
        out.missing.append(f"version: {doc.get('version')!r}, this reader follows version 3 (nccl-tests 2.19.6)")
    out.about = {"op": op, "world": world, "hosts": len({d.get("hostname") for d in devices if isinstance(d, dict)}),
                 "devices": sorted({d.get("device_info", "") for d in devices if isinstance(d, dict)}),
                 "program": args[0] if args else None}
    iters = config.get("iterations")
    for i, r in enumerate(doc["results"]):
        where = f"{path}: results[{i}]"
        try:
            parsed = {"size": int(r["size"]), "count": int(r["count"]), "type": r["type"], "redop": r["redop"],
                      "out": _json_set(where, r.get("out_of_place")), "in": _json_set(where, r.get("in_place"))}
        except InputError:
            raise
        except (KeyError, TypeError, ValueError):
            raise InputError(where, r, "size, count, type, redop and out_of_place/in_place {time, bus_bw, "
                             "nwrong}") from None
        _add(out, op, world, iters, cluster, where, parsed)
    return _finish(out)


def _json_set(where: str, entry) -> tuple | None:
    """(time us, busbw, wrong or None) of one half of a JSON result (None where absent)."""
    if entry is None:
        return None
    if "time" not in entry and "cpu_time" in entry:
        raise InputError(f"{where}.cpu_time", entry["cpu_time"], "the collective's time (nccl-tests run without -C)")
    time_key = "time"
    wrong = entry.get("nwrong")
    return float(entry[time_key]), float(entry["bus_bw"]), None if wrong is None else float(wrong)


def _add(out: UserFile, op: str, world: int, iters, cluster, where: str, row: dict) -> None:
    """The record of one row (out-of-place time; in-place where that is all there is), or a line
    saying why the row is not used."""
    chosen = row["out"] or row["in"]
    if row["out"] is None:
        _once(out, "out-of-place: not in the file (trace replay); in-place times used")
    if row["in"] is None:
        _once(out, "in-place: not in the file")
    time_us, busbw, wrong = chosen
    if wrong is None:
        _once(out, "#wrong: N/A (run with -c 0): results not checked")
    elif wrong > 0:
        out.missing.append(f"{where}: size {row['size']}: {wrong:g} wrong elements, row not used")
        return
    if row["size"] <= 0 or not time_us > 0:
        out.missing.append(f"{where}: size {row['size']}, time {time_us:g} us: row not used")
        return
    fields = dict(op=op, compressor="none", algorithm="auto", world=world, backend="nccl", size_bytes=row["size"],
                  wire_bytes=row["size"], time_s=time_us * 1e-6, compress_s=0.0, decompress_s=0.0,
                  max_rel_error=0.0, busbw_factor=busbw_factor(op, world), source=where, busbw_GBps=busbw,
                  dtype=row["type"], timing=TIMING)
    if iters is not None:
        fields["iters"] = int(iters)
    if cluster:
        fields["cluster"] = cluster
    out.records.append(make_record("collective", **fields))


def _once(out: UserFile, line: str) -> None:
    if line not in out.missing:
        out.missing.append(line)


def _finish(out: UserFile) -> UserFile:
    op = out.about["op"]
    if op not in PRICED_OPS:
        raise InputError(f"{out.path}: op", op, " or ".join(PRICED_OPS) + " (what the fit prices: realrun's "
                         "collectives; this op is read but nothing in it can be fitted)")
    if out.about["world"] < 2:
        raise InputError(f"{out.path}: world", out.about["world"], "at least 2 ranks (one rank moves nothing)")
    if not out.records:
        raise InputError(out.path, "no usable row", "result rows with a time and no wrong elements")
    cluster = out.records[0].get("cluster")
    if cluster and out.about.get("hosts"):
        _say_placement(out, cluster)
    return out


def _say_placement(out: UserFile, cluster: str) -> None:
    """A line where the file's ranks per host differ from the cluster's GPUs per host: the fit
    places the ranks packed on the cluster, not as the file ran them."""
    from topologies import build_cluster

    per_host, hosts = build_cluster(cluster).gpus_per_host, out.about["hosts"]
    if out.about["world"] != hosts * per_host and -(-out.about["world"] // per_host) != hosts:
        out.missing.append(f"placement: {out.about['world']} ranks on {hosts} host(s) in the file; the fit packs "
                           f"them {per_host} to a host of {cluster}")


# ---------------------------------------------------------------- training logs

ANSI = re.compile(r"\x1b\[[0-9;]*m")
MEGATRON = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)")
TORCHTITAN = re.compile(r"(?<!validate )step:\s*(\d+)\s+loss:.*?tps:\s*([0-9,]+)")
DS_THROUGHPUT = re.compile(r"global_step=(\d+), RunningAvgSamplesPerSec=[^,]*, CurrSamplesPerSec=([0-9.eE+-]+)")
DS_BREAKDOWN = re.compile(r"time \(ms\) \| fwd: ([0-9.]+) \| bwd: ([0-9.]+) .*?\| step: ([0-9.]+)")
EXPECTED = {"megatron-log": "Megatron-LM's ' iteration N/M | ... elapsed time per iteration (ms): T |' lines",
            "torchtitan-log": "torchtitan's 'step: N  loss: ...  tps: T' lines",
            "deepspeed-log": "DeepSpeed's 'global_step=N, RunningAvgSamplesPerSec=.., CurrSamplesPerSec=S' or "
                             "'time (ms) | fwd: F | bwd: B | ... | step: O' lines"}


@dataclass
class StepLog:
    """The step lines of a training log: (step, value, line) with ``unit`` 's' (seconds per step),
    'tokens/s/device' (torchtitan) or 'samples/s' (DeepSpeed's throughput); what it lacked."""
    path: str
    kind: str
    unit: str
    samples: list
    missing: list = field(default_factory=list)


def read_step_log(path: str, kind: str) -> StepLog:
    """The step lines of a Megatron-LM, torchtitan or DeepSpeed log (module doc)."""
    if kind not in LOG_KINDS:
        raise InputError("log kind", kind, ", ".join(LOG_KINDS))
    lines = [ANSI.sub("", line) for line in _read_text(path).splitlines()]
    found = {"megatron-log": [(MEGATRON, "s", lambda m: float(m[2]) / 1e3)],
             "torchtitan-log": [(TORCHTITAN, "tokens/s/device", lambda m: float(m[2].replace(",", "")))],
             "deepspeed-log": [(DS_THROUGHPUT, "samples/s", lambda m: float(m[2])),
                               (DS_BREAKDOWN, "s", lambda m: (float(m[1]) + float(m[2]) + float(m[3])) / 1e3)]}[kind]
    missing = []
    for pattern, unit, value in found:
        samples = []
        for number, line in enumerate(lines, 1):
            if m := pattern.search(line):
                step = int(m[1]) if pattern is not DS_BREAKDOWN else len(samples) + 1
                samples.append((step, value(m), number))
        if samples:
            return StepLog(path, kind, unit, samples, missing)
        if kind == "deepspeed-log" and pattern is DS_THROUGHPUT:
            missing.append("CurrSamplesPerSec: no throughput lines (steps_per_print); the wall-clock breakdown used")
    raise InputError(f"{path}:{len(lines)}", "no step line", EXPECTED[kind])


@dataclass(frozen=True)
class StepStats:
    """Step seconds over the steps after warm-up: median, robust spread (1.4826 x MAD: the standard
    deviation where the steps are normal, and not moved by one slow step), min, max, count."""
    median_s: float
    spread_s: float
    min_s: float
    max_s: float
    steps: int
    skipped: int


def step_seconds(log: StepLog, tokens_per_step: float | None = None, samples_per_step: float | None = None,
                 gpus: int | None = None) -> list[tuple[int, float]]:
    """(step, seconds) of each step line: seconds as logged, or from a rate and the plan (torchtitan:
    global tokens per step / (gpus x tps); DeepSpeed: global batch / CurrSamplesPerSec)."""
    if log.unit == "s":
        return [(step, v) for step, v, _ in log.samples]
    if log.unit == "tokens/s/device":
        if not tokens_per_step or not gpus:
            raise InputError(f"{log.path}: tps", None, "the plan's global batch, sequence and GPUs (--gbs, --seq, "
                             "--gpus) to turn tokens per second per device into step seconds")
        return [(step, tokens_per_step / (gpus * v)) for step, v, _ in log.samples if v > 0]
    if not samples_per_step:
        raise InputError(f"{log.path}: CurrSamplesPerSec", None, "the global batch (--gbs) to turn samples per "
                         "second into step seconds")
    return [(step, samples_per_step / v) for step, v, _ in log.samples if v > 0]


def step_stats(seconds: list[tuple[int, float]], path: str = "log") -> StepStats:
    """``StepStats`` of the steps past ``WARMUP_STEPS`` (refused where none is left)."""
    kept = [s for step, s in seconds if step > WARMUP_STEPS]
    if not kept:
        raise InputError(f"{path}: steps", len(seconds), f"a step line past the first {WARMUP_STEPS} (warm-up) steps")
    median = statistics.median(kept)
    mad = statistics.median(abs(s - median) for s in kept)
    return StepStats(median_s=median, spread_s=1.4826 * mad, min_s=min(kept), max_s=max(kept), steps=len(kept),
                     skipped=len(seconds) - len(kept))


def check_step(log: StepLog, predicted_s: float, *, gbs: int, seq: int, gpus: int) -> dict:
    """Measured step (median, spread) of a log against a predicted step time, and the relative error
    (predicted / measured - 1); a check, not a fit (docs/calibrate-from-files.md says why)."""
    stats = step_stats(step_seconds(log, tokens_per_step=gbs * seq, samples_per_step=gbs, gpus=gpus), log.path)
    return {"log": log.path, "kind": log.kind, "unit": log.unit, "missing": list(log.missing),
            "warmup_steps": WARMUP_STEPS, **stats.__dict__, "predicted_s": predicted_s,
            "relative_error": predicted_s / stats.median_s - 1.0,
            "within_spread": abs(predicted_s - stats.median_s) <= stats.spread_s}


# ---------------------------------------------------------------- the tier fit's errors


def tier_errors(records: list[dict], cluster: str, profile: dict) -> dict:
    """Standard errors of the tier fit's values (``fit.fit_tiers``) at the fitted values, from the
    Jacobian of its relative residuals and their variance: {"base_us_sd", "primitives": {class:
    {primitive: {"step_us_sd", "bw_fraction_sd"}}}, "residual_sd": relative, "separable", "cov", "keys"};
    NaN without spare records, and for base and step latencies where the records cannot separate
    them (``separable`` false: one world size gives every row the same steps; their sum is fixed,
    and predictions for these records keep their error). Empty where the profile fitted no tier."""
    design, rows, keys = tier_design(records, cluster)
    times = np.array([r["time_s"] for r in rows])
    if not rows or "primitives" not in profile:
        return {}
    x = _fitted_vector(profile, keys)
    jac = design / times[:, None]
    res = (design @ x - times) / times
    dof = len(times) - len(x)
    with np.errstate(all="ignore"):
        cov = np.linalg.pinv(jac.T @ jac) * (float(res @ res) / dof if dof > 0 else math.nan)
    sd = np.sqrt(np.abs(np.diag(cov)))
    separable = int(np.linalg.matrix_rank(jac)) == len(x)
    if not separable:   # one world size: every row has the same steps (base and alpha: one latency)
        sd[:1 + len(keys["step"])] = math.nan
    out = {"separable": separable, "base_us_sd": sd[0] * 1e6,
           "residual_sd": math.sqrt(float(res @ res) / dof) if dof > 0 else math.nan,
           "primitives": {}, "cov": cov.tolist(), "keys": keys}
    n = len(keys["step"])
    for i, (cls, prim) in enumerate(keys["beta"]):
        bw = profile["primitives"][cls][prim]["bw_fraction"]
        step_i = keys["step"].index((cls, prim.removesuffix(PAIR)))
        out["primitives"].setdefault(cls, {})[prim] = {"step_us_sd": sd[1 + step_i] * 1e6,
                                                       "bw_fraction_sd": sd[1 + n + i] * bw * bw}
    return out


def tier_design(records: list[dict], cluster: str, keys: dict | None = None):
    """(design, the records it prices, keys) of the tier fit, as ``fit._fit_shared_steps`` builds them: columns base,
    a step latency per (class, primitive), seconds at full link bandwidth per (class, primitive[@pair])
    (``keys``: these columns, as another set of records gave them)."""
    from perfmodel.calibration.fit import PAIR_MIN_BYTES, _features, phases_of, tier_design_matrix, tier_keys
    from perfmodel.compression import compile_spec

    rows = [r for r in records if r["kind"] == "collective" and compile_spec(r["compressor"]).is_none
            and r["time_s"] > 0 and r["world"] > 1]
    feats = [_features(*phases_of(r, r.get("cluster", cluster), with_pair=True)) for r in rows]
    keep = [i for i, (f, r) in enumerate(zip(feats, rows))
            if not (any(p.endswith(PAIR) for _, p in f) and r["size_bytes"] < PAIR_MIN_BYTES)] \
        or list(range(len(rows)))
    feats = [feats[i] for i in keep]
    step, beta = (keys["step"], keys["beta"]) if keys else tier_keys(feats)
    return tier_design_matrix(feats, step, beta), [rows[i] for i in keep], {"step": step, "beta": beta}


def _fitted_vector(profile: dict, keys: dict) -> np.ndarray:
    """The fit's parameters (base s, step s per key, 1 / bw_fraction per key) from the profile."""
    prims = profile["primitives"]
    base = next(iter(next(iter(profile["protocols"].values())).values()))["base_us"] * 1e-6
    steps = [next(v["step_us"] for p, v in prims[c].items() if p.removesuffix(PAIR) == prim) * 1e-6
             for c, prim in keys["step"]]
    return np.array([base, *steps, *[1.0 / prims[c][p]["bw_fraction"] for c, p in keys["beta"]]])


def busbw_check(user: UserFile, cluster: str, profile: dict, errors: dict) -> list[dict]:
    """Per record of an nccl-tests file: measured busbw, the profile's (the tier fit's model at the
    fitted values) and the fit's error of one point, relative: the prediction's standard error
    (covariance) and the residual scatter in quadrature; ``within`` where they differ by at most
    ``WITHIN`` of it."""
    design, rows, keys = tier_design(user.records, cluster, errors.get("keys"))
    x, cov = _fitted_vector(profile, keys), np.array(errors.get("cov", [[math.nan]]))
    out = []
    for r, row in zip(rows, design):
        t = float(row @ x)
        error = math.hypot(math.sqrt(max(float(row @ cov @ row), 0.0)) / t, errors.get("residual_sd", math.nan))
        gbytes = r["busbw_factor"] * r["size_bytes"] / 1e9
        measured, fitted = gbytes / r["time_s"], gbytes / t
        out.append({"size_bytes": r["size_bytes"], "measured_busbw_GBps": measured, "fitted_busbw_GBps": fitted,
                    "relative_error": error, "within": abs(measured / fitted - 1.0) <= WITHIN * error})
    return out


def read_from_file(spec: str, cluster: str | None = None, model: str | None = None,
                   plan: dict | None = None) -> UserFile:
    """The records of a ``KIND:PATH`` for the fit (nccl-tests; torch-trace, PyTorch profiler traces:
    ``perfmodel.calibration.traces``, whose memory-bound fit needs ``model`` and ``plan`` where the
    trace does not name them); a training log is refused here: its step times check a prediction
    (``perfmodel check-step``), they are not fitted."""
    kind, path, op = split_spec(spec)
    if kind == "torch-trace":
        from perfmodel.calibration import traces

        return traces.read(path, cluster, model, plan)
    if kind in LOG_KINDS:
        raise InputError("from-file", spec, f"nccl-tests:PATH (a {kind}'s step times check a prediction, they fit "
                         f"nothing: perfmodel check-step --log {kind}:{path} --model ... --cluster ...)")
    return read_nccl_tests(path, op, cluster)


def calibrate(records: list[dict], cluster: str | None, specs=(), sources=(), model: str | None = None,
              plan: dict | None = None) -> tuple[dict, list, dict]:
    """(profile, user files, tier errors): the profile ``perfmodel calibrate`` fits
    (``fit.fit_profile``) from ``records`` and the ``KIND:PATH`` files ``specs``, with the tier fit's
    standard errors under ``fits.tiers.errors`` (NaN written as None). ``cluster`` None: the one the
    records name. ``model`` and ``plan`` (``perfmodel.prediction.predict``'s keywords): what a
    profiler trace ran, where it does not say."""
    from perfmodel.calibration.fit import fit_profile

    users = [read_from_file(spec, cluster, model, plan) for spec in specs]
    records = list(records) + [r for u in users for r in u.records]
    cluster = cluster or next((r["cluster"] for r in records if "cluster" in r), None)
    if cluster is None:
        raise InputError("cluster", None, "--cluster NAME (the records do not name the cluster they ran on)")
    profile = fit_profile(records, cluster, sources=[*sources, *(u.path for u in users)])
    for user in users:
        _say_bound(user, cluster, profile)
    errors = tier_errors(records, cluster, profile)
    if errors:
        profile["fits"]["tiers"]["errors"] = _finite({k: v for k, v in errors.items() if k not in ("cov", "keys")})
    return profile, users, errors


def _say_bound(user: UserFile, cluster: str, profile: dict) -> None:
    """A line for each primitive of an nccl-tests file whose fitted bandwidth fraction sits at its bound, 1:
    the file moves bytes faster than the cluster's links allow for the algorithm the fit prices, so the
    profile cannot reproduce it (its standard errors then cover the misfit; the busbw table says how far)."""
    if user.kind != "nccl-tests" or not user.records:
        return
    _, _, keys = tier_design(user.records, cluster)
    for cls, prim in keys["beta"]:
        fraction = profile.get("primitives", {}).get(cls, {}).get(prim, {}).get("bw_fraction", 0.0)
        if fraction >= 1.0 - 1e-9:
            user.missing.append(f"{cls} {prim}: bw_fraction at its bound 1.0: the file's busbw is more than "
                                f"{cluster}'s {cls} links give this op (the fit cannot reproduce it: is {cluster} "
                                f"the cluster it ran on, and {user.about['world']} ranks its world?)")


def _finite(value):
    """``value`` with every NaN as None (strict JSON: a standard error the records do not determine)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return None if isinstance(value, float) and math.isnan(value) else value
