"""GPU compressors: CuPy RawKernels (kernels.cu) for the hot paths, byte-identical payloads.

``GpuCompressor(spec)`` takes CuPy arrays or CUDA torch tensors (through DLPack, no copy) and
produces the same payload bytes as the numpy reference (``realrun.compressors``), on the
device. Specs with a GPU path are the families with a ``cupy`` implementation registered
here (``gpu_families()``: none, fp16, fp8, int8, int4, sign, topk); any other spec is a
clear error, never a silent copy to the host. CuPy is imported on first use
(the ``gpu`` extra); on machines without it the CUDA source still compiles under nvcc in a
test, and ``scripts/gpu_check.sh`` runs everything on a GPU.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from perfmodel.compression import families
from perfmodel.compression.codec import Codec, compile_spec, header_bytes
from realrun.compressors.payload import MAX_NDIM, Header, checksum, spec_digest
from topologies.errors import InputError

SOURCE = Path(__file__).with_name("kernels.cu")
THREADS = 256


def kernel_source() -> str:
    return SOURCE.read_text()


def _cupy():
    try:
        import cupy
    except ImportError:
        raise InputError("device", "cuda", "CuPy installed (pip install 'commpress[gpu]')") from None
    return cupy


@lru_cache(maxsize=1)
def module():
    """The compiled RawModule (compiled once per process by NVRTC)."""
    return _cupy().RawModule(code=kernel_source(), options=("--std=c++17",))


def array_module(x):
    """numpy, or CuPy for a CuPy array (so the collectives are written once for both)."""
    return _cupy() if type(x).__module__.split(".")[0] == "cupy" else np


def from_tensor(t):
    """A CuPy view of a CUDA tensor (DLPack, no copy)."""
    return _cupy().from_dlpack(t)


def synchronize() -> None:
    """Wait for the current stream (GPU kernels run asynchronously)."""
    _cupy().cuda.get_current_stream().synchronize()


def as_device_array(x):
    cp = _cupy()
    if type(x).__module__.split(".")[0] == "torch":
        if x.device.type != "cuda":
            raise InputError("device", str(x.device), "cuda for GpuCompressor (CPU tensors: Compressor)")
        return cp.from_dlpack(x.detach())
    return cp.asarray(x)


class GpuCompressor:
    """One spec on the GPU: a single family with a ``cupy`` implementation (registered
    below against its perfmodel family); anything else is refused, never run on the host."""

    def __init__(self, spec):
        codec = spec if isinstance(spec, Codec) else compile_spec(spec)
        self.spec, self.codec = codec.text, codec
        if len(codec.families) != 1 or codec.error_feedback:
            raise InputError("compressor", self.spec, "one of " + ", ".join(gpu_families()) + " on the GPU")
        self.family = codec.families[0]
        self.kernels = self.family.implementation("cupy")(self.family)
        self.digest = spec_digest(self.spec)

    def compress(self, x):
        """A device uint8 array holding the payload (``cupy.asnumpy(...)`` gives its bytes)."""
        cp = _cupy()
        arr = as_device_array(x)
        if arr.dtype != cp.float32:
            raise InputError("dtype", str(arr.dtype), "float32 on the GPU")
        flat = cp.ascontiguousarray(arr).reshape(-1)
        if self.family.IDENTITY:
            return flat.view(cp.uint8)
        parts = self.kernels.encode(flat)
        body = cp.concatenate([p.view(cp.uint8) for p in parts]) if parts else cp.zeros(0, cp.uint8)
        header = Header(dtype=np.dtype(np.float32), shape=tuple(arr.shape) or (1,), digest=self.digest,
                        checksum=checksum(body, cp)).pack()
        return cp.concatenate([cp.asarray(np.frombuffer(header, np.uint8)), body])

    def decompress(self, payload, like=None):
        cp = _cupy()
        data = cp.asarray(payload).view(cp.uint8)
        if self.family.IDENTITY:
            return data.view(cp.float32).reshape(like.shape if like is not None else (-1,))
        host = cp.asnumpy(data[:header_bytes(MAX_NDIM)]).tobytes()
        header, offset = Header.unpack(host, verify=False)
        if header.digest != self.digest:
            raise InputError("payload", "spec digest", f"a payload made with {self.spec}")
        body = data[offset:]
        if checksum(body, cp) != header.checksum:
            raise InputError("payload.checksum", f"{header.checksum:#010x}", "the checksum of the body")
        lay = self.family.layout(header.count, np.dtype(np.float32))
        if body.size != lay.meta_bytes + lay.value_bytes:
            raise InputError("payload", f"{body.size} body bytes", f"{lay.meta_bytes + lay.value_bytes} bytes")
        return self.kernels.decode(body, header.count).reshape(header.shape)


def gpu_families() -> tuple[str, ...]:
    """Names of the families with a GPU implementation."""
    return tuple(name for name, cls in families.FAMILIES.items() if "cupy" in cls.IMPLEMENTATIONS)


def _grid(n):
    return (max(1, math.ceil(n / THREADS)),), (THREADS,)


class _Kernels:
    """A family's CuPy kernels: ``encode(x) -> [device arrays of the body, in order]`` and
    ``decode(body, n) -> float32 array``, laid out as the family's ``layout``."""

    def __init__(self, family):
        self.family = family
        self.params = family.params


@families.Fp16.implements("cupy")
class _Fp16(_Kernels):
    def encode(self, x):
        return [x.astype(_cupy().float16)]

    def decode(self, body, n):
        return body.view(_cupy().float16)[:n].astype(_cupy().float32)


@families.Fp8.implements("cupy")
class _Fp8(_Kernels):
    def _e5m2(self):
        return 1 if self.params["format"] == "e5m2" else 0

    def encode(self, x):
        cp = _cupy()
        out = cp.empty(len(x), cp.uint8)
        module().get_function("to_fp8")(*_grid(len(x)), (x, out, np.int64(len(x)), np.int32(self._e5m2())))
        return [out]

    def decode(self, body, n):
        cp = _cupy()
        y = cp.empty(n, cp.float32)
        module().get_function("from_fp8")(*_grid(n), (body[:n], y, np.int64(n), np.int32(self._e5m2())))
        return y


class _BlockQuant(_Kernels):
    """int8 / int4 codes and fp32 scales; a block never shares a byte with the next (int4: even blocks)."""

    MULTIPLE = 1

    def __init__(self, family):
        super().__init__(family)
        if family.params["block"] % self.MULTIPLE:
            raise InputError(f"{family.NAME}.block", family.params["block"],
                             f"a multiple of {self.MULTIPLE} on the GPU: a byte never spans two blocks")

    def encode(self, x):
        cp = _cupy()
        n, block, bits = len(x), self.params["block"], self.family.bits
        lay = self.family.layout(n, np.float32)
        codes, scales = cp.zeros(lay.count, cp.uint8), cp.empty(lay.meta_bytes // 4, cp.float32)
        if n:
            module().get_function("quantize_absmax")((len(scales),), (THREADS,), (x, codes, scales, np.int64(n),
                                                                                  np.int32(block), np.int32(bits)))
        return [scales, codes]

    def decode(self, body, n):
        cp = _cupy()
        lay = self.family.layout(n, np.float32)
        scales = body[: lay.meta_bytes].view(cp.float32)
        codes = body[lay.meta_bytes: lay.meta_bytes + lay.count]
        y = cp.empty(n, cp.float32)
        if n:
            module().get_function("dequantize_absmax")(*_grid(n), (codes, scales, y, np.int64(n),
                                                                    np.int32(self.params["block"]),
                                                                    np.int32(self.family.bits)))
        return y


@families.Int8.implements("cupy")
class _Int8(_BlockQuant):
    pass


@families.Int4.implements("cupy")
class _Int4(_BlockQuant):
    MULTIPLE = 2


@families.Sign.implements("cupy")
class _Sign(_BlockQuant):
    MULTIPLE = 8

    def encode(self, x):
        cp = _cupy()
        n, block = len(x), self.params["block"]
        lay = self.family.layout(n, np.float32)
        bits, scales = cp.zeros(lay.count, cp.uint8), cp.empty(lay.meta_bytes // 4, cp.float32)
        if n:
            module().get_function("sign_pack")((len(scales),), (THREADS,), (x, bits, scales, np.int64(n),
                                                                            np.int32(block)))
        return [scales, bits]

    def decode(self, body, n):
        cp = _cupy()
        lay = self.family.layout(n, np.float32)
        y = cp.empty(n, cp.float32)
        if n:
            scales = body[: lay.meta_bytes].view(cp.float32)
            module().get_function("sign_unpack")(*_grid(n), (body[lay.meta_bytes:], scales, y, np.int64(n),
                                                              np.int32(self.params["block"])))
        return y


@families.TopK.implements("cupy")
class _TopK(_Kernels):
    def encode(self, x):
        cp = _cupy()
        n, k = len(x), self.family.kept(len(x))
        mag = cp.abs(x)
        mag = cp.where(cp.isnan(mag), cp.inf, mag)
        idx = cp.arange(n) if k == n else cp.sort(cp.argpartition(mag, n - k)[n - k:])
        idx = idx.astype(cp.int32)
        values = cp.empty(k, cp.float32)
        if k:
            module().get_function("gather_f32")(*_grid(k), (x, idx, values, np.int64(k)))
        if not self.family.index_bitmap(n):
            return [idx, values]
        mask = cp.zeros(n, cp.bool_)
        mask[idx] = True
        return [cp.packbits(mask, bitorder="little"), values]

    def decode(self, body, n):
        cp = _cupy()
        k, meta = self.family.kept(n), self.family.layout(n, np.float32).meta_bytes
        if not self.family.index_bitmap(n):
            idx = body[:meta].view(cp.int32)
            if k and bool(((idx[0] < 0) | (idx[-1] >= n) | cp.any(cp.diff(idx) <= 0)).get()):
                raise InputError("payload.indices", f"{k} indices", f"increasing indices in [0, {n})")
        else:
            bits = cp.unpackbits(body[:meta], bitorder="little")
            idx = cp.flatnonzero(bits[:n]).astype(cp.int32)
            if int(idx.size) != k or bool(bits[n:].any().get()):
                raise InputError("payload.indices", f"a bitmap of {int(idx.size)} positions", f"{k} below {n}")
        values = body[meta: meta + 4 * k].view(cp.float32)
        y = cp.zeros(n, cp.float32)
        if k:
            module().get_function("scatter_f32")(*_grid(k), (values, idx, y, np.int64(k)))
        return y


@families.NoneFamily.implements("cupy")
class _None(_Kernels):
    pass
