"""Low-rank: PowerSGD's factors, summed by an ordinary all-reduce."""
from __future__ import annotations

import math

import numpy as np

from perfmodel.compression.contract import Family, Layout, Param, _positive_int, register


MAX_RANK = 4096


@register
class PowerSgd(Family):
    """PowerSGD (Vogels et al., NeurIPS 2019): the buffer as an m x n matrix (m = ceil(sqrt N)
    unless ``rows`` is given), sent as P (m x rank) and Q (n x rank); the factors are summed
    by an ordinary all-reduce. Memory-bound for small rank: M is read twice to compress
    and written once to decompress. Error: i.i.d. data (worst case, real gradients are
    far more compressible): energy of the top ``rank`` singular values, each about
    (sqrt m + sqrt n)^2 (Marchenko-Pastur edge)."""

    NAME, REDUCIBLE = "powersgd", True
    EXAMPLES = ("powersgd(4)", "powersgd(rank=2,rows=10)")
    PARAMS = (Param(name="rank", kind=int, default=4, check=lambda v: _positive_int(v) and v <= MAX_RANK,
                    allowed=f"an integer from 1 to {MAX_RANK}"),
              Param(name="rows", kind=int, default=None, check=lambda v: _positive_int(v) and v <= 1 << 31,
                    allowed="an integer from 1 to 2^31"))

    def shape(self, count: int) -> tuple[int, int]:
        rows = self.rows or max(1, math.ceil(math.sqrt(count)))
        return rows, max(1, math.ceil(count / rows))

    def factor_rank(self, count: int) -> int:
        m, n = self.shape(count)
        return min(self.rank, m, n)

    def layout(self, count, dtype):
        if not count:
            return Layout(0, np.dtype(dtype))
        m, n = self.shape(count)
        return Layout((m + n) * self.factor_rank(count), np.dtype(dtype))

    def reduce_parts(self, stream):
        per = stream.nbytes / max(stream.count, 1)
        m, n = self.shape(stream.count)
        r = self.factor_rank(stream.count)
        return [int(math.ceil(m * r * per)), int(math.ceil(n * r * per))]

    def compress_traffic(self, stream):
        return 2.0

    def decompress_traffic(self, stream):
        return 1.0

    def error(self, count: int = 2**24):
        m, n = self.shape(count)
        captured = self.rank * (math.sqrt(m) + math.sqrt(n)) ** 2 / (m * n)
        return math.sqrt(max(0.0, 1.0 - min(1.0, captured)))
