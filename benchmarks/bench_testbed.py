#!/usr/bin/env python3
"""How repeatable the emulated testbed is, with and without a fixed CPU share per host.

Two 4-host clusters at the same link rate stand side by side: one whose hosts each have a
fixed share of one core (``realrun cluster up --cpus-per-host auto``: a cgroup per host, one
core and a quota) and one whose hosts time-share the machine's cores (``--cpus-per-host
none``). Each training case of ``realrun validate --training`` given here is run ``--repeats``
times on each, the two clusters alternating run by run so a drift of the machine's load hits
both alike. A run's value is its median step after the warm-up; a case's spread is max/min - 1
over its repeats. Prints the table and the median spread of each cluster (its noise floor).

Needs root and iproute2. Usage:
    python benchmarks/bench_testbed.py [--repeats 3] [--steps 7] [--bandwidth 1gbit] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from perfmodel.plan.degrees import Degrees
from realrun.cluster import EmulatedSpec, cpu, down, up
from realrun.measure import EmulatedRunner
from realrun.validate_training import TrainCase, _median

CASES = (TrainCase(Degrees(tp=2, dp=2), 0, "none", 0), TrainCase(Degrees(pp=2, dp=2), 0, "naive:int8", 0),
         TrainCase(Degrees(dp=4), 0, "naive:fp16", 0))
MODES = {"fixed": "auto", "shared": "none"}   # cluster name suffix -> --cpus-per-host


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1.0


def run(repeats: int, steps: int, bandwidth: str, cases=CASES) -> dict:
    runners = {}
    try:
        for mode, share in MODES.items():
            up(EmulatedSpec(hosts=4, bandwidth=bandwidth, cpus_per_host=share), f"tb{mode[:2]}")
            runners[mode] = EmulatedRunner(f"tb{mode[:2]}")
        out = {mode: {} for mode in MODES}
        for rep in range(repeats):
            for case in cases:
                for mode, runner in runners.items():
                    step = _median(runner.train(case.config(steps)), "step_s")
                    out[mode].setdefault(f"{case.plan} {case.policy}", []).append(step)
                    print(f"repeat {rep + 1}/{repeats} {case.plan} {case.policy} {mode}: {step:.4f} s",
                          file=sys.stderr, flush=True)
        shares = {mode: runner.spec.cpus_per_host for mode, runner in runners.items()}
        return {"shares": shares, "steps": out}
    finally:
        for mode in MODES:
            down(f"tb{mode[:2]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--period-us", type=int, default=cpu.PERIOD_US, help="quota period of the fixed hosts")
    ap.add_argument("--no-quota", action="store_true", help="fixed hosts pinned and weighted, without the quota")
    ap.add_argument("--only", default="", help="run only the cases whose plan contains this text (e.g. tp2)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cpu.PERIOD_US, cpu.QUOTA = args.period_us, not args.no_quota
    result = run(args.repeats, args.steps, args.bandwidth, tuple(c for c in CASES if args.only in c.plan))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'case':32s} " + "  ".join(f"{m + ' median s':>14s} {'spread':>7s}" for m in MODES))
    for case in result["steps"]["fixed"]:
        cells = []
        for mode in MODES:
            values = result["steps"][mode][case]
            cells.append(f"{statistics.median(values):14.4f} {spread(values):7.1%}")
        print(f"{case:32s} " + "  ".join(cells))
    for mode in MODES:
        floor = statistics.median(spread(v) for v in result["steps"][mode].values())
        print(f"noise floor ({mode}, cpu share {result['shares'][mode]}): median spread {floor:.1%}")


if __name__ == "__main__":
    main()
