"""Compressor families: wire size, kernel traffic, reducibility, losslessness, error.

Every family maps an input *stream* (``count`` values, ``nbytes`` bytes) to an output
value stream plus metadata bytes (scales, indices); chains feed one family's value
stream to the next. Sizes are exact where the format is deterministic (casts, block
quantizers, top-k, fixed-rate zfp) and ``input / ratio`` where it depends on the data
(zfp tolerance/precision, sz3, lossless), the ratio a parameter with a documented
default that calibration replaces.

Kernel cost is memory traffic: ``compress_traffic`` and ``decompress_traffic`` are
bytes of device memory read plus written per input byte; ``device.py`` turns them
into time through the device's streaming bandwidth. Compute-heavy codecs (zfp, sz3,
lossless) carry an equivalent traffic that is an assumption until calibrated.

``error`` is the relative RMS error of one application, ``||x' - x|| / ||x||``, for
i.i.d. unit-Gaussian data (the convention stated in docs/design.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from scipy.stats import norm

from perfmodel.compression.grammar import _fmt
from topologies.errors import InputError

FP_MANTISSA_BITS = {"fp16": 10, "bf16": 7, "e4m3": 3, "e5m2": 2}
SCALE_BYTES = 4            # one float32 scale per block
INDEX_BYTES = 4            # int32 index per kept value
DEFAULT_BLOCK = 256        # values per quantization block: scale overhead 4/256 B per value

# Ratios for data-dependent codecs when no calibration is given.
DEFAULT_RATIO = {
    # DESIGN.md section 8: SZ3 abs 1e-4 on 16 M Gaussian float32 gave 6.8x.
    "sz3": 6.8,
    # Assumption, no measurement yet: zfp in accuracy mode near rate-8 quality (4x, DESIGN 8).
    "zfp": 4.0,
    # DESIGN.md section 8: lossless codecs gave at most 1.15x on Gaussian float32.
    "lossless": 1.15,
}


@dataclass(frozen=True)
class Stream:
    count: int
    nbytes: float


@dataclass(frozen=True, kw_only=True)
class Param:
    name: str
    kind: type
    default: object = None
    check: object = None      # value -> bool
    allowed: str = ""


def _positive_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _density(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1


def _positive(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and math.isfinite(v)


def _ratio(v):
    return _positive(v) and v >= 1


@dataclass(frozen=True, kw_only=True)
class Family:
    """Base of every family. Subclasses set NAME, PARAMS and the flags."""

    params: dict = field(default_factory=dict)
    NAME = ""
    PARAMS = ()
    REDUCIBLE = False
    LOSSLESS = False
    EXACT = True

    def __getattr__(self, key):
        params = object.__getattribute__(self, "params")
        if key in params:
            return params[key]
        raise AttributeError(key)

    @property
    def reducible(self) -> bool:
        return self.REDUCIBLE

    @property
    def lossless(self) -> bool:
        return self.LOSSLESS

    @property
    def exact(self) -> bool:
        return self.EXACT

    def transform(self, stream: Stream) -> tuple[Stream, float]:
        raise NotImplementedError

    def compress_traffic(self, stream: Stream) -> float:
        out, meta = self.transform(stream)
        return 1.0 + (out.nbytes + meta) / max(stream.nbytes, 1.0)

    def decompress_traffic(self, stream: Stream) -> float:
        return self.compress_traffic(stream)

    def error(self) -> float:
        return 0.0

    def __str__(self) -> str:
        shown = [f"{p.name}={_fmt(self.params[p.name])}" for p in self.PARAMS
                 if self.params.get(p.name) is not None]
        return self.NAME + (f"({','.join(shown)})" if shown else "")


class NoneFamily(Family):
    NAME, REDUCIBLE, LOSSLESS = "none", True, True

    def transform(self, stream):
        return stream, 0.0

    def compress_traffic(self, stream):
        return 0.0

    def decompress_traffic(self, stream):
        return 0.0


class Cast(Family):
    """fp16 / bf16 / fp8: round to nearest; relative error 2^-(m+1)/sqrt(3) for m mantissa bits."""

    BYTES = {"fp16": 2, "bf16": 2, "fp8": 1}

    def _bytes(self):
        return self.BYTES[self.NAME]

    def _mantissa(self):
        return FP_MANTISSA_BITS[self.params.get("format", self.NAME)]

    def transform(self, stream):
        per = min(self._bytes(), stream.nbytes / max(stream.count, 1))
        return Stream(stream.count, stream.count * per), 0.0

    def error(self):
        return 2.0 ** -(self._mantissa() + 1) / math.sqrt(3.0)


class Fp16(Cast):
    NAME, REDUCIBLE = "fp16", True


class Bf16(Cast):
    NAME, REDUCIBLE = "bf16", True


class Fp8(Cast):
    NAME = "fp8"
    PARAMS = (Param(name="format", kind=str, default="e4m3", check=lambda v: v in ("e4m3", "e5m2"),
                    allowed="e4m3 or e5m2"),)


def _expected_absmax(block: int) -> float:
    """E[max |x|] of ``block`` unit Gaussians, ~sqrt(2 ln 2b) (extreme-value approximation)."""
    return math.sqrt(2.0 * math.log(max(2 * block, 2)))


class BlockQuant(Family):
    """Blockwise absmax quantization to ``bits`` (sign included) with one fp32 scale per block.

    Compress reads the input twice (absmax, then quantize); error is uniform over half
    a step: step = absmax / (2^(bits-1) - 1), RMS = step / sqrt(12).
    """

    BITS = 8
    PARAMS = (Param(name="block", kind=int, default=DEFAULT_BLOCK, check=_positive_int,
                    allowed="an integer >= 1"),)

    def _bits(self):
        return self.BITS

    def transform(self, stream):
        blocks = math.ceil(stream.count / self.block) if stream.count else 0
        return Stream(stream.count, math.ceil(stream.count * self._bits() / 8)), blocks * SCALE_BYTES

    def compress_traffic(self, stream):
        return 1.0 + super().compress_traffic(stream)

    def decompress_traffic(self, stream):
        return super().compress_traffic(stream)

    def _levels(self):
        return 2 ** (self._bits() - 1) - 1

    def error(self):
        return _expected_absmax(self.block) / self._levels() / math.sqrt(12.0)


class Int8(BlockQuant):
    NAME, BITS = "int8", 8


class Int4(BlockQuant):
    NAME, BITS = "int4", 4


class Qsgd(BlockQuant):
    """QSGD (Alistarh et al., NeurIPS 2017) per block: ``bits`` per value including sign,
    stochastic rounding (unbiased, error variance step^2/6 on average) or nearest."""

    NAME = "qsgd"
    PARAMS = (Param(name="bits", kind=int, default=4, check=lambda v: _positive_int(v) and 2 <= v <= 8,
                    allowed="an integer from 2 to 8"),
              Param(name="stochastic", kind=bool, default=True, check=lambda v: isinstance(v, bool),
                    allowed="true or false"),
              Param(name="block", kind=int, default=DEFAULT_BLOCK, check=_positive_int,
                    allowed="an integer >= 1"))

    def _bits(self):
        return self.bits

    def error(self):
        spread = math.sqrt(6.0) if self.stochastic else math.sqrt(12.0)
        return _expected_absmax(self.block) / self._levels() / spread


class Sign(BlockQuant):
    """signSGD with a per-block scale (mean |x|, as in EF-signSGD): 1 bit per value.
    Relative error for Gaussian data: sqrt(1 - (E|x|)^2 / E[x^2]) = sqrt(1 - 2/pi)."""

    NAME, BITS = "sign", 1

    def error(self):
        return math.sqrt(1.0 - 2.0 / math.pi)


class TopK(Family):
    """Keep the ``density`` fraction of largest magnitudes: values plus int32 indices, or a
    bitmap when that is smaller (density > 1/32). Selection is a radix select, 4 passes
    over float32 (Alabi et al., 'Fast k-selection algorithms for GPUs', JEA 2012)."""

    NAME = "topk"
    SELECT_PASSES = 4.0
    PARAMS = (Param(name="density", kind=float, check=_density, allowed="a fraction in (0, 1]"),)

    def kept(self, count: int) -> int:
        return min(count, math.ceil(self.density * count)) if count else 0

    def transform(self, stream):
        k = self.kept(stream.count)
        per = stream.nbytes / max(stream.count, 1)
        index = min(k * INDEX_BYTES, math.ceil(stream.count / 8))
        return Stream(k, k * per), index

    def compress_traffic(self, stream):
        return self.SELECT_PASSES + super().compress_traffic(stream) - 1.0

    def decompress_traffic(self, stream):
        out, meta = self.transform(stream)
        return 1.0 + (out.nbytes + meta) / max(stream.nbytes, 1.0)

    def error(self):
        if self.density >= 1:
            return 0.0
        t = norm.ppf(1.0 - self.density / 2.0)
        kept_energy = self.density + 2.0 * t * norm.pdf(t)
        return math.sqrt(max(0.0, 1.0 - kept_energy))


class RandK(TopK):
    """Random ``density`` fraction from a seed shared by all ranks: no indices on the wire,
    only the 8-byte step number that, with the seed, draws them."""

    NAME = "randk"
    STEP_BYTES = 8

    def transform(self, stream):
        k = self.kept(stream.count)
        return Stream(k, k * stream.nbytes / max(stream.count, 1)), float(self.STEP_BYTES)

    def compress_traffic(self, stream):
        return Family.compress_traffic(self, stream) - 1.0 + self.density

    def error(self):
        return math.sqrt(1.0 - self.density)


class PowerSgd(Family):
    """PowerSGD (Vogels et al., NeurIPS 2019): the buffer as an m x n matrix (m = ceil(sqrt N)
    unless ``rows`` is given), sent as P (m x rank) and Q (n x rank); the factors are summed
    by an ordinary all-reduce. Memory-bound for small rank: M is read twice to compress
    and written once to decompress. Error: i.i.d. data (worst case, real gradients are
    far more compressible): energy of the top ``rank`` singular values, each about
    (sqrt m + sqrt n)^2 (Marchenko-Pastur edge)."""

    NAME, REDUCIBLE = "powersgd", True
    PARAMS = (Param(name="rank", kind=int, default=4, check=_positive_int, allowed="an integer >= 1"),
              Param(name="rows", kind=int, default=None, check=_positive_int, allowed="an integer >= 1"))

    def shape(self, count: int) -> tuple[int, int]:
        rows = self.rows or max(1, math.ceil(math.sqrt(count)))
        return rows, max(1, math.ceil(count / rows))

    def factor_bytes(self, stream: Stream) -> tuple[float, float]:
        per = stream.nbytes / max(stream.count, 1)
        m, n = self.shape(stream.count)
        r = min(self.rank, m, n)
        return m * r * per, n * r * per

    def transform(self, stream):
        if not stream.count:
            return Stream(0, 0.0), 0.0
        p, q = self.factor_bytes(stream)
        per = stream.nbytes / stream.count
        return Stream(round((p + q) / per), p + q), 0.0

    def compress_traffic(self, stream):
        return 2.0

    def decompress_traffic(self, stream):
        return 1.0

    def error(self, count: int = 2**24):
        m, n = self.shape(count)
        captured = self.rank * (math.sqrt(m) + math.sqrt(n)) ** 2 / (m * n)
        return math.sqrt(max(0.0, 1.0 - min(1.0, captured)))


def _one_of(params: dict, keys: tuple, family: str) -> str:
    given = [k for k in keys if params.get(k) is not None]
    if len(given) != 1:
        raise InputError(family, {k: params.get(k) for k in given} or None,
                         "exactly one of " + ", ".join(keys))
    return given[0]


class Zfp(Family):
    """zfp (Lindstrom 2014). ``rate`` is fixed-rate: exactly ``rate`` bits per value in 1-D
    blocks of 4, padded to 64-bit words. ``tolerance`` / ``precision`` are data-dependent
    (``ratio`` or the default). Equivalent traffic of 8 bytes per input byte is an
    assumption to calibrate. rate <= 2 is refused: zfpy crashes on 1-D input there
    (DESIGN.md section 8)."""

    NAME = "zfp"
    TRAFFIC = 8.0
    PARAMS = (Param(name="rate", kind=float, check=lambda v: _positive(v) and 2 < v <= 32,
                    allowed="bits per value in (2, 32]"),
              Param(name="tolerance", kind=float, check=_positive, allowed="an absolute error > 0"),
              Param(name="precision", kind=int, check=lambda v: _positive_int(v) and v <= 32,
                    allowed="an integer from 1 to 32"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    @property
    def mode(self) -> str:
        return _one_of(self.params, ("rate", "tolerance", "precision"), "zfp")

    @property
    def exact(self) -> bool:
        return self.mode == "rate"

    def transform(self, stream):
        if self.mode == "rate":
            bits = math.ceil(stream.count / 4) * 4 * self.rate
            return Stream(stream.count, math.ceil(bits / 64) * 8), 0.0
        return Stream(stream.count, stream.nbytes / (self.ratio or DEFAULT_RATIO["zfp"])), 0.0

    def compress_traffic(self, stream):
        return self.TRAFFIC

    def decompress_traffic(self, stream):
        return self.TRAFFIC

    # Measured with realrun.compressors (zfpy 1.0.1) on 2^18 unit-Gaussian float32 values:
    # relative RMS error = C * 2^-rate (C 13.8-15.5 for rate 4-16), 6.3 * 2^-precision, and
    # 0.13 * tolerance in accuracy mode (zfp stays well inside its bound).
    RATE_C, PRECISION_C, TOLERANCE_C = 13.9, 6.3, 0.133

    def error(self):
        if self.mode == "tolerance":
            return self.TOLERANCE_C * self.tolerance
        if self.mode == "rate":
            return min(1.0, self.RATE_C * 2.0 ** -self.rate)
        return min(1.0, self.PRECISION_C * 2.0 ** -self.precision)


class Sz3(Family):
    """SZ3 error-bounded (Liang et al., ICDE 2023): ``abs`` or ``rel`` (to the value range)
    bound; size is data-dependent (``ratio`` or the default, measured at abs 1e-4).
    Equivalent traffic of 10 bytes per input byte is an assumption to calibrate."""

    NAME = "sz3"
    TRAFFIC = 10.0
    RANGE_SIGMAS = 10.0   # value range of ~16 M unit Gaussians is about +-5 sigma
    PARAMS = (Param(name="abs", kind=float, check=_positive, allowed="an absolute error bound > 0"),
              Param(name="rel", kind=float, check=lambda v: _positive(v) and v < 1,
                    allowed="a relative error bound in (0, 1)"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    @property
    def exact(self) -> bool:
        return False

    def transform(self, stream):
        _one_of(self.params, ("abs", "rel"), "sz3")
        return Stream(stream.count, stream.nbytes / (self.ratio or DEFAULT_RATIO["sz3"])), 0.0

    def compress_traffic(self, stream):
        return self.TRAFFIC

    def decompress_traffic(self, stream):
        return self.TRAFFIC

    def error(self):
        mode = _one_of(self.params, ("abs", "rel"), "sz3")
        bound = self.abs if mode == "abs" else self.rel * self.RANGE_SIGMAS
        return bound / math.sqrt(3.0)


class Lossless(Family):
    """A lossless byte codec after an optional byte/bit shuffle (stands in for MPC and
    nvCOMP). Data-dependent ratio; equivalent traffic 6 bytes per input byte (assumption)."""

    NAME, LOSSLESS, EXACT = "lossless", True, False
    TRAFFIC = 6.0
    PARAMS = (Param(name="codec", kind=str, default="zstd", check=lambda v: v in ("zstd", "lz4"),
                    allowed="zstd or lz4"),
              Param(name="shuffle", kind=str, default="byte", check=lambda v: v in ("byte", "bit", "none"),
                    allowed="byte, bit or none"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    def transform(self, stream):
        return Stream(stream.count, stream.nbytes / (self.ratio or DEFAULT_RATIO["lossless"])), 0.0

    def compress_traffic(self, stream):
        return self.TRAFFIC

    def decompress_traffic(self, stream):
        return self.TRAFFIC


FAMILIES: dict[str, type[Family]] = {cls.NAME: cls for cls in (
    NoneFamily, Fp16, Bf16, Fp8, Int8, Int4, Qsgd, Sign, TopK, RandK, PowerSgd, Zfp, Sz3, Lossless)}


def make_family(name: str, args: tuple, kwargs: tuple) -> Family:
    """Build and validate one family from parsed positional and keyword arguments."""
    if name not in FAMILIES:
        raise InputError("compressor", name, "one of " + ", ".join(FAMILIES) + ", or ef(...)")
    cls = FAMILIES[name]
    names = [p.name for p in cls.PARAMS]
    if len(args) > len(names):
        raise InputError(f"{name}", list(args), f"at most {len(names)} positional argument(s): "
                         + (", ".join(names) or "none"))
    given = dict(zip(names, args))
    for key, value in kwargs:
        if key not in names:
            raise InputError(f"{name}.{key}", value, "allowed parameters: " + (", ".join(names) or "none"))
        if key in given:
            raise InputError(f"{name}.{key}", value, "given twice")
        given[key] = value
    params = {}
    for p in cls.PARAMS:
        value = given.get(p.name, p.default)
        if value is None and p.default is None and p.name in given:
            raise InputError(f"{name}.{p.name}", value, p.allowed)
        if value is not None:
            if p.kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not p.check(value):
                raise InputError(f"{name}.{p.name}", value, p.allowed)
        params[p.name] = value
    required = [p.name for p in cls.PARAMS if p.default is None and p.name not in given
                and name in ("topk", "randk")]
    if required:
        raise InputError(f"{name}.{required[0]}", None, "required: " + cls.PARAMS[0].allowed)
    family = cls(params=params)
    family.transform(Stream(4, 16.0))  # mode checks (zfp/sz3 need exactly one bound)
    return family
