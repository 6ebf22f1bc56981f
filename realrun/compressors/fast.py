"""Compiled CPU paths (numba) for the hot compressors; byte-identical to the numpy reference.

numpy alone reaches 0.04-0.1 of memcpy on these (its float32->float16 cast runs at 0.8 GB/s on
the development machine); numba compiles the single-pass loops to machine code and runs them
on every core. Used when numba is installed (the ``real`` extra); otherwise the numpy
reference runs. NaN inputs: the fp16 path writes a quiet NaN where numpy may keep other
payload bits; decoded values are NaN either way.
"""
from __future__ import annotations

import numpy as np

try:
    from numba import njit, prange
except ImportError:  # the numpy reference is used
    njit = None

AVAILABLE = njit is not None
TINY = np.float32(np.finfo(np.float32).smallest_subnormal)
MAGIC = np.float32(1.5 * 2**23)   # y + MAGIC - MAGIC == rint(y) in float32 for |y| < 2**22

if AVAILABLE:
    @njit(parallel=True, cache=True)
    def quantize_absmax(x, block, levels, codes, scales):
        n = x.size
        for b in prange((n + block - 1) // block):
            s, e = b * block, min(b * block + block, n)
            m, bad = np.float32(0.0), False
            for i in range(s, e):
                v = x[i]
                if not np.isfinite(v):
                    bad = True
                elif abs(v) > m:
                    m = abs(v)
            scale = np.float32(np.nan) if bad else np.float32(m / np.float32(levels))
            if not bad and m > 0 and scale < TINY:
                scale = TINY
            if np.float64(scale) * levels < np.float64(m):
                scale = np.nextafter(scale, np.float32(np.inf))
            scales[b] = scale
            safe = scale if (scale > 0 and np.isfinite(scale)) else np.float32(1.0)
            if bad:
                for i in range(s, e):
                    v = x[i] if np.isfinite(x[i]) else np.float32(0.0)
                    codes[i] = min(max(np.rint(v / safe), -levels), levels)
            else:   # finite block: MAGIC rounds half to even (a subnormal scale may pass the levels)
                for i in range(s, e):
                    codes[i] = min(max((x[i] / safe + MAGIC) - MAGIC, -levels), levels)

    @njit(parallel=True, cache=True)
    def sign_encode(x, block, bits, scales):
        """Bit i of byte j is x[8j + i] >= 0 (NaN counts as non-negative); scale = mean |x| per
        block, summed in index order in float64 (as the reference's cumulative sum)."""
        n = x.size
        for j in prange(bits.size):
            byte = 0
            for i in range(8 * j, min(8 * j + 8, n)):
                if not x[i] < 0:
                    byte |= 1 << (i - 8 * j)
            bits[j] = byte
        for b in prange(scales.size):
            s, e = b * block, min(b * block + block, n)
            total = 0.0
            for i in range(s, e):
                total += abs(np.float64(x[i]))
            scales[b] = np.float32(total / (e - s))

    @njit(parallel=True, cache=True)
    def sign_decode(bits, scales, block, top, out):
        n = out.size
        for b in prange(scales.size):
            v = min(max(np.float64(scales[b]), -top), top)
            for i in range(b * block, min(b * block + block, n)):
                out[i] = v if (bits[i >> 3] >> (i & 7)) & 1 else -v

    @njit(cache=True)
    def _key(v):
        a = v & 0x7FFFFFFF
        return 0x7F800000 if a > 0x7F800000 else a

    @njit(parallel=True, cache=True)
    def _histogram(bits, chunks, high, shift, mask):
        """Per-chunk counts of (key >> shift) & mask over the keys whose top bits equal ``high``
        (high < 0: all keys)."""
        n = bits.size
        hist = np.zeros((chunks, mask + 1), np.int64)
        for c in prange(chunks):
            for i in range(c * n // chunks, (c + 1) * n // chunks):
                k = _key(bits[i])
                if high < 0 or (k >> 16) == high:
                    hist[c, (k >> shift) & mask] += 1
        return hist.sum(axis=0)

    @njit(cache=True)
    def _bin_of_rank(hist, k):
        """The bin holding the k-th largest key, and how many keys lie above that bin."""
        above = 0
        for b in range(hist.size - 1, -1, -1):
            if above + hist[b] >= k:
                return b, above
            above += hist[b]
        return 0, above

    @njit(parallel=True, cache=True)
    def _collect(x, bits, t, ties, chunks, idx, values):
        n = x.size
        more = np.zeros(chunks, np.int64)
        same = np.zeros(chunks, np.int64)
        for c in prange(chunks):
            for i in range(c * n // chunks, (c + 1) * n // chunks):
                k = _key(bits[i])
                if k > t:
                    more[c] += 1
                elif k == t:
                    same[c] += 1
        start = np.zeros(chunks, np.int64)
        allow = np.zeros(chunks, np.int64)
        pos, left = 0, ties
        for c in range(chunks):
            allow[c] = min(same[c], left)
            left -= allow[c]
            start[c] = pos
            pos += more[c] + allow[c]
        for c in prange(chunks):
            p, a = start[c], allow[c]
            for i in range(c * n // chunks, (c + 1) * n // chunks):
                k = _key(bits[i])
                if k > t or (k == t and a > 0):
                    if k == t:
                        a -= 1
                    idx[p] = i
                    values[p] = x[i]
                    p += 1

    @njit(parallel=True, cache=True)
    def weighted_sum(words):
        """sum (2i+1) * words[i] mod 2^64 (the payload checksum's reduction, one pass)."""
        total = np.uint64(0)
        for i in prange(words.size):
            total += np.uint64(words[i]) * np.uint64(2 * i + 1)
        return total

    @njit(parallel=True, cache=True)
    def scatter(values, idx, out):
        out[:] = 0
        for j in prange(idx.size):
            out[idx[j]] = values[j]

    @njit(parallel=True, cache=True)
    def dequantize(codes, scales, block, top, out):
        n = out.size
        for b in prange(scales.size):
            scale = np.float64(scales[b])
            if abs(scale) * 127.0 <= top:   # no product can leave the finite range
                for i in range(b * block, min(b * block + block, n)):
                    out[i] = np.float64(codes[i]) * scale
            else:
                for i in range(b * block, min(b * block + block, n)):
                    out[i] = min(max(np.float64(codes[i]) * scale, -top), top)

    @njit(cache=True)
    def _f2h(u):
        sign = (u >> 16) & 0x8000
        a = u & 0x7FFFFFFF
        if a > 0x7F800000:
            return sign | 0x7E00 | ((a >> 13) & 0x3FF)
        if a >= 0x477FF000:          # rounds to 65520 or more: Inf
            return sign | 0x7C00
        if a < 0x38800000:           # below the smallest normal half
            if a <= 0x33000000:      # at most 2^-25: rounds to (signed) zero
                return sign
            m = (a & 0x7FFFFF) | 0x800000
            sh = 126 - (a >> 23)
            q, r, half = m >> sh, m & ((1 << sh) - 1), 1 << (sh - 1)
            if r > half or (r == half and (q & 1)):
                q += 1
            return sign | q
        h = ((((a >> 23) - 112) << 10) | ((a & 0x7FFFFF) >> 13))
        r = a & 0x1FFF
        if r > 0x1000 or (r == 0x1000 and (h & 1)):
            h += 1
        return sign | h

    @njit(parallel=True, cache=True)
    def to_fp16_bits(bits32, out):
        for i in prange(bits32.size):
            out[i] = _f2h(np.uint32(bits32[i]))

    @njit(parallel=True, cache=True)
    def from_fp16_bits(h, out):
        """Half bits -> float32 bits (exact: every half is a float32)."""
        for i in prange(h.size):
            v = np.uint32(h[i])
            sign, e, m = (v & 0x8000) << 16, (v >> 10) & 0x1F, v & 0x3FF
            if e == 31:
                out[i] = sign | 0x7F800000 | (m << 13)
            elif e > 0:
                out[i] = sign | ((e + 112) << 23) | (m << 13)
            elif m == 0:
                out[i] = sign
            else:   # subnormal half: normalize
                k = 0
                while (m & 0x400) == 0:
                    m <<= 1
                    k += 1
                out[i] = sign | ((113 - k) << 23) | ((m & 0x3FF) << 13)


def _chunks() -> int:
    """Work items of the top-k passes: two per thread (each has its own 512 KiB histogram)."""
    from numba import get_num_threads

    return 2 * get_num_threads()


def _empty(n, dtype, out):
    return np.empty(n, dtype) if out is None else out


def quantize(x: np.ndarray, block: int, levels: int, codes=None, scales=None) -> tuple[np.ndarray, np.ndarray]:
    codes = _empty(x.size, np.int8 if levels > 7 else np.int64, codes)
    scales = _empty((x.size + block - 1) // block, np.float32, scales)
    quantize_absmax(np.ascontiguousarray(x, dtype=np.float32), block, levels, codes, scales)
    return codes, scales


def fp16_encode(x: np.ndarray, out=None) -> np.ndarray:
    out = _empty(x.size, np.uint16, out)
    to_fp16_bits(np.ascontiguousarray(x, dtype=np.float32).view(np.uint32), out.view(np.uint16))
    return out.view(np.float16)


def fp16_decode(h: np.ndarray, out=None) -> np.ndarray:
    out = _empty(h.size, np.float32, out)
    from_fp16_bits(np.ascontiguousarray(h).view(np.uint16), out.view(np.uint32))
    return out


def topk_threshold(bits: np.ndarray, k: int) -> tuple[int, int]:
    """Radix select on |x|'s float bits (NaN ranks as Inf): the k-th largest key ``t`` and how
    many of the keys equal to ``t`` are kept (the lowest indices first)."""
    chunks = _chunks()
    hist = _histogram(bits, chunks, -1, 16, 0xFFFF)
    high, _ = _bin_of_rank(hist, k)
    low_hist = _histogram(bits, chunks, high, 0, 0xFFFF)
    above_high = int(hist[high + 1:].sum())
    low, above_low = _bin_of_rank(low_hist, k - above_high)
    t = (int(high) << 16) | int(low)
    return t, k - above_high - int(above_low)


def topk(x: np.ndarray, k: int, idx=None, values=None) -> tuple[np.ndarray, np.ndarray]:
    """Indices (ascending, int64) and values of the k largest |x| with the reference's tie rule."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    t, ties = topk_threshold(bits, k)
    idx, values = _empty(k, np.int64, idx), _empty(k, np.float32, values)
    _collect(x, bits, t, ties, _chunks(), idx, values)
    return idx, values
