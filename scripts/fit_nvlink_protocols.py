#!/usr/bin/env python3
"""Fit the NVLink protocol table (perfmodel/catalog/protocols.toml [nvlink]) to measured
nccl-tests all-reduce bus bandwidth on one 8x A100 NVSwitch node.

Data: validation/published/allreduce_busbw_a100_8gpu.csv, the Azure ND A100 v4 rows (NCCL 2.18.5,
1 KiB to 8 GiB). The model is perfmodel's own ring all-reduce on `dgx-a100 --nodes 1`, so the
fitted numbers include the topology's path latency exactly as predictions use it. The fit
minimises log busbw error (robust soft-L1 loss) over sizes >= --min-size and prints the
TOML block plus the per-size error. Usage:

    python scripts/fit_nvlink_protocols.py [--csv PATH] [--min-size 65536]
"""
from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from perfmodel.devices import PROTOCOL_NAMES, Protocol
from perfmodel.collectives.fabric import make_ctx
from perfmodel.collectives.transfers import evaluate
from perfmodel.collectives.plain import ring_allreduce
from topologies import build_cluster

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "validation" / "published" / "allreduce_busbw_a100_8gpu.csv"


def load_rows(path: Path, system_prefix: str = "Azure") -> tuple[np.ndarray, np.ndarray]:
    with open(path) as handle:
        rows = [r for r in csv.DictReader(handle) if r["system"].startswith(system_prefix)]
    return (np.array([float(r["message_size_bytes"]) for r in rows]),
            np.array([float(r["busbw_GBps"]) for r in rows]))


def model_busbw(params: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    ctx = make_ctx(build_cluster("dgx-a100", nodes=1), tuple(range(8)))
    table = {name: Protocol(name=name, base_s=params[3 * i] * 1e-6, step_s=params[3 * i + 1] * 1e-6,
                            bw_fraction=params[3 * i + 2]) for i, name in enumerate(PROTOCOL_NAMES)}
    ring = replace(ctx.ring, protocols=table)
    ctx = replace(ctx, ring=ring)
    out = []
    for s in sizes:
        t = evaluate(ring_allreduce(ctx, float(s)), ctx.device, 1).time_s
        out.append(s / t * 2 * 7 / 8 / 1e9)
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--min-size", type=float, default=65536)
    args = ap.parse_args()
    sizes, busbw = load_rows(args.csv)
    keep = sizes >= args.min_size
    p0 = [10, 1.0, 0.3, 20, 2.0, 0.45, 60, 8.0, 0.77]
    fit = least_squares(lambda p: np.log(model_busbw(p, sizes[keep]) / busbw[keep]), p0,
                        bounds=([0, 0, 0.05] * 3, [500, 50, 1.0] * 3), loss="soft_l1")
    print("[nvlink]")
    for i, name in enumerate(PROTOCOL_NAMES):
        b, s, f = fit.x[3 * i:3 * i + 3]
        print(f"{name} = {{ base_us = {b:.2f}, step_us = {s:.3f}, bw_fraction = {f:.4f} }}")
    pred = model_busbw(fit.x, sizes)
    for s, m, p in zip(sizes, busbw, pred):
        print(f"{int(s):>12d}  measured {m:8.2f}  model {p:8.2f}  error {100 * (p / m - 1):+6.1f}%")


if __name__ == "__main__":
    main()
