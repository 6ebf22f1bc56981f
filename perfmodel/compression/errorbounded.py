"""Error-bounded lossy codecs: zfp (fixed rate, precision, tolerance) and SZ3."""
from __future__ import annotations

import math

from perfmodel.compression.contract import (BYTES, Family, Layout, Param, _one_of, _positive, _positive_int,
                                              _ratio, register)


@register
class Zfp(Family):
    """zfp (Lindstrom 2014). ``rate`` is fixed-rate: exactly ``rate`` bits per value in 1-D
    blocks of 4, padded to 64-bit words. ``tolerance`` / ``precision`` are data-dependent
    (``ratio`` or the default). Equivalent traffic of 8 bytes per input byte is an
    assumption to calibrate. rate <= 2 is refused: zfpy crashes on 1-D input there
    (docs/design.md, measured facts)."""

    NAME = "zfp"
    EXAMPLES = ("zfp(rate=8)", "zfp(rate=3)", "zfp(tolerance=1e-3)", "zfp(precision=12)")
    TRAFFIC = 8.0
    DEFAULT_RATIO = 4.0   # assumption, no measurement yet: accuracy mode near rate-8 quality (docs/design.md)
    PARAMS = (Param(name="rate", kind=float, check=lambda v: _positive(v) and 2 < v <= 32,
                    allowed="bits per value in (2, 32]"),
              Param(name="tolerance", kind=float, check=_positive, allowed="an absolute error > 0"),
              Param(name="precision", kind=int, check=lambda v: _positive_int(v) and v <= 32,
                    allowed="an integer from 1 to 32"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    @property
    def mode(self) -> str:
        return _one_of(self.params, ("rate", "tolerance", "precision"), "zfp")

    @property
    def exact(self) -> bool:
        return self.mode == "rate"

    def layout(self, count, dtype):
        if self.mode != "rate":
            return Layout(0, None)
        bits = math.ceil(count / 4) * 4 * self.rate
        return Layout(math.ceil(bits / 64) * 8, BYTES)

    def compress_traffic(self, stream):
        return self.TRAFFIC

    def decompress_traffic(self, stream):
        return self.TRAFFIC

    # Measured with realrun.compressors (zfpy 1.0.1) on 2^18 unit-Gaussian float32 values:
    # relative RMS error = C * 2^-rate (C 13.8-15.5 for rate 4-16), 6.3 * 2^-precision, and
    # 0.13 * tolerance in accuracy mode (zfp stays well inside its bound).
    RATE_C, PRECISION_C, TOLERANCE_C = 13.9, 6.3, 0.133

    def error(self):
        if self.mode == "tolerance":
            return self.TOLERANCE_C * self.tolerance
        if self.mode == "rate":
            return min(1.0, self.RATE_C * 2.0 ** -self.rate)
        return min(1.0, self.PRECISION_C * 2.0 ** -self.precision)


@register
class Sz3(Family):
    """SZ3 error-bounded (Liang et al., ICDE 2023): ``abs`` or ``rel`` (to the value range)
    bound; size is data-dependent (``ratio`` or the default, measured at abs 1e-4).
    Equivalent traffic of 10 bytes per input byte is an assumption to calibrate where
    catalog/codec_kernels.toml has no measurement (A100: cuSZp, the GPU SZ-class compressor)."""

    NAME, EXACT = "sz3", False
    EXAMPLES = ("sz3(abs=1e-3)", "sz3(rel=1e-3)")
    TRAFFIC = 10.0
    DEFAULT_RATIO = 6.8   # measured (docs/design.md, Facts measured): abs 1e-4 on 16 M Gaussian float32
    RANGE_SIGMAS = 10.0   # value range of ~16 M unit Gaussians is about +-5 sigma
    PARAMS = (Param(name="abs", kind=float, check=_positive, allowed="an absolute error bound > 0"),
              Param(name="rel", kind=float, check=lambda v: _positive(v) and v < 1,
                    allowed="a relative error bound in (0, 1)"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    @property
    def mode(self) -> str:
        return _one_of(self.params, ("abs", "rel"), "sz3")

    def layout(self, count, dtype):
        _one_of(self.params, ("abs", "rel"), "sz3")   # exactly one bound
        return Layout(0, None)

    def compress_traffic(self, stream):
        return self.TRAFFIC

    def decompress_traffic(self, stream):
        return self.TRAFFIC

    def error(self):
        bound = self.abs if self.mode == "abs" else self.rel * self.RANGE_SIGMAS
        return bound / math.sqrt(3.0)
