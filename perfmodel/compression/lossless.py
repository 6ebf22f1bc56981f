"""Lossless codecs: a byte codec after a shuffle (zstd, lz4), and MPC."""
from __future__ import annotations

from perfmodel.compression.contract import Family, Layout, Param, _float_input, _positive_int, _ratio, register
from topologies.errors import InputError


def _opaque_layout(self, count, dtype):
    """A lossless codec's output: an opaque blob of data-dependent length, no metadata."""
    return Layout(0, None)


def _fixed_traffic(self, stream):
    """The codec's stated equivalent traffic per input byte (``TRAFFIC``), either direction."""
    return self.TRAFFIC


@register
class Lossless(Family):
    """A lossless byte codec after an optional byte/bit shuffle (stands in for MPC and
    nvCOMP). Data-dependent ratio; equivalent traffic 6 bytes per input byte, an assumption where
    catalog/codec_kernels.toml has no measurement (A100: nvCOMP LZ4 for codec=lz4, DietGPU for zstd).
    Takes any typed input: floats, or the bytes of a quantizer."""

    NAME, LOSSLESS, EXACT = "lossless", True, False
    EXAMPLES = ("lossless", "lossless(codec=lz4,shuffle=bit)", "lossless(shuffle=none)")
    TRAFFIC = 6.0
    DEFAULT_RATIO = 1.15   # measured (docs/design.md, Facts measured): at most 1.15x on Gaussian float32
    PARAMS = (Param(name="codec", kind=str, default="zstd", check=lambda v: v in ("zstd", "lz4"),
                    allowed="zstd or lz4"),
              Param(name="shuffle", kind=str, default="byte", check=lambda v: v in ("byte", "bit", "none"),
                    allowed="byte, bit or none"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    def accepts(self, dtype):
        if dtype is None:
            raise InputError("compressor", self.NAME, "a typed input (an opaque blob of data-dependent length "
                             "cannot be compressed again: zfp accuracy modes and sz3 come last in a chain)")

    layout = _opaque_layout
    compress_traffic = decompress_traffic = _fixed_traffic


@register
class Mpc(Family):
    """MPC (Yang, Mukka, Hesaaraki and Burtscher, IEEE Cluster 2015): the GPU lossless codec of
    the seed paper's MPI library; per chunk, subtract the value ``dim`` back, transpose bit
    planes, subtract the previous plane, drop zero words (realrun.compressors.mpc). Floats only
    (its words are the float's width). Data-dependent ratio; equivalent traffic ``TRAFFIC``
    bytes per input byte (an assumption: one read, one write and the in-register transposition
    of every chunk; calibration replaces it)."""

    NAME, LOSSLESS, EXACT = "mpc", True, False
    EXAMPLES = ("mpc", "mpc(dim=2)", "mpc(ratio=1.3)")
    TRAFFIC = 4.0
    # Measured (benchmarks/bench_lossless.py, docs/design.md): on a small GPT's fp32 activations
    # and gradients after 20 steps, 1.11x and 1.11x (fp16: 1.04x, 1.06x).
    DEFAULT_RATIO = 1.11
    PARAMS = (Param(name="dim", kind=int, default=1, check=lambda v: _positive_int(v) and v <= 32,
                    allowed="the data's dimensionality, an integer from 1 to 32"),
              Param(name="ratio", kind=float, check=_ratio, allowed="a compression ratio >= 1"))

    def accepts(self, dtype):
        _float_input(self.NAME, dtype)

    layout = _opaque_layout
    compress_traffic = decompress_traffic = _fixed_traffic
