"""``Compressor``: a spec string (perfmodel's grammar) built into stages, with payloads.

    c = Compressor("ef(topk(0.01))+int8", seed=0)
    p = c.compress(x, key="bucket3")      # numpy array or CPU torch tensor -> Payload
    y = c.decompress(p)                   # numpy array, x's shape and dtype

Body layout: every stage's metadata in order, then the last stage's values (raw when the size
is known from the element count, else an 8-byte length and the blob). ``len(payload)`` equals
perfmodel's ``Codec.wire_bytes`` for every fixed-size spec.
"""
from __future__ import annotations

import struct

import numpy as np

from perfmodel.compression import families
from perfmodel.compression.codec import EF as EFNode
from perfmodel.compression.codec import Codec, compile_spec
from perfmodel.compression.families import Family
from realrun.compressors import codecs, stages  # noqa: F401  (codecs registers its implementations)
from realrun.compressors.payload import DTYPES, Header, Payload, seal, spec_digest
from topologies.errors import InputError

LENGTH = struct.Struct("<Q")


class ChainStage(stages.Stage):
    """Stages applied in order; each stage's values feed the next, metadata in order."""

    def __init__(self, parts):
        self.parts = parts

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.parts)

    def _walk(self, n, dtype):
        """(stage, its input count, its input dtype) for every stage."""
        for part in self.parts:
            yield part, n, dtype
            lay = part.layout(n, dtype)
            n, dtype = lay.count, lay.dtype

    def check(self, dtype):
        for part, _, d in self._walk(0, dtype):
            part.check(d)

    def layout(self, n, dtype):
        meta, lay = 0, None
        for part, m, d in self._walk(n, dtype):
            lay = part.layout(m, d)
            meta += lay.meta_bytes
        return families.Layout(lay.count, lay.dtype, meta)

    def encode(self, x, ctx):
        metas = []
        for part in self.parts:
            x, meta = part.encode(x, ctx)
            metas.append(meta)
        return x, b"".join(metas)

    def decode(self, values, meta, n, dtype, ctx):
        steps = list(self._walk(n, dtype))
        offsets = np.cumsum([0] + [p.layout(m, d).meta_bytes for p, m, d in steps])
        out, ctx.out = ctx.out, None   # only the first stage writes the final values
        for i in range(len(steps) - 1, -1, -1):
            part, m, d = steps[i]
            ctx.out = out if i == 0 else None
            values = part.decode(values, meta[offsets[i]:offsets[i + 1]], m, d, ctx)
        return values


class ErrorFeedbackStage(stages.Stage):
    """Adds the residual of the previous call (per key and size) before compressing, and keeps
    the new residual: what compression dropped is sent later instead of lost."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def name(self) -> str:
        return f"ef({self.inner.name})"

    def check(self, dtype):
        self.inner.check(dtype)

    def layout(self, n, dtype):
        return self.inner.layout(n, dtype)

    def encode(self, x, ctx):
        key = ("ef", self.name, ctx.key, x.shape, x.dtype.str)   # stable across processes (checkpoints)
        y = x + ctx.state.get(key, 0)
        values, meta = self.inner.encode(y, ctx)
        ctx.state[key] = y - self.inner.decode(values, meta, len(y), y.dtype, ctx)
        return values, meta

    def decode(self, values, meta, n, dtype, ctx):
        return self.inner.decode(values, meta, n, dtype, ctx)


def build_stage(node, backend: str = "numpy"):
    """The implementation tree of a compiled spec's root (perfmodel's Codec.root)."""
    if isinstance(node, Family):
        return node.implementation(backend)(node)
    if isinstance(node, EFNode):
        return ErrorFeedbackStage(build_stage(node.inner, backend))
    return ChainStage([build_stage(p, backend) for p in node])


def as_array(x) -> np.ndarray:
    """A host numpy view of ``x`` (numpy, or a CPU torch tensor through DLPack: no copy)."""
    if isinstance(x, np.ndarray):
        return x
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        if x.device.type != "cpu":
            raise InputError("device", str(x.device), "cpu: the GPU kernels run on CuPy arrays (realrun.gpu)")
        if str(x.dtype) == "torch.bfloat16":
            raise InputError("dtype", "bfloat16", "float16, float32 or float64 (numpy has no bfloat16)")
        return np.from_dlpack(x.detach())
    if module == "cupy":
        raise InputError("device", "cuda", "cpu for the numpy reference compressors")
    return np.asarray(x)


def _assemble(small: list, values: np.ndarray, out=None):
    """One copy of the values, after the header, metadata and prefix: into ``out`` (a writable
    buffer at least as long; a memoryview of its start is returned) or a new bytearray."""
    head = b"".join(small)
    size = len(head) + values.nbytes
    if out is None:
        buf = bytearray(size)
    else:
        buf = memoryview(out).cast("B")
        if buf.readonly or len(buf) < size:
            raise InputError("out", f"{len(buf)} bytes{' read-only' if buf.readonly else ''}",
                             f"a writable buffer of at least {size} bytes")
        buf = buf[:size]
    body = np.frombuffer(buf, np.uint8)
    body[: len(head)] = np.frombuffer(head, np.uint8)
    if values.nbytes:
        body[len(head):] = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
    return buf


def _check_out(out, shape, dtype) -> np.ndarray:
    if not isinstance(out, np.ndarray) or out.shape != tuple(shape) or out.dtype != dtype \
            or not out.flags.c_contiguous or not out.flags.writeable:
        got = f"{type(out).__name__} {getattr(out, 'shape', '')} {getattr(out, 'dtype', '')}".strip()
        raise InputError("out", got, f"a writable contiguous numpy array of shape {tuple(shape)} and dtype {dtype}")
    return out.reshape(-1)


class Compressor:
    """Compress and decompress with one spec (a string, parsed once here, or a compiled
    ``Codec``); stateful parts (error feedback residuals, PowerSGD warm start, random draws)
    live in ``self.ctx``. Every payload is checked whole before it is decoded (``Header``)."""

    def __init__(self, spec: str | Codec, seed: int = 0):
        codec = spec if isinstance(spec, Codec) else compile_spec(spec)
        self.spec, self.codec = codec.text, codec
        self.root = build_stage(codec.root)
        self.ctx = stages.CompressorState(seed=seed)
        self.digest = spec_digest(self.spec)

    def compress(self, x, key: str = "", out=None) -> Payload:
        """``x`` compressed; with ``out`` (a writable buffer), the payload is written into its
        start and ``Payload.data`` is a view of it (reuse a buffer to skip page faults)."""
        arr = as_array(x)
        if arr.dtype not in DTYPES.values():
            raise InputError("dtype", str(arr.dtype), "float16, float32 or float64")
        flat = np.ascontiguousarray(arr).reshape(-1)
        if self.codec.is_none:
            return Payload(flat.tobytes() if out is None else _assemble([], flat, out))
        self.root.check(flat.dtype)
        self.ctx.key, self.ctx.out = key, None
        values, meta = self.root.encode(flat, self.ctx)
        self.ctx.step += 1
        header = Header(dtype=flat.dtype, shape=tuple(arr.shape) or (1,), digest=self.digest).pack()
        prefix = LENGTH.pack(values.nbytes) if self.root.layout(0, flat.dtype).dtype is None else b""
        buf = _assemble([header, meta, prefix], values, out)
        seal(buf)
        return Payload(buf)

    def decompress(self, payload: Payload, like=None, out=None) -> np.ndarray:
        """The array back; for ``none`` (raw bytes, no header) pass ``like`` (shape and dtype).
        With ``out`` (an array of the original shape and dtype) the values are written there.
        A malformed or corrupted payload is an InputError, before any value is decoded."""
        data = memoryview(payload.data if isinstance(payload, Payload) else payload).cast("B")
        if self.codec.is_none:
            return self._raw(data, like, out)
        header, offset = Header.unpack(data)
        if header.digest != self.digest:
            raise InputError("payload", "spec digest", f"a payload made with {self.spec}")
        n, dtype = header.count, header.dtype
        values, meta = self._split(data, offset, n, dtype)
        self.ctx.out = None if out is None else _check_out(out, header.shape, dtype)
        try:
            decoded = self.root.decode(values, meta, n, dtype, self.ctx)
        finally:
            self.ctx.out = None
        if np.size(decoded) != n:
            raise InputError("payload", f"{np.size(decoded)} decoded values", f"{n} values (header)")
        result = np.asarray(decoded, dtype=dtype).reshape(header.shape)
        if out is not None and not np.shares_memory(result, out):
            out[...] = result
            return out
        return result if out is None else out

    def _raw(self, data, like, out):
        if like is None:
            raise InputError("like", None, "an array of the original shape and dtype for spec none")
        if len(data) != like.nbytes:
            raise InputError("payload", f"{len(data)} bytes", f"{like.nbytes} bytes of raw values (spec none)")
        raw = np.frombuffer(data, dtype=like.dtype).reshape(like.shape)
        if out is None:
            return raw.copy()
        _check_out(out, like.shape, like.dtype)[:] = raw.reshape(-1)
        return out

    def _split(self, data, offset: int, n: int, dtype) -> tuple[np.ndarray, bytes]:
        """(values, metadata) of a payload body, its length checked against the layout."""
        lay = self.root.layout(n, dtype)
        body = len(data) - offset
        meta = bytes(data[offset:offset + lay.meta_bytes])
        if lay.dtype is not None:
            if body != lay.meta_bytes + lay.value_bytes:
                raise InputError("payload", f"{body} body bytes", f"{lay.meta_bytes + lay.value_bytes} bytes "
                                 f"for {n} values under {self.spec}")
            return np.frombuffer(data, lay.dtype, count=lay.count, offset=offset + lay.meta_bytes), meta
        start = offset + lay.meta_bytes + LENGTH.size
        if body < lay.meta_bytes + LENGTH.size or LENGTH.unpack_from(data, start - LENGTH.size)[0] != len(data) - start:
            raise InputError("payload", f"{body} body bytes", f"{lay.meta_bytes} metadata bytes, an 8-byte length "
                             "and that many bytes of encoded values")
        return np.frombuffer(data, np.uint8, offset=start), meta
