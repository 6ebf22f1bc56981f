"""A compiled compressor spec: what the cost model needs to know about it.

``compile_spec("ef(topk(0.01))+int8")`` returns a ``Codec`` that answers, for a
message of ``count`` values of ``dtype_bytes`` each: wire bytes, memory traffic of
compress and decompress kernels, whether payloads can be summed without decoding,
whether it is lossless, whether its size is exact, and the relative error of one
application. Chains feed each transform's value stream to the next transform; metadata
(indices, scales) passes through. Error feedback (``ef``) keeps a residual: the same
wire size, a little more traffic, and the same per-step error, compensated over steps.

The residual's options (``EF``) are LoCo's (Xie et al. 2024, arXiv 2407.04480, as DeepSpeed runs it:
``deepspeed/runtime/comm/coalesced_collectives.py`` ``all_to_all_loco_quant_reduce``, its kernel
``csrc/quantization/swizzled_quantize.cu``): ``beta`` keeps a moving average of the errors,
``e <- beta e + (1 - beta) (y - C(y))`` (DeepSpeed's ``err_beta``, 0.8 in its docs; 0: plain error
feedback), ``state=int8`` stores it blockwise in 8 bits between steps (4x less memory than fp32),
and ``reset`` restarts it at zero every that many calls (DeepSpeed's ``reset_T``, 1024; 0: never).
The model charges them nothing apart: the same traffic and per-step error as plain error feedback.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

from perfmodel.compression.families import FLOAT_DTYPES, Family, Stream, make_family, message_dtype
from perfmodel.compression.grammar import Call, Chain, ErrorFeedback, parse_spec
from topologies.errors import InputError

EF_TRAFFIC = 4.0   # read residual, write x + e; read x', write new residual (bytes per input byte)
HEADER_FIXED_BYTES = 32   # payload header: magic, version, dtype, ndim, count, spec digest, body checksum
LENGTH_BYTES = 8          # length prefix of a data-dependent transform's output inside a payload


def header_bytes(ndim: int = 1) -> int:
    """Bytes of a payload header (realrun.compressors.payload): 32 fixed + 8 per dim of shape."""
    return HEADER_FIXED_BYTES + 8 * ndim


@dataclass(frozen=True, kw_only=True)
class Applied:
    values: Stream
    meta_bytes: float
    compress_bytes: float       # device memory traffic, bytes
    decompress_bytes: float


def _apply(node, stream: Stream, kernels=None) -> Applied:
    """``node`` applied to ``stream``; ``kernels`` (a ``DeviceKernels``, or None) prices a family's kernels
    from a published measurement where it has one (``perfmodel.compression.kernels``)."""
    if isinstance(node, Family):
        node.accepts(stream.dtype)
        out, meta = node.transform(stream)
        comp, decomp = node.compress_traffic(stream), node.decompress_traffic(stream)
        if kernels is not None:
            comp, decomp = kernels.traffic(node, "compress", comp), kernels.traffic(node, "decompress", decomp)
        return Applied(values=out, meta_bytes=meta, compress_bytes=comp * stream.nbytes,
                       decompress_bytes=decomp * stream.nbytes)
    if isinstance(node, EF):
        inner = _apply(node.inner, stream, kernels)
        extra = EF_TRAFFIC * stream.nbytes + inner.decompress_bytes
        return Applied(values=inner.values, meta_bytes=inner.meta_bytes,
                       compress_bytes=inner.compress_bytes + extra,
                       decompress_bytes=inner.decompress_bytes)
    meta = comp = decomp = 0.0
    for part in node:
        step = _apply(part, stream, kernels)
        stream, meta = step.values, meta + step.meta_bytes
        comp, decomp = comp + step.compress_bytes, decomp + step.decompress_bytes
    return Applied(values=stream, meta_bytes=meta, compress_bytes=comp, decompress_bytes=decomp)


EF_STATES = ("full", "int8")   # the residual kept in the compute dtype (float32), or blockwise int8 (LoCo)


@dataclass(frozen=True)
class EF:
    """Error feedback around ``inner``, with its residual's options (module doc)."""

    inner: object
    beta: float = 0.0
    state: str = "full"
    reset: int = 0

    def options(self) -> str:
        """The options that differ from plain error feedback, as spec text (``,beta=0.8,...``)."""
        out = [f"beta={self.beta:g}" if self.beta else "", f"state={self.state}" if self.state != "full" else "",
               f"reset={self.reset}" if self.reset else ""]
        return "".join("," + o for o in out if o)


def _ef_options(text: str, kwargs: tuple) -> dict:
    """``ef(...)``'s keyword options checked: beta in [0, 1), state in EF_STATES, reset >= 0."""
    out = {}
    for key, value in kwargs:
        if key in out:
            raise InputError(f"ef.{key}", value, "each option once")
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if key == "beta" and number and 0 <= value < 1:
            out[key] = float(value)
        elif (key == "state" and value in EF_STATES) or \
                (key == "reset" and number and isinstance(value, int) and 0 <= value <= 1 << 31):
            out[key] = value
        else:
            allowed = {"beta": "a moving-average weight in [0, 1)", "state": " or ".join(EF_STATES),
                       "reset": "an integer number of calls >= 0 (0: never)"}
            raise InputError(f"ef.{key}", value, allowed.get(key, "ef options: beta, state, reset"))
    return out


def _leaves(node):
    if isinstance(node, Family):
        yield node
    elif isinstance(node, EF):
        yield from _leaves(node.inner)
    else:
        for part in node:
            yield from _leaves(part)


def _build(tree):
    if isinstance(tree, Call):
        return make_family(tree.name, tree.args, tree.kwargs)
    if isinstance(tree, ErrorFeedback):
        return EF(_build(tree.inner), **_ef_options(str(tree), tree.kwargs))
    if isinstance(tree, Chain):
        return tuple(_build(p) for p in tree.parts)
    raise TypeError(tree)


def _map(node, fn):
    """The tree with every family replaced by ``fn(family)``."""
    if isinstance(node, Family):
        return fn(node)
    if isinstance(node, EF):
        return replace(node, inner=_map(node.inner, fn))
    return tuple(_map(p, fn) for p in node)


def _text(node) -> str:
    if isinstance(node, Family):
        return str(node)
    if isinstance(node, EF):
        return f"ef({_text(node.inner)}{node.options()})"
    return "+".join(_text(p) for p in node)


@dataclass(frozen=True, kw_only=True, eq=False)
class Codec:
    """A compressor spec compiled for the cost model (see module doc). Parsed once at the edge
    and carried as it is; equal (and hashed) by its canonical text, so it keys caches. ``kernels``
    (``on(device)``) prices its kernels from the published measurements that apply on one device;
    None: the traffic model everywhere."""

    text: str
    root: object
    kernels: object = None

    def __eq__(self, other) -> bool:
        return isinstance(other, Codec) and other.text == self.text and other.kernels == self.kernels

    def __hash__(self) -> int:
        return hash(self.text)

    @cached_property
    def families(self) -> tuple[Family, ...]:
        return tuple(_leaves(self.root))

    @cached_property
    def is_none(self) -> bool:
        return all(f.IDENTITY for f in self.families)

    @cached_property
    def reducible(self) -> bool:
        """Payloads can be summed as they are (none, fp16, bf16, powersgd factors)."""
        return all(f.reducible for f in self.families) and sum(
            f.reduce_parts(Stream(1, 4.0, FLOAT_DTYPES[4])) is not None for f in self.families) <= 1

    @cached_property
    def sparse(self) -> bool:
        """Some transform keeps a subset of the values (top-k, rand-k)."""
        return any(f.SPARSE for f in self.families)

    @cached_property
    def factored(self) -> bool:
        """Some transform sends factors that an ordinary all-reduce sums (PowerSGD)."""
        return any(f.reduce_parts(Stream(1, 4.0, FLOAT_DTYPES[4])) is not None for f in self.families)

    @cached_property
    def cast_to(self) -> str | None:
        """torch dtype name when the spec is one reducible cast (fp16, bf16), else None."""
        fams = self.families
        return fams[0].CAST_TO if len(fams) == 1 else None

    @property
    def lossless(self) -> bool:
        return all(f.lossless for f in self.families)

    @cached_property
    def exact(self) -> bool:
        """Wire size is a deterministic function of the message size."""
        return all(f.exact for f in self.families)

    @property
    def error_feedback(self) -> bool:
        return "ef(" in self.text

    def with_ratios(self, ratios: dict) -> Codec:
        """This codec with ``ratios`` ({family name: measured ratio}) on every data-dependent transform
        that does not give its own (calibration transforms the compiled codec; nothing is re-parsed)."""
        def calibrated(f: Family) -> Family:
            if f.NAME in ratios and f.DEFAULT_RATIO and f.params.get("ratio") is None:
                return f.with_params(ratio=ratios[f.NAME])
            return f
        if not any(f.NAME in ratios for f in self.families):
            return self
        root = _map(self.root, calibrated)
        return Codec(text=_text(root), root=root, kernels=self.kernels)

    def on(self, device) -> Codec:
        """This codec with its kernels priced for ``device`` (a ``perfmodel.devices.Device``): a published
        measurement of the device's GPU, or of its architecture scaled by streaming bandwidth, replaces a
        family's traffic model (catalog/codec_kernels.toml); itself where none applies."""
        from perfmodel.compression.kernels import device_kernels

        kernels = device_kernels(device)
        return self if kernels == self.kernels else replace(self, kernels=kernels)

    def apply(self, count: int, dtype_bytes: int) -> Applied:
        return _apply(self.root, Stream(count, float(count * dtype_bytes), message_dtype(dtype_bytes)), self.kernels)

    def wire_bytes(self, count: int, dtype_bytes: int, ndim: int = 1) -> int:
        """Bytes of the payload for ``count`` values: header plus body, exact for exact specs
        (the realrun payload has this length, a contract test checks it), estimated from a
        ratio otherwise (a data-dependent output also carries an 8-byte length prefix)."""
        if self.is_none:
            return count * dtype_bytes
        return self.payload_bytes(self.apply(count, dtype_bytes), ndim)

    def payload_bytes(self, out: Applied, ndim: int = 1) -> int:
        """Payload length for an already applied message (see ``wire_bytes``)."""
        prefixes = 0 if self.exact else LENGTH_BYTES   # a data-dependent output is one length-prefixed blob
        return header_bytes(ndim) + prefixes + int(math.ceil(out.values.nbytes + out.meta_bytes))

    def reduce_parts(self, count: int, dtype_bytes: int) -> list[int]:
        """Sizes of the all-reduces that carry a reducible payload (PowerSGD: P, then Q)."""
        stream = Stream(count, float(count * dtype_bytes), message_dtype(dtype_bytes))
        for f in self.families:
            parts = f.reduce_parts(stream)
            if parts is not None:
                return parts
        return [self.wire_bytes(count, dtype_bytes)]

    @cached_property
    def error(self) -> float:
        """Relative RMS error of one application (unit-Gaussian data); transforms add in quadrature."""
        return math.sqrt(sum(f.error() ** 2 for f in self.families))

    def __str__(self) -> str:
        return self.text


@lru_cache(maxsize=1024)
def compile_spec(text: str) -> Codec:
    """Parse, validate and compile one compressor spec string. Cached."""
    root = _build(parse_spec(text))
    codec = Codec(text=_text(root), root=root)
    codec.apply(4, 4)   # the chain's input types: each transform accepts what the one before makes
    return codec
