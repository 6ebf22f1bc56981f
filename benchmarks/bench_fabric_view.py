#!/usr/bin/env python3
"""The first prediction on a large cluster: a cold ``perfmodel.predict`` (graph built, fabric
views computed, nothing cached) of gpt3-175b, tp 8, pp 8, 96 microbatches per DP replica, on
dgx-a100 at each size, each in a fresh process; seconds and peak resident memory. Then one warm
predict. Targets: 16,384 GPUs at most 1 s, 131,072 at most 10 s and 1 GiB.

Usage: python benchmarks/bench_fabric_view.py [--gpus 1024 16384 131072]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = r"""
import json, resource, sys, time
from perfmodel import predict
gpus = int(sys.argv[1])
kw = dict(model="gpt3-175b", cluster="dgx-a100", gpus=gpus, tp=8, pp=8, mbs=1, gbs=96 * (gpus // 64),
          allow_oom=True)
start = time.perf_counter()
r = predict(**kw)
cold = time.perf_counter() - start
start = time.perf_counter()
predict(**kw)
warm = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(dict(gpus=gpus, cold_s=cold, warm_s=warm, rss_MiB=rss, step_s=r.step_time_s)))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1024, 16384, 131072])
    args = ap.parse_args()
    print(f"{'GPUs':>8s} {'cold s':>8s} {'warm ms':>8s} {'peak MiB':>9s} {'step s':>8s}")
    for gpus in args.gpus:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(gpus)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{gpus:8d} {r['cold_s']:8.2f} {r['warm_s'] * 1e3:8.1f} {r['rss_MiB']:9.0f} {r['step_s']:8.3f}")


if __name__ == "__main__":
    main()
