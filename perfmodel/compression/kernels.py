"""Published GPU codec kernel measurements (catalog/codec_kernels.toml) and where they replace the traffic model.

The model prices a codec kernel as memory traffic (``Family.compress_traffic``: bytes of device memory per
input byte) over the device's streaming bandwidth (``Device.kernel_time_s``). A measured throughput ``T`` on a
GPU of streaming bandwidth ``B`` is the same thing said differently: an *equivalent traffic* of ``B / T`` bytes
per input byte (``copy_ratio`` r: 2 r, a copy reading and writing each byte once). Where the catalog has a cell
for the device's GPU, that equivalent traffic replaces the family's; where it has one for another GPU of the
same architecture, the same equivalent traffic is used, which scales the measured throughput by the ratio of
the two GPUs' streaming bandwidths (the kernel keeps its fraction of the bandwidth). Any other GPU, and any
kernel without a cell, keeps the traffic model: an assumption, which ``perfmodel.compression.kernel_costs``
reports as such.

A transform the model prices at zero traffic (``none``, ``fp8(gemm=true)``, whose cast is the GEMM's) stays
free. Calibration (``perfmodel calibrate``) still overrides all of it with the machine's own measurement.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache

from perfmodel.devices import Device, gpu_catalog, read_catalog
from topologies.errors import InputError

FILE = "codec_kernels.toml"
DIRECTIONS = ("compress", "decompress")
EXTRA_KERNELS = ("hadamard",)       # kernels the catalog may name before their family is registered
COPY_TRAFFIC = 2.0                  # a copy reads and writes every byte once
COPY_RATIO_RANGE = (0.5, 100.0)     # a kernel that only reads its input can take half a copy's time
CELL_KEYS = ("family", "match", "gpu", "compress_GBps", "decompress_GBps", "copy_ratio", "input",
             "implementation", "source")
TEXT_KEYS = ("input", "implementation", "source")
REFERENCE_COUNT = 1 << 20            # values of the fp32 message the report prices each kernel on


@dataclass(frozen=True, kw_only=True)
class KernelCell:
    """One published measurement: ``family`` (with the parameters in ``match``) on GPU ``gpu`` (arch ``arch``),
    as equivalent traffic per input byte per direction (None: not measured), with what it ran and where from."""

    family: str
    gpu: str
    arch: str
    match: tuple = ()
    traffic: dict = field(default_factory=dict)    # direction -> equivalent bytes per input byte
    measured_GBps: dict = field(default_factory=dict)   # direction -> the throughput as published (GB/s)
    input: str = ""
    implementation: str = ""
    source: str = ""

    def covers(self, params: dict) -> bool:
        """The cell applies to a spec with these parameters (each matched parameter has the cell's value)."""
        return all(params.get(k) == v for k, v in self.match)

    def to_dict(self) -> dict:
        return {"family": self.family, "match": dict(self.match), "gpu": self.gpu, "arch": self.arch,
                "compress_GBps": self.measured_GBps.get("compress"),
                "decompress_GBps": self.measured_GBps.get("decompress"),
                "equivalent_traffic": dict(self.traffic), "input": self.input,
                "implementation": self.implementation, "source": self.source}


def _fail(index: int, key: str, value, allowed: str):
    raise InputError(f"{FILE} kernel[{index}].{key}", value, allowed)


def _number(index: int, key: str, value, low: float, high: float, unit: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low < value <= high:
        _fail(index, key, value, f"a number in ({low:g}, {high:g}] {unit}")
    return float(value)


def _family_params(index: int, name) -> dict:
    """{parameter name: Param} of kernel ``name``: a registered family's, None for an extra kernel whose
    family is not registered (its parameters cannot be checked)."""
    from perfmodel.compression.families import FAMILIES

    if name not in FAMILIES and name in EXTRA_KERNELS:
        return None
    if name not in FAMILIES:
        _fail(index, "family", name, "a compressor family (" + ", ".join(FAMILIES) + ") or "
              + ", ".join(EXTRA_KERNELS))
    return {p.name: p for p in FAMILIES[name].PARAMS}


def _match(index: int, family: str, body) -> tuple:
    if body is None:
        return ()
    params = _family_params(index, family)
    if not isinstance(body, dict):
        _fail(index, "match", body, f"a table of {family}'s parameters")
    for key, value in body.items():
        if params is None:
            continue
        p = params.get(key)
        if p is None:
            _fail(index, f"match.{key}", value, f"a parameter of {family}: " + (", ".join(params) or "none"))
        if not p.check(value):
            _fail(index, f"match.{key}", value, p.allowed)
    return tuple(sorted(body.items()))


def _traffic(index: int, body: dict, stream_Bps: float, hbm_Bps: float) -> tuple[dict, dict]:
    """({direction: equivalent traffic}, {direction: published GB/s}) of one cell."""
    given = [k for k in ("compress_GBps", "decompress_GBps", "copy_ratio") if k in body]
    if not given or ("copy_ratio" in given and len(given) > 1):
        _fail(index, "compress_GBps", body.get("compress_GBps"),
              "compress_GBps and/or decompress_GBps, or copy_ratio alone")
    if "copy_ratio" in given:
        ratio = _number(index, "copy_ratio", body["copy_ratio"], *COPY_RATIO_RANGE, "times a copy's time")
        return {d: COPY_TRAFFIC * ratio for d in DIRECTIONS}, {d: stream_Bps / (COPY_TRAFFIC * ratio) / 1e9
                                                               for d in DIRECTIONS}
    high = hbm_Bps / 1e9
    out, published = {}, {}
    for d in DIRECTIONS:
        if f"{d}_GBps" in body:
            published[d] = _number(index, f"{d}_GBps", body[f"{d}_GBps"], 0.0, high,
                                   "GB/s (the GPU's HBM bandwidth: a kernel reads its input at least once)")
            out[d] = stream_Bps / (published[d] * 1e9)
    return out, published


def check_cell(index: int, body, gpus: dict) -> KernelCell:
    """One [[kernel]] cell checked key by key and converted; the first bad key raises InputError
    naming the file, the cell and what is allowed."""
    if not isinstance(body, dict):
        _fail(index, "", body, "a [[kernel]] table")
    for key in body:
        if key not in CELL_KEYS:
            _fail(index, key, body[key], "one of " + ", ".join(CELL_KEYS))
    family = body.get("family")
    _family_params(index, family)
    gpu = body.get("gpu")
    if gpu not in gpus or gpus[gpu].arch in ("", "cpu"):
        _fail(index, "gpu", gpu, "a GPU of gpus.toml: " + ", ".join(k for k, d in gpus.items()
                                                                     if d.arch not in ("", "cpu")))
    for key in TEXT_KEYS:
        if not isinstance(body.get(key), str) or not body[key].strip():
            _fail(index, key, body.get(key), "a non-empty string (every number has its source)")
    traffic, published = _traffic(index, body, gpus[gpu].stream_Bps, gpus[gpu].hbm_Bps)
    return KernelCell(family=family, gpu=gpu, arch=gpus[gpu].arch, match=_match(index, family, body.get("match")),
                      traffic=traffic, measured_GBps=published, input=body["input"],
                      implementation=body["implementation"], source=body["source"])


def load_cells(raw: dict, gpus: dict | None = None) -> tuple[KernelCell, ...]:
    """Every cell of a parsed codec_kernels.toml, checked (``raw``: its TOML as a dict)."""
    gpus = gpu_catalog() if gpus is None else gpus
    for key in raw:
        if key != "kernel":
            raise InputError(f"{FILE} {key}", raw[key], "only [[kernel]] tables")
    cells = raw.get("kernel", [])
    if not isinstance(cells, list):
        raise InputError(f"{FILE} kernel", cells, "an array of [[kernel]] tables")
    return tuple(check_cell(i, body, gpus) for i, body in enumerate(cells))


@cache
def codec_kernels() -> tuple[KernelCell, ...]:
    """The catalog's measured codec kernels (catalog/codec_kernels.toml), checked. Cached."""
    return load_cells(read_catalog("codec_kernels"))


@dataclass(frozen=True)
class Basis:
    """How one direction of one kernel is priced on one device: ``how`` is ``measured`` (this GPU),
    ``scaled`` (another GPU of its architecture, by streaming bandwidth) or ``assumption`` (traffic model)."""

    how: str
    traffic: float
    cell: KernelCell | None = None


def resolve(name: str, params: dict, gpu: str, arch: str, direction: str) -> KernelCell | None:
    """The cell that prices ``direction`` of kernel ``name`` (with ``params``) on GPU ``gpu`` of ``arch``:
    this GPU's before its architecture's, then the one matching more parameters; None where none does."""
    best, rank = None, None
    for cell in codec_kernels():
        if cell.family != name or direction not in cell.traffic or not cell.covers(params):
            continue
        if cell.gpu != gpu and (cell.arch != arch or arch in ("", "cpu")):
            continue
        key = (cell.gpu == gpu, len(cell.match))
        if rank is None or key > rank:
            best, rank = cell, key
    return best


@dataclass(frozen=True)
class DeviceKernels:
    """The measured kernels as one device sees them (``Codec.on``): equal for equal GPU and architecture."""

    gpu: str
    arch: str

    def basis(self, name: str, params: dict, direction: str, modelled: float) -> Basis:
        """How ``direction`` of kernel ``name`` is priced here, given the traffic model's ``modelled``
        bytes per input byte: a zero-traffic transform stays free (module doc)."""
        cell = resolve(name, params, self.gpu, self.arch, direction) if modelled > 0 else None
        if cell is None:
            return Basis("assumption", modelled)
        return Basis("measured" if cell.gpu == self.gpu else "scaled", cell.traffic[direction], cell)

    def traffic(self, family, direction: str, modelled: float) -> float:
        """Equivalent traffic per input byte of ``family``'s ``direction`` kernel on this device."""
        return self.basis(family.NAME, family.params, direction, modelled).traffic


def device_kernels(dev: Device) -> DeviceKernels | None:
    """The measured kernels that apply on ``dev`` (its GPU's or its architecture's), or None where none do."""
    if not any(c.gpu == dev.key or (c.arch == dev.arch and dev.arch not in ("", "cpu")) for c in codec_kernels()):
        return None
    return DeviceKernels(dev.key, dev.arch)
