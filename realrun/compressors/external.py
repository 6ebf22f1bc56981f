"""Transforms backed by external codecs and linear algebra: PowerSGD, zfp (zfpy), SZ3 (pysz),
lossless (numcodecs), MPC. zfp, SZ3 and numcodecs come with the ``real`` extra. Host only:
none of these has a GPU path (a GPU compressor refuses them).

A payload's checksum stops accidents, not a peer that forges one, and these libraries' C
decoders do not check their input against their buffers. So before a stream reaches one,
the count the header claims is checked against what the stream can hold (a bound per codec:
``ZFP_VALUES_PER_BYTE``, ``SZ3_MAX_RATIO``, ``LOSSLESS_MAX_RATIO``), the sizes the stream
declares itself against that count, and zfp reads from a copy padded to the most any stream
of that count could make it read (so a forged one never reads past its buffer); any error a
library raises becomes ``InputError``.
"""
from __future__ import annotations

import struct

import numpy as np

from perfmodel.compression import families
from realrun.compressors import mpc
from realrun.compressors.transforms import Transform
from topologies.errors import InputError


def _need(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise InputError("compressor", module, "installed: pip install 'commpress[real]'") from None


# The most values a stream can hold per byte of it, per codec (checked before decoding):
# zfp's accuracy modes spend at least 1 bit on a block of 4 values (an all-zero block);
ZFP_VALUES_PER_BYTE = 32
# SZ3 (measured on all-zero input, its best case: 2.7e5x at 2^24 values, 6.7e5x at 2^26; the
# ratio grows with the count, toward about 2^20), with a margin of 8;
SZ3_MAX_RATIO = 2**23
# zstd at most ~32768x (an RLE block: 128 KiB from 4 bytes), Blosc with zstd ~4400x, LZ4 ~255x.
LOSSLESS_MAX_RATIO = {"zstd": 2**16, "lz4": 2**9}
LOSSLESS_SLACK = 2**10   # bytes: headers of a short stream
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _external(name: str, decode, *args):
    """Run an external codec's decoder; its own errors on a malformed stream become InputError."""
    try:
        return decode(*args)
    except MemoryError:
        raise InputError("payload", name, f"a {name} stream that decodes within memory") from None
    except Exception as e:   # noqa: BLE001  (each library raises its own types: TypeError, NotImplementedError...)
        raise InputError("payload", name, f"a valid {name} stream ({type(e).__name__}: {str(e)[:80]})") from None


def _holds(name: str, n: int, stream_bytes: int, most: float) -> None:
    """Refuse a claim of ``n`` values that a stream of ``stream_bytes`` cannot hold."""
    if n > most:
        raise InputError("payload.count", n, f"at most {int(most)} values in a {stream_bytes}-byte {name} stream")


def _host_float(name: str, dtype) -> None:
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InputError("dtype", str(np.dtype(dtype)), f"float32 or float64 for {name} (its library has no "
                         f"{np.dtype(dtype)})")


def _finite(name: str, x: np.ndarray) -> None:
    if not np.all(np.isfinite(x)):
        raise InputError("compressor", name, "finite input: zfp and sz3 cannot encode NaN or Inf")


@families.PowerSgd.implements("numpy")
class PowerSgdTransform(Transform):
    """Rank-r approximation by one power iteration with warm start (Vogels et al. 2019): the
    buffer as an m x n matrix (zero padded), P = M Q, orthogonalized, Q = M^T P; payload P, Q
    with columns balanced so that neither factor overflows. Q starts from (seed) random and
    is kept per key between calls."""

    def shape(self, count):
        return self.family.shape(count)

    def rank(self, count):
        return self.family.factor_rank(count)

    def encode(self, x, ctx):
        if not len(x):
            return x, b""
        m, n = self.shape(len(x))
        r = self.rank(len(x))
        M = np.zeros(m * n, np.float64)
        M[: len(x)] = x
        M = M.reshape(m, n)
        key = ("powersgd", ctx.key, m, n, r)
        Q = ctx.state.get(key)
        if Q is None:
            Q = np.random.default_rng([ctx.seed, 0x505347]).standard_normal((n, r))
        P, _ = np.linalg.qr(M @ Q)
        Q = M.T @ P
        ctx.state[key] = Q
        # balance the factors (P Q^T unchanged) so neither overflows the payload's dtype
        norms = np.linalg.norm(Q, axis=0)
        f = np.sqrt(np.where((norms > 0) & np.isfinite(norms), norms, 1.0))
        return np.concatenate([(P * f).ravel(), (Q / f).ravel()]).astype(x.dtype), b""

    def decode(self, values, meta, count, dtype, ctx):
        if not count:
            return np.zeros(0, dtype)
        m, n = self.shape(count)
        r = self.rank(count)
        P = values[: m * r].astype(np.float64).reshape(m, r)
        Q = values[m * r:].astype(np.float64).reshape(n, r)
        with np.errstate(over="ignore"):   # beyond the dtype's range: +-Inf, as a cast does
            return (P @ Q.T).ravel()[:count].astype(dtype)


@families.Zfp.implements("numpy")
class ZfpTransform(Transform):
    """zfp through zfpy, headerless: fixed rate is exact (``rate`` bits per value, 64-bit
    words); tolerance and precision produce a blob of data-dependent length."""

    def _kw(self):
        mode = self.family.mode
        return {mode: self.params[mode]}

    def check(self, dtype):
        super().check(dtype)
        _host_float("zfp", dtype)

    def _stream(self, values, n: int, dtype) -> np.ndarray:
        """The stream, bounds checked; in an accuracy mode a copy padded with zeros to the most a
        stream of ``n`` values can read (a block: 1 + exponent bits, at most ~5 bits per value bit
        plane group; 64-bit words read ahead), so a forged stream never reads past it. Fixed
        rate reads exactly its layout, which the payload's length check already enforced."""
        data = np.asarray(values, np.uint8).reshape(-1)
        if self.family.mode == "rate":
            return np.ascontiguousarray(data)
        _holds("zfp", n, len(data), ZFP_VALUES_PER_BYTE * len(data))
        bits = 8 * np.dtype(dtype).itemsize
        worst = -(-n // 4) * (5 * bits + 24) // 8 + 64
        padded = np.zeros(max(len(data), worst) + 64, np.uint8)   # pages untouched stay free
        padded[: len(data)] = data
        return padded

    def encode(self, x, ctx):
        zfpy = _need("zfpy")
        _finite("zfp", x)
        if not len(x):
            return np.zeros(self.layout(0, x.dtype).count, np.uint8), b""
        blob = zfpy.compress_numpy(np.ascontiguousarray(x), write_header=False, **self._kw())
        return np.frombuffer(blob, np.uint8), b""

    def decode(self, values, meta, n, dtype, ctx):
        zfpy = _need("zfpy")
        if not n:
            return np.zeros(0, dtype)
        ztype = zfpy.dtype_to_ztype(np.dtype(dtype))
        stream = self._stream(values, n, dtype)
        out = _external("zfp", lambda: zfpy._decompress(stream, ztype, [n], **self._kw()))
        top = np.finfo(dtype).max   # input was finite: at low rates zfp can round the largest values past it
        return np.clip(np.asarray(out, dtype=dtype).reshape(-1)[:n], -top, top)


@families.Sz3.implements("numpy")
class Sz3Transform(Transform):
    """SZ3 through pysz with an absolute or value-range-relative error bound."""

    def check(self, dtype):
        super().check(dtype)
        _host_float("sz3", dtype)

    def encode(self, x, ctx):
        pysz = _need("pysz")
        _finite("sz3", x)
        if not len(x):
            return np.zeros(0, np.uint8), b""
        config = pysz.szConfig()
        if self.params.get("abs") is not None:
            config.errorBoundMode, config.absErrorBound = pysz.szErrorBoundMode.ABS, self.params["abs"]
        else:
            config.errorBoundMode, config.relErrorBound = pysz.szErrorBoundMode.REL, self.params["rel"]
        blob, _ = pysz.sz.compress(np.ascontiguousarray(x), config)
        return np.asarray(blob, np.uint8), b""

    def decode(self, values, meta, n, dtype, ctx):
        pysz = _need("pysz")
        if not n:
            return np.zeros(0, dtype)
        _holds("sz3", n, len(values), SZ3_MAX_RATIO * (len(values) + LOSSLESS_SLACK) / np.dtype(dtype).itemsize)
        stream = np.ascontiguousarray(values, dtype=np.uint8)
        out, _ = _external("sz3", pysz.sz.decompress, stream, np.dtype(dtype), (n,))
        return np.asarray(out).reshape(-1)


@families.Lossless.implements("numpy")
class LosslessTransform(Transform):
    """A byte shuffle (or Blosc bit shuffle) and zstd or lz4 from numcodecs; bit-exact."""

    def _codec(self, itemsize):
        numcodecs = _need("numcodecs")
        codec, shuffle = self.params["codec"], self.params["shuffle"]
        if shuffle == "bit":
            return [numcodecs.Blosc(cname=codec, clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE, typesize=itemsize)]
        core = numcodecs.Zstd(level=3) if codec == "zstd" else numcodecs.LZ4()
        return ([numcodecs.Shuffle(elementsize=itemsize)] if shuffle == "byte" and itemsize > 1 else []) + [core]

    def encode(self, x, ctx):
        if not len(x):
            return np.zeros(0, np.uint8), b""
        data = np.ascontiguousarray(x).view(np.uint8)
        for c in self._codec(x.dtype.itemsize):
            data = np.frombuffer(c.encode(data), np.uint8)
        return data, b""

    def _check_stream(self, data: bytes, n: int, itemsize: int) -> None:
        """``n`` values must fit what the stream's length can hold, and the stream's own declared
        size must be theirs."""
        codec, blosc = self.params["codec"], self.params["shuffle"] == "bit"
        _holds("lossless", n, len(data), LOSSLESS_MAX_RATIO[codec] * (len(data) + LOSSLESS_SLACK) / itemsize)
        declared = _declared_size(data, codec, blosc)
        if declared != n * itemsize:
            raise InputError("payload", f"a {'blosc' if blosc else codec} stream of {declared} bytes",
                             f"{n * itemsize} bytes (the header's {n} values)")

    def decode(self, values, meta, n, dtype, ctx):
        if not n:
            return np.zeros(0, dtype)
        data = bytes(values)
        self._check_stream(data, n, np.dtype(dtype).itemsize)
        for c in reversed(self._codec(np.dtype(dtype).itemsize)):
            data = bytes(_external("lossless", c.decode, data))
        if len(data) != n * np.dtype(dtype).itemsize:
            raise InputError("payload", f"{len(data)} decoded bytes", f"{n * np.dtype(dtype).itemsize} (header)")
        return np.frombuffer(data, dtype=dtype).copy()


def _declared_size(data: bytes, codec: str, blosc: bool) -> int | None:
    """The decoded size a stream declares in its own header (None where it declares none):
    Blosc's nbytes (and its cbytes must be the stream's length), numcodecs' LZ4 size prefix,
    the content size of a zstd frame."""
    if blosc:
        if len(data) < 16 or struct.unpack_from("<I", data, 12)[0] != len(data):
            return None
        return struct.unpack_from("<I", data, 4)[0]
    if codec == "lz4":
        return struct.unpack_from("<I", data, 0)[0] if len(data) >= 4 else None
    if len(data) < 6 or data[:4] != ZSTD_MAGIC:
        return None
    fhd = data[4]
    single, dict_bytes, fcs_flag = (fhd >> 5) & 1, (0, 1, 2, 4)[fhd & 3], fhd >> 6
    size_bytes = (1 if single else 0, 2, 4, 8)[fcs_flag]
    at = 5 + (0 if single else 1) + dict_bytes
    if not size_bytes or len(data) < at + size_bytes:
        return None
    value = int.from_bytes(data[at:at + size_bytes], "little")
    return value + 256 if size_bytes == 2 else value


@families.Mpc.implements("numpy")
class MpcTransform(Transform):
    """MPC's four stages in numpy (realrun.compressors.mpc); bit-exact for every float pattern."""

    def encode(self, x, ctx):
        return mpc.encode(x, self.params["dim"]), b""

    def decode(self, values, meta, n, dtype, ctx):
        return mpc.decode(np.asarray(values, np.uint8), n, dtype, self.params["dim"])
