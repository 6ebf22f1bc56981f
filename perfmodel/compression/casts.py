"""The identity and the float casts: fp16, bf16, fp8 (e4m3, e5m2)."""
from __future__ import annotations

import math

import numpy as np

from perfmodel.compression.contract import BYTES, Family, Layout, Param, register


@register
class NoneFamily(Family):
    NAME, REDUCIBLE, LOSSLESS, IDENTITY = "none", True, True, True

    def accepts(self, dtype):
        pass

    def layout(self, count, dtype):
        return Layout(count, dtype)

    def compress_traffic(self, stream):
        return 0.0

    def decompress_traffic(self, stream):
        return 0.0


class Cast(Family):
    """fp16 / bf16 / fp8: round to nearest; relative error 2^-(m+1)/sqrt(3) for m mantissa bits.
    A narrower input passes through unchanged (a cast never widens)."""

    CODE = np.dtype(np.float16)

    MANTISSA_BITS = 0          # explicit mantissa bits of the format (each cast sets its own)

    def _mantissa(self):
        return self.MANTISSA_BITS

    def layout(self, count, dtype):
        dtype = np.dtype(dtype)
        return Layout(count, self.CODE if dtype.itemsize > self.CODE.itemsize else dtype)

    def error(self):
        return 2.0 ** -(self._mantissa() + 1) / math.sqrt(3.0)


@register
class Fp16(Cast):
    NAME, REDUCIBLE, CAST_TO, MANTISSA_BITS = "fp16", True, "float16", 10


@register
class Bf16(Cast):
    NAME, REDUCIBLE, CAST_TO, CODE, MANTISSA_BITS = "bf16", True, "bfloat16", np.dtype(np.uint16), 7


@register
class Fp8(Cast):
    """``gemm=true``: the payload is what an FP8 GEMM consumes as it arrives (a plan whose precision
    is an 8-bit recipe gathering its parameters in fp8, Megatron's ``--fp8-param-gather``): the
    recipe casts the weights anyway (its cost is in the step's compute) and the receiver decodes
    nothing, so the transform adds no kernel traffic; its wire size and error are the cast's.
    ``CompressionPolicy.under`` sets it from the plan's precision."""

    NAME, CODE = "fp8", BYTES
    EXAMPLES = ("fp8", "fp8(format=e5m2)")
    PARAMS = (Param(name="format", kind=str, default="e4m3", check=lambda v: v in ("e4m3", "e5m2"),
                    allowed="e4m3 or e5m2"),
              Param(name="gemm", kind=bool, check=lambda v: isinstance(v, bool), allowed="true or false"))
    FORMAT_MANTISSA_BITS = {"e4m3": 3, "e5m2": 2}

    def _mantissa(self):
        return self.FORMAT_MANTISSA_BITS[self.format]

    def compress_traffic(self, stream):
        return 0.0 if self.gemm else super().compress_traffic(stream)

    def decompress_traffic(self, stream):
        return 0.0 if self.gemm else super().decompress_traffic(stream)
