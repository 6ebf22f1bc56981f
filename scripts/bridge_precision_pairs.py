"""What a lower precision buys, measured against predicted, on the Megatron-Bridge table's identical plans.

Two rows of ``validation/published/megatron_bridge_training_throughput.csv`` (read through
``perfmodel.calibration.bridge``) form a pair when they run the same model on the same system, GPUs and
plan (tp, pp, cp, vp, ep, micro and global batch, FSDP) in the same container and differ only in
precision (``perfmodel.calibration.published.precision_pairs`` finds them). For each pair: the
published speedup of the lower precision (its tokens/s/GPU over the other's) and the predicted one,
and their difference in points. Issue 38's target: the FP8-over-BF16 speedup within 5 points.

    python scripts/bridge_precision_pairs.py [--json]
"""
from __future__ import annotations

import argparse
import json

from perfmodel.calibration.published import precision_pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    found = precision_pairs()
    if parser.parse_args().json:
        print(json.dumps(found, indent=1))
        return
    print(f"{'plan':58s} {'low':>15s} {'over':>15s} {'measured':>8s} {'predicted':>9s} {'points':>6s}")
    for p in found:
        print(f"{p['plan'][:58]:58s} {p['low']:>15s} {p['high']:>15s} {p['measured']:8.3f} {p['predicted']:9.3f} "
              f"{p['points']:+6.1f}")
    if found:
        mean = sum(abs(p["points"]) for p in found) / len(found)
        print(f"{len(found)} pairs; mean |difference| {mean:.1f} points")


if __name__ == "__main__":
    main()
