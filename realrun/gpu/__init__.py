"""GPU compressors: the CuPy backend of the transforms (``kernels``: RawKernels from kernels.cu)
and ``GpuCompressor`` (``compressor``), byte-identical to the numpy reference. CuPy is imported
on first use (the ``gpu`` extra), so this package imports anywhere."""
from realrun.gpu.compressor import GpuCompressor, gpu_families
from realrun.gpu.kernels import (SOURCE, array_module, as_device_array, from_tensor, kernel_source, synchronize,
                                 to_tensor)

__all__ = ["SOURCE", "GpuCompressor", "array_module", "as_device_array", "from_tensor", "gpu_families",
           "kernel_source", "synchronize", "to_tensor"]
