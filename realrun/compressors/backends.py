"""Array backends: the hot-path primitives behind the transforms, chosen by the input's array module.

Transforms (``transforms.py``) are written once. For their hot paths they ask ``of(x)`` for the backend
of their input and call its primitives: blockwise quantize / dequantize, casts, sign packing,
top-k selection and scatter, and the payload checksum's reduction. Two backends exist:

* ``numba`` (``realrun.compressors.fast``) for numpy arrays: compiled CPU loops for float32
  input where numba is installed; otherwise, and for other dtypes, the transform's numpy reference
  runs (``compiled`` is False, ``serves`` says no).
* ``cupy`` (``realrun.gpu.kernels``) for CuPy arrays: RawKernels from ``realrun/gpu/kernels.cu``
  for the families it declares (a family without a GPU path is refused when a GPU compressor is
  built, never run on the host).

Both implement ``Kernels`` and produce the reference's bytes (tests compare them). ``Backend``
also carries what differs between host and device memory for metadata: host metadata is
``bytes``, device metadata a uint8 device array (``meta``, ``view``, ``join``), so chains, error
feedback and payload assembly (``compressor.py``) are written once too. Adding a backend is a
module that defines a ``Backend`` subclass (implementing ``Kernels``) as ``BACKEND``, and its
entry in ``BACKENDS``.
"""
from __future__ import annotations

import importlib
from functools import cache
from typing import Protocol

import numpy as np

from realrun.compressors import dtypes
from topologies.errors import InputError

# array module of an input -> the module whose BACKEND serves it (imported on first use)
BACKENDS = {"numpy": "realrun.compressors.fast", "cupy": "realrun.gpu.kernels"}


class Backend:
    """What transforms and payloads need of one array module: its metadata form, whether its
    kernels run (``compiled``, ``serves``, ``casts``) and the checksum's reduction. The base is
    the host side (numpy arrays, bytes metadata, no kernels); a backend subclasses it and
    implements ``Kernels``."""

    NAME = "numpy"
    CASTS = frozenset()   # cast formats (fp16, bf16, e4m3, e5m2) with a kernel here

    @property
    def xp(self):
        """The array module (numpy or cupy)."""
        return np

    @property
    def compiled(self) -> bool:
        """Whether this backend's kernels can run here (numba installed; a GPU backend always)."""
        return False

    def serves(self, dtype) -> bool:
        """Whether the kernels take values of ``dtype`` (float32 only, on every backend)."""
        return self.compiled and np.dtype(dtype) == np.float32

    def casts(self, fmt: str, dtype) -> bool:
        return fmt in self.CASTS and self.serves(dtype)

    def meta(self, arr):
        """Metadata bytes of an array (scales, indices): ``bytes`` on the host."""
        return arr.tobytes()

    def view(self, meta, dtype):
        """Metadata as an array of ``dtype`` (no copy)."""
        return np.frombuffer(meta, dtype)

    def join(self, parts):
        """Metadata parts (bytes, or arrays of this module) as one."""
        return b"".join(parts)

    def to_host(self, arr) -> np.ndarray:
        """A numpy copy (or view, on the host) of a small array: header bytes, a length."""
        return arr

    def weighted_sum(self, words) -> int:
        """``sum_i (2i+1) * words[i] mod 2^64`` of uint32 words (the checksum's reduction)."""
        xp = self.xp
        weights = xp.arange(1, 2 * int(words.size), 2, dtype=xp.uint64)
        return int((words.astype(xp.uint64) * weights).sum())

    def widen(self, x, work=None):
        """``x``'s exact float32 values where its dtype is narrow (bf16, fp16, fp8; into the
        transform's scratch array ``work("wide", ...)`` where given), else ``x`` itself."""
        if not dtypes.is_narrow(x.dtype):
            return x
        return dtypes.widen(x, None if work is None else work("wide", len(x), np.float32))

    def narrow(self, y, dtype, ctx=None):
        """Decoded float32 values ``y`` rounded to a narrow ``dtype`` (into the decoder's output,
        ``ctx.output``, where a ``ctx`` is given); ``y`` itself where it already has ``dtype``."""
        if y.dtype == np.dtype(dtype):
            return y
        return dtypes.narrow(y, dtype, None if ctx is None else ctx.output(len(y), dtype, self.xp))


class Kernels(Protocol):
    """The hot-path primitives of a compiled backend (numba, CuPy), on float32 values of its
    array module; ``work(tag, n, dtype)`` gives a transform's reusable host scratch arrays. Transforms
    call one only where ``Backend.serves`` (or ``casts``) says yes, else they run the reference."""

    def quantize(self, x, block: int, bits: int, work):
        """Blockwise absmax codes of float32 ``x`` in ``bits`` (8, or 4 packed two per byte, low
        nibble first) as uint8, and the float32 scale of every block."""

    def dequantize(self, values, scales, n: int, block: int, bits: int, top: float, out, work):
        """float32 values of ``n`` codes into ``out``, clipped to +-``top``."""

    def sign_encode(self, x, block: int, work):
        """Sign bits (1 = non-negative or NaN, eight per byte, LSB first) and mean |x| per block."""

    def sign_decode(self, bits, scales, n: int, block: int, top: float, out):
        """+-scale of each value's block into ``out`` (clipped to +-``top``), by its sign bit."""

    def cast_encode(self, fmt: str, x, work):
        """The codes of float32 ``x`` in ``fmt`` (one of ``CASTS``)."""

    def cast_decode(self, fmt: str, codes, out):
        """float32 values of ``codes`` into ``out``."""

    def topk(self, x, k: int, work):
        """Ascending indices and values of the ``k`` largest |x| (0 < k < n), ties at the
        threshold keeping the lowest indices (the reference's rule)."""

    def scatter(self, values, idx, out):
        """``out`` zeroed, then ``out[idx] = values``."""


@cache
def _backend(module: str) -> Backend:
    path = BACKENDS.get(module)
    if path is None:
        raise InputError("array", module, "a numpy or CuPy array")
    return importlib.import_module(path).BACKEND


def of(x) -> Backend:
    """The backend of an array, from its array module (numpy or cupy)."""
    return _backend(type(x).__module__.split(".")[0])
