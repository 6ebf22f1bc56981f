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

**One contract per compressor.** A family is the single definition both sides use: its
parameters and their validation, its ``layout`` (values out, their dtype, metadata bytes:
realrun's payloads are laid out from it, so the model's wire size *is* the payload size),
what it accepts as input, its traits (``IDENTITY``, ``SPARSE``, ``CAST_TO``, factored
``reduce_parts``), error and traffic. Implementations register against the class, per
backend (``numpy``: realrun's reference; ``cupy``: realrun.gpu's kernels), with
``Family.implements(backend)``; ``register`` adds a family to ``FAMILIES`` (the grammar's
names). A new compressor is its contract here plus its implementation class; nothing keys
on name strings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from perfmodel.compression.grammar import _fmt
from topologies.errors import InputError

_NORMAL = NormalDist()   # the unit Gaussian of the error convention (stdlib: no scipy.stats at import)
FP_MANTISSA_BITS = {"fp16": 10, "bf16": 7, "e4m3": 3, "e5m2": 2}
SCALE_BYTES = 4            # one float32 scale per block
INDEX_BYTES = 4            # int32 index per kept value
DEFAULT_BLOCK = 256        # values per quantization block: scale overhead 4/256 B per value

# Ratios for data-dependent codecs when no calibration is given.
DEFAULT_RATIO = {
    # Measured (docs/design.md, Facts measured): SZ3 abs 1e-4 on 16 M Gaussian float32 gave 6.8x.
    "sz3": 6.8,
    # Assumption, no measurement yet: zfp in accuracy mode near rate-8 quality (4x, docs/design.md).
    "zfp": 4.0,
    # Measured (docs/design.md, Facts measured): lossless codecs gave at most 1.15x on Gaussian float32.
    "lossless": 1.15,
    # Measured (benchmarks/bench_lossless.py, docs/design.md): MPC on a small GPT's fp32
    # activations and gradients after 20 steps, 1.11x and 1.11x (fp16: 1.04x, 1.06x).
    "mpc": 1.11,
}


BYTES = np.dtype(np.uint8)
FLOAT_DTYPES = {2: np.dtype(np.float16), 4: np.dtype(np.float32), 8: np.dtype(np.float64)}


def message_dtype(dtype_bytes: int) -> np.dtype:
    """The float type the model stands in for a message of ``dtype_bytes`` per value (bf16 as fp16)."""
    return FLOAT_DTYPES.get(dtype_bytes, BYTES)


@dataclass(frozen=True)
class Stream:
    """A value stream: ``count`` values, ``nbytes`` bytes, of ``dtype`` (None: an opaque blob
    whose size the model only estimates)."""

    count: int
    nbytes: float
    dtype: np.dtype | None = None


@dataclass(frozen=True)
class Layout:
    """What a family makes of ``count`` values of one dtype: ``count`` output values of
    ``dtype`` (None: an opaque blob of data-dependent length, always last in a chain) and
    ``meta_bytes`` of metadata (scales, indices), both known from the input size alone."""

    count: int
    dtype: np.dtype | None
    meta_bytes: int = 0

    @property
    def value_bytes(self) -> int:
        return self.count * self.dtype.itemsize if self.dtype is not None else 0


FAMILIES: dict[str, type[Family]] = {}


def register(cls):
    """Add a family to the grammar (``FAMILIES[cls.NAME]``) with its own implementation table."""
    if not cls.NAME or cls.NAME in ("ef",):
        raise ValueError(f"family {cls.__name__} needs a NAME other than ef")
    cls.IMPLEMENTATIONS = {}
    FAMILIES[cls.NAME] = cls
    return cls


def unregister(cls) -> None:
    """Remove a family added with ``register`` (tests that define one)."""
    if FAMILIES.get(cls.NAME) is cls:
        del FAMILIES[cls.NAME]


@dataclass(frozen=True, kw_only=True)
class Param:
    name: str
    kind: type
    default: object = None
    check: object = None      # value -> bool
    allowed: str = ""
    required: bool = False


def _positive_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _density(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1


def _positive(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and math.isfinite(v)


def _ratio(v):
    return _positive(v) and v >= 1


def _float_input(name: str, dtype) -> None:
    if dtype is None or np.dtype(dtype).kind != "f":
        raise InputError("compressor", name, "a floating-point input (quantized or opaque values cannot be "
                         "compressed again; only lossless may follow them)")


@dataclass(frozen=True, kw_only=True)
class Family:
    """Base of every family. Subclasses set NAME, PARAMS, the flags and ``layout``."""

    params: dict = field(default_factory=dict)
    NAME = ""
    PARAMS = ()
    EXAMPLES = ()              # spec strings the contract tests run (default: the bare name)
    REDUCIBLE = False
    LOSSLESS = False
    EXACT = True
    IDENTITY = False           # `none`: the raw buffer, no header
    SPARSE = False             # a subset of the values: all-gather them rather than re-compress partial sums
    CAST_TO = None             # torch dtype name of a reducible cast (the ordinary all-reduce runs on it)
    IMPLEMENTATIONS = {}       # backend -> implementation class (set per family by register)

    def __getattr__(self, key):
        params = object.__getattribute__(self, "params")
        if key in params:
            return params[key]
        raise AttributeError(key)

    @classmethod
    def implements(cls, backend: str):
        """Class decorator: register an implementation of this family for ``backend``."""
        def deco(impl):
            cls.IMPLEMENTATIONS[backend] = impl
            return impl
        return deco

    def implementation(self, backend: str):
        """The implementation class for ``backend``; a clear error when there is none."""
        impl = type(self).IMPLEMENTATIONS.get(backend)
        if impl is None:
            have = [name for name, cls in FAMILIES.items() if backend in cls.IMPLEMENTATIONS]
            raise InputError("compressor", self.NAME, f"a family with a {backend} implementation: " + ", ".join(have))
        return impl

    @classmethod
    def examples(cls) -> tuple:
        return cls.EXAMPLES or (cls.NAME,)

    @property
    def reducible(self) -> bool:
        return self.REDUCIBLE

    @property
    def lossless(self) -> bool:
        return self.LOSSLESS

    @property
    def exact(self) -> bool:
        return self.EXACT

    def accepts(self, dtype) -> None:
        """Refuse an input type this family cannot encode (InputError)."""
        _float_input(self.NAME, dtype)

    def layout(self, count: int, dtype) -> Layout:
        raise NotImplementedError

    def ratio_estimate(self) -> float:
        """Compression ratio assumed for a data-dependent output (``ratio`` or the default)."""
        return self.params.get("ratio") or DEFAULT_RATIO[self.NAME]

    def transform(self, stream: Stream) -> tuple[Stream, float]:
        """The model's view of ``layout``: the output stream and metadata bytes."""
        lay = self.layout(stream.count, stream.dtype)
        if lay.dtype is None:
            nbytes = stream.nbytes / self.ratio_estimate()
            return Stream(math.ceil(nbytes), nbytes, None), float(lay.meta_bytes)
        return Stream(lay.count, float(lay.value_bytes), lay.dtype), float(lay.meta_bytes)

    def reduce_parts(self, stream: Stream) -> list[int] | None:
        """Sizes of the ordinary all-reduces that carry a factored payload (None: not factored)."""
        return None

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


@register
class NoneFamily(Family):
    NAME, REDUCIBLE, LOSSLESS, IDENTITY = "none", True, True, True

    def accepts(self, dtype):
        pass

    def layout(self, count, dtype):
        return Layout(count, dtype)

    def compress_traffic(self, stream):
        return 0.0

    def decompress_traffic(self, stream):
        return 0.0


class Cast(Family):
    """fp16 / bf16 / fp8: round to nearest; relative error 2^-(m+1)/sqrt(3) for m mantissa bits.
    A narrower input passes through unchanged (a cast never widens)."""

    CODE = np.dtype(np.float16)

    def _mantissa(self):
        return FP_MANTISSA_BITS[self.params.get("format", self.NAME)]

    def layout(self, count, dtype):
        dtype = np.dtype(dtype)
        return Layout(count, self.CODE if dtype.itemsize > self.CODE.itemsize else dtype)

    def error(self):
        return 2.0 ** -(self._mantissa() + 1) / math.sqrt(3.0)


@register
class Fp16(Cast):
    NAME, REDUCIBLE, CAST_TO = "fp16", True, "float16"


@register
class Bf16(Cast):
    NAME, REDUCIBLE, CAST_TO, CODE = "bf16", True, "bfloat16", np.dtype(np.uint16)


@register
class Fp8(Cast):
    NAME, CODE = "fp8", BYTES
    EXAMPLES = ("fp8", "fp8(format=e5m2)")
    PARAMS = (Param(name="format", kind=str, default="e4m3", check=lambda v: v in ("e4m3", "e5m2"),
                    allowed="e4m3 or e5m2"),)


def _expected_absmax(block: int) -> float:
    """E[max |x|] of ``block`` unit Gaussians, ~sqrt(2 ln 2b) (extreme-value approximation)."""
    return math.sqrt(2.0 * math.log(max(2 * block, 2)))


MAX_BLOCK = 1 << 24   # values per block: beyond it a scale per block saves nothing and buffers grow unbounded


class BlockQuant(Family):
    """Blockwise absmax quantization to ``bits`` (sign included) with one fp32 scale per block:
    packed codes (ceil(n bits / 8) bytes), then one scale per block as metadata.

    Compress reads the input twice (absmax, then quantize); error is uniform over half
    a step: step = absmax / (2^(bits-1) - 1), RMS = step / sqrt(12).
    """

    BITS = 8
    PARAMS = (Param(name="block", kind=int, default=DEFAULT_BLOCK, check=lambda v: _positive_int(v) and v <= MAX_BLOCK,
                    allowed=f"an integer from 1 to {MAX_BLOCK}"),)

    @property
    def bits(self) -> int:
        return self.params.get("bits", self.BITS)

    def layout(self, count, dtype):
        blocks = math.ceil(count / self.block) if count else 0
        return Layout(math.ceil(count * self.bits / 8), BYTES, blocks * SCALE_BYTES)

    def compress_traffic(self, stream):
        return 1.0 + super().compress_traffic(stream)

    def decompress_traffic(self, stream):
        return super().compress_traffic(stream)

    def _levels(self):
        return 2 ** (self.bits - 1) - 1

    def error(self):
        return _expected_absmax(self.block) / self._levels() / math.sqrt(12.0)


@register
class Int8(BlockQuant):
    NAME, BITS = "int8", 8
    EXAMPLES = ("int8", "int8(block=100)")


@register
class Int4(BlockQuant):
    NAME, BITS = "int4", 4
    EXAMPLES = ("int4", "int4(block=7)")


@register
class Qsgd(BlockQuant):
    """QSGD (Alistarh et al., NeurIPS 2017) per block: ``bits`` per value including sign,
    stochastic rounding (unbiased, error variance step^2/6 on average) or nearest."""

    NAME = "qsgd"
    EXAMPLES = ("qsgd(bits=4)", "qsgd(bits=3,stochastic=false)")
    PARAMS = (Param(name="bits", kind=int, default=4, check=lambda v: _positive_int(v) and 2 <= v <= 8,
                    allowed="an integer from 2 to 8"),
              Param(name="stochastic", kind=bool, default=True, check=lambda v: isinstance(v, bool),
                    allowed="true or false"),
              BlockQuant.PARAMS[0])

    def error(self):
        spread = math.sqrt(6.0) if self.stochastic else math.sqrt(12.0)
        return _expected_absmax(self.block) / self._levels() / spread


@register
class Sign(BlockQuant):
    """signSGD with a per-block scale (mean |x|, as in EF-signSGD): 1 bit per value.
    Relative error for Gaussian data: sqrt(1 - (E|x|)^2 / E[x^2]) = sqrt(1 - 2/pi)."""

    NAME, BITS = "sign", 1
    EXAMPLES = ("sign", "sign(block=64)")

    def error(self):
        return math.sqrt(1.0 - 2.0 / math.pi)


@register
class TopK(Family):
    """Keep the ``density`` fraction of largest magnitudes: values plus int32 indices, or a
    bitmap when that is smaller (density > 1/32). Selection is a radix select, 4 passes
    over float32 (Alabi et al., 'Fast k-selection algorithms for GPUs', JEA 2012)."""

    NAME, SPARSE = "topk", True
    EXAMPLES = ("topk(0.01)", "topk(0.5)")
    SELECT_PASSES = 4.0
    PARAMS = (Param(name="density", kind=float, check=_density, allowed="a fraction in (0, 1]", required=True),)

    def kept(self, count: int) -> int:
        return min(count, math.ceil(self.density * count)) if count else 0

    def index_bitmap(self, count: int) -> bool:
        """Positions travel as a bitmap (ceil(n/8) bytes) rather than int32 indices."""
        return INDEX_BYTES * self.kept(count) > math.ceil(count / 8)

    def layout(self, count, dtype):
        k = self.kept(count)
        return Layout(k, np.dtype(dtype), min(k * INDEX_BYTES, math.ceil(count / 8)))

    def compress_traffic(self, stream):
        return self.SELECT_PASSES + super().compress_traffic(stream) - 1.0

    def decompress_traffic(self, stream):
        out, meta = self.transform(stream)
        return 1.0 + (out.nbytes + meta) / max(stream.nbytes, 1.0)

    def error(self):
        if self.density >= 1:
            return 0.0
        t = _NORMAL.inv_cdf(1.0 - self.density / 2.0)
        kept_energy = self.density + 2.0 * t * _NORMAL.pdf(t)
        return math.sqrt(max(0.0, 1.0 - kept_energy))


@register
class RandK(TopK):
    """Random ``density`` fraction from a seed shared by all ranks: no indices on the wire,
    only the 8-byte step number that, with the seed, draws them."""

    NAME = "randk"
    EXAMPLES = ("randk(0.01)",)
    STEP_BYTES = 8

    def layout(self, count, dtype):
        return Layout(self.kept(count), np.dtype(dtype), self.STEP_BYTES)

    def compress_traffic(self, stream):
        return Family.compress_traffic(self, stream) - 1.0 + self.density

    def error(self):
        return math.sqrt(1.0 - self.density)


MAX_RANK = 4096


@register
class PowerSgd(Family):
    """PowerSGD (Vogels et al., NeurIPS 2019): the buffer as an m x n matrix (m = ceil(sqrt N)
    unless ``rows`` is given), sent as P (m x rank) and Q (n x rank); the factors are summed
    by an ordinary all-reduce. Memory-bound for small rank: M is read twice to compress
    and written once to decompress. Error: i.i.d. data (worst case, real gradients are
    far more compressible): energy of the top ``rank`` singular values, each about
    (sqrt m + sqrt n)^2 (Marchenko-Pastur edge)."""

    NAME, REDUCIBLE = "powersgd", True
    EXAMPLES = ("powersgd(4)", "powersgd(rank=2,rows=10)")
    PARAMS = (Param(name="rank", kind=int, default=4, check=lambda v: _positive_int(v) and v <= MAX_RANK,
                    allowed=f"an integer from 1 to {MAX_RANK}"),
              Param(name="rows", kind=int, default=None, check=lambda v: _positive_int(v) and v <= 1 << 31,
                    allowed="an integer from 1 to 2^31"))

    def shape(self, count: int) -> tuple[int, int]:
        rows = self.rows or max(1, math.ceil(math.sqrt(count)))
        return rows, max(1, math.ceil(count / rows))

    def factor_rank(self, count: int) -> int:
        m, n = self.shape(count)
        return min(self.rank, m, n)

    def layout(self, count, dtype):
        if not count:
            return Layout(0, np.dtype(dtype))
        m, n = self.shape(count)
        return Layout((m + n) * self.factor_rank(count), np.dtype(dtype))

    def reduce_parts(self, stream):
        per = stream.nbytes / max(stream.count, 1)
        m, n = self.shape(stream.count)
        r = self.factor_rank(stream.count)
        return [int(math.ceil(m * r * per)), int(math.ceil(n * r * per))]

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


@register
class Zfp(Family):
    """zfp (Lindstrom 2014). ``rate`` is fixed-rate: exactly ``rate`` bits per value in 1-D
    blocks of 4, padded to 64-bit words. ``tolerance`` / ``precision`` are data-dependent
    (``ratio`` or the default). Equivalent traffic of 8 bytes per input byte is an
    assumption to calibrate. rate <= 2 is refused: zfpy crashes on 1-D input there
    (docs/design.md, measured facts)."""

    NAME = "zfp"
    EXAMPLES = ("zfp(rate=8)", "zfp(rate=3)", "zfp(tolerance=1e-3)", "zfp(precision=12)")
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

    def layout(self, count, dtype):
        if self.mode != "rate":
            return Layout(0, None)
        bits = math.ceil(count / 4) * 4 * self.rate
        return Layout(math.ceil(bits / 64) * 8, BYTES)

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


@register
class Sz3(Family):
    """SZ3 error-bounded (Liang et al., ICDE 2023): ``abs`` or ``rel`` (to the value range)
    bound; size is data-dependent (``ratio`` or the default, measured at abs 1e-4).
    Equivalent traffic of 10 bytes per input byte is an assumption to calibrate."""

    NAME, EXACT = "sz3", False
    EXAMPLES = ("sz3(abs=1e-3)", "sz3(rel=1e-3)")
    TRAFFIC = 10.0
    RANGE_SIGMAS = 10.0   # value range of ~16 M unit Gaussians is about +-5 sigma
    PARAMS = (Param(name="abs", kind=float, check=_positive, allowed="an absolute error bound > 0"),
              Param(name="rel", kind=float, check=lambda v: _positive(v) and v < 1,
                    allowed="a relative error bound in (0, 1)"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    @property
    def mode(self) -> str:
        return _one_of(self.params, ("abs", "rel"), "sz3")

    def layout(self, count, dtype):
        _one_of(self.params, ("abs", "rel"), "sz3")   # exactly one bound
        return Layout(0, None)

    def compress_traffic(self, stream):
        return self.TRAFFIC

    def decompress_traffic(self, stream):
        return self.TRAFFIC

    def error(self):
        bound = self.abs if self.mode == "abs" else self.rel * self.RANGE_SIGMAS
        return bound / math.sqrt(3.0)


def _opaque_layout(self, count, dtype):
    """A lossless codec's output: an opaque blob of data-dependent length, no metadata."""
    return Layout(0, None)


def _fixed_traffic(self, stream):
    """The codec's stated equivalent traffic per input byte (``TRAFFIC``), either direction."""
    return self.TRAFFIC


@register
class Lossless(Family):
    """A lossless byte codec after an optional byte/bit shuffle (stands in for MPC and
    nvCOMP). Data-dependent ratio; equivalent traffic 6 bytes per input byte (assumption).
    Takes any typed input: floats, or the bytes of a quantizer."""

    NAME, LOSSLESS, EXACT = "lossless", True, False
    EXAMPLES = ("lossless", "lossless(codec=lz4,shuffle=bit)", "lossless(shuffle=none)")
    TRAFFIC = 6.0
    PARAMS = (Param(name="codec", kind=str, default="zstd", check=lambda v: v in ("zstd", "lz4"),
                    allowed="zstd or lz4"),
              Param(name="shuffle", kind=str, default="byte", check=lambda v: v in ("byte", "bit", "none"),
                    allowed="byte, bit or none"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    def accepts(self, dtype):
        if dtype is None:
            raise InputError("compressor", self.NAME, "a typed input (an opaque blob of data-dependent length "
                             "cannot be compressed again: zfp accuracy modes and sz3 come last in a chain)")

    layout = _opaque_layout
    compress_traffic = decompress_traffic = _fixed_traffic


@register
class Mpc(Family):
    """MPC (Yang, Mukka, Hesaaraki and Burtscher, IEEE Cluster 2015): the GPU lossless codec of
    the seed paper's MPI library; per chunk, subtract the value ``dim`` back, transpose bit
    planes, subtract the previous plane, drop zero words (realrun.compressors.mpc). Floats only
    (its words are the float's width). Data-dependent ratio; equivalent traffic ``TRAFFIC``
    bytes per input byte (an assumption: one read, one write and the in-register transposition
    of every chunk; calibration replaces it)."""

    NAME, LOSSLESS, EXACT = "mpc", True, False
    EXAMPLES = ("mpc", "mpc(dim=2)", "mpc(ratio=1.3)")
    TRAFFIC = 4.0
    PARAMS = (Param(name="dim", kind=int, default=1, check=lambda v: _positive_int(v) and v <= 32,
                    allowed="the data's dimensionality, an integer from 1 to 32"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    def accepts(self, dtype):
        _float_input(self.NAME, dtype)

    layout = _opaque_layout
    compress_traffic = decompress_traffic = _fixed_traffic


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
    for p in cls.PARAMS:
        if p.required and params[p.name] is None:
            raise InputError(f"{name}.{p.name}", None, "required: " + p.allowed)
    family = cls(params=params)
    family.layout(4, FLOAT_DTYPES[4])  # mode checks (zfp/sz3 need exactly one bound)
    return family
