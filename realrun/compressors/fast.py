"""The numba backend: compiled CPU paths for the hot transforms, byte-identical to the numpy reference.

numpy alone reaches 0.04-0.1 of memcpy on these (its float32->float16 cast runs at 0.8 GB/s on
the development machine); numba compiles the single-pass loops to machine code and runs them
on every core. Used for float32 numpy input when numba is installed (the ``real`` extra);
otherwise the numpy reference runs. NaN inputs: the fp16 path writes a quiet NaN where numpy
may keep other payload bits; decoded values are NaN either way.

The compiled kernels are in ``_kernels`` (which imports nothing from here); this module wraps
them and is the ``Backend`` that transforms call (``NumbaBackend``). numba itself is imported the
first time a compiled path runs, so importing realrun stays quick.
"""
from __future__ import annotations

import importlib.util
import math
from functools import partial

import numpy as np

from realrun.compressors import dtypes
from realrun.compressors.backends import Backend

AVAILABLE = importlib.util.find_spec("numba") is not None   # numba itself loads on first use


def _k():
    """The compiled kernels (``_kernels``): numba is imported the first time one runs."""
    from realrun.compressors import _kernels

    return _kernels


def set_threads(n: int) -> int | None:
    """Run the compiled kernels on at most ``n`` threads of the calling thread (numba's default:
    every core; ``realrun.threads`` picks ``n``), at most numba's pool (``NUMBA_NUM_THREADS``).
    Returns the count set; None where numba is not installed."""
    if not AVAILABLE:
        return None
    import numba

    count = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(count)
    return count


def _chunks() -> int:
    """Work items of the top-k passes: two per thread (each has its own 512 KiB histogram)."""
    from numba import get_num_threads

    return 2 * get_num_threads()


def _empty(n, dtype, out):
    return np.empty(n, dtype) if out is None else out


def quantize(x: np.ndarray, block: int, levels: int, codes=None, scales=None) -> tuple[np.ndarray, np.ndarray]:
    codes = _empty(x.size, np.int8, codes)
    scales = _empty((x.size + block - 1) // block, np.float32, scales)
    _k().quantize_absmax(np.ascontiguousarray(x, dtype=np.float32), block, levels, codes, scales)
    return codes, scales


def pack_int4(codes: np.ndarray, out=None) -> np.ndarray:
    out = _empty((codes.size + 1) // 2, np.uint8, out)
    _k().pack_nibbles(codes, out)
    return out


def unpack_int4(packed: np.ndarray, n: int, codes=None) -> np.ndarray:
    codes = _empty(n, np.int8, codes)
    _k().unpack_nibbles(packed, n, codes)
    return codes


def bf16_encode(x: np.ndarray, out=None) -> np.ndarray:
    out = _empty(x.size, np.uint16, out)
    _k().to_bf16_bits(np.ascontiguousarray(x, dtype=np.float32).view(np.uint32), out)
    return out


def bf16_decode(h: np.ndarray, out=None) -> np.ndarray:
    out = _empty(h.size, np.float32, out)
    _k().from_bf16_bits(np.ascontiguousarray(h).view(np.uint16), out.view(np.uint32))
    return out


def fp16_encode(x: np.ndarray, out=None) -> np.ndarray:
    out = _empty(x.size, np.uint16, out)
    _k().to_fp16_bits(np.ascontiguousarray(x, dtype=np.float32).view(np.uint32), out.view(np.uint16))
    return out.view(np.float16)


_HALF_TABLE = []


def _half_table() -> np.ndarray:
    """float32 bits of every half (65536 x 4 bytes: fits L2), from the exact bit conversion."""
    if not _HALF_TABLE:
        table = np.empty(65536, np.uint32)
        _k().from_fp16_bits(np.arange(65536, dtype=np.uint32).astype(np.uint16), table)
        _HALF_TABLE.append(table)
    return _HALF_TABLE[0]


def fp16_decode(h: np.ndarray, out=None) -> np.ndarray:
    """Half -> float32 through a table of all 65536 halves (a gather: no branches per value)."""
    out = _empty(h.size, np.float32, out)
    _k().lookup(np.ascontiguousarray(h).view(np.uint16), _half_table(), out.view(np.uint32))
    return out


def topk_threshold(bits: np.ndarray, k: int):
    """Radix select on |x|'s float bits (NaN ranks as Inf), two histogram passes: the k-th
    largest key ``t``, how many of the keys equal to ``t`` are kept (the lowest indices first),
    and per chunk the keys above and equal to ``t``."""
    chunks = _chunks()
    hist, _ = _k()._histogram(bits, chunks, -1, 16, 0xFFFF)
    total = hist.sum(axis=0)
    high, _ = _k()._bin_of_rank(total, k)
    low_hist, above = _k()._histogram(bits, chunks, high, 0, 0xFFFF)
    above_high = int(total[high + 1:].sum())
    low, above_low = _k()._bin_of_rank(low_hist.sum(axis=0), k - above_high)
    t = (int(high) << 16) | int(low)
    more = above + low_hist[:, low + 1:].sum(axis=1)
    return t, k - above_high - int(above_low), more, low_hist[:, low].copy()


def topk(x: np.ndarray, k: int, idx=None, values=None) -> tuple[np.ndarray, np.ndarray]:
    """Indices (ascending, int64) and values of the k largest |x| with the reference's tie rule."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    t, ties, more, same = topk_threshold(bits, k)
    idx, values = _empty(k, np.int64, idx), _empty(k, np.float32, values)
    _k()._collect(x, bits, t, more, same, ties, _chunks(), idx, values)
    return idx, values


# OCP FP8 formats: mantissa bits, exponent bias, largest finite code, the code a value rounding
# past it gets (e4m3 has no Inf: it saturates; e5m2 overflows to Inf), as casts.to_fp8
FP8_FORMATS = {"e4m3": (3, 7, 0x7E, 0x7E), "e5m2": (2, 15, 0x7B, 0x7C)}


def fp8_encode(x: np.ndarray, out=None, *, fmt: str) -> np.ndarray:
    out = _empty(x.size, np.uint8, out)
    _k().to_fp8_bits(np.ascontiguousarray(x, dtype=np.float32).view(np.uint32), *FP8_FORMATS[fmt], out)
    return out


def fp8_decode(codes: np.ndarray, out=None, *, fmt: str) -> np.ndarray:
    """FP8 -> float32 through the reference's table of all 256 codes (NaN bits included)."""
    from realrun.compressors.casts import fp8_table

    out = _empty(codes.size, np.float32, out)
    _k().lookup(np.ascontiguousarray(codes).view(np.uint8), fp8_table(fmt).view(np.uint32), out.view(np.uint32))
    return out


# cast format -> (encode, decode, code dtype)
_CASTS = {"fp16": (fp16_encode, fp16_decode, np.uint16), "bf16": (bf16_encode, bf16_decode, np.uint16),
          **{fmt: (partial(fp8_encode, fmt=fmt), partial(fp8_decode, fmt=fmt), np.uint8) for fmt in FP8_FORMATS}}


class NumbaBackend(Backend):
    """numpy arrays: the compiled kernels above where numba is installed (``AVAILABLE``, read at
    every call so a test can switch it off), scratch arrays from the transform's workspace."""

    NAME = "numba"
    CASTS = frozenset(_CASTS)

    @property
    def compiled(self) -> bool:
        return AVAILABLE

    def weighted_sum(self, words) -> int:
        return int(_k().weighted_sum(words)) if AVAILABLE else super().weighted_sum(words)

    def quantize(self, x, block, bits, work):
        n = len(x)
        codes = work("codes", n, np.int8)
        q, scale = quantize(x, block, 2 ** (bits - 1) - 1, codes, work("scales", math.ceil(n / block), np.float32))
        if bits == 4:
            return pack_int4(q, work("packed", (n + 1) // 2, np.uint8)), scale
        return q.view(np.uint8), scale

    def dequantize(self, values, scales, n, block, bits, top, out, work):
        q = values.view(np.int8) if bits == 8 else unpack_int4(values, n, work("unpacked", n, np.int8))
        _k().dequantize(np.ascontiguousarray(q), scales, block, top, out)
        return out

    def sign_encode(self, x, block, work):
        bits = work("bits", math.ceil(len(x) / 8), np.uint8)
        scales = work("scales", math.ceil(len(x) / block), np.float32)
        _k().sign_encode(x, block, bits, scales)
        return bits, scales

    def sign_decode(self, bits, scales, n, block, top, out):
        _k().sign_decode(bits, scales, block, top, out)
        return out

    def cast_encode(self, fmt, x, work):
        encode, _, dtype = _CASTS[fmt]
        return encode(x, work("codes", len(x), dtype))

    def cast_decode(self, fmt, codes, out):
        return _CASTS[fmt][1](codes, out)

    def topk(self, x, k, work):
        return topk(x, k, work("idx", k, np.int64), work("values", k, x.dtype))

    def widen(self, x, work=None):
        """bf16 and fp16 to float32 by the kernels (the reference's bits), fp8 by the reference."""
        d = x.dtype
        if not AVAILABLE or d not in (dtypes.BFLOAT16, np.dtype(np.float16)):
            return super().widen(x, work)
        out = np.empty(len(x), np.float32) if work is None else work("wide", len(x), np.float32)
        if d == np.float16:
            return fp16_decode(np.ascontiguousarray(x), out)
        return bf16_decode(np.ascontiguousarray(x).view(np.uint16), out)

    def narrow(self, y, dtype, ctx=None):
        """float32 to bf16 or fp16 by the kernels (nearest even, as the reference casts)."""
        d = np.dtype(dtype)
        if not AVAILABLE or y.dtype != np.float32 or d not in (dtypes.BFLOAT16, np.dtype(np.float16)):
            return super().narrow(y, dtype, ctx)
        out = np.empty(len(y), d) if ctx is None else ctx.output(len(y), d)
        bits = out.view(np.uint16)
        (bf16_encode if d == dtypes.BFLOAT16 else fp16_encode)(np.ascontiguousarray(y), bits)
        return out

    def scatter(self, values, idx, out):
        """On the bits (unsigned integers of the values' width): one kernel for every float type."""
        _k().scatter(dtypes.uint_view(np.ascontiguousarray(values)), idx, dtypes.uint_view(out))
        return out


BACKEND = NumbaBackend()
