"""Sparsifiers: top-k (values and indices or a bitmap) and rand-k (a shared seed, no indices)."""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from perfmodel.compression.contract import Family, Layout, Param, _density, register


_NORMAL = NormalDist()   # the unit Gaussian of the error convention (stdlib: no scipy.stats at import)
INDEX_BYTES = 4            # int32 index per kept value


@register
class TopK(Family):
    """Keep the ``density`` fraction of largest magnitudes: values plus int32 indices, or a
    bitmap when that is smaller (density > 1/32). Selection is a radix select, 4 passes
    over float32 (Alabi et al., 'Fast k-selection algorithms for GPUs', JEA 2012)."""

    NAME, SPARSE = "topk", True
    EXAMPLES = ("topk(0.01)", "topk(0.5)")
    SELECT_PASSES = 4.0
    PARAMS = (Param(name="density", kind=float, check=_density, allowed="a fraction in (0, 1]", required=True),)

    def kept(self, count: int) -> int:
        return min(count, math.ceil(self.density * count)) if count else 0

    def index_bitmap(self, count: int) -> bool:
        """Positions travel as a bitmap (ceil(n/8) bytes) rather than int32 indices."""
        return INDEX_BYTES * self.kept(count) > math.ceil(count / 8)

    def layout(self, count, dtype):
        k = self.kept(count)
        return Layout(k, np.dtype(dtype), min(k * INDEX_BYTES, math.ceil(count / 8)))

    def compress_traffic(self, stream):
        return self.SELECT_PASSES + super().compress_traffic(stream) - 1.0

    def decompress_traffic(self, stream):
        out, meta = self.transform(stream)
        return 1.0 + (out.nbytes + meta) / max(stream.nbytes, 1.0)

    def error(self):
        if self.density >= 1:
            return 0.0
        t = _NORMAL.inv_cdf(1.0 - self.density / 2.0)
        kept_energy = self.density + 2.0 * t * _NORMAL.pdf(t)
        return math.sqrt(max(0.0, 1.0 - kept_energy))


@register
class RandK(TopK):
    """Random ``density`` fraction from a seed shared by all ranks: no indices on the wire,
    only the 8-byte step number that, with the seed, draws them."""

    NAME = "randk"
    EXAMPLES = ("randk(0.01)",)
    STEP_BYTES = 8

    def layout(self, count, dtype):
        return Layout(self.kept(count), np.dtype(dtype), self.STEP_BYTES)

    def compress_traffic(self, stream):
        return Family.compress_traffic(self, stream) - 1.0 + self.density

    def error(self):
        return math.sqrt(1.0 - self.density)
