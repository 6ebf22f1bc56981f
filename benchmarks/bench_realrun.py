#!/usr/bin/env python3
"""realrun performance: CPU compressor throughput against memcpy, and all-reduce overhead.

1. Compress and decompress throughput (into reused buffers) of fp16, bf16, int8, int4, sign,
   topk(0.01) and powersgd(4) on 16 MiB and 64 MiB of float32, as a fraction of this
   machine's memcpy bandwidth measured in the same run (numpy copyto of the same array):
   ``--runs`` runs, each the median of ``--iters`` calls; the table shows the median fraction
   over runs and its spread (min-max). Targets: 0.3 of memcpy for the casts, quantizers and
   sign; 0.15 for top-k.
2. A 4-rank gloo all-reduce of 64 MiB on loopback: median time of the slowest rank and
   speedup over uncompressed, per compressor and algorithm; and realrun's uncompressed
   all-reduce against plain in-place ``torch.distributed.all_reduce`` (target: within 1.2x).

Usage: python benchmarks/bench_realrun.py [--skip-allreduce] [--iters 5] [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from realrun.bench import BenchConfig, cold_inputs, run_collectives
from realrun.compressors import Compressor

SIZES = (16 * 2**20, 64 * 2**20)
SPECS = ("fp16", "bf16", "int8", "int4", "sign", "topk(0.01)", "powersgd(4)")


def _median_s(fn, iters):
    out = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def _cycled_s(fn, items, iters):
    """Median seconds of ``fn(item)`` over ``iters`` calls, cycling through ``items`` (cache-cold)."""
    out = []
    for i in range(max(iters, len(items))):
        item = items[i % len(items)]
        start = time.perf_counter()
        fn(item)
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def _one_run(xs, iters) -> dict:
    """One run on inputs ``xs`` (distinct arrays, together three times the last-level cache,
    so no call finds its data cached: as in training, where each bucket is new data)."""
    dst = np.empty_like(xs[0])
    nbytes = xs[0].nbytes
    memcpy = nbytes / _cycled_s(lambda x: np.copyto(dst, x), xs, iters)
    out = {"memcpy": memcpy}
    for spec in SPECS:
        c = Compressor(spec)
        payloads = [c.compress(x) for x in xs]
        buf, back = bytearray(len(payloads[0])), np.empty_like(xs[0])
        comp = nbytes / _cycled_s(lambda x, c=c, b=buf: c.compress(x, out=b), xs, iters)
        decomp = nbytes / _cycled_s(lambda p, c=c, o=back: c.decompress(p, out=o), payloads, iters)
        out[spec] = (comp / memcpy, decomp / memcpy)
    return out


def kernels(iters: int, runs: int) -> None:
    for size in SIZES:
        xs = cold_inputs(size)
        results = [_one_run(xs, iters) for _ in range(runs)]
        mem = [r["memcpy"] / 1e9 for r in results]
        print(f"{size >> 20} MiB float32: memcpy {statistics.median(mem):.2f} GB/s "
              f"(runs {min(mem):.2f}-{max(mem):.2f}); fraction of memcpy, median of {runs} runs [min-max]")
        for spec in SPECS:
            comp = [r[spec][0] for r in results]
            dec = [r[spec][1] for r in results]
            print(f"  {spec:12s} compress {statistics.median(comp):5.2f} [{min(comp):.2f}-{max(comp):.2f}]  "
                  f"decompress {statistics.median(dec):5.2f} [{min(dec):.2f}-{max(dec):.2f}]")


def allreduce(iters: int) -> None:
    config = BenchConfig.grid(op="allreduce", world=4, sizes=[64 * 2**20],
                              compressors=["none", "fp16", "int8", "topk(0.01)"],
                              algorithms=["auto", "ring", "allgather", "two_phase"], iters=iters, warmup=1)
    records = run_collectives(config)
    base = next(r["time_s"] for r in records if r["compressor"] == "none" and r["algorithm"] == "auto")
    print(f"4-rank gloo all-reduce of 64 MiB on loopback, median of {iters} (slowest rank):")
    for r in records:
        print(f"  {r['compressor']:11s} {r['algorithm']:10s} {r['time_s'] * 1e3:9.1f} ms  "
              f"speedup {base / r['time_s']:5.2f}  error {r['max_rel_error']:.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-allreduce", action="store_true")
    args = ap.parse_args()
    kernels(args.iters, args.runs)
    if not args.skip_allreduce:
        allreduce(max(2, args.iters // 2))


if __name__ == "__main__":
    main()
