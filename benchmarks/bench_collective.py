#!/usr/bin/env python3
"""Performance of the collective model (targets in brackets):

1. one ``collective_time`` on a 1024-GPU cluster with the fabric view cached [< 100 us];
2. a 30-size sweep x 10 compressors on ``dgx-h100 --nodes 128``, topology build included [< 1 s].

Prints medians over repeats (the machine is shared and noisy). Usage:
    python benchmarks/bench_collective.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

from perfmodel import collective_time
from perfmodel.collectives.predict import _uncompressed_time
from perfmodel.collectives.fabric import make_ctx
from perfmodel.compression import compile_spec
from topologies import build_cluster
from topologies.catalog import load_spec
from topologies.fabricview import _fabric_view
from topologies.routing import router_for

COMPRESSORS = ["none", "fp16", "bf16", "int8", "int4", "sign", "topk(0.01)", "ef(topk(0.01))+int8",
               "powersgd(4)", "sz3(abs=1e-4)"]
SIZES = [1024 * 2 ** i for i in range(30)]       # 1 KiB .. 512 GiB


def clear_caches() -> None:
    for cached in (build_cluster, load_spec, _fabric_view, router_for, make_ctx, _uncompressed_time,
                   compile_spec):
        cached.cache_clear()


def per_call_us(compressor: str, algorithm: str, calls: int = 400) -> float:
    collective_time("allreduce", 1 << 20, cluster="dgx-h100", nodes=128, compressor=compressor)
    start = time.perf_counter()
    for i in range(calls):   # distinct sizes: nothing is answered from a result cache
        collective_time("allreduce", (1 << 20) + 4 * i, cluster="dgx-h100", nodes=128,
                        compressor=compressor, algorithm=algorithm)
    return (time.perf_counter() - start) / calls * 1e6


def sweep_s() -> float:
    clear_caches()
    start = time.perf_counter()
    for size in SIZES:
        for c in COMPRESSORS:
            collective_time("allreduce", size, cluster="dgx-h100", nodes=128, compressor=c)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print("collective_time on dgx-h100 x128 (1024 GPUs), fabric view cached, "
          "median us per call [target < 100]")
    for comp in ("none", "int8", "topk(0.01)"):
        for alg in ("ring", "auto"):
            us = statistics.median(per_call_us(comp, alg) for _ in range(args.repeats))
            print(f"  {comp:12s} algorithm={alg:5s} {us:8.1f} us")
    runs = [sweep_s() for _ in range(args.repeats)]
    print(f"30 sizes x 10 compressors on dgx-h100 x128, build included [target < 1 s]: median "
          f"{statistics.median(runs):.3f} s (min {min(runs):.3f}, max {max(runs):.3f})")


if __name__ == "__main__":
    main()
