"""One class per compressor family, written once; numpy is the reference implementation.

A transform implements one perfmodel family (its contract), registered against the family class
with ``@Family.implements("numpy")`` (and ``"cupy"`` by ``realrun.gpu.kernels`` for the
families the GPU backend declares: the same class runs there). Its layout (output values,
their dtype, metadata bytes) is the family's ``layout``, so payload sizes are the model's wire
sizes by construction. For its hot paths a transform asks the backend of its input
(``backends.of``: numba for float32 numpy arrays where installed, CuPy RawKernels for CuPy
arrays) and otherwise runs the numpy reference below. Stateful transforms (randk, qsgd, powersgd)
read a ``CompressorState``: seed, step number and the tensor's key.

Non-finite input (documented, tested): block quantizers and sign decode a block holding a
NaN or Inf as all NaN; the Hadamard transform spreads a NaN or Inf over its block; top-k and
rand-k keep what they select as it is; PowerSGD spreads NaN through the product; zfp and sz3
refuse non-finite input; casts follow casts.py; lossless codecs are bit-exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from perfmodel.compression import families, quantizers
from realrun.compressors import backends, casts, dtypes
from topologies.errors import InputError

TINY = np.float32(np.finfo(np.float32).smallest_subnormal)   # the least block scale (absmax > 0)


WORKSPACE_ENTRIES = 32   # scratch arrays kept per compressor (oldest dropped first)


@dataclass
class CompressorState:
    """Per-compressor state: seed, step, tensor key, persistent state (residuals, warm starts),
    a workspace of reused scratch arrays, and where the final decoded values go (``out``)."""

    seed: int = 0
    step: int = 0
    key: str = ""
    state: dict = field(default_factory=dict)
    work: dict = field(default_factory=dict)
    out: np.ndarray | None = None
    # error feedback's contraction, where asked for (``track_contraction``): sums of ||residual||^2
    # and ||input + old residual||^2 over its calls since the last ``take_contraction``; None: not
    # tracked (two more passes over every buffer, so only on the steps that measure)
    ef_energy: list | None = None

    def track_contraction(self, on: bool) -> None:
        self.ef_energy = [0.0, 0.0] if on else None

    def take_contraction(self) -> tuple[float, float]:
        """(residual energy, input energy) of the error-feedback calls since the last take (or
        since tracking began), and tracking stops."""
        out, self.ef_energy = tuple(self.ef_energy or (0.0, 0.0)), None
        return out

    def buffer(self, owner, tag: str, n: int, dtype) -> np.ndarray:
        """A scratch array reused across calls (fresh pages cost more than the kernels): valid
        until the same transform asks again; whatever a transform returns from it is copied out."""
        key = (id(owner), tag, n, np.dtype(dtype).str)
        buf = self.work.pop(key, None)
        if buf is None:
            buf = np.empty(n, dtype)
        self.work[key] = buf
        while len(self.work) > WORKSPACE_ENTRIES:
            self.work.pop(next(iter(self.work)))
        return buf

    def workspace(self, owner):
        """``(tag, n, dtype) -> scratch array`` of one transform (what host kernels write into)."""
        return partial(self.buffer, owner)

    def output(self, n: int, dtype, xp=np):
        """The array a decoder's final values go to: the caller's ``out`` once, else a new one
        of the array module ``xp``."""
        out, self.out = self.out, None
        return out if out is not None else xp.empty(n, dtype)


class Transform:
    """One family's implementation: ``encode(x, ctx) -> (values, meta)`` and
    ``decode(values, meta, n, dtype, ctx) -> array``, laid out as ``family.layout`` says.
    ``values`` are an array of the input's module; ``meta`` is ``bytes`` on the host and a
    uint8 device array on the GPU (``Backend.meta``), ``b""`` when empty."""

    def __init__(self, family: families.Family):
        self.family = family
        self.params = family.params

    @property
    def name(self) -> str:
        return self.family.NAME

    def layout(self, n: int, dtype) -> families.Layout:
        """The family's layout of ``n`` values of ``dtype`` (bf16 and fp8 through their
        stand-ins, values passed through keep the input's type: ``dtypes.standin``)."""
        lay = self.family.layout(n, dtypes.standin(dtype))
        out = dtypes.unstand(lay.dtype, dtype)
        return lay if out is lay.dtype else families.Layout(lay.count, out, lay.meta_bytes)

    def check(self, dtype) -> None:
        self.family.accepts(dtypes.standin(dtype))

    def leaves(self, dtype):
        """(transform, its input dtype) for every family transform in this tree."""
        yield self, np.dtype(dtype)

    def passes(self, dtype) -> bool:
        """Whether encode returns input of ``dtype`` unchanged (no kernel is involved)."""
        return False


@families.NoneFamily.implements("numpy")
class NoneTransform(Transform):
    def encode(self, x, ctx):
        return x, b""

    def decode(self, values, meta, n, dtype, ctx):
        return values

    def passes(self, dtype) -> bool:
        return True


class CastTransform(Transform):
    """A cast to ``FORMAT`` codes: a backend's kernel for float32 where it has one, else the
    reference (``to_codes`` / ``from_codes``); an input no wider than the codes passes through
    (a bf16 tensor under ``fp16`` or ``bf16`` is sent as its own bits). A wider narrow input
    (bf16 or fp16 under fp8) is cast from its exact float32 values and decodes to float32,
    then rounds to its dtype (``dtypes``)."""

    FORMAT = ""

    def passes(self, dtype) -> bool:
        return self.layout(1, dtype).dtype == dtype   # a narrower input is not cast

    def encode(self, x, ctx):
        if self.passes(x.dtype):
            return x, b""
        be = backends.of(x)
        x = be.widen(x, ctx.workspace(self))
        if be.casts(self.FORMAT, x.dtype):
            return be.cast_encode(self.FORMAT, x, ctx.workspace(self)), b""
        return self.to_codes(x), b""

    def decode(self, values, meta, n, dtype, ctx):
        if self.passes(dtype):
            return values
        be = backends.of(values)
        wide = dtypes.compute_dtype(dtype)
        if be.casts(self.FORMAT, wide):
            target = ctx.output(n, np.float32, be.xp) if wide == dtype else be.xp.empty(n, np.float32)
            return be.narrow(be.cast_decode(self.FORMAT, values, target), dtype, ctx)
        return be.narrow(self.from_codes(values).astype(wide), dtype, ctx)


@families.Fp16.implements("numpy")
class Fp16Transform(CastTransform):
    FORMAT = "fp16"

    def to_codes(self, x):
        with np.errstate(over="ignore"):
            return x.astype(np.float16)

    def from_codes(self, c):
        return c.astype(np.float32)


@families.Bf16.implements("numpy")
class Bf16Transform(CastTransform):
    FORMAT = "bf16"

    def to_codes(self, x):
        return casts.to_bf16(x.astype(np.float32))

    def from_codes(self, c):
        return casts.from_bf16(c)


@families.Fp8.implements("numpy")
class Fp8Transform(CastTransform):
    def __init__(self, family):
        super().__init__(family)
        self.FORMAT = self.params["format"]   # e4m3 or e5m2

    def to_codes(self, x):
        return casts.to_fp8(x.astype(np.float32), self.params["format"])

    def from_codes(self, c):
        return casts.from_fp8(c, self.params["format"])


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    pad = (-len(x)) % block
    return np.concatenate([x.astype(np.float32), np.zeros(pad, np.float32)]).reshape(-1, block)


def _pack_bits(q: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Two's-complement ``bits``-bit integers, little-endian bit order, ceil(n bits / 8) bytes."""
    if bits == 4:   # the same layout, two nibbles per byte, low nibble first
        u = (q[:n].astype(np.int64) & 0xF).astype(np.uint8)
        if n % 2:
            u = np.concatenate([u, np.zeros(1, np.uint8)])
        return u[0::2] | (u[1::2] << 4)
    u = (q.astype(np.int64) & ((1 << bits) - 1)).astype(np.uint16)
    planes = ((u[:, None] >> np.arange(bits, dtype=np.uint16)) & 1).astype(np.uint8)
    return np.packbits(planes.reshape(-1), bitorder="little")[: math.ceil(n * bits / 8)]


def _unpack_bits(data: np.ndarray, bits: int, n: int) -> np.ndarray:
    if bits == 4:
        u = np.empty(2 * len(data), np.int64)
        u[0::2], u[1::2] = data & 0xF, data >> 4
        u = u[:n]
        return np.where(u >= 8, u - 16, u)
    planes = np.unpackbits(data, bitorder="little")[: n * bits].reshape(n, bits).astype(np.int64)
    u = (planes << np.arange(bits)).sum(axis=1)
    return np.where(u >= 1 << (bits - 1), u - (1 << bits), u)


class BlockQuantTransform(Transform):
    """Blockwise absmax: ``scale = absmax / levels`` per block (fp32, at least the smallest
    subnormal when absmax > 0, one ulp up where rounding left levels x scale < absmax, as it
    does for subnormal blocks), codes = round(x / scale); |x - x'| <= scale / 2. A block with
    a non-finite value gets a NaN scale. ``KERNEL``: a backend's quantize kernel computes the
    same codes (round to nearest in 4 or 8 bits); decoding 4 or 8 bits always has one."""

    KERNEL = False

    @property
    def block(self) -> int:
        return self.params["block"]

    def n_bits(self) -> int:
        return self.family.bits

    def levels(self) -> int:
        return 2 ** (self.n_bits() - 1) - 1

    def scales(self, b: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            absmax = np.max(np.abs(b), axis=1)
        scale = (absmax / self.levels()).astype(np.float32)
        scale = np.where(absmax > 0, np.maximum(scale, TINY), scale)   # never underflow to 0 for x != 0
        short = scale.astype(np.float64) * self.levels() < absmax      # rounded down (subnormals): one ulp up
        scale = np.where(short, np.nextafter(scale, np.float32(np.inf)), scale)
        return np.where(np.isfinite(absmax), scale, np.float32(np.nan)).astype(np.float32)

    def quantize(self, b, scale, ctx):
        safe = np.where((scale > 0) & np.isfinite(scale), scale, 1.0)[:, None]
        return np.rint(np.where(np.isfinite(b), b, 0.0) / safe)

    def encode(self, x, ctx):
        be = backends.of(x)
        x = be.widen(x, ctx.workspace(self))   # narrow types: their exact float32 values
        if self.KERNEL and be.serves(x.dtype):
            values, scales = be.quantize(x, self.block, self.n_bits(), ctx.workspace(self))
            return values, be.meta(scales)
        b = _blocks(x, self.block)
        scale = self.scales(b)
        q = np.clip(self.quantize(b, scale, ctx), -self.levels(), self.levels()).astype(np.int64).reshape(-1)
        return self.pack(q[: len(x)], len(x)), scale.tobytes()

    def pack(self, q, n):
        return _pack_bits(q, self.n_bits(), n) if self.n_bits() < 8 else q.astype(np.int8).view(np.uint8)

    def unpack(self, values, n):
        return _unpack_bits(values, self.n_bits(), n) if self.n_bits() < 8 else values.view(np.int8).astype(np.int64)

    def decode(self, values, meta, n, dtype, ctx):
        """Values of ``dtype``; a narrow dtype decodes in float32 (clipped to its range), then rounds."""
        top = dtypes.finfo_max(dtype)   # levels x rounded scale may pass the largest finite value
        be = backends.of(values)
        wide = dtypes.compute_dtype(dtype)
        if be.serves(wide) and self.n_bits() in (4, 8):
            out = ctx.output(n, wide, be.xp) if wide == dtype else be.xp.empty(n, wide)
            return be.narrow(be.dequantize(values, be.view(meta, np.float32), n, self.block, self.n_bits(), top,
                                           out, ctx.workspace(self)), dtype, ctx)
        scale = np.frombuffer(meta, dtype=np.float32)
        q = self.unpack(values, n)
        per = np.repeat(scale, self.block)[:n].astype(np.float64)
        return be.narrow(np.clip(q * per, -top, top).astype(wide), dtype, ctx)


@families.Int8.implements("numpy")
class Int8Transform(BlockQuantTransform):
    KERNEL = True


@families.Int4.implements("numpy")
class Int4Transform(BlockQuantTransform):
    KERNEL = True


@families.Qsgd.implements("numpy")
class QsgdTransform(BlockQuantTransform):
    """QSGD per block: ``bits`` including sign; stochastic rounding draws from (seed, step)."""

    def quantize(self, b, scale, ctx):
        if not self.params["stochastic"]:
            return super().quantize(b, scale, ctx)
        safe = np.where((scale > 0) & np.isfinite(scale), scale, 1.0)[:, None]
        y = np.where(np.isfinite(b), b, 0.0) / safe
        rng = np.random.default_rng([ctx.seed, ctx.step, 0x5153])
        return np.floor(y + rng.random(y.shape))


@families.Sign.implements("numpy")
class SignTransform(BlockQuantTransform):
    """1 bit per value (1 = non-negative) and the block's mean |x| as its scale."""

    def scales(self, b):
        """Mean |x| per block in float64, in one fixed order that vectorizes: value i of a block
        goes to lane i mod 8, each lane sums in index order, then the lanes combine as
        ((0+1)+(2+3))+((4+5)+(6+7)). The compiled and CUDA paths sum the same way (same bits)."""
        if not b.size:
            return np.zeros(len(b), np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            a = np.abs(b).astype(np.float64)
            a = np.concatenate([a, np.zeros((len(a), (-a.shape[1]) % 8))], axis=1)
            lanes = np.cumsum(a.reshape(len(a), -1, 8), axis=1)[:, -1, :]
            pairs = lanes[:, 0::2] + lanes[:, 1::2]
            quads = pairs[:, 0::2] + pairs[:, 1::2]
            return ((quads[:, 0] + quads[:, 1]) / b.shape[1]).astype(np.float32)

    def encode(self, x, ctx):
        be = backends.of(x)
        x = be.widen(x, ctx.workspace(self))
        if be.serves(x.dtype):
            bits, scales = be.sign_encode(x, self.block, ctx.workspace(self))
            return bits, be.meta(scales)
        b = _blocks(x, self.block)
        pad = b.size - len(x)
        scale = self.scales(b)
        if pad:   # the padding must not dilute the last block's mean
            scale[-1] = self.scales(x[len(x) - (self.block - pad):][None, :])[0]
        bits = (x >= 0) | np.isnan(x)
        return np.packbits(bits, bitorder="little"), scale.astype(np.float32).tobytes()

    def decode(self, values, meta, n, dtype, ctx):
        top = dtypes.finfo_max(dtype)
        be = backends.of(values)
        wide = dtypes.compute_dtype(dtype)
        if be.serves(wide):
            out = ctx.output(n, wide, be.xp) if wide == dtype else be.xp.empty(n, wide)
            return be.narrow(be.sign_decode(values, be.view(meta, np.float32), n, self.block, top, out), dtype, ctx)
        scale = np.repeat(np.frombuffer(meta, dtype=np.float32), self.block)[:n]
        sign = np.unpackbits(values, bitorder="little")[:n].astype(np.float64) * 2 - 1
        return be.narrow(np.clip(sign * scale, -top, top).astype(wide), dtype, ctx)


def hadamard_rotate(y, block: int, scale: float, xp=np):
    """``scale`` times the Walsh-Hadamard transform (the +-1 matrix H) of every whole ``block`` of ``y``,
    in float64; a last partial block stays as it is. H H = block I, so ``scale`` 1/block one way and 1
    the other is the inverse pair."""
    whole = len(y) // block * block
    out = y.astype(xp.float64)
    if not whole:
        return out
    b = out[:whole].reshape(-1, block)
    h = 1
    with np.errstate(invalid="ignore", over="ignore"):   # NaN and Inf spread over their block (module doc)
        while h < block:   # butterflies: pairs (i, i + h) inside each 2h-long run
            v = b.reshape(len(b), -1, 2, h)
            top, bottom = v[:, :, 0, :].copy(), v[:, :, 1, :]
            v[:, :, 0, :] += bottom
            v[:, :, 1, :] = top - bottom
            h *= 2
        out[:whole] *= scale
    return out


@quantizers.Hadamard.implements("numpy")
class HadamardTransform(Transform):
    """SDP4Bit's smoother (``perfmodel.compression.quantizers.Hadamard``): each whole ``block`` rotated,
    values of the input's type out. Encode is H x / block, so no value grows (|y| <= max|x|: nothing
    overflows the type), decode H y (clipped to the type's range); a block quantizer that follows is
    scale-invariant, so its error is the orthonormal rotation's."""

    def encode(self, x, ctx):
        be = backends.of(x)
        block = self.params["block"]
        return be.narrow(hadamard_rotate(be.widen(x), block, 1.0 / block, be.xp), x.dtype), b""

    def decode(self, values, meta, n, dtype, ctx):
        be = backends.of(values)
        top = dtypes.finfo_max(dtype)
        y = hadamard_rotate(be.widen(values), self.params["block"], 1.0, be.xp)
        with np.errstate(invalid="ignore"):
            y = be.xp.clip(y, -top, top)
        return be.narrow(y.astype(dtypes.compute_dtype(dtype)), dtype)


@quantizers.TwoLevel.implements("numpy")
class TwoLevelTransform(Transform):
    """SDP4Bit's TLq-HS on one tensor: the Hadamard transform, then the intra-node quantizer (what a
    flat reduction or one node runs; the inter-node tier is the hierarchical reduce-scatter's)."""

    def __init__(self, family):
        super().__init__(family)
        intra = families.make_family(f"int{self.params['intra']}", (), (("block", self.params["block"]),))
        self.quant = intra.implementation("numpy")(intra)
        h = self.params["hadamard"]
        smooth = families.make_family("hadamard", (), (("block", h),)) if h else None
        self.smooth = HadamardTransform(smooth) if smooth is not None else None

    def encode(self, x, ctx):
        if self.smooth is not None:
            x = self.smooth.encode(x, ctx)[0]
        return self.quant.encode(x, ctx)

    def decode(self, values, meta, n, dtype, ctx):
        y = self.quant.decode(values, meta, n, dtype, ctx)
        return self.smooth.decode(y, b"", n, dtype, ctx) if self.smooth is not None else y


@quantizers.WeightDifference.implements("numpy")
class WeightDifferenceTransform(BlockQuantTransform):
    """SDP4Bit's qWD on the wire: ``bits``-bit groups of what it is given (the caller gives it the weight
    difference: ``realrun.train.zero``); a backend's quantize kernel at 4 and 8 bits, the numpy reference
    at other widths."""

    @property
    def KERNEL(self) -> bool:  # noqa: N802 (BlockQuantTransform's flag, per instance here)
        return self.n_bits() in (4, 8)


def select_largest(x, k: int, xp=np):
    """Ascending positions of the k largest |x| (NaN ranks as Inf): every |x| above the k-th
    largest, then the ties at it in index order. Written against ``xp`` (numpy or CuPy)."""
    n = len(x)
    if k == n:
        return xp.arange(n)
    mag = xp.abs(x)
    mag = xp.where(xp.isnan(mag), xp.inf, mag)
    t = xp.partition(mag, n - k)[n - k]
    above = xp.flatnonzero(mag > t)
    ties = xp.flatnonzero(mag == t)[: k - len(above)]
    return xp.sort(xp.concatenate([above, ties]))   # disjoint sets: their sorted union


@families.TopK.implements("numpy")
class TopKTransform(Transform):
    """The ``density`` fraction of largest |x|: values, then int32 indices or a bitmap
    (whichever is smaller), in index order. NaN and Inf rank as largest and are kept. A narrow
    input is ranked by its exact float32 values; the values sent are its own (same dtype)."""

    def encode(self, x, ctx):
        n, k = len(x), self.family.kept(len(x))
        be = backends.of(x)
        wide = be.widen(x, ctx.workspace(self))
        if be.serves(wide.dtype) and 0 < k < n:
            idx, values = be.topk(wide, k, ctx.workspace(self))
            if wide is not x:   # the values sent are the input's own (same dtype)
                values = x[idx]
        else:
            idx = select_largest(wide, k, be.xp)
            values = x[idx]
        return values, self._index_bytes(idx, n, be)

    def _index_bytes(self, idx, n, be):
        if not self.family.index_bitmap(n):
            return be.meta(idx.astype(np.int32))
        mask = be.xp.zeros(n, dtype=bool)
        mask[idx] = True
        return be.meta(be.xp.packbits(mask, bitorder="little"))

    def indices(self, meta, n, be):
        """The kept positions, checked: k of them, strictly increasing, inside [0, n)."""
        k, xp = self.family.kept(n), be.xp
        if not self.family.index_bitmap(n):
            idx = be.view(meta, np.int32)
            if len(idx) != k or (k and bool((idx[0] < 0) | (idx[-1] >= n) | xp.any(xp.diff(idx) <= 0))):
                raise InputError("payload.indices", f"{len(idx)} indices", f"{k} increasing indices in [0, {n})")
            return idx
        bits = xp.unpackbits(be.view(meta, np.uint8), bitorder="little")
        idx = xp.flatnonzero(bits[:n])
        if len(idx) != k or bool(bits[n:].any()):
            raise InputError("payload.indices", f"a bitmap of {int(bits.sum())} positions", f"{k} positions below {n}")
        return idx

    def decode(self, values, meta, n, dtype, ctx):
        be = backends.of(values)
        out = ctx.output(n, dtype, be.xp)
        if be.compiled and n:
            return be.scatter(values, self.indices(meta, n, be), out)
        out[:] = 0
        out[self.indices(meta, n, be)] = values
        return out


@families.RandK.implements("numpy")
class RandKTransform(TopKTransform):
    """``density`` of the positions drawn from (seed, step); the payload carries the step."""

    def _draw(self, n, seed, step):
        rng = np.random.default_rng([seed, step, 0x52414E44])
        return np.sort(rng.choice(n, self.family.kept(n), replace=False))

    def encode(self, x, ctx):
        idx = self._draw(len(x), ctx.seed, ctx.step)
        return x[idx], np.uint64(ctx.step).tobytes()

    def decode(self, values, meta, n, dtype, ctx):
        out = np.zeros(n, dtype=dtype)
        out[self._draw(n, ctx.seed, int(np.frombuffer(meta, np.uint64)[0]))] = values
        return out
