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

from perfmodel.compression.codec import EF as EFNode
from perfmodel.compression.codec import compile_spec
from perfmodel.compression.families import Family
from realrun.compressors import codecs, stages
from realrun.compressors.payload import DTYPES, Header, Payload, spec_digest
from topologies.errors import InputError

STAGES = {cls.name: cls for cls in (stages.NoneStage, stages.Fp16, stages.Bf16, stages.Fp8, stages.Int8, stages.Int4,
                                    stages.Qsgd, stages.Sign, stages.TopK, stages.RandK, codecs.PowerSgd, codecs.Zfp,
                                    codecs.Sz3, codecs.Lossless)}
LENGTH = struct.Struct("<Q")


class Chain(stages.Stage):
    name = "chain"

    def __init__(self, parts):
        super().__init__({})
        self.parts = parts

    def _walk(self, n, dtype):
        for part in self.parts:
            yield part, n, dtype
            n, dtype = part.out_count(n), part.out_dtype(dtype)
            dtype = np.dtype(np.uint8) if dtype is None and part is not self.parts[-1] else dtype

    def check(self, dtype):
        for part, _, d in self._walk(0, dtype):
            part.check(d)

    def out_count(self, n):
        for part in self.parts:
            n = part.out_count(n)
        return n

    def out_dtype(self, dtype):
        last, _, last_dtype = list(self._walk(0, dtype))[-1]
        return last.out_dtype(last_dtype)

    def meta_size(self, n, dtype):
        return sum(part.meta_size(m, d) for part, m, d in self._walk(n, dtype))

    def encode(self, x, ctx):
        metas = []
        for part in self.parts:
            x, meta = part.encode(x, ctx)
            metas.append(meta)
        return x, b"".join(metas)

    def decode(self, values, meta, n, dtype, ctx):
        steps = list(self._walk(n, dtype))
        offsets = np.cumsum([0] + [p.meta_size(m, d) for p, m, d in steps])
        out, ctx.out = ctx.out, None   # only the first stage writes the final values
        for i in range(len(steps) - 1, -1, -1):
            part, m, d = steps[i]
            ctx.out = out if i == 0 else None
            values = part.decode(values, meta[offsets[i]:offsets[i + 1]], m, d, ctx)
        return values


class ErrorFeedback(stages.Stage):
    """Adds the residual of the previous call (per key and size) before compressing, and keeps
    the new residual: what compression dropped is sent later instead of lost."""

    name = "ef"

    def __init__(self, inner):
        super().__init__({})
        self.inner = inner

    def check(self, dtype):
        self.inner.check(dtype)

    def out_count(self, n):
        return self.inner.out_count(n)

    def out_dtype(self, dtype):
        return self.inner.out_dtype(dtype)

    def meta_size(self, n, dtype):
        return self.inner.meta_size(n, dtype)

    def encode(self, x, ctx):
        key = ("ef", id(self), ctx.key, x.shape, x.dtype.str)
        y = x + ctx.state.get(key, 0)
        values, meta = self.inner.encode(y, ctx)
        ctx.state[key] = y - self.inner.decode(values, meta, len(y), y.dtype, ctx)
        return values, meta

    def decode(self, values, meta, n, dtype, ctx):
        return self.inner.decode(values, meta, n, dtype, ctx)


def _build(node):
    if isinstance(node, Family):
        return STAGES[node.NAME](node.params)
    if isinstance(node, EFNode):
        return ErrorFeedback(_build(node.inner))
    return Chain([_build(p) for p in node])


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
    """Compress and decompress with one spec; stateful parts (error feedback residuals,
    PowerSGD warm start, random draws) live in ``self.ctx``."""

    def __init__(self, spec: str, seed: int = 0):
        codec = compile_spec(spec)
        self.spec, self.codec = codec.text, codec
        self.root = _build(codec.root)
        self.ctx = stages.Ctx(seed=seed)
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
        prefix = LENGTH.pack(values.nbytes) if self.root.out_dtype(flat.dtype) is None else b""
        return Payload(_assemble([header, meta, prefix], values, out))

    def decompress(self, payload: Payload, like=None, out=None) -> np.ndarray:
        """The array back; for ``none`` (raw bytes, no header) pass ``like`` (shape and dtype).
        With ``out`` (an array of the original shape and dtype) the values are written there."""
        data = memoryview(payload.data if isinstance(payload, Payload) else payload).cast("B")
        if self.codec.is_none:
            if like is None:
                raise InputError("like", None, "an array of the original shape and dtype for spec none")
            raw = np.frombuffer(data, dtype=like.dtype).reshape(like.shape)
            if out is None:
                return raw.copy()
            _check_out(out, like.shape, like.dtype)[:] = raw.reshape(-1)
            return out
        header, offset = Header.unpack(data)
        if header.digest != self.digest:
            raise InputError("payload", "spec digest", f"a payload made with {self.spec}")
        n, dtype = header.count, header.dtype
        self.ctx.out = None if out is None else _check_out(out, header.shape, dtype)
        meta_end = offset + self.root.meta_size(n, dtype)
        meta, rest = bytes(data[offset:meta_end]), data[meta_end:]
        out_dtype = self.root.out_dtype(dtype)
        if out_dtype is None:
            (length,) = LENGTH.unpack_from(rest, 0)
            values = np.frombuffer(rest[8:8 + length], np.uint8)
        else:
            values = np.frombuffer(rest, out_dtype, count=self.root.out_count(n))
        result = np.asarray(self.root.decode(values, meta, n, dtype, self.ctx), dtype=dtype).reshape(header.shape)
        self.ctx.out = None
        if out is not None and not np.shares_memory(result, out):
            out[...] = result
            return out
        return result if out is None else out
