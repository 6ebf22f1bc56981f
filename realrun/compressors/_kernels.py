"""The numba kernels behind ``realrun.compressors.fast`` (compiled on first use, cached on disk).

Kept apart so that importing realrun does not import numba (a quarter of a second): ``fast``
(the numba backend) loads this module the first time a compiled path runs. This module owns
the kernels and imports nothing from ``fast``.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from realrun.compressors.transforms import TINY

ROUND_BIAS = np.float32(1.5 * 2**23)   # y + ROUND_BIAS - ROUND_BIAS == rint(y) in float32 for |y| < 2**22


@njit(parallel=True, cache=True)
def quantize_absmax(x, block, levels, codes, scales):
    """Blockwise absmax codes (int8, or int4 values in int8) and scales. Inner loops run on
    slices (numba vectorizes them; indexed s..e loops it does not, 3-4x slower); the absmax
    is an integer max over |x|'s float bits (same order; NaN and Inf sort above every
    finite value), then the float of that bit pattern."""
    n = x.size
    bits = x.view(np.uint32)
    for b in prange((n + block - 1) // block):
        s = b * block
        e = min(s + block, n)
        xs, bs, cs = x[s:e], bits[s:e], codes[s:e]
        mb = np.uint32(0)
        for i in range(bs.size):
            a = bs[i] & np.uint32(0x7FFFFFFF)
            mb = a if a > mb else mb
        bad = mb >= np.uint32(0x7F800000)
        m = np.float32(0.0)
        for i in range(bs.size):
            if (bs[i] & np.uint32(0x7FFFFFFF)) == mb:
                m = abs(xs[i])
                break
        scale = np.float32(np.nan) if bad else np.float32(m / np.float32(levels))
        if not bad and m > 0 and scale < TINY:
            scale = TINY
        if np.float64(scale) * levels < np.float64(m):
            scale = np.nextafter(scale, np.float32(np.inf))
        scales[b] = scale
        safe = scale if (scale > 0 and np.isfinite(scale)) else np.float32(1.0)
        if bad:
            for i in range(xs.size):
                v = xs[i] if np.isfinite(xs[i]) else np.float32(0.0)
                cs[i] = min(max(np.rint(v / safe), -levels), levels)
        else:   # finite block: ROUND_BIAS rounds half to even (a subnormal scale may pass the levels)
            for i in range(xs.size):
                cs[i] = min(max((xs[i] / safe + ROUND_BIAS) - ROUND_BIAS, -levels), levels)

@njit(parallel=True, cache=True)
def pack_nibbles(codes, out):
    """Two's-complement 4-bit codes, two per byte, low nibble first (the reference layout)."""
    n = codes.size
    for j in prange(out.size):
        lo = np.uint8(codes[2 * j] & 0xF)
        hi = np.uint8(codes[2 * j + 1] & 0xF) if 2 * j + 1 < n else np.uint8(0)
        out[j] = lo | (hi << 4)

@njit(cache=True)
def _lane_mean(xs):
    """Mean |x| of a block in the reference's order: lane i mod 8, lanes combined pairwise."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    full = xs.size // 8 * 8
    for i in range(0, full, 8):
        a0 += abs(np.float64(xs[i]))
        a1 += abs(np.float64(xs[i + 1]))
        a2 += abs(np.float64(xs[i + 2]))
        a3 += abs(np.float64(xs[i + 3]))
        a4 += abs(np.float64(xs[i + 4]))
        a5 += abs(np.float64(xs[i + 5]))
        a6 += abs(np.float64(xs[i + 6]))
        a7 += abs(np.float64(xs[i + 7]))
    t = xs.size - full
    a0 += abs(np.float64(xs[full])) if t > 0 else 0.0
    a1 += abs(np.float64(xs[full + 1])) if t > 1 else 0.0
    a2 += abs(np.float64(xs[full + 2])) if t > 2 else 0.0
    a3 += abs(np.float64(xs[full + 3])) if t > 3 else 0.0
    a4 += abs(np.float64(xs[full + 4])) if t > 4 else 0.0
    a5 += abs(np.float64(xs[full + 5])) if t > 5 else 0.0
    a6 += abs(np.float64(xs[full + 6])) if t > 6 else 0.0
    return np.float32((((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))) / xs.size)

@njit(cache=True)
def _pack_signs(xs, bs):
    """Bit i of byte j is xs[8j + i] >= 0 (NaN counts as non-negative)."""
    for j in range(bs.size):
        byte = 0
        lo = 8 * j
        for i in range(lo, min(lo + 8, xs.size)):
            if not xs[i] < 0:
                byte |= 1 << (i - lo)
        bs[j] = byte

@njit(parallel=True, cache=True)
def sign_encode(x, block, bits, scales):
    """Sign bits and the mean |x| per block; one pass per block where bytes do not span
    blocks (block a multiple of 8), else bits and means in separate passes."""
    n = x.size
    if block % 8 == 0:
        for b in prange(scales.size):
            s = b * block
            e = min(s + block, n)
            scales[b] = _lane_mean(x[s:e])
            _pack_signs(x[s:e], bits[s // 8:(e + 7) // 8])
    else:
        for c in prange(8):
            lo = bits.size * c // 8
            hi = bits.size * (c + 1) // 8
            _pack_signs(x[8 * lo:min(8 * hi, n)], bits[lo:hi])
        for b in prange(scales.size):
            s = b * block
            scales[b] = _lane_mean(x[s:min(s + block, n)])

@njit(parallel=True, cache=True)
def sign_decode(bits, scales, block, top, out):
    n = out.size
    for b in prange(scales.size):
        v = min(max(np.float64(scales[b]), -top), top)
        s = b * block
        os_ = out[s:min(s + block, n)]
        for i in range(os_.size):
            k = s + i
            os_[i] = v if (bits[k >> 3] >> (k & 7)) & 1 else -v

@njit(cache=True)
def _key(v):
    a = v & 0x7FFFFFFF
    return 0x7F800000 if a > 0x7F800000 else a

@njit(parallel=True, cache=True)
def _histogram(bits, chunks, high, shift, mask):
    """Per-chunk counts of (key >> shift) & mask over the keys whose top bits equal ``high``
    (high < 0: all keys), and per chunk how many keys have top bits above ``high``."""
    n = bits.size
    hist = np.zeros((chunks, mask + 1), np.int64)
    above = np.zeros(chunks, np.int64)
    for c in prange(chunks):
        bs = bits[c * n // chunks:(c + 1) * n // chunks]
        over = 0
        for i in range(bs.size):
            k = _key(bs[i])
            if high < 0 or (k >> 16) == high:
                hist[c, (k >> shift) & mask] += 1
            elif (k >> 16) > high:
                over += 1
        above[c] = over
    return hist, above

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
def _collect(x, bits, t, more, same, ties, chunks, idx, values):
    """Write the kept (index, value) pairs in index order; ``more[c]`` / ``same[c]`` are the
    keys above / equal to the threshold in chunk c (from the histograms: no counting pass)."""
    n = x.size
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
        lo = c * n // chunks
        bs = bits[lo:(c + 1) * n // chunks]
        for i in range(bs.size):
            k = _key(bs[i])
            if k > t or (k == t and a > 0):
                if k == t:
                    a -= 1
                idx[p] = lo + i
                values[p] = x[lo + i]
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
    """codes (int8 values) x scale per block, clipped to the finite range only where a
    product could leave it."""
    n = out.size
    for b in prange(scales.size):
        scale = np.float64(scales[b])
        s = b * block
        e = min(s + block, n)
        cs, os_ = codes[s:e], out[s:e]
        if abs(scale) * 127.0 <= top:   # no product can leave the finite range
            for i in range(cs.size):
                os_[i] = np.float64(cs[i]) * scale
        else:
            for i in range(cs.size):
                os_[i] = min(max(np.float64(cs[i]) * scale, -top), top)

@njit(parallel=True, cache=True)
def unpack_nibbles(packed, n, codes):
    """Inverse of ``pack_nibbles``: sign-extended int8 codes."""
    for j in prange((n + 1) // 2):
        byte = packed[j]
        lo, hi = np.int8(byte & 0xF), np.int8(byte >> 4)
        codes[2 * j] = lo - 16 if lo >= 8 else lo
        if 2 * j + 1 < n:
            codes[2 * j + 1] = hi - 16 if hi >= 8 else hi

@njit(parallel=True, cache=True)
def to_bf16_bits(u, out):
    """float32 bits -> bf16 bits, nearest even; NaN keeps its top bits, quiet (as casts.to_bf16)."""
    for i in prange(u.size):
        v = u[i]
        if (v & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            out[i] = np.uint16((v >> 16) | 0x40)
        else:
            out[i] = np.uint16((v + (((v >> 16) & 1) + 0x7FFF)) >> 16)

@njit(parallel=True, cache=True)
def from_bf16_bits(h, out):
    for i in prange(h.size):
        out[i] = np.uint32(h[i]) << 16

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
def lookup(codes, table, out):
    for i in prange(codes.size):
        out[i] = table[codes[i]]

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

@njit(cache=True)
def _f2fp8(u, man, bias, top, over):
    """float32 bits -> OCP FP8 code (``man`` mantissa bits, exponent ``bias``), nearest, ties
    to even, as casts.to_fp8: ``top`` is the largest finite code, ``over`` the code of a value
    rounding past it (e4m3: ``top``, saturation; e5m2: Inf); NaN is 0x7F, unsigned."""
    a = u & 0x7FFFFFFF
    sign = (u >> 24) & 0x80
    if a > 0x7F800000:
        return 0x7F
    if a == 0x7F800000:
        return 0x7F if over == top else sign | over
    e = a >> 23
    drop = 23 - man
    if e >= 128 - bias:              # normal in fp8 (or beyond its range)
        code = (a >> drop) - ((127 - bias) << man)
        r, half = a & ((1 << drop) - 1), 1 << (drop - 1)
    else:                            # fp8 subnormal: the implicit bit shifted in
        sh = 151 - bias - man - e
        if sh > 24:                  # at most half the smallest subnormal: (signed) zero
            return sign
        m = (a & 0x7FFFFF) | 0x800000
        code, r, half = m >> sh, m & ((1 << sh) - 1), 1 << (sh - 1)
    if r > half or (r == half and (code & 1)):
        code += 1
    return sign | (over if code > top else code)

@njit(parallel=True, cache=True)
def to_fp8_bits(bits32, man, bias, top, over, out):
    for i in prange(bits32.size):
        out[i] = _f2fp8(np.uint32(bits32[i]), man, bias, top, over)
