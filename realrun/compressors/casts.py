"""Casts: fp16, bf16 (round to nearest even), fp8 e4m3 / e5m2 (OCP FP8, nearest, ties to even).

Non-finite values: NaN stays NaN; Inf stays Inf where the format has it (fp16, bf16, e5m2);
e4m3 has no Inf, so +-Inf becomes NaN. Finite values beyond the range: fp16 and e5m2
overflow to +-Inf (IEEE), e4m3 saturates to +-448.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np


def to_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (((u >> 16) & 1) + 0x7FFF)) >> 16
    nan = np.isnan(x)
    rounded = np.where(nan, (u >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16)


def from_bf16(codes: np.ndarray) -> np.ndarray:
    return (codes.astype(np.uint32) << 16).view(np.float32)


@lru_cache(maxsize=2)
def fp8_table(fmt: str) -> np.ndarray:
    """float32 value of each of the 256 codes (NaN where the code is NaN)."""
    exp_bits, man_bits = (4, 3) if fmt == "e4m3" else (5, 2)
    bias = 2 ** (exp_bits - 1) - 1
    values = np.empty(256, dtype=np.float32)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if fmt == "e4m3" and e == 15 and m == 7:
            values[code] = np.nan
        elif fmt == "e5m2" and e == 31:
            values[code] = sign * np.inf if m == 0 else np.nan
        elif e == 0:
            values[code] = sign * m / 2**man_bits * 2.0 ** (1 - bias)
        else:
            values[code] = sign * (1 + m / 2**man_bits) * 2.0 ** (e - bias)
    return values


def to_fp8(x: np.ndarray, fmt: str) -> np.ndarray:
    table = fp8_table(fmt)
    positive = table[:128]
    finite = np.flatnonzero(np.isfinite(positive))          # ascending magnitudes, codes 0..max
    grid = positive[finite]
    mag = np.abs(x).astype(np.float32)
    hi = np.clip(np.searchsorted(grid, mag), 1, len(grid) - 1)
    lo = hi - 1
    d_lo, d_hi = mag - grid[lo], grid[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (finite[hi] % 2 == 0))
    codes = np.where(pick_hi, finite[hi], finite[lo]).astype(np.uint8)
    top = grid[-1]
    if fmt == "e5m2":   # IEEE-style overflow: beyond max + half an ulp goes to Inf
        half_ulp = (grid[-1] - grid[-2]) / 2
        codes = np.where(mag >= top + half_ulp, np.uint8(0x7C), codes)
    codes = np.where(mag > top, codes if fmt == "e5m2" else np.uint8(finite[-1]), codes)
    codes = np.where(np.signbit(x), codes | 0x80, codes).astype(np.uint8)
    nan_code = np.uint8(0x7F)
    codes = np.where(np.isnan(x), nan_code, codes)
    if fmt == "e4m3":
        codes = np.where(np.isinf(x), nan_code, codes)
    else:
        codes = np.where(np.isinf(x), np.where(x > 0, np.uint8(0x7C), np.uint8(0xFC)), codes)
    return codes.astype(np.uint8)


def from_fp8(codes: np.ndarray, fmt: str) -> np.ndarray:
    return fp8_table(fmt)[codes]
