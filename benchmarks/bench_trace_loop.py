#!/usr/bin/env python3
"""Calibrate from one profiler trace of a small run, predict a bigger run, measure it.

The loop a user runs on their own job, here on this machine's CPU with realrun's small GPT:

1. ``realrun train --profile DIR`` on the small job (``--model``, ``--mbs``): one rank, one thread;
   its trace holds the steady steps' operators with their shapes and the run's model and plan.
2. ``perfmodel calibrate --from-file torch-trace:DIR --cluster emulated:hosts=1`` (the Python API:
   ``perfmodel.calibration.userfiles.calibrate``): the GEMM efficiency per size and attention from
   the trace's shapes, the memory-bound work's streaming rate from the model's bytes of that job.
3. ``perfmodel predict`` of the big job (twice the layers and twice the batch: ``num_layers`` x 2,
   ``mbs`` x 2) and of the small job itself, with that profile.
4. Both jobs run unprofiled (``realrun train``, ``--steps`` steps; the median step after the
   warm-up, ``realrun.train.report.steady``).

Each repeat runs the three jobs in turn (profiled small, small, big), so a drift of the machine's
load falls on all three; the table gives every repeat and the median and spread (max - min) of the
errors. Target (issue 41): the big job within 15% on this machine. The profiled run's own median
step beside the unprofiled one shows what profiling costs (the trace's times carry it: every
recorded operator pays the profiler's callbacks).

Usage: python benchmarks/bench_trace_loop.py [--model gpt-tiny] [--mbs 8] [--steps 12]
           [--repeats 3] [--threads 1] [--out DIR] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from perfmodel.calibration.userfiles import calibrate
from perfmodel.prediction import predict
from perfmodel.workload import load_model
from realrun.train.config import TrainConfig
from realrun.train.report import steady

CLUSTER = "emulated:hosts=1"


def train(model: str, mbs: int, steps: int, threads: int, folder: str, name: str, profile: bool) -> float:
    """The median steady step (seconds) of one ``realrun train`` run (a process of its own)."""
    metrics = os.path.join(folder, f"{name}.jsonl")
    cmd = [sys.executable, "-m", "realrun.cli", "train", "--model", model, "--mbs", str(mbs), "--steps", str(steps),
           "--threads", str(threads), "--device", "cpu", "--eval-every", "0", "--error-every", "0",
           "--metrics", metrics] + (["--profile", os.path.join(folder, name)] if profile else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(metrics, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return statistics.median(r["step_s"] for r in steady(records))


def predicted(model: str, mbs: int, calibration: str) -> float:
    """perfmodel's step of the run ``realrun train`` makes of (model, mbs) with the profile."""
    plan = TrainConfig(model=model, mbs=mbs).plan()
    return predict(model, CLUSTER, gpus=1, **plan.degrees.as_dict(), zero=plan.zero, mbs=plan.mbs, gbs=plan.gbs,
                   seq=plan.seq, schedule=plan.schedule, compute_dtype=plan.compute_dtype,
                   grad_dtype=plan.grad_dtype, bucket_bytes=plan.bucket_bytes, dp_overlap=plan.dp_overlap,
                   kernels=plan.kernels, allow_oom=True, calibration=calibration).step_time_s


def repeat(args, folder: str, index: int) -> dict:
    small, big = args.model, f"{args.model}:num_layers={2 * load_model(args.model).num_layers}"
    name = f"trace{index}"
    profiled = train(small, args.mbs, args.steps, args.threads, folder, name, True)
    measured_small = train(small, args.mbs, args.steps, args.threads, folder, f"small{index}", False)
    measured_big = train(big, 2 * args.mbs, args.steps, args.threads, folder, f"big{index}", False)
    profile, users, _ = calibrate([], CLUSTER, [f"torch-trace:{os.path.join(folder, name)}"])
    path = os.path.join(folder, f"profile{index}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(profile, f)
    pred_small, pred_big = predicted(small, args.mbs, path), predicted(big, 2 * args.mbs, path)
    return {"repeat": index, "profiled_small_s": profiled, "measured_small_s": measured_small,
            "predicted_small_s": pred_small, "small_error": pred_small / measured_small - 1,
            "measured_big_s": measured_big, "predicted_big_s": pred_big, "big_error": pred_big / measured_big - 1,
            "missing": users[0].missing}


def summary(rows: list[dict]) -> dict:
    out = {}
    for key in ("small_error", "big_error", "profiled_small_s", "measured_small_s", "measured_big_s"):
        values = [r[key] for r in rows]
        out[key] = {"median": statistics.median(values), "spread": max(values) - min(values)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt-tiny")
    p.add_argument("--mbs", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="keep the traces, metrics and profiles here (default: a temporary folder)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or tmp
        os.makedirs(folder, exist_ok=True)
        rows = [repeat(args, folder, i) for i in range(args.repeats)]
    s = summary(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": s}, indent=1))
        return
    print(f"# {args.model} mbs {args.mbs} profiled -> {args.model} x2 layers, mbs {2 * args.mbs}; "
          f"{args.steps} steps, {args.threads} thread(s), load {os.getloadavg()[0]:.1f}")
    print("repeat  profiled_s  small_s  pred_small_s  err     big_s   pred_big_s  err")
    for r in rows:
        print(f"{r['repeat']:>6}  {r['profiled_small_s']:10.4f}  {r['measured_small_s']:7.4f}  "
              f"{r['predicted_small_s']:12.4f}  {100 * r['small_error']:+5.1f}%  {r['measured_big_s']:6.4f}  "
              f"{r['predicted_big_s']:10.4f}  {100 * r['big_error']:+5.1f}%")
    print(f"big job error: median {100 * s['big_error']['median']:+.1f}%, spread {100 * s['big_error']['spread']:.1f} "
          f"points; small job (the traced one): median {100 * s['small_error']['median']:+.1f}%")
    for line in rows[0]["missing"]:
        print(f"# trace: {line}")


if __name__ == "__main__":
    main()
