#!/usr/bin/env python3
"""``perfmodel search`` throughput: (plan, policy) evaluations per minute with the default
candidates and budget, cold (each run a fresh process: nothing cached), one worker unless
``--workers`` says more. Target: at least 100,000 per minute for GPT-3 175B on 1024 A100.

Each case runs ``--repeats`` times; printed: the median evaluations per minute by the clock and
by CPU time (the search's processes, workers included: what it costs when the cores are shared with other work),
and the spread of the clock rate (max / min - 1).

Usage: python benchmarks/bench_search.py [--quick] [--repeats N] [--workers 1,2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

_CHILD = r"""
import json, resource, sys, time
from perfmodel.explore.search import search


def cpu_s():
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


model, cluster, gpus, gbs, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cpu = cpu_s()
r = search(model, cluster, gpus=gpus, gbs=gbs, workers=workers)
cpu = cpu_s() - cpu
print(json.dumps(dict(plans=r.plans, oom=r.skipped_oom, evaluated=r.evaluated, seconds=r.seconds, cpu=cpu,
                      per_minute=r.per_minute, ranked=len(r.ranked))))
"""
CASES = [("gpt3-1.3b", "commodity-25g", 32, 256), ("gpt3-1.3b", "dgx-a100", 64, 512),
         ("gpt3-175b", "dgx-a100", 1024, 1536)]


def run_case(model: str, cluster: str, gpus: int, gbs: int, workers: int, repeats: int) -> dict:
    """Median clock and CPU rates of ``repeats`` fresh processes, and the spread of the clock rate."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _CHILD, model, cluster, str(gpus), str(gbs), str(workers)],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    rates = [r["per_minute"] for r in runs]
    first = runs[0]
    return dict(plans=first["plans"], evaluated=first["evaluated"],
                seconds=statistics.median(r["seconds"] for r in runs), per_minute=statistics.median(rates),
                spread=max(rates) / min(rates) - 1,
                cpu_per_minute=statistics.median(60 * r["evaluated"] / r["cpu"] for r in runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first case only")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per case (default 3)")
    ap.add_argument("--workers", default="1", help="comma-separated worker counts (default 1)")
    args = ap.parse_args()
    workers = sorted({int(w) for w in args.workers.split(",")})
    print(f"{'model':10s} {'cluster':14s} {'GPUs':>5s} {'workers':>7s} {'plans':>6s} {'evals':>7s} {'s':>7s} "
          f"{'evals/min':>10s} {'spread':>7s} {'per CPU-min':>11s}")
    for model, cluster, gpus, gbs in CASES[:1] if args.quick else CASES:
        for w in workers:
            r = run_case(model, cluster, gpus, gbs, w, max(1, args.repeats))
            print(f"{model:10s} {cluster:14s} {gpus:5d} {w:7d} {r['plans']:6d} {r['evaluated']:7d} "
                  f"{r['seconds']:7.1f} {r['per_minute']:10,.0f} {r['spread']:7.0%} {r['cpu_per_minute']:11,.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
