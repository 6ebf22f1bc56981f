"""The compressor contract: what every family declares, and how the grammar builds one.

A family maps an input *stream* (``count`` values, ``nbytes`` bytes) to an output value
stream plus metadata bytes (scales, indices); chains feed one family's value stream to the
next. A family is the single definition both sides use: its parameters and their
validation (``Param``), its ``layout`` (values out, their dtype, metadata bytes: realrun's
payloads are laid out from it, so the model's wire size *is* the payload size), what it
accepts as input, its traits (``IDENTITY``, ``SPARSE``, ``CAST_TO``, factored
``reduce_parts``), its constants (``DEFAULT_RATIO`` for a data-dependent size, a cast's
mantissa bits, a codec's equivalent ``TRAFFIC``), error and traffic. Implementations
register against the class, per backend (``numpy``: realrun's reference; ``cupy``:
realrun.gpu's kernels), with ``Family.implements(backend)``; ``register`` adds a family to
``FAMILIES`` (the grammar's names). Nothing keys on name strings: the catalogue
(``perfmodel.compression.families``) is classes, each with its own numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from perfmodel.compression.grammar import _fmt
from topologies.errors import InputError

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
    DEFAULT_RATIO = None       # compression ratio assumed for a data-dependent size (None: size is exact)

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
        return self.params.get("ratio") or self.DEFAULT_RATIO

    def with_params(self, **changes) -> Family:
        """This family with some parameters changed, validated as the grammar validates them."""
        given = {**self.params, **changes}
        return make_family(self.NAME, (), tuple((k, v) for k, v in given.items() if v is not None))

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


def _one_of(params: dict, keys: tuple, family: str) -> str:
    given = [k for k in keys if params.get(k) is not None]
    if len(given) != 1:
        raise InputError(family, {k: params.get(k) for k in given} or None,
                         "exactly one of " + ", ".join(keys))
    return given[0]


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


def data_dependent() -> dict[str, float]:
    """{family name: its DEFAULT_RATIO} for every registered family whose size depends on the data."""
    return {name: cls.DEFAULT_RATIO for name, cls in FAMILIES.items() if cls.DEFAULT_RATIO}
