"""The CuPy backend: the transforms' hot-path primitives as RawKernels (``kernels.cu``) on CuPy arrays.

The transforms of ``realrun.compressors`` are written once; on a CuPy input they call this
backend (``backends.of``) and produce the numpy reference's bytes on the device. ``SERVES`` is
the backend's one declaration: the families it runs, the kernels of ``kernels.cu`` each one
launches and the block sizes it needs (a byte of codes never spans two blocks). Those
families' transforms are registered for ``cupy`` here (the same classes as on the host), so
``build_transform(..., "cupy")`` refuses every other family with a clear error, never a silent
copy to the host. A test checks ``SERVES`` against the kernels defined in ``kernels.cu`` and
launched below.

CuPy is imported on first use (the ``gpu`` extra); on machines without it the CUDA source still
compiles under nvcc in a test, and ``scripts/gpu_check.sh`` runs everything on a GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from perfmodel.compression import families
from realrun.compressors import transforms
from realrun.compressors.backends import Backend
from topologies.errors import InputError

SOURCE = Path(__file__).with_name("kernels.cu")
THREADS = 256   # threads per CUDA block (MAX_THREADS in kernels.cu: the shared-memory reductions)


@dataclass(frozen=True, kw_only=True)
class Serves:
    """What the GPU backend does for one family: the kernels it launches (none: CuPy array
    operations suffice) and the multiple every ``block`` must be."""

    kernels: tuple[str, ...] = ()
    block_multiple: int = 1


SERVES = {
    families.NoneFamily: Serves(),
    families.Fp16: Serves(),   # a CuPy cast (astype): IEEE round to nearest even, as numpy's
    families.Fp8: Serves(kernels=("to_fp8", "from_fp8")),
    families.Int8: Serves(kernels=("quantize_absmax", "dequantize_absmax")),
    families.Int4: Serves(kernels=("quantize_absmax", "dequantize_absmax"), block_multiple=2),
    families.Sign: Serves(kernels=("sign_pack", "sign_unpack"), block_multiple=8),
    families.TopK: Serves(kernels=("gather_f32", "scatter_f32")),
}
for _family in SERVES:
    _family.implements("cupy")(_family.IMPLEMENTATIONS["numpy"])   # one transform class, both backends

# The dtype kernels: a bf16 tensor's values widen exactly to float32 at the codec boundary and the
# decoded values round back to bf16 (``widen``, ``narrow``); the families' kernels take float32.
DTYPE_KERNELS = ("bf16_to_f32", "f32_to_bf16")


def kernel_source() -> str:
    return SOURCE.read_text()


def cupy():
    """The cupy module (imported here, on first use)."""
    try:
        import cupy as cp
    except ImportError:
        raise InputError("device", "cuda", "CuPy installed (pip install 'commpress[gpu]')") from None
    return cp


@lru_cache(maxsize=1)
def module():
    """The compiled RawModule (compiled once per process by NVRTC)."""
    return cupy().RawModule(code=kernel_source(), options=("--std=c++17",))


def _launch(name: str, grid: tuple, args: tuple) -> None:
    module().get_function(name)(grid, (THREADS,), args)


def _grid(n: int) -> tuple:
    """One thread per value."""
    return (max(1, math.ceil(n / THREADS)),)


def array_module(x):
    """numpy, or CuPy for a CuPy array (so the collectives are written once for both)."""
    return cupy() if type(x).__module__.split(".")[0] == "cupy" else np


def from_tensor(t):
    """A CuPy view of a CUDA tensor (DLPack, no copy); a bf16 or fp16 tensor as its exact float32
    values (a new array: ``widen``), since the kernels take float32 and CuPy has no bf16."""
    name = str(t.dtype).removeprefix("torch.")
    if name == "bfloat16":
        import torch

        return widen(cupy().from_dlpack(t.detach().view(torch.int16)).view(cupy().uint16), "bfloat16")
    if name == "float16":
        return widen(cupy().from_dlpack(t.detach()), "float16")
    return cupy().from_dlpack(t)


def to_tensor(arr, dtype=None):
    """A CUDA tensor over a CuPy array (DLPack), rounded to ``dtype`` where that is bf16 or fp16
    and ``arr`` holds float32 values (``narrow``): what ``from_tensor`` widened goes back."""
    import torch

    name = str(dtype).removeprefix("torch.") if dtype is not None else None
    if name in ("bfloat16", "float16") and arr.dtype == cupy().float32:
        out = narrow(arr, name)
        return torch.from_dlpack(out).view(torch.bfloat16) if name == "bfloat16" else torch.from_dlpack(out)
    return torch.from_dlpack(arr)


def widen(codes, name: str):
    """float32 values of a device array of bf16 bits (uint16; the ``bf16_to_f32`` kernel) or of
    float16 (CuPy's exact cast)."""
    cp = cupy()
    if name == "float16":
        return codes.astype(cp.float32)
    bits = cp.ascontiguousarray(codes).view(cp.uint16).reshape(-1)
    out = cp.empty(bits.shape, cp.float32)
    if len(bits):
        _launch("bf16_to_f32", _grid(len(bits)), (bits, out, np.int64(len(bits))))
    return out.reshape(codes.shape)


def narrow(values, name: str):
    """float32 device values rounded to bf16 (uint16 bits; the ``f32_to_bf16`` kernel: nearest
    even) or to float16 (CuPy's cast: nearest even)."""
    cp = cupy()
    if name == "float16":
        return values.astype(cp.float16)
    flat = cp.ascontiguousarray(values, dtype=cp.float32).reshape(-1)
    out = cp.empty(flat.shape, cp.uint16)
    if len(flat):
        _launch("f32_to_bf16", _grid(len(flat)), (flat, out, np.int64(len(flat))))
    return out.reshape(values.shape)


def synchronize() -> None:
    """Wait for the current stream (GPU kernels run asynchronously)."""
    cupy().cuda.get_current_stream().synchronize()


def as_device_array(x):
    """A CuPy array of ``x`` (a CUDA tensor: ``from_tensor``, bf16 and fp16 as float32 values)."""
    cp = cupy()
    if type(x).__module__.split(".")[0] == "torch":
        if x.device.type != "cuda":
            raise InputError("device", str(x.device), "cuda for GpuCompressor (CPU tensors: Compressor)")
        return from_tensor(x.detach())
    return cp.asarray(x)


def check(transform, dtype) -> None:
    """Refuse a transform the kernels cannot run: a block that would share a byte with the next
    one, or input other than float32 to a transform that does not pass it through (a cast to fp16
    may only be followed by transforms that pass float16 on)."""
    family = transform.family
    multiple = SERVES[type(family)].block_multiple
    if family.params.get("block", 0) % multiple:
        raise InputError(f"{family.NAME}.block", family.params["block"],
                         f"a multiple of {multiple} on the GPU: a byte never spans two blocks")
    if np.dtype(dtype) != np.float32 and not transform.passes(dtype):
        raise InputError("compressor", str(family), f"float32 input on the GPU (it would get {np.dtype(dtype)})")


def _device(part):
    cp = cupy()
    if isinstance(part, (bytes, bytearray)):
        return cp.asarray(np.frombuffer(part, np.uint8))
    return part.reshape(-1).view(cp.uint8)


def _nbytes(part) -> int:
    return len(part) if isinstance(part, (bytes, bytearray)) else int(part.nbytes)


class CupyBackend(Backend):
    """CuPy arrays: RawKernels from ``kernels.cu`` (float32 values), device metadata. Scratch
    arrays come from CuPy's memory pool, not the transform's (host) workspace."""

    NAME = "cupy"
    CASTS = frozenset({"fp16", "e4m3", "e5m2"})

    @property
    def xp(self):
        return cupy()

    @property
    def compiled(self) -> bool:
        return True

    def meta(self, arr):
        return arr.reshape(-1).view(cupy().uint8)

    def view(self, meta, dtype):
        """As on the host; a copy where the bytes start off the dtype's alignment (metadata and
        values after a bitmap of odd length), since kernels read whole aligned words."""
        arr = _device(meta)
        if arr.data.ptr % np.dtype(dtype).itemsize:
            arr = arr.copy()
        return arr.view(dtype)

    def join(self, parts):
        cp = cupy()
        parts = [_device(p) for p in parts if _nbytes(p)]
        return cp.concatenate(parts) if parts else cp.zeros(0, cp.uint8)

    def to_host(self, arr) -> np.ndarray:
        return cupy().asnumpy(arr)

    def quantize(self, x, block, bits, work):
        cp, n = cupy(), len(x)
        codes = cp.zeros(math.ceil(n * bits / 8), cp.uint8)
        scales = cp.empty(math.ceil(n / block), cp.float32)
        if n:   # one CUDA block per quantization block
            _launch("quantize_absmax", (len(scales),), (x, codes, scales, np.int64(n), np.int32(block), np.int32(bits)))
        return codes, scales

    def dequantize(self, values, scales, n, block, bits, top, out, work):
        if n:
            _launch("dequantize_absmax", _grid(n), (values, scales, out, np.int64(n), np.int32(block), np.int32(bits)))
        return out

    def sign_encode(self, x, block, work):
        cp, n = cupy(), len(x)
        bits, scales = cp.zeros(math.ceil(n / 8), cp.uint8), cp.empty(math.ceil(n / block), cp.float32)
        if n:   # one CUDA block per quantization block
            _launch("sign_pack", (len(scales),), (x, bits, scales, np.int64(n), np.int32(block)))
        return bits, scales

    def sign_decode(self, bits, scales, n, block, top, out):
        if n:
            _launch("sign_unpack", _grid(n), (bits, scales, out, np.int64(n), np.int32(block)))
        return out

    def cast_encode(self, fmt, x, work):
        cp = cupy()
        if fmt == "fp16":
            return x.astype(cp.float16)
        out = cp.empty(len(x), cp.uint8)
        _launch("to_fp8", _grid(len(x)), (x, out, np.int64(len(x)), np.int32(fmt == "e5m2")))
        return out

    def cast_decode(self, fmt, codes, out):
        if fmt == "fp16":
            out[...] = codes.astype(cupy().float32)
            return out
        _launch("from_fp8", _grid(len(out)), (codes, out, np.int64(len(out)), np.int32(fmt == "e5m2")))
        return out

    def topk(self, x, k, work):
        cp = cupy()
        idx = transforms.select_largest(x, k, cp).astype(cp.int32)
        values = cp.empty(k, cp.float32)
        _launch("gather_f32", _grid(k), (x, idx, values, np.int64(k)))
        return idx, values

    def scatter(self, values, idx, out):
        cp = cupy()
        out[...] = 0
        k = len(idx)
        if k:
            _launch("scatter_f32", _grid(k), (values, cp.ascontiguousarray(idx, dtype=cp.int32), out, np.int64(k)))
        return out


BACKEND = CupyBackend()
