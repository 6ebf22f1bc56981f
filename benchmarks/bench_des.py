#!/usr/bin/env python3
"""The event engine's cores, measured: the same step simulation (pipeline stages x microbatches
under 1F1B, every stage's gradient buckets sharing its NIC with the transfers) on the heap core
written for it and on SimPy; median seconds of 5 runs each, the events they handled and the
end time (which must agree). Then ``perfmodel predict --engine des`` against the analytical
engine for GPT-3 175B on 1024 and 16,384 A100s (targets: des at most 2 s and 30 s), with events per second.

Usage: python benchmarks/bench_des.py [--stages 16] [--microbatches 64] [--buckets 40]
"""
from __future__ import annotations

import argparse
import statistics
import time

from perfmodel import predict
from perfmodel.simulate.step import StageWork, simulate


def _median_s(fn, repeats: int = 5) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=64)
    ap.add_argument("--buckets", type=int, default=40)
    args = ap.parse_args()
    p, m, n = args.stages, args.microbatches, args.buckets
    work = [StageWork(1.0, 2.0, 0.3, 0.3, ((1 / n, 1 / n, n, 0.06),))] * p
    work_items = 2 * p * m + 2 * (p - 1) * m + p * n
    print(f"# {p} stages x {m} microbatches, {n} buckets per stage: {work_items} pieces of work")
    print(f"{'core':6s} {'median s':>9s} {'work/s':>10s} {'end s':>10s}")
    ends = {}
    for core in ("heap", "simpy"):
        try:
            t, r = _median_s(lambda core=core: simulate(work, "1f1b", m, core=core))
        except ImportError:
            print(f"{core:6s} (not installed)")
            continue
        ends[core] = r.end_s
        print(f"{core:6s} {t:9.4f} {work_items / t:10.0f} {r.end_s:10.3f}")
    if len(ends) == 2:
        print(f"# same end time on both cores: {abs(ends['heap'] - ends['simpy']) < 1e-9}")
    print("# predict gpt3-175b, dgx-a100, tp 8, pp 8, 1F1B, 96 microbatches per step (targets: des at most "
          "2 s on 1024 GPUs, 30 s on 16,384); warm caches, median of 3")
    print(f"{'GPUs':>6s} {'engine':10s} {'median s':>9s} {'events':>8s} {'events/s':>9s} {'step s':>8s}")
    for gpus in (1024, 16384):
        kw = dict(model="gpt3-175b", cluster="dgx-a100", gpus=gpus, tp=8, pp=8, mbs=1, gbs=96 * gpus // 64,
                  allow_oom=True)
        predict(**kw)   # build the cluster and its fabric views once
        for engine in ("analytical", "des"):
            t, r = _median_s(lambda engine=engine, kw=kw: predict(**kw, engine=engine), repeats=3)
            rate = f"{r.simulated_events / t:9.0f}" if r.simulated_events else f"{'-':>9s}"
            print(f"{gpus:6d} {engine:10s} {t:9.3f} {r.simulated_events:8d} {rate} {r.step_time_s:8.3f}")


if __name__ == "__main__":
    main()
