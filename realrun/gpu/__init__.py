"""GPU compressors: CuPy RawKernels (kernels.cu) for the hot paths, byte-identical payloads.

``GpuCompressor(spec)`` takes CuPy arrays or CUDA torch tensors (through DLPack, no copy) and
produces the same payload bytes as the numpy reference (``realrun.compressors``), on the
device. Specs with a GPU path: none, fp16, fp8 (e4m3, e5m2), int8, int4, sign, topk; any
other spec is a clear error, never a silent copy to the host. CuPy is imported on first use
(the ``gpu`` extra); on machines without it the CUDA source still compiles under nvcc in a
test, and ``scripts/gpu_check.sh`` runs everything on a GPU.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from perfmodel.compression.codec import compile_spec
from realrun.compressors.payload import Header, spec_digest
from topologies.errors import InputError

SOURCE = Path(__file__).with_name("kernels.cu")
THREADS = 256
GPU_FAMILIES = ("none", "fp16", "fp8", "int8", "int4", "sign", "topk")


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
    def __init__(self, spec: str):
        codec = compile_spec(spec)
        self.spec, self.codec = codec.text, codec
        if len(codec.families) != 1 or codec.families[0].NAME not in GPU_FAMILIES or codec.error_feedback:
            raise InputError("compressor", spec, "one of " + ", ".join(GPU_FAMILIES) + " on the GPU")
        self.family = codec.families[0]
        self.digest = spec_digest(self.spec)
        block = self.family.params.get("block")
        if self.family.NAME in ("sign", "int4") and block % (8 if self.family.NAME == "sign" else 2):
            raise InputError(f"{self.family.NAME}.block", block,
                             "a multiple of 8 (sign) or 2 (int4) on the GPU: a byte never spans two blocks")

    def compress(self, x):
        """A device uint8 array holding the payload (``cupy.asnumpy(...)`` gives its bytes)."""
        cp = _cupy()
        arr = as_device_array(x)
        if arr.dtype != cp.float32:
            raise InputError("dtype", str(arr.dtype), "float32 on the GPU")
        flat = cp.ascontiguousarray(arr).reshape(-1)
        if self.family.NAME == "none":
            return flat.view(cp.uint8)
        header = Header(dtype=np.dtype(np.float32), shape=tuple(arr.shape) or (1,), digest=self.digest).pack()
        parts = getattr(self, f"_enc_{self.family.NAME}")(flat)
        return cp.concatenate([cp.asarray(np.frombuffer(header, np.uint8))] + [p.view(cp.uint8) for p in parts])

    def decompress(self, payload, like=None):
        cp = _cupy()
        data = cp.asarray(payload).view(cp.uint8)
        if self.family.NAME == "none":
            return data.view(cp.float32).reshape(like.shape if like is not None else (-1,))
        host = cp.asnumpy(data[:64]).tobytes()
        header, offset = Header.unpack(host)
        if header.digest != self.digest:
            raise InputError("payload", "spec digest", f"a payload made with {self.spec}")
        out = getattr(self, f"_dec_{self.family.NAME}")(data[offset:], header.count)
        return out.reshape(header.shape)

    def _grid(self, n):
        return (max(1, math.ceil(n / THREADS)),), (THREADS,)

    def _enc_fp16(self, x):
        return [x.astype(_cupy().float16)]

    def _dec_fp16(self, body, n):
        return body.view(_cupy().float16)[:n].astype(_cupy().float32)

    def _e5m2(self):
        return 1 if self.family.params["format"] == "e5m2" else 0

    def _enc_fp8(self, x):
        cp = _cupy()
        out = cp.empty(len(x), cp.uint8)
        module().get_function("to_fp8")(*self._grid(len(x)), (x, out, np.int64(len(x)), np.int32(self._e5m2())))
        return [out]

    def _dec_fp8(self, body, n):
        cp = _cupy()
        y = cp.empty(n, cp.float32)
        module().get_function("from_fp8")(*self._grid(n), (body[:n], y, np.int64(n), np.int32(self._e5m2())))
        return y

    def _bits(self):
        return {"int8": 8, "int4": 4, "sign": 1}[self.family.NAME]

    def _enc_int8(self, x):
        cp = _cupy()
        n, block, bits = len(x), self.family.params["block"], self._bits()
        blocks = math.ceil(n / block)
        codes = cp.zeros(math.ceil(n * bits / 8), cp.uint8)
        scales = cp.empty(blocks, cp.float32)
        if n:
            module().get_function("quantize_absmax")((blocks,), (THREADS,), (x, codes, scales, np.int64(n),
                                                                            np.int32(block), np.int32(bits)))
        return [scales, codes]

    _enc_int4 = _enc_int8

    def _dec_int8(self, body, n):
        cp = _cupy()
        block, bits = self.family.params["block"], self._bits()
        blocks = math.ceil(n / block)
        scales = body[: blocks * 4].view(cp.float32)
        codes = body[blocks * 4: blocks * 4 + math.ceil(n * bits / 8)]
        y = cp.empty(n, cp.float32)
        if n:
            module().get_function("dequantize_absmax")(*self._grid(n), (codes, scales, y, np.int64(n),
                                                                         np.int32(block), np.int32(bits)))
        return y

    _dec_int4 = _dec_int8

    def _enc_sign(self, x):
        cp = _cupy()
        n, block = len(x), self.family.params["block"]
        blocks = math.ceil(n / block)
        bits = cp.zeros(math.ceil(n / 8), cp.uint8)
        scales = cp.empty(blocks, cp.float32)
        if n:
            module().get_function("sign_pack")((blocks,), (THREADS,), (x, bits, scales, np.int64(n), np.int32(block)))
        return [scales, bits]

    def _dec_sign(self, body, n):
        cp = _cupy()
        block = self.family.params["block"]
        blocks = math.ceil(n / block)
        y = cp.empty(n, cp.float32)
        if n:
            scales = body[: blocks * 4].view(cp.float32)
            module().get_function("sign_unpack")(*self._grid(n), (body[blocks * 4:], scales, y, np.int64(n),
                                                                  np.int32(block)))
        return y

    def _kept(self, n):
        return min(n, math.ceil(self.family.params["density"] * n)) if n else 0

    def _enc_topk(self, x):
        cp = _cupy()
        n, k = len(x), self._kept(len(x))
        mag = cp.abs(x)
        mag = cp.where(cp.isnan(mag), cp.inf, mag)
        idx = cp.arange(n) if k == n else cp.sort(cp.argpartition(mag, n - k)[n - k:])
        idx = idx.astype(cp.int32)
        values = cp.empty(k, cp.float32)
        if k:
            module().get_function("gather_f32")(*self._grid(k), (x, idx, values, np.int64(k)))
        if 4 * k <= math.ceil(n / 8):
            return [idx, values]
        mask = cp.zeros(n, cp.bool_)
        mask[idx] = True
        return [cp.packbits(mask, bitorder="little"), values]

    def _dec_topk(self, body, n):
        cp = _cupy()
        k = self._kept(n)
        meta = min(4 * k, math.ceil(n / 8))
        if 4 * k <= math.ceil(n / 8):
            idx = body[:meta].view(cp.int32)
        else:
            idx = cp.flatnonzero(cp.unpackbits(body[:meta], bitorder="little")[:n]).astype(cp.int32)
        values = body[meta: meta + 4 * k].view(cp.float32)
        y = cp.zeros(n, cp.float32)
        if k:
            module().get_function("scatter_f32")(*self._grid(k), (values, idx, y, np.int64(k)))
        return y
