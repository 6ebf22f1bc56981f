"""Stages backed by external codecs and linear algebra: PowerSGD, zfp (zfpy), SZ3 (pysz),
lossless (numcodecs), MPC. zfp, SZ3 and numcodecs come with the ``real`` extra. Host only:
none of these has a GPU path (a GPU compressor refuses them)."""
from __future__ import annotations


import numpy as np

from perfmodel.compression import families
from realrun.compressors import mpc
from realrun.compressors.stages import Stage
from topologies.errors import InputError


def _need(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise InputError("compressor", module, "installed: pip install 'commpress[real]'") from None


def _external(name: str, decode, *args):
    """Run an external codec's decoder; its own errors on a malformed stream become InputError."""
    try:
        return decode(*args)
    except (ValueError, RuntimeError, IndexError, OverflowError) as e:
        raise InputError("payload", name, f"a valid {name} stream ({str(e)[:80]})") from None


def _finite(name: str, x: np.ndarray) -> None:
    if not np.all(np.isfinite(x)):
        raise InputError("compressor", name, "finite input: zfp and sz3 cannot encode NaN or Inf")


@families.PowerSgd.implements("numpy")
class PowerSgdStage(Stage):
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
class ZfpStage(Stage):
    """zfp through zfpy, headerless: fixed rate is exact (``rate`` bits per value, 64-bit
    words); tolerance and precision produce a blob of data-dependent length."""

    def _kw(self):
        mode = self.family.mode
        return {mode: self.params[mode]}

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
        out = _external("zfp", lambda: zfpy._decompress(bytes(values), ztype, [n], **self._kw()))
        top = np.finfo(dtype).max   # input was finite: at low rates zfp can round the largest values past it
        return np.clip(np.asarray(out, dtype=dtype).reshape(-1)[:n], -top, top)


@families.Sz3.implements("numpy")
class Sz3Stage(Stage):
    """SZ3 through pysz with an absolute or value-range-relative error bound."""

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
        out, _ = _external("sz3", pysz.sz.decompress, np.ascontiguousarray(values), np.dtype(dtype), (n,))
        return np.asarray(out).reshape(-1)


@families.Lossless.implements("numpy")
class LosslessStage(Stage):
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

    def decode(self, values, meta, n, dtype, ctx):
        if not n:
            return np.zeros(0, dtype)
        data = bytes(values)
        for c in reversed(self._codec(np.dtype(dtype).itemsize)):
            data = bytes(_external("lossless", c.decode, data))
        if len(data) != n * np.dtype(dtype).itemsize:
            raise InputError("payload", f"{len(data)} decoded bytes", f"{n * np.dtype(dtype).itemsize} (header)")
        return np.frombuffer(data, dtype=dtype).copy()


@families.Mpc.implements("numpy")
class MpcStage(Stage):
    """MPC's four stages in numpy (realrun.compressors.mpc); bit-exact for every float pattern."""

    def encode(self, x, ctx):
        return mpc.encode(x, self.params["dim"]), b""

    def decode(self, values, meta, n, dtype, ctx):
        return mpc.decode(np.asarray(values, np.uint8), n, dtype, self.params["dim"])
