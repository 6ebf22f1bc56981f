"""``GpuCompressor``: ``Compressor`` with device edges: CuPy arrays or CUDA tensors in, payloads
as device uint8 arrays out, byte-identical to the host's.

Transforms, chains, error feedback, the header, the checksum and every check before decoding are
``realrun.compressors``'; only moving the input on and assembling the payload on the device are
here. Specs run on the GPU when every family in them has a GPU path (``gpu_families()``: the
GPU backend's declaration, ``kernels.SERVES``) and gets float32 input; anything else is a clear
error when the compressor is built, never a silent copy to the host. A bf16 or fp16 CUDA tensor
is taken as its exact float32 values (``kernels.from_tensor``: the ``bf16_to_f32`` kernel), so
its payload is a float32 one; ``kernels.to_tensor`` rounds decoded values back (``f32_to_bf16``).
"""
from __future__ import annotations

import numpy as np

from perfmodel.compression import families
from perfmodel.compression.codec import Codec
from realrun.compressors.compressor import Compressor
from realrun.compressors.payload import checksum
from realrun.gpu import kernels
from topologies.errors import InputError


def gpu_families() -> tuple[str, ...]:
    """Names of the families with a GPU implementation."""
    return tuple(name for name, cls in families.FAMILIES.items() if "cupy" in cls.IMPLEMENTATIONS)


class GpuCompressor(Compressor):
    """One spec on the GPU (float32 values). Error feedback keeps a residual per tensor, so
    ``compress`` needs the tensor's ``key`` for a spec with ``ef(...)``."""

    BACKEND = "cupy"

    def __init__(self, spec: str | Codec, seed: int = 0):
        super().__init__(spec, seed=seed)   # a family without a cupy implementation is refused here
        for transform, dtype in self.root.leaves(np.float32):
            kernels.check(transform, dtype)

    def compress(self, x, key: str | None = None):
        """A device uint8 array holding the payload (``cupy.asnumpy(...)`` gives its bytes)."""
        if key is None and self.codec.error_feedback:
            raise InputError("key", None, f"the tensor's key for {self.spec} (error feedback keeps a residual "
                             "per tensor)")
        cp = kernels.cupy()
        arr = kernels.as_device_array(x)
        if arr.dtype != cp.float32:
            raise InputError("dtype", str(arr.dtype), "float32 on the GPU")
        flat = cp.ascontiguousarray(arr).reshape(-1)
        if self.codec.is_none:
            return flat.view(cp.uint8)
        header, meta, prefix, values = self._encode(flat, arr.shape, key or "")
        body = kernels.BACKEND.join([meta, prefix, values])
        return kernels.BACKEND.join([header.sealed(checksum(body)), body])

    def decompress(self, payload, like=None):
        """The float32 values back on the device, in the payload's shape (``like``: the shape
        for ``none``, whose payload is the raw values)."""
        cp = kernels.cupy()
        data = cp.asarray(payload).reshape(-1).view(cp.uint8)
        if self.codec.is_none:
            return data.view(cp.float32).reshape(like.shape if like is not None else (-1,))
        header, values, meta = self._parse(data)
        if header.dtype != np.float32:
            raise InputError("payload.dtype", str(header.dtype), "float32 on the GPU")
        return self._decode(header, values, meta, None).reshape(header.shape)
