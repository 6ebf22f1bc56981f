#!/usr/bin/env python3
"""Performance of the step model (targets in brackets):

1. one ``predict`` with catalogs loaded and the plan's fabric views cached [< 10 ms];
2. the sweep of every valid plan of gpt3-175b on 1024 GPUs of dgx-a100 for 5 policies [< 60 s],
   from cold caches; reports plans per second. ``--recompute any`` widens the plan space 3x.

Usage: python benchmarks/bench_step.py [--repeats 5] [--recompute none|any]
"""
from __future__ import annotations

import argparse
import statistics
import time

from perfmodel.prediction import predict
from perfmodel.explore.sweep import sweep_plans

POLICIES = "none;naive:int8;hybrid;naive:fp16;dp=ef(topk(0.01))+int8,zero=ef(topk(0.01))+int8"
NEOX = dict(gpus=192, tp=4, pp=4, mbs=4, gbs=1056, zero=1, recompute="full")


def predict_ms(calls: int = 50) -> float:
    predict("gpt-neox-20b", "lassen", policy="hybrid", **NEOX)
    start = time.perf_counter()
    for i in range(calls):   # a new overlap factor each call: nothing answered from the record caches
        predict("gpt-neox-20b", "lassen", policy="hybrid", overlap_slowdown=0.1 + 1e-6 * i, **NEOX)
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--recompute", default="any")
    args = ap.parse_args()
    start = time.perf_counter()
    predict("llama2-7b", "dgx-h100", nodes=8, tp=4, pp=2, mbs=2, gbs=256, policy="hybrid")
    print(f"first predict of a new layout (fabric views routed, 64 GPUs of dgx-h100): "
          f"{(time.perf_counter() - start) * 1e3:.0f} ms")
    runs = [predict_ms() for _ in range(args.repeats)]
    print(f"predict gpt-neox-20b on 192 GPUs of lassen, policy hybrid [target < 10 ms]: median "
          f"{statistics.median(runs):.2f} ms (min {min(runs):.2f}, max {max(runs):.2f})")
    start = time.perf_counter()
    result = sweep_plans("gpt3-175b", "dgx-a100", gpus=1024, gbs=1536, policies=POLICIES, recompute=args.recompute)
    wall = time.perf_counter() - start
    print(f"sweep gpt3-175b on 1024 GPUs of dgx-a100, 5 policies, recompute={args.recompute} [target < 60 s]: "
          f"{wall:.1f} s for {result.plans} candidate plans ({result.skipped_oom} do not fit), "
          f"{result.evaluated} predictions; {result.plans / wall:.1f} plans/s, {result.evaluated / wall:.1f} "
          f"predictions/s")
    best = result.records[0]
    print(f"  best: {best.policy} tp={best.plan['tp']} pp={best.plan['pp']} dp={best.plan['dp']} "
          f"mbs={best.plan['mbs']} zero={best.plan['zero']} recompute={best.plan['recompute']} "
          f"step {best.step_time_s:.2f} s, {best.model_tflops_per_gpu:.1f} TFLOPS/GPU")


if __name__ == "__main__":
    main()
