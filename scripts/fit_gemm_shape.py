"""Fit the A100's GEMM shape model (perfmodel.devices.GemmShape) to measured GEMM rows.

Data: validation/published/gemm_a100.csv (rows of docs/data/measured_gemm_and_hbm.csv:
the cuBLASLt fp16 rows of A100-SXM4-80GB and the MAMF bf16 best shape of A100 SXM), the rows
with ``used_by_fit`` yes (the misaligned n = 2145 row is kept and reported, not fitted). The
tile (128) and the SM count (108) are fixed; the fit chooses the fraction of an SM's peak a
tile reaches and the fixed time per kernel, least squares in log TFLOP/s. Prints the catalog
line for perfmodel/catalog/gpus.toml and each row's error.

    python scripts/fit_gemm_shape.py [--csv PATH]
"""
from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from scipy.optimize import least_squares

from perfmodel.devices import GemmShape

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "validation" / "published" / "gemm_a100.csv"
PEAK_FLOPS_PER_S = 312e12        # A100 dense fp16/bf16 tensor peak
STREAM_BPS = 1.61e12             # A100 80GB BabelStream copy (perfmodel/catalog/gpus.toml)
SM_COUNT, TILE = 108, 128


def load_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def tflops(shape: GemmShape, row: dict) -> float:
    m, n, k = (float(row[d]) for d in "mnk")
    return 2 * m * n * k / shape.time_s(m, n, k, PEAK_FLOPS_PER_S, 2, STREAM_BPS) / 1e12


def fit(rows: list[dict]) -> GemmShape:
    used = [r for r in rows if r["used_by_fit"] == "yes"]

    def shape(p) -> GemmShape:
        return GemmShape(sm_count=SM_COUNT, tile=TILE, peak_fraction=p[0], fixed_s=p[1] * 1e-6)

    res = least_squares(lambda p: [math.log(tflops(shape(p), r) / float(r["measured_tflops"])) for r in used],
                        [0.85, 4.0], bounds=([0.3, 0.0], [1.0, 50.0]))
    return shape(res.x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    rows = load_rows(ap.parse_args().csv)
    shape = fit(rows)
    print(f"gemm_shape = {{ sm_count = {shape.sm_count}, tile = {shape.tile}, "
          f"peak_fraction = {shape.peak_fraction:.3f}, fixed_us = {shape.fixed_s * 1e6:.2f} }}")
    for r in rows:
        got = tflops(shape, r)
        print(f"{r['m']:>7} x {r['n']:>6} x {r['k']:>6}  measured {float(r['measured_tflops']):6.1f}  "
              f"model {got:6.1f}  {got / float(r['measured_tflops']) - 1:+.1%}  fitted: {r['used_by_fit']}")


if __name__ == "__main__":
    main()
