#!/usr/bin/env python3
"""realrun train under three gradient policies on 2 local ranks (gpt-tiny, 100 steps): final
training and validation loss, median step time, dp payload bytes per step and rank, measured
gradient-sum error; the loss curves to docs/train_loss.png (or --plot).

Usage: python benchmarks/bench_train.py [--steps 100] [--plot docs/train_loss.png]
"""
from __future__ import annotations

import argparse

from realrun.train.config import TrainConfig
from realrun.train.launch import run_local
from realrun.train.report import plot_losses, summary

POLICIES = ("none", "naive:int8", "dp=ef(topk(0.01))+int8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--plot", default="docs/train_loss.png")
    args = ap.parse_args()
    runs = {}
    for policy in POLICIES:
        runs[policy] = run_local(TrainConfig.of(model="gpt-tiny", dp=2, mbs=8, steps=args.steps, policy=policy,
                                                eval_every=20))
        s = summary(runs[policy])
        print(f"{policy:24s} loss {s['final_loss']:.3f}  val {s['final_val_loss']:.3f}  step "
              f"{s['median_step_s'] * 1e3:6.1f} ms  dp bytes/step {s['dp_wire_bytes_per_step']:>10,.0f}  "
              f"error {s['dp_rel_error']:.3g}")
    plot_losses(runs, args.plot)


if __name__ == "__main__":
    main()
