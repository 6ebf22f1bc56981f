"""The catalogue of compressor families: importing this module registers every one.

Each family is a class in the module of its kind, with its own constants beside it; the
contract they all follow is ``perfmodel.compression.contract``:

- ``casts``: none, fp16, bf16, fp8;
- ``quantizers``: int8, int4, qsgd, sign (blockwise, one fp32 scale per block); SDP4Bit's hadamard, tlq and qwd;
- ``sparsifiers``: topk, randk;
- ``lowrank``: powersgd;
- ``errorbounded``: zfp, sz3;
- ``lossless``: lossless (zstd/lz4 after a shuffle), mpc.

Sizes are exact where the format is deterministic (casts, block quantizers, top-k,
fixed-rate zfp) and ``input / ratio`` where it depends on the data (zfp tolerance/precision,
sz3, lossless, mpc), the ratio a parameter whose default is the family's ``DEFAULT_RATIO``
and which calibration replaces. Kernel cost is memory traffic: ``compress_traffic`` and
``decompress_traffic`` are bytes of device memory read plus written per input byte;
``perfmodel.devices`` turns them into time through the device's streaming bandwidth. Compute-heavy
codecs (zfp, sz3, lossless, mpc) carry an equivalent traffic, an assumption wherever no published
measurement replaces it (``perfmodel.compression.kernels``, catalog/codec_kernels.toml: per GPU and
architecture, docs/codec-costs.md) and until calibrated. ``error`` is the relative RMS error of one
application, ``||x' - x|| / ||x||``, for i.i.d. unit-Gaussian data (the convention stated in docs/design.md).
"""
from __future__ import annotations

from perfmodel.compression.casts import Bf16, Cast, Fp8, Fp16, NoneFamily
from perfmodel.compression.contract import (BYTES, FAMILIES, FLOAT_DTYPES, Family, Layout, Param, Stream,
                                             data_dependent, make_family, message_dtype, register, unregister)
from perfmodel.compression.errorbounded import Sz3, Zfp
from perfmodel.compression.lossless import Lossless, Mpc
from perfmodel.compression.lowrank import PowerSgd
from perfmodel.compression.quantizers import BlockQuant, Int4, Int8, Qsgd, Sign
from perfmodel.compression.sparsifiers import RandK, TopK

__all__ = ["BYTES", "FAMILIES", "FLOAT_DTYPES", "Bf16", "BlockQuant", "Cast", "Family", "Fp16", "Fp8", "Int4", "Int8",
           "Layout", "Lossless", "Mpc", "NoneFamily", "Param", "PowerSgd", "Qsgd", "RandK", "Sign", "Stream", "Sz3",
           "TopK", "Zfp", "data_dependent", "make_family", "message_dtype", "register", "unregister"]
