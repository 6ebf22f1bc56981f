"""What the model's codec kernels cost on one GPU, as ``perfmodel catalog codecs`` reports it: every
compressor family's first example and each measured variant of catalog/codec_kernels.toml, priced from
a measurement, scaled from its architecture's, or the traffic model's assumption
(``perfmodel.compression.kernels`` says which applies; this module only reports it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from perfmodel.compression.codec import compile_spec
from perfmodel.compression.families import FAMILIES
from perfmodel.compression.grammar import _fmt
from perfmodel.compression.kernels import (DIRECTIONS, EXTRA_KERNELS, REFERENCE_COUNT, Basis, DeviceKernels,
                                           codec_kernels)
from perfmodel.devices import Device, gpu_catalog
from topologies.errors import InputError


@dataclass(frozen=True, kw_only=True)
class KernelCost:
    """One kernel on one GPU, as the model prices it: throughput per direction (GB/s of input) and its basis."""

    kernel: str
    gpu: str
    compress_GBps: float | None
    decompress_GBps: float | None
    compress: str
    decompress: str
    source: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _basis_text(b: Basis, dev: Device) -> str:
    if b.how == "assumption":
        if b.traffic == 0:
            return "no kernel of its own (traffic model: 0)"
        if math.isinf(b.traffic):
            return "assumption: not priced (its family is not registered)"
        return f"assumption: traffic model, {b.traffic:.3g} B per input byte"
    if b.how == "measured":
        return "measured"
    ref = gpu_catalog()[b.cell.gpu]
    return f"scaled from {b.cell.gpu} x stream {dev.stream_Bps / 1e12:.3g}/{ref.stream_Bps / 1e12:.3g} TB/s"


def _cost(kernel: str, dev: Device, bases: dict) -> KernelCost:
    rate = {d: (dev.stream_Bps / b.traffic / 1e9 if 0 < b.traffic < math.inf else None) for d, b in bases.items()}
    return KernelCost(kernel=kernel, gpu=dev.key, compress_GBps=rate["compress"],
                      decompress_GBps=rate["decompress"], compress=_basis_text(bases["compress"], dev),
                      decompress=_basis_text(bases["decompress"], dev),
                      source="; ".join(sorted({b.cell.source for b in bases.values() if b.cell is not None})))


def _spec_cost(codec, dev: Device, kernels: DeviceKernels) -> KernelCost:
    """One single-family codec's kernels on ``dev`` (an fp32 message of REFERENCE_COUNT values)."""
    family, raw = codec.families[0], 4.0 * REFERENCE_COUNT
    applied = codec.apply(REFERENCE_COUNT, 4)
    modelled = {"compress": applied.compress_bytes / raw, "decompress": applied.decompress_bytes / raw}
    return _cost(codec.text, dev, {d: kernels.basis(family.NAME, family.params, d, modelled[d]) for d in DIRECTIONS})


def _specs() -> list:
    """The codecs the report prices: every family's first example and each measured variant, once each."""

    texts = [cls.examples()[0] for cls in FAMILIES.values() if not cls.IDENTITY]
    texts += [c.family + "(" + ",".join(f"{k}={_fmt(v)}" for k, v in c.match) + ")"
              for c in codec_kernels() if c.match and c.family in FAMILIES]
    out = {}
    for text in texts:
        codec = compile_spec(text)
        out.setdefault(codec.text, codec)
    return list(out.values())


def kernel_costs(gpu: str) -> list[KernelCost]:
    """Every compressor family (its first example spec, on fp32 values) and each measured variant of the
    catalog, as the model prices them on GPU ``gpu``: throughput per direction (GB/s of input) and whether
    it is measured, scaled from its architecture's measurement, or the traffic model's assumption."""

    gpus = gpu_catalog()
    if gpu not in gpus:
        raise InputError("gpu", gpu, "one of " + ", ".join(gpus))
    dev, kernels = gpus[gpu], DeviceKernels(gpu, gpus[gpu].arch)
    out = [_spec_cost(codec, dev, kernels) for codec in _specs()]
    for name in EXTRA_KERNELS:
        if name not in FAMILIES:
            out.append(_cost(name, dev, {d: kernels.basis(name, {}, d, math.inf) for d in DIRECTIONS}))
    return out
