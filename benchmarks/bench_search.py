#!/usr/bin/env python3
"""``perfmodel search`` throughput: (plan, policy) evaluations per minute with the default
candidates and budget, cold (each run a fresh process: nothing cached), on one worker and on
every core. Target: at least 100,000 per minute on this machine.

Usage: python benchmarks/bench_search.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import json, sys
from perfmodel.search import search
model, cluster, gpus, gbs, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
r = search(model, cluster, gpus=gpus, gbs=gbs, workers=workers)
print(json.dumps(dict(plans=r.plans, oom=r.skipped_oom, evaluated=r.evaluated, seconds=r.seconds,
                      per_minute=r.per_minute, ranked=len(r.ranked))))
"""
CASES = [("gpt3-1.3b", "commodity-25g", 32, 256), ("gpt3-1.3b", "dgx-a100", 64, 512),
         ("gpt3-175b", "dgx-a100", 1024, 1536)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first case only")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    print(f"{'model':10s} {'cluster':14s} {'GPUs':>5s} {'workers':>7s} {'plans':>6s} {'evals':>7s} {'s':>7s} "
          f"{'evals/min':>10s}")
    for model, cluster, gpus, gbs in CASES[:1] if args.quick else CASES:
        for workers in sorted({1, cores}):
            out = subprocess.run([sys.executable, "-c", _CHILD, model, cluster, str(gpus), str(gbs), str(workers)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{model:10s} {cluster:14s} {gpus:5d} {workers:7d} {r['plans']:6d} {r['evaluated']:7d} "
                  f"{r['seconds']:7.1f} {r['per_minute']:10,.0f}")


if __name__ == "__main__":
    main()
