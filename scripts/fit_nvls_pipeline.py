#!/usr/bin/env python3
"""Fit NVLS's per-loop synchronization (perfmodel/catalog/nccl_arch.toml [hopper] nvls_loop_sync_us)
to measured nccl-tests all-reduce bus bandwidth on one 8x H200 node.

Data: validation/published/allreduce_busbw_h200_8gpu.csv (NCCL 2.30.7, 32 KiB - 16 GiB); the fit uses
the rows from --min-size (2 MiB: below it NCCL runs the ring's LL, not NVLS). The model is
perfmodel's own NVLS all-reduce on `dgx-h200 --nodes 1` (perfmodel.collectives.plain.nvls_allreduce:
NCCL's channels and chunk schedule, the 25 us NVLS latency, NCCL's NVLS bandwidth) with the loop
synchronization as the one free parameter, for each fill (--fills, loops of pipeline fill). It
minimises the log busbw error and prints, per fill, the fitted value, then per size the measured
busbw, NVLS's, and the error of what 'auto' predicts with it (the fastest of NVLS and the ring).
Usage:

    python scripts/fit_nvls_pipeline.py [--csv PATH] [--min-size 2097152] [--fills 1 2]
"""
from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from perfmodel.collectives.fabric import make_ctx
from perfmodel.collectives.plain import nvls_pipelined, ring_allreduce
from perfmodel.collectives.transfers import evaluate
from perfmodel.devices import nvls_pipeline
from topologies import build_cluster

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "validation" / "published" / "allreduce_busbw_h200_8gpu.csv"
P = 8


def load_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    return (np.array([float(r["message_size_bytes"]) for r in rows]),
            np.array([float(r["busbw_GBps"]) for r in rows]))


def _ctx(sync_us: float, fill: int):
    """The 8-GPU context with NVLS's loop synchronization and fill replaced."""
    ctx = make_ctx(build_cluster("dgx-h200", nodes=1), tuple(range(P)))
    link = ctx.nvls_link
    proto = replace(link.protocols["Simple"], step_s=sync_us * 1e-6)
    pipe = replace(nvls_pipeline(ctx.device.arch), fill_loops=fill)
    return replace(ctx, nvls_link=replace(link, protocols={"Simple": proto})), pipe


def busbw(times: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    return sizes / times * 2 * (P - 1) / P / 1e9


def nvls_times(sync_us: float, fill: int, sizes: np.ndarray) -> np.ndarray:
    ctx, pipe = _ctx(sync_us, fill)
    return np.array([evaluate(nvls_pipelined(ctx, float(s), pipe), ctx.device, 1).time_s for s in sizes])


def ring_times(sizes: np.ndarray) -> np.ndarray:
    ctx = make_ctx(build_cluster("dgx-h200", nodes=1), tuple(range(P)))
    return np.array([evaluate(ring_allreduce(ctx, float(s)), ctx.device, 1).time_s for s in sizes])


def fit_sync(fill: int, sizes: np.ndarray, measured: np.ndarray) -> float:
    """The loop synchronization (us) that minimises the log busbw error of NVLS on ``sizes``."""
    fit = least_squares(lambda x: np.log(busbw(nvls_times(x[0], fill, sizes), sizes) / measured), [2.0],
                        bounds=([0.0], [50.0]))
    return float(fit.x[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--min-size", type=float, default=2 * 2**20)
    ap.add_argument("--fills", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    sizes, measured = load_rows(args.csv)
    keep = sizes >= args.min_size
    ring = ring_times(sizes)
    for fill in args.fills:
        sync = fit_sync(fill, sizes[keep], measured[keep])
        nvls = nvls_times(sync, fill, sizes)
        auto = busbw(np.minimum(nvls, ring), sizes)
        errors = auto / measured - 1
        big = np.abs(errors[sizes >= 2**20])
        print(f"fill {fill} loop(s): nvls_loop_sync_us = {sync:.2f}; 'auto' from 1 MiB: MAPE "
              f"{100 * np.mean(big):.1f}%, worst {100 * np.max(big):.1f}%")
        for s, m, n, a, e in zip(sizes, measured, busbw(nvls, sizes), auto, errors):
            print(f"  {int(s):>12d}  measured {m:7.2f}  nvls {n:7.2f}  auto {a:7.2f}  error {100 * e:+6.1f}%")


if __name__ == "__main__":
    main()
