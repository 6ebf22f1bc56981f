"""Compressor kernels timed alone, and with several processes sharing the machine's cores.

``run_kernels``: median compress and decompress seconds per (size, spec) on inputs cycled out
of the last-level cache (``cold_inputs``). ``run_kernels_shared``: ``ranks`` processes in step
(``realrun.bench.instep``), as the ranks of an emulated cluster share this machine. Records
follow ``perfmodel.calibration.measurements``.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from perfmodel.calibration.measurements import make_record
from realrun.bench.instep import in_step
from topologies.errors import InputError


def run_kernels(sizes, compressors, iters: int = 5, device: str = "cpu", accumulate: bool = False) -> list[dict]:
    """Compressor throughput alone: median compress and decompress seconds, ratio, error; each
    iteration takes the next of ``cold_inputs`` (new data, as in a run, not a cache-hot array).
    ``accumulate``: decompression also adds the values into a float32 sum, as every realrun
    reduction does with what it decodes (what calibration wants to know)."""
    from realrun.compressors import Compressor

    if device != "cpu":
        raise InputError("device", device, "cpu here (cuda kernels run through scripts/gpu_check.sh)")
    out = []
    for size in sizes:
        xs = cold_inputs(size)
        totals = [np.zeros(xs[0].size, np.float32)] if accumulate else None
        for spec in compressors:
            comp, decomp, x, p, y = _timed_calls(Compressor(spec), xs, iters, totals)
            err = float(np.linalg.norm(y - x) / max(float(np.linalg.norm(x)), 1e-30)) if x.size else 0.0
            out.append(make_record("kernel", compressor=spec, device=device, size_bytes=size, wire_bytes=len(p),
                                   compress_s=statistics.median(comp), decompress_s=statistics.median(decomp),
                                   max_rel_error=err, iters=iters, accumulate=accumulate))
    return out


SHARED_MIN_S = 0.25
COLD_BYTES = 96 * 2**20   # inputs cycled per process: 3x this machine's 32 MiB L3, so no case runs cache-hot


def cold_inputs(size: int) -> list[np.ndarray]:
    """Distinct inputs of ``size`` bytes, enough that cycling through them keeps every call's data
    out of the last-level cache, as in a real run where each call sees new data."""
    copies = min(64, max(1, -(-COLD_BYTES // max(size, 1))))
    rng = np.random.default_rng(0)
    return [rng.standard_normal(size // 4).astype(np.float32) for _ in range(copies)]


def _timed_calls(c, xs, iters: int, totals=None, min_s: float = 0.0):
    """Compress and decompress the inputs in turn, at least ``iters`` times and ``min_s``
    seconds; decoded values are added into ``totals`` (cycled) when given. Returns the compress
    and decompress seconds of every call and the last input, payload and output."""
    comp, decomp = [], []
    begin = time.perf_counter()
    while len(comp) < iters or time.perf_counter() - begin < min_s:
        k = len(comp)
        x = xs[k % len(xs)]
        start = time.perf_counter()
        p = c.compress(x)
        comp.append(time.perf_counter() - start)
        start = time.perf_counter()
        y = c.decompress(p, like=x)
        if totals is not None:
            totals[k % len(totals)] += y
        decomp.append(time.perf_counter() - start)
    return comp, decomp, x, p, y


def _shared_worker(barrier, queue, sizes, compressors, iters):
    from realrun.compressors import Compressor

    out = []
    for size in sizes:
        xs = cold_inputs(size)
        totals = [np.zeros(x.size, np.float32) for x in xs]
        for spec in compressors:
            c = Compressor(spec)
            c.compress(xs[0])   # warm: numba caches, workspaces
            barrier.wait()
            # long enough for the scheduler to interleave the processes (a few 4 ms slices each)
            cpu = time.process_time()
            comp, decomp, _, p, _ = _timed_calls(c, xs, iters, totals, SHARED_MIN_S)
            cpu = (time.process_time() - cpu) / len(comp)   # CPU seconds per compress + decompress
            out.append((size, spec, len(p), sum(comp) / len(comp), sum(decomp) / len(decomp), cpu))
    queue.put(out)


def run_kernels_shared(sizes, compressors, iters: int = 5, ranks: int = 2, threads: int = 1,
                       place=None) -> list[dict]:
    """Compressor throughput with ``ranks`` processes (``threads`` threads each) computing at once,
    in step (a barrier before every case, each case run for at least ``SHARED_MIN_S`` so the
    scheduler interleaves them), as the ranks of an emulated cluster share this machine;
    decompression accumulates (as in a reduction). Mean times of the median process,
    records marked ``concurrent = ranks``, with the CPU seconds per compress and decompress the
    process got (``cpu_s``: perfmodel prices a host with a quota at its declared share from
    them, ``perfmodel.calibration.fit.compute_seconds``). ``place``: as ``in_step``'s."""
    results = in_step(_shared_worker, (list(sizes), list(compressors), iters), ranks, threads, place)
    out = []
    for rows in zip(*results):
        size, spec, wire, comp, decomp, cpu = sorted(rows, key=lambda r: r[3] + r[4])[len(rows) // 2]
        out.append(make_record("kernel", compressor=spec, device="cpu", size_bytes=size, wire_bytes=wire,
                               compress_s=comp, decompress_s=decomp, max_rel_error=0.0, iters=iters,
                               accumulate=True, concurrent=ranks, cpu_s=cpu))
    return out
