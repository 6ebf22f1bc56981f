"""Blockwise quantizers with one fp32 scale per block: int8, int4, QSGD, sign."""
from __future__ import annotations

import math

from perfmodel.compression.contract import BYTES, Family, Layout, Param, _positive_int, register


SCALE_BYTES = 4            # one float32 scale per block
DEFAULT_BLOCK = 256        # values per quantization block: scale overhead 4/256 B per value


def _expected_absmax(block: int) -> float:
    """E[max |x|] of ``block`` unit Gaussians, ~sqrt(2 ln 2b) (extreme-value approximation)."""
    return math.sqrt(2.0 * math.log(max(2 * block, 2)))


MAX_BLOCK = 1 << 24   # values per block: beyond it a scale per block saves nothing and buffers grow unbounded


class BlockQuant(Family):
    """Blockwise absmax quantization to ``bits`` (sign included) with one fp32 scale per block:
    packed codes (ceil(n bits / 8) bytes), then one scale per block as metadata.

    Compress reads the input twice (absmax, then quantize); error is uniform over half
    a step: step = absmax / (2^(bits-1) - 1), RMS = step / sqrt(12).
    """

    BITS = 8
    PARAMS = (Param(name="block", kind=int, default=DEFAULT_BLOCK, check=lambda v: _positive_int(v) and v <= MAX_BLOCK,
                    allowed=f"an integer from 1 to {MAX_BLOCK}"),)

    @property
    def bits(self) -> int:
        return self.params.get("bits", self.BITS)

    def layout(self, count, dtype):
        blocks = math.ceil(count / self.block) if count else 0
        return Layout(math.ceil(count * self.bits / 8), BYTES, blocks * SCALE_BYTES)

    def compress_traffic(self, stream):
        return 1.0 + super().compress_traffic(stream)

    def decompress_traffic(self, stream):
        return super().compress_traffic(stream)

    def _levels(self):
        return 2 ** (self.bits - 1) - 1

    def error(self):
        return _expected_absmax(self.block) / self._levels() / math.sqrt(12.0)


@register
class Int8(BlockQuant):
    NAME, BITS = "int8", 8
    EXAMPLES = ("int8", "int8(block=100)")


@register
class Int4(BlockQuant):
    NAME, BITS = "int4", 4
    EXAMPLES = ("int4", "int4(block=7)")


@register
class Qsgd(BlockQuant):
    """QSGD (Alistarh et al., NeurIPS 2017) per block: ``bits`` per value including sign,
    stochastic rounding (unbiased, error variance step^2/6 on average) or nearest."""

    NAME = "qsgd"
    EXAMPLES = ("qsgd(bits=4)", "qsgd(bits=3,stochastic=false)")
    PARAMS = (Param(name="bits", kind=int, default=4, check=lambda v: _positive_int(v) and 2 <= v <= 8,
                    allowed="an integer from 2 to 8"),
              Param(name="stochastic", kind=bool, default=True, check=lambda v: isinstance(v, bool),
                    allowed="true or false"),
              BlockQuant.PARAMS[0])

    def error(self):
        spread = math.sqrt(6.0) if self.stochastic else math.sqrt(12.0)
        return _expected_absmax(self.block) / self._levels() / spread


@register
class Sign(BlockQuant):
    """signSGD with a per-block scale (mean |x|, as in EF-signSGD): 1 bit per value.
    Relative error for Gaussian data: sqrt(1 - (E|x|)^2 / E[x^2]) = sqrt(1 - 2/pi)."""

    NAME, BITS = "sign", 1
    EXAMPLES = ("sign", "sign(block=64)")

    def error(self):
        return math.sqrt(1.0 - 2.0 / math.pi)
