"""Measurement records: the versioned schema realrun writes and calibration reads.

One JSON object per line (JSON Lines). ``kind`` is ``collective`` (a timed collective) or
``kernel`` (a compressor alone). Times are seconds, sizes bytes; ``time_s`` of a collective is
the median over iterations of the slowest rank; an optional ``cpu_s`` is the CPU seconds per call
of the busiest rank's process (all its threads), ``thread_cpu_s`` that of the thread that called
the collective and ``kernel_cpu_s`` that of its compress and decompress calls (realrun.bench.worker).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from topologies import bounds
from topologies.errors import InputError

RECORD_SCHEMA = "commpress.record/1"
REQUIRED = {
    "collective": ("op", "compressor", "algorithm", "world", "backend", "size_bytes", "wire_bytes", "time_s",
                   "compress_s", "decompress_s", "max_rel_error"),
    "kernel": ("compressor", "device", "size_bytes", "wire_bytes", "compress_s", "decompress_s",
               "max_rel_error"),
    # a training step's compute, timed forward and backward: op gemm (m x n x k), attention
    # (s x s x head_dim GEMMs of all heads), elementwise (a layer's memory-bound work) or scores
    # (an eager ring-attention block, ``scores`` of them, its GEMMs' flops); flops and bytes as
    # perfmodel.step.compute counts them
    "compute": ("op", "device", "m", "n", "k", "flops", "bytes", "time_s"),
}
COMPUTE_OPS = ("gemm", "attention", "elementwise", "scores")
# every field a record may carry and what it must be (another field is kept and never read)
TEXT = ("op", "compressor", "algorithm", "backend", "device", "cluster")
# numbers with a declared bound (topologies.bounds): sizes, counts of ranks, a GEMM's dims, a step's FLOPs
# (``scores``: the elementwise operations of an eager ring-attention block, bounded as FLOPs), the host's
# CPU share (a cgroup quota of one core; None where the hosts time-share the cores)
BOUNDED = {"world": "world", "concurrent": "world", "size_bytes": "size_bytes", "wire_bytes": "wire_bytes",
           "bytes": "size_bytes", "m": "gemm_size", "n": "gemm_size", "k": "gemm_size", "flops": "flops",
           "scores": "flops", "cpu_share": "cpu_share"}
# seconds of one call: 0 (not measured: an uncompressed spec's kernels) or within ``measured_s``
SECONDS = ("time_s", "time_min_s", "time_max_s", "compress_s", "decompress_s", "cpu_s", "thread_cpu_s",
           "kernel_cpu_s")
COUNTS = ("iters", "wrong")                  # whole numbers >= 0
FACTORS = ("max_rel_error", "busbw_factor")  # numbers >= 0 (a relative error is inf where the input held a 0)
FLAGS = ("accumulate",)
# the fastest rate a record may imply (bytes over seconds): no link, memory or kernel moves more than the
# declared ``_GBps`` bound; a record past it (compress_s 1e-300) would fit an absurd profile
MAX_RATE_Bps = bounds.bound("_GBps")[2] * 1e9
MAX_FLOPS_PER_S = bounds.bound("fp32_TFLOPS")[2] * 1e12


@dataclass
class UserFile:
    """What one of a user's files gave (``perfmodel calibrate --from-file``: nccl-tests output,
    profiler traces): records, the lines saying what it did not contain, and what it said about
    itself (op, world, hosts, device)."""
    path: str
    kind: str
    records: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    about: dict = field(default_factory=dict)


def make_record(kind: str, **fields) -> dict:
    """A validated record with the schema and kind filled in."""
    return validate_record({"schema": RECORD_SCHEMA, "kind": kind, **fields})


def validate_record(record: dict, where: str = "record") -> dict:
    """``record`` if every field it carries is of its type and within its declared bound, and the
    record can be fitted (``_check_fittable``); else one line naming ``where`` and the field."""
    if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA:
        got = record.get("schema") if isinstance(record, dict) else record
        raise InputError(f"{where}.schema", got, f"'{RECORD_SCHEMA}'")
    kind = record.get("kind")
    if kind not in REQUIRED:
        raise InputError(f"{where}.kind", kind, " or ".join(REQUIRED))
    for key in REQUIRED[kind]:
        if key not in record:
            raise InputError(f"{where}.{key}", None, f"required in a {kind} record")
    for key, value in record.items():
        _check_field(f"{where}.{key}", key, value)
    if kind == "compute" and record["op"] not in COMPUTE_OPS:
        raise InputError(f"{where}.op", record["op"], " or ".join(COMPUTE_OPS))
    if kind != "compute":
        _check_spec(f"{where}.compressor", record["compressor"])
    _check_fittable(record, where)
    return record


def _number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and not math.isnan(value)


def _check_field(field: str, key: str, value) -> None:
    """One field of a record, by its name: text, a bounded number, seconds, a count, a factor or a flag."""
    if key in TEXT and not isinstance(value, str):
        raise InputError(field, value, "a string")
    if key in BOUNDED and not (key == "cpu_share" and value is None):
        bounds.check(field, value, BOUNDED[key])
    if key in SECONDS:
        _check_seconds(field, value)
    if key in COUNTS and (not _number(value) or not math.isfinite(value) or value < 0 or value != int(value)):
        raise InputError(field, value, "a whole number >= 0")
    if key in FACTORS and (not _number(value) or value < 0 or (math.isinf(value) and key != "max_rel_error")):
        raise InputError(field, value, "a finite non-negative number")
    if key in FLAGS and not isinstance(value, bool):
        raise InputError(field, value, "true or false")


def _check_seconds(field: str, value) -> None:
    if _number(value) and value == 0:
        return
    try:
        bounds.check(field, value, "measured_s")
    except InputError:
        raise InputError(field, value, "0 (not measured) or " + bounds.describe("measured_s") + " seconds") from None


def _check_spec(field: str, text: str) -> None:
    from perfmodel.compression import compile_spec

    try:
        compile_spec(text)
    except InputError as err:
        raise InputError(field, text, f"a compressor spec ({err.allowed})") from None


def _check_fittable(record: dict, where: str) -> None:
    """Refuse what would make a fit meaningless: a kernel record of no bytes or no payload (its ratio
    size / wire infinite), or a record whose bytes or FLOPs over its seconds imply a rate no device
    reaches (``MAX_RATE_Bps``, ``MAX_FLOPS_PER_S``: a time of 1e-300 s, FLOPs of 1e300)."""
    kind = record["kind"]
    if kind == "kernel":
        for key in ("size_bytes", "wire_bytes"):
            if record[key] < 1:
                raise InputError(f"{where}.{key}", record[key], "at least 1 byte in a kernel record (a ratio of "
                                 "size_bytes / wire_bytes is fitted from it)")
        for key in ("compress_s", "decompress_s"):
            _check_rate(where, key, record[key], record["size_bytes"], MAX_RATE_Bps, "bytes")
    elif kind == "collective":
        _check_rate(where, "time_s", record["time_s"], record["size_bytes"], MAX_RATE_Bps, "bytes")
    else:
        if record["op"] != "elementwise" and record["flops"] <= 0:
            raise InputError(f"{where}.flops", record["flops"], f"above 0 in a {record['op']} record (its GEMMs' "
                             "FLOPs over its time are the rate fitted)")
        seconds = compute_seconds(record)
        key = "cpu_s" if has_quota(record) else "time_s"
        _check_rate(where, key, seconds, record["flops"], MAX_FLOPS_PER_S, "FLOPs")
        _check_rate(where, key, seconds, record["bytes"], MAX_RATE_Bps, "bytes")


def _check_rate(where: str, key: str, seconds: float, amount: float, highest: float, unit: str) -> None:
    """``amount`` (of ``unit``) over ``seconds`` (where measured) at most ``highest`` per second, or one
    line naming ``key``."""
    if seconds > 0 and amount / seconds > highest:
        raise InputError(f"{where}.{key}", seconds, f"at least {amount / highest:.2g} s for its {amount:.3g} {unit} "
                         f"({amount / seconds:.2g} {unit}/s is past any device: {highest:g} at most)")


def has_quota(r: dict) -> bool:
    """The record was measured on a host with a fixed CPU share (``cpu_share``) and says the CPU it got."""
    return bool(r.get("cpu_share")) and r.get("cpu_s", 0) > 0


def compute_seconds(r: dict) -> float:
    """A compute record's seconds per call as the model prices them: on a host with a fixed CPU
    share (``cpu_share``: a quota), the CPU seconds the work took over that share, which is the
    wall time the quota gives it when the machine has the cores it promised (measured wall time
    on a busy machine is longer: the quota is a cap, not a guarantee; ``granted_share`` in the
    report says how much the helpers got); elsewhere the wall time."""
    return r["cpu_s"] / r["cpu_share"] if has_quota(r) else r["time_s"]


def read_records(path: str) -> list[dict]:
    """Every record of a JSON Lines file, validated (errors name the line)."""
    out = []
    try:
        with open(path) as handle:
            for i, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        out.append(validate_record(json.loads(line), f"{path}:{i}"))
                    except json.JSONDecodeError as err:
                        raise InputError(f"{path}:{i}", line[:40], f"a JSON record ({err.msg})") from None
    except OSError as err:
        raise InputError("records", path, f"a readable file ({err.strerror})") from None
    except UnicodeDecodeError:
        raise InputError("records", path, "a UTF-8 JSON Lines file") from None
    except RecursionError:
        raise InputError("records", path, "JSON records nested at most a few levels") from None
    return out
