"""``Compressor``: a spec string (perfmodel's grammar) built into transforms, with payloads.

    c = Compressor("ef(topk(0.01))+int8", seed=0)
    p = c.compress(x, key="bucket3")      # numpy array or CPU torch tensor -> Payload
    y = c.decompress(p)                   # numpy array, x's shape and dtype

Body layout: every transform's metadata in order, then the last transform's values (raw when the size
is known from the element count, else an 8-byte length and the blob). ``len(payload)`` equals
perfmodel's ``Codec.wire_bytes`` for every fixed-size spec.

Chains, error feedback, the header, the checksum and the checks before decoding are written
once here, for any array backend (``backends``): ``Compressor`` takes host arrays and makes
``Payload`` bytes; ``realrun.gpu.GpuCompressor`` is the same class with device edges (CuPy
arrays in, a device uint8 array out).
"""
from __future__ import annotations

import struct

import numpy as np

from perfmodel.compression import families
from perfmodel.compression.codec import EF as EFNode
from perfmodel.compression.codec import Codec, compile_spec, header_bytes
from perfmodel.compression.families import Family
from realrun.compressors import backends, dtypes, external, transforms  # noqa: F401  (external registers its implementations)
from realrun.compressors.payload import MAX_NDIM, PAYLOAD_DTYPES, Header, Payload, seal, spec_digest
from topologies.errors import InputError

LENGTH = struct.Struct("<Q")


class ChainTransform(transforms.Transform):
    """Transforms applied in order; each transform's values feed the next, metadata in order."""

    def __init__(self, parts):
        self.parts = parts

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.parts)

    def _walk(self, n, dtype):
        """(transform, its input count, its input dtype) for every transform."""
        for part in self.parts:
            yield part, n, dtype
            lay = part.layout(n, dtype)
            n, dtype = lay.count, lay.dtype

    def check(self, dtype):
        for part, _, d in self._walk(0, dtype):
            part.check(d)

    def leaves(self, dtype):
        for part, _, d in self._walk(0, dtype):
            yield from part.leaves(d)

    def layout(self, n, dtype):
        meta, lay = 0, None
        for part, m, d in self._walk(n, dtype):
            lay = part.layout(m, d)
            meta += lay.meta_bytes
        return families.Layout(lay.count, lay.dtype, meta)

    def encode(self, x, ctx):
        be, metas = backends.of(x), []
        for part in self.parts:
            x, meta = part.encode(x, ctx)
            metas.append(meta)
        return x, be.join(metas)

    def decode(self, values, meta, n, dtype, ctx):
        steps = list(self._walk(n, dtype))
        offsets = np.cumsum([0] + [p.layout(m, d).meta_bytes for p, m, d in steps])
        out, ctx.out = ctx.out, None   # only the first transform writes the final values
        for i in range(len(steps) - 1, -1, -1):
            part, m, d = steps[i]
            ctx.out = out if i == 0 else None
            values = part.decode(values, meta[offsets[i]:offsets[i + 1]], m, d, ctx)
        return values


class ErrorFeedbackTransform(transforms.Transform):
    """Adds the residual of the previous call (per key and size) before compressing, and keeps
    the new residual: what compression dropped is sent later instead of lost. The residual is
    kept in ``dtypes.compute_dtype``: float32 for bf16, fp16 and fp8 tensors (the sum is formed
    in float32 and rounded to the tensor's dtype before compression; that rounding is part of the
    residual too), the tensor's own dtype for float32 and float64.

    LoCo's options (``perfmodel.compression.codec.EF``): ``beta`` keeps a moving average of the
    errors instead (``e <- beta e + (1 - beta) (y - C(y))``), ``state=int8`` stores it between calls
    as blockwise int8 codes and one float32 scale per ``STATE_BLOCK`` values (absmax, DeepSpeed's
    symmetric 8-bit quantizer), and ``reset`` restarts it at zero every that many calls of the key."""

    STATE_BLOCK = 256

    def __init__(self, inner, beta: float = 0.0, state: str = "full", reset: int = 0):
        self.inner, self.beta, self.state, self.reset = inner, beta, state, reset

    @property
    def name(self) -> str:
        opts = "".join(f",{k}={v:g}" if isinstance(v, float) else f",{k}={v}"
                       for k, v, plain in (("beta", self.beta, 0.0), ("state", self.state, "full"),
                                           ("reset", self.reset, 0)) if v != plain)
        return f"ef({self.inner.name}{opts})"

    def check(self, dtype):
        self.inner.check(dtype)

    def leaves(self, dtype):
        yield from self.inner.leaves(dtype)

    def layout(self, n, dtype):
        return self.inner.layout(n, dtype)

    def encode(self, x, ctx):
        key = ("ef", self.name, ctx.key, x.shape, _dtype_tag(x.dtype))   # stable across processes (checkpoints)
        be = backends.of(x)
        wide = be.widen(x)   # narrow types: the sum is formed in float32, the residual kept in it
        old = self._load(ctx, key, wide, be.xp)
        total = wide + old
        y = total if wide is x else be.narrow(total, x.dtype)
        values, meta = self.inner.encode(y, ctx)
        decoded = self.inner.decode(values, meta, len(y), y.dtype, ctx)
        with np.errstate(invalid="ignore"):   # Inf input: Inf - Inf is NaN in the residual, as in the sum
            residual = total - be.widen(decoded)
        if ctx.ef_energy is not None:   # the contraction measured: ||C(y) - y||^2 / ||y||^2
            ctx.ef_energy[0] += _energy(residual)
            ctx.ef_energy[1] += _energy(total)
        if self.beta:
            residual = self.beta * old + (1.0 - self.beta) * residual
        self._store(ctx, key, residual, be.xp)
        return values, meta

    def _load(self, ctx, key, like, xp):
        """The residual kept for ``key`` (0 at first, after a reset, or ``reset`` calls on)."""
        if self.reset:
            calls = int(ctx.state.get(key + ("calls",), np.zeros(1, np.int64))[0])
            ctx.state[key + ("calls",)] = np.array([calls + 1], np.int64)
            if calls % self.reset == 0:
                return 0
        if self.state == "int8":
            codes = ctx.state.get(key + ("codes",))
            if codes is None:
                return 0
            scales = ctx.state[key + ("scales",)]
            return (codes.reshape(-1, self.STATE_BLOCK).astype(like.dtype) * scales[:, None]).reshape(-1)[
                :like.size].reshape(like.shape)
        return ctx.state.get(key, 0)

    def _store(self, ctx, key, residual, xp) -> None:
        """The residual kept: as it is, or (``state=int8``) blockwise absmax int8 codes and scales,
        on the residual's device (``xp``: numpy or CuPy)."""
        if self.state != "int8":
            ctx.state[key] = residual
            return
        flat = residual.reshape(-1).astype(xp.float32)
        pad = (-flat.size) % self.STATE_BLOCK
        blocks = xp.concatenate([flat, xp.zeros(pad, xp.float32)]).reshape(-1, self.STATE_BLOCK)
        with np.errstate(invalid="ignore"):   # a NaN or Inf residual (Inf input) keeps no meaning in 8 bits
            scales = xp.abs(blocks).max(axis=1) / 127.0
            safe = xp.where(scales > 0, scales, 1.0)
            codes = xp.clip(xp.rint(blocks / safe[:, None]), -127, 127).astype(xp.int8)
        ctx.state[key + ("codes",)] = codes
        ctx.state[key + ("scales",)] = scales.astype(xp.float32)

    def decode(self, values, meta, n, dtype, ctx):
        return self.inner.decode(values, meta, n, dtype, ctx)


def _dtype_tag(dtype) -> str:
    """A dtype's name in state keys: numpy's type string (``<f4``), or the name of an ml_dtypes
    type (whose type string, ``<V2``, names no float)."""
    d = np.dtype(dtype)
    return d.name if d in dtypes.EXTENSION else d.str


def _energy(x: np.ndarray) -> float:
    """``||x||^2`` by BLAS in the array's own precision (blocked sums: about 1e-6 relative in
    float32, what a ratio of energies needs; float64 einsum ran 8x slower, 3.4 GB/s), in float64
    where that overflows (values near float32's largest)."""
    flat = x.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        energy = float(flat @ flat)
    if not np.isfinite(energy) and np.isfinite(flat).all():
        energy = float(np.einsum("i,i->", flat, flat, dtype=np.float64))
    return energy


def build_transform(node, backend: str = "numpy"):
    """The implementation tree of a compiled spec's root (perfmodel's Codec.root), every family
    from its implementation registered for ``backend`` (a clear error where there is none)."""
    if isinstance(node, Family):
        return node.implementation(backend)(node)
    if isinstance(node, EFNode):
        return ErrorFeedbackTransform(build_transform(node.inner, backend), node.beta, node.state, node.reset)
    return ChainTransform([build_transform(p, backend) for p in node])


def as_array(x) -> np.ndarray:
    """A host numpy view of ``x`` (numpy, or a CPU torch tensor through DLPack: no copy)."""
    if isinstance(x, np.ndarray):
        return x
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        if x.device.type != "cpu":
            raise InputError("device", str(x.device), "cpu: the GPU kernels run on CuPy arrays (realrun.gpu)")
        return dtypes.to_numpy(x)   # bf16 and fp8 as ml_dtypes arrays over the tensor's bytes
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
    live in ``self.ctx``. Every payload is checked whole before it is decoded (``Header``).
    ``BACKEND`` names the implementations built (perfmodel's registry key): ``numpy`` here,
    for host arrays; the transforms pick numba or the reference by themselves."""

    BACKEND = "numpy"

    def __init__(self, spec: str | Codec, seed: int = 0):
        codec = spec if isinstance(spec, Codec) else compile_spec(spec)
        self.spec, self.codec = codec.text, codec
        self.root = build_transform(codec.root, self.BACKEND)
        self.ctx = transforms.CompressorState(seed=seed)
        self.digest = spec_digest(self.spec)

    def compress(self, x, key: str = "", out=None) -> Payload:
        """``x`` compressed; with ``out`` (a writable buffer), the payload is written into its
        start and ``Payload.data`` is a view of it (reuse a buffer to skip page faults)."""
        arr = as_array(x)
        if arr.dtype not in PAYLOAD_DTYPES.values():
            dtypes.need(arr.dtype)
        flat = np.ascontiguousarray(arr).reshape(-1)
        if self.codec.is_none:
            return Payload(flat.tobytes() if out is None else _assemble([], flat, out))
        header, meta, prefix, values = self._encode(flat, arr.shape, key)
        buf = _assemble([header.pack(), meta, prefix], values, out)
        seal(buf)
        return Payload(buf)

    def _encode(self, flat, shape, key: str):
        """(header without its checksum, metadata, length prefix, values) of a flat array of
        any backend: the transforms run, the call is counted."""
        self.root.check(flat.dtype)
        self.ctx.key, self.ctx.out = key, None
        values, meta = self.root.encode(flat, self.ctx)
        self.ctx.step += 1
        header = Header(dtype=flat.dtype, shape=tuple(shape) or (1,), digest=self.digest)
        prefix = LENGTH.pack(values.nbytes) if self.root.layout(0, flat.dtype).dtype is None else b""
        return header, meta, prefix, values

    def decompress(self, payload: Payload, like=None, out=None) -> np.ndarray:
        """The array back; for ``none`` (raw bytes, no header) pass ``like`` (shape and dtype).
        With ``out`` (an array of the original shape and dtype) the values are written there.
        A malformed or corrupted payload is an InputError, before any value is decoded."""
        data = memoryview(payload.data if isinstance(payload, Payload) else payload).cast("B")
        if self.codec.is_none:
            return self._raw(data, like, out)
        header, values, meta = self._parse(np.frombuffer(data, np.uint8))
        decoded = self._decode(header, values, meta, None if out is None else _check_out(out, header.shape,
                                                                                          header.dtype))
        result = np.asarray(decoded, dtype=header.dtype).reshape(header.shape)
        if out is not None and not np.shares_memory(result, out):
            out[...] = result
            return out
        return result if out is None else out

    def _parse(self, data):
        """(header, values, metadata) of a payload, a uint8 array of any backend: the header's
        fields, the body's checksum, the spec digest and the body's length are checked first."""
        be = backends.of(data)
        header, offset = Header.unpack(be.to_host(data[:header_bytes(MAX_NDIM)]), verify=False)
        body = data[offset:]
        header.verify(body)
        if header.digest != self.digest:
            raise InputError("payload", "spec digest", f"a payload made with {self.spec}")
        try:
            self.root.check(header.dtype)
        except InputError as err:
            raise InputError("payload.dtype", str(header.dtype), f"a dtype {self.spec} encodes ({err})") from None
        values, meta = self._split(body, header.count, header.dtype, be)
        return header, values, meta

    def _decode(self, header, values, meta, out):
        """The flat decoded values (into ``out`` where given, a flat array of the right size)."""
        self.ctx.out = out
        try:
            decoded = self.root.decode(values, meta, header.count, header.dtype, self.ctx)
        finally:
            self.ctx.out = None
        if np.size(decoded) != header.count:
            raise InputError("payload", f"{np.size(decoded)} decoded values", f"{header.count} values (header)")
        return decoded

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

    def _split(self, body, n: int, dtype, be) -> tuple:
        """(values, metadata) of a payload body (a uint8 array), its length checked against the layout."""
        lay = self.root.layout(n, dtype)
        meta = be.meta(body[:lay.meta_bytes])
        if lay.dtype is not None:
            if len(body) != lay.meta_bytes + lay.value_bytes:
                raise InputError("payload", f"{len(body)} body bytes", f"{lay.meta_bytes + lay.value_bytes} bytes "
                                 f"for {n} values under {self.spec}")
            return be.view(body[lay.meta_bytes:], lay.dtype), meta
        start = lay.meta_bytes + LENGTH.size
        if len(body) < start or LENGTH.unpack(bytes(be.to_host(body[start - LENGTH.size:start])))[0] != \
                len(body) - start:
            raise InputError("payload", f"{len(body)} body bytes", f"{lay.meta_bytes} metadata bytes, an 8-byte length "
                             "and that many bytes of encoded values")
        return body[start:], meta
