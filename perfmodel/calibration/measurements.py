"""Measurement records: the versioned schema realrun writes and calibration reads.

One JSON object per line (JSON Lines). ``kind`` is ``collective`` (a timed collective) or
``kernel`` (a compressor alone). Times are seconds, sizes bytes; ``time_s`` of a collective is
the median over iterations of the slowest rank; an optional ``cpu_s`` is the CPU seconds per call
of the busiest rank's process (all its threads).
"""
from __future__ import annotations

import json
import math

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
NUMBERS = ("world", "size_bytes", "wire_bytes", "time_s", "compress_s", "decompress_s", "max_rel_error",
           "time_min_s", "time_max_s", "m", "n", "k", "flops", "bytes", "wrong", "cpu_s", "scores")


def make_record(kind: str, **fields) -> dict:
    """A validated record with the schema and kind filled in."""
    return validate_record({"schema": RECORD_SCHEMA, "kind": kind, **fields})


def validate_record(record: dict, where: str = "record") -> dict:
    if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA:
        got = record.get("schema") if isinstance(record, dict) else record
        raise InputError(f"{where}.schema", got, f"'{RECORD_SCHEMA}'")
    kind = record.get("kind")
    if kind not in REQUIRED:
        raise InputError(f"{where}.kind", kind, " or ".join(REQUIRED))
    for key in REQUIRED[kind]:
        if key not in record:
            raise InputError(f"{where}.{key}", None, f"required in a {kind} record")
    if kind == "compute" and record["op"] not in COMPUTE_OPS:
        raise InputError(f"{where}.op", record["op"], " or ".join(COMPUTE_OPS))
    for key in NUMBERS:
        value = record.get(key)
        if key in record and (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
                              or value < 0 or (math.isinf(value) and key != "max_rel_error")):
            raise InputError(f"{where}.{key}", value, "a finite non-negative number")
        if key in record and bounds.bound(key) is not None:   # sizes and rank counts: declared bounds
            bounds.check(f"{where}.{key}", value, key)
    return record


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
