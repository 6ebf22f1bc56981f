"""MPC, the massively parallel lossless floating-point codec (Yang, Mukka, Hesaaraki and
Burtscher, IEEE Cluster 2015), as a numpy reference: bit-exact, chunk-parallel by design.

The paper searched 138,240 pipelines of parallel components and kept four (its "LNVs BIT LVs
ZE"): per chunk of values, treated as unsigned words of the float's width B,

1. **LNVs**: subtract the word ``dim`` positions earlier (dimensionality of the data; 1 for a
   flat tensor), so smooth data leaves small differences;
2. **BIT**: transpose each group of B words as a B x B bit matrix, so word k holds bit k of
   every difference: the high bits of small differences become whole zero words;
3. **LVs**: subtract the previous transposed word, so runs of equal bit planes become zeros;
4. **ZE**: a bitmap of the non-zero words, then those words.

Differences are zigzag-mapped (``(d << 1) ^ (d >> (B - 1))``) before the transposition so small
negative differences also have zero high bits (the paper's code rotates the sign bit; any
bijection that moves the sign to bit 0 keeps the algorithm). A chunk is B groups (B^2 words:
1024 for float32, as MPC's warps take them); the tail is padded with zeros, which the bitmap
drops. Subtractions wrap modulo 2^B, so decoding is exact for every bit pattern (NaN, inf,
denormals). fp16/bf16 use 16-bit words, float64 64-bit words.
"""
from __future__ import annotations

import numpy as np

from topologies.errors import InputError

WORDS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _check(itemsize: int, dim: int) -> tuple[type, int, int]:
    if itemsize not in WORDS:
        raise InputError("dtype", f"{itemsize}-byte values", "2-, 4- or 8-byte floats for mpc")
    bits = itemsize * 8
    return WORDS[itemsize], bits, bits * bits


def _transpose_bits(words: np.ndarray, bits: int) -> np.ndarray:
    """Each row of ``bits`` words as a bits x bits bit matrix, transposed (an involution)."""
    groups = words.reshape(-1, bits)
    if not len(groups):
        return words.copy()
    flat = np.unpackbits(groups.view(np.uint8), axis=1, bitorder="little").reshape(-1, bits, bits)
    packed = np.packbits(flat.transpose(0, 2, 1).reshape(len(groups), -1), axis=1, bitorder="little")
    return packed.view(words.dtype).reshape(words.shape)


def _zigzag(d: np.ndarray, bits: int) -> np.ndarray:
    signed = d.view(d.dtype.str.replace("u", "i"))
    return (d << d.dtype.type(1)) ^ (signed >> (bits - 1)).view(d.dtype)


def _unzigzag(z: np.ndarray) -> np.ndarray:
    one = z.dtype.type(1)
    return (z >> one) ^ (np.zeros_like(z) - (z & one))


def encode(x: np.ndarray, dim: int = 1) -> np.ndarray:
    """The MPC bytes of a float array (flattened): bitmap of non-zero words, then the words."""
    word, bits, chunk = _check(x.dtype.itemsize, dim)
    n = x.size
    chunks = -(-n // chunk)
    w = np.zeros(chunks * chunk, word)
    w[:n] = np.ascontiguousarray(x).reshape(-1).view(word)
    w = w.reshape(chunks, chunk)
    d = w.copy()
    d[:, dim:] -= w[:, :-dim]                          # LNVs (wraps modulo 2^B)
    t = _transpose_bits(_zigzag(d, bits), bits)        # BIT
    t[:, 1:] -= t[:, :-1].copy()                       # LVs
    t = t.reshape(-1)
    nonzero = t != 0                                   # ZE
    return np.concatenate([np.packbits(nonzero, bitorder="little"), t[nonzero].view(np.uint8)])


def decode(data: np.ndarray, n: int, dtype, dim: int = 1) -> np.ndarray:
    """The ``n`` values ``encode`` was given, bit for bit."""
    dtype = np.dtype(dtype)
    word, bits, chunk = _check(dtype.itemsize, dim)
    chunks = -(-n // chunk)
    total = chunks * chunk
    data = np.frombuffer(memoryview(data), np.uint8) if not isinstance(data, np.ndarray) else data
    head = -(-total // 8)
    if len(data) < head:
        raise InputError("payload", f"{len(data)} bytes", f"at least the {head}-byte bitmap of {n} values")
    nonzero = np.unpackbits(data[:head], count=total, bitorder="little").astype(bool)
    body = data[head:]
    if len(body) != int(nonzero.sum()) * dtype.itemsize:
        raise InputError("payload", f"{len(body)} word bytes", f"{int(nonzero.sum()) * dtype.itemsize} "
                         "(one word per bit set in the bitmap)")
    t = np.zeros(total, word)
    t[nonzero] = np.frombuffer(body.tobytes(), word)
    t = np.cumsum(t.reshape(chunks, chunk), axis=1, dtype=word)    # undo LVs
    d = _unzigzag(_transpose_bits(t, bits))                         # undo BIT, zigzag
    w = np.empty_like(d)
    for r in range(min(dim, chunk)):                                # undo LNVs, one residue at a time
        w[:, r::dim] = np.cumsum(d[:, r::dim], axis=1, dtype=word)
    return w.reshape(-1)[:n].view(dtype).copy()
