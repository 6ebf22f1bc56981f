#!/usr/bin/env python3
"""realrun performance (issue 4, section 5):

1. CPU compressor throughput for fp16, int8, sign, topk(0.01) on 16 M float32 values, as a
   fraction of this machine's memcpy bandwidth measured the same way (copy of the same array);
2. a 4-rank gloo compressed all-reduce of 64 MiB on loopback: median time of the slowest
   rank and speedup over uncompressed, per compressor and algorithm.

Usage: python benchmarks/bench_realrun.py [--skip-allreduce] [--iters 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from realrun.bench import run_collectives
from realrun.compressors import Compressor

N = 16 * 2**20


def _median_s(fn, iters):
    out = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def kernels(iters: int) -> None:
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    dst = np.empty_like(x)
    memcpy = x.nbytes / _median_s(lambda: np.copyto(dst, x), iters)
    print(f"memcpy (numpy copyto, 64 MiB): {memcpy / 1e9:.2f} GB/s")
    print("  into reused buffers (compress(out=...), decompress(out=...)); fresh buffers in brackets")
    for spec in ("fp16", "int8", "sign", "topk(0.01)"):
        c = Compressor(spec)
        p = c.compress(x)
        payload, back = bytearray(len(p)), np.empty_like(x)
        comp = x.nbytes / _median_s(lambda c=c, b=payload: c.compress(x, out=b), iters)
        decomp = x.nbytes / _median_s(lambda c=c, p=p, o=back: c.decompress(p, out=o), iters)
        comp_new = x.nbytes / _median_s(lambda c=c: c.compress(x), iters)
        decomp_new = x.nbytes / _median_s(lambda c=c, p=p: c.decompress(p), iters)
        print(f"  {spec:11s} compress {comp / 1e9:5.2f} GB/s ({comp / memcpy:.2f} of memcpy) [{comp_new / 1e9:5.2f}]  "
              f"decompress {decomp / 1e9:5.2f} GB/s ({decomp / memcpy:.2f}) [{decomp_new / 1e9:5.2f}]  "
              f"ratio {x.nbytes / len(p):.2f}")


def allreduce(iters: int) -> None:
    config = dict(op="allreduce", world=4, backend="gloo", sizes=[64 * 2**20],
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
    ap.add_argument("--skip-allreduce", action="store_true")
    args = ap.parse_args()
    kernels(args.iters)
    if not args.skip_allreduce:
        allreduce(max(2, args.iters // 2))


if __name__ == "__main__":
    main()
