"""Floating dtypes at the boundary between torch and the codecs: fp32, fp64, fp16, bf16 and fp8.

numpy has no bfloat16 and no fp8; ``ml_dtypes`` (with the ``real`` extra) gives numpy arrays of
those types, so a bf16 tensor reaches the codecs as a numpy view of its own bytes (no copy):
``to_numpy`` and ``to_torch`` cross the boundary in both directions for every floating dtype
torch has (``float8_e4m3fn`` and ``float8_e5m2`` where the torch build has them).

How the codecs serve each dtype (docs/runtime.md, Dtypes):

* **Arithmetic codecs** (int8, int4, qsgd, sign, fp8, top-k's selection) run in float32 on a
  narrower input: its values are widened exactly (``widen``: bf16 is its 16 bits shifted left,
  fp16 and fp8 convert exactly), the float32 path runs (numba kernels where installed), and the
  decoded float32 values, clipped to the dtype's finite range, round to the dtype (nearest even:
  ``narrow``). float64 keeps its own path.
* **Values that are carried, not computed** (none, top-k and rand-k values, PowerSGD factors,
  lossless and MPC words, a 2-byte input under the fp16 or bf16 cast, which passes it through)
  stay in the tensor's dtype: a bf16 tensor's top-k values are 2 bytes on the wire, as
  perfmodel's wire size for a 2-byte message says.
* **Error feedback** keeps its residual in ``compute_dtype``: float32 for the 1- and 2-byte
  types (what compression dropped is often below their resolution), the tensor's own dtype for
  float32 and float64.

perfmodel's families know numpy's float types only; they see a dtype through ``standin``: bf16
as float16 (the model's stand-in for any 2-byte message, so its wire sizes hold), fp8 as bytes
(the model's view of 1-byte messages: quantized values, which no lossy family re-encodes; only
``none`` and ``lossless`` take them). A family that cannot serve a dtype refuses it in one line.
"""
from __future__ import annotations

import numpy as np

from topologies.errors import InputError

try:
    import ml_dtypes
except ImportError:   # the real extra brings it; without it bf16 and fp8 are refused in one line
    ml_dtypes = None

# numpy dtypes of the extension types (None without ml_dtypes)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16) if ml_dtypes is not None else None
FLOAT8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn) if ml_dtypes is not None else None
FLOAT8_E5M2 = np.dtype(ml_dtypes.float8_e5m2) if ml_dtypes is not None else None
EXTENSION = tuple(d for d in (BFLOAT16, FLOAT8_E4M3, FLOAT8_E5M2) if d is not None)
STANDARD = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64))
SERVED = STANDARD + EXTENSION   # every dtype a payload may hold
NAMES = "float32, float64, float16, bfloat16, float8_e4m3fn or float8_e5m2"

# torch dtype name -> (numpy dtype, the integer dtype its bits are viewed as on the way over: one
# name in torch and numpy)
_TORCH = {"float32": (np.dtype(np.float32), None), "float64": (np.dtype(np.float64), None),
          "float16": (np.dtype(np.float16), None), "bfloat16": (BFLOAT16, "int16"),
          "float8_e4m3fn": (FLOAT8_E4M3, "uint8"), "float8_e5m2": (FLOAT8_E5M2, "uint8")}
_TORCH_NAME = {d: name for name, (d, _) in _TORCH.items() if d in EXTENSION}   # an extension type's torch name
_UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def is_narrow(dtype) -> bool:
    """A floating dtype narrower than float32 (fp16, bf16, fp8): arithmetic runs on it widened."""
    d = np.dtype(dtype)
    return d in SERVED and d.itemsize < 4


def standin(dtype):
    """The dtype perfmodel's families see for ``dtype``: bf16 as float16, fp8 as bytes (module
    doc); every other dtype as itself (None stays None: an opaque stream)."""
    if dtype is None:
        return None
    d = np.dtype(dtype)
    if d in EXTENSION:
        return np.dtype(np.float16) if d.itemsize == 2 else np.dtype(np.uint8)
    return d


def unstand(out_dtype, in_dtype):
    """A layout's output dtype in realrun's terms: where a family passed its (stand-in) input
    type through, the input's own type (bf16 values stay bf16)."""
    if out_dtype is None or in_dtype is None:
        return out_dtype
    d = np.dtype(in_dtype)
    return d if d in EXTENSION and np.dtype(out_dtype) == standin(d) else out_dtype


def compute_dtype(dtype):
    """The float type arithmetic codecs compute in, and error feedback keeps its residual in:
    float32 for narrow types (their own resolution would drop what compression dropped), else
    the dtype."""
    return np.dtype(np.float32) if is_narrow(dtype) else np.dtype(dtype)


def finfo_max(dtype) -> float:
    """The largest finite value of a floating dtype (numpy's, or ml_dtypes' for its types)."""
    d = np.dtype(dtype)
    return float(ml_dtypes.finfo(d).max if d in EXTENSION else np.finfo(d).max)


def uint_view(x):
    """``x``'s bits as unsigned integers of its width (scatter and gather move bits, so one
    kernel serves every float type: numba has no bf16, and its float16 support is partial)."""
    return x.view(_UINT[x.dtype.itemsize])


def widen(x, out=None):
    """``x`` as float32 values, exactly (the numpy reference; the numba backend has kernels for
    bf16 and fp16 that give the same bits): a float32 or float64 array is returned as it is;
    into ``out`` (a float32 array of ``x``'s length) where given."""
    if not is_narrow(x.dtype):
        return x
    if out is None:
        return x.astype(np.float32)
    out[...] = x.astype(np.float32)
    return out


def narrow(y, dtype, out=None):
    """Values ``y`` rounded to ``dtype`` (nearest, ties to even; NaN stays NaN: the numpy and
    ml_dtypes casts), into ``out`` where given. ``y`` already of ``dtype`` is returned as it is."""
    d = np.dtype(dtype)
    if y.dtype == d:
        return y if out is None else _copy(y, out)
    with np.errstate(over="ignore", invalid="ignore"):
        result = y.astype(d)
    return result if out is None else _copy(result, out)


def _copy(src, out):
    out[...] = src
    return out


def need(dtype):
    """``dtype`` as a served numpy dtype, or one clear error naming what is served."""
    try:
        d = np.dtype(dtype)
    except TypeError:
        d = None
    if d is None or d not in SERVED:
        raise InputError("dtype", str(dtype if d is None else d), NAMES if ml_dtypes is not None else
                         "float32, float64 or float16 (bfloat16 and fp8 need ml_dtypes: pip install "
                         "'commpress[real]')")
    return d


def torch_name(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def to_numpy(tensor):
    """A host numpy view of a CPU torch tensor of any floating dtype (no copy): bf16 and fp8 as
    ml_dtypes arrays over the tensor's bytes; other dtypes as numpy's own."""
    name = torch_name(tensor)
    dtype, bits = _TORCH.get(name, (None, None))
    if dtype is None:
        if name in _TORCH:   # a type numpy lacks and ml_dtypes is not installed
            need(name)
        return tensor.detach().numpy()   # integer and bool tensors: numpy's view (refused later if it must)
    t = tensor.detach()
    if bits is None:
        return t.numpy()
    import torch

    return t.view(getattr(torch, bits)).numpy().view(dtype)


def to_torch(arr):
    """A CPU torch tensor over a host array (no copy where it is contiguous) of the same dtype:
    bf16 and fp8 arrays become bf16 and fp8 tensors."""
    import torch

    arr = np.ascontiguousarray(arr)
    name = _TORCH_NAME.get(arr.dtype)
    if name is None:
        return torch.from_numpy(arr)
    if not hasattr(torch, name):
        raise InputError("dtype", name, "a dtype this torch build has")
    return torch.from_numpy(arr.view(_TORCH[name][1])).view(getattr(torch, name))


def torch_dtypes() -> list:
    """The floating torch dtypes of this build that realrun serves (fp8 where torch has it)."""
    import torch

    return [getattr(torch, k) for k, (v, _) in _TORCH.items() if v is not None and hasattr(torch, k)]
