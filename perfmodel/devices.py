"""Catalog files inside perfmodel: GPUs (devices) and collective protocols."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources

from perfmodel.dtypes import DTYPE_BYTES
from topologies.errors import InputError
from topologies.units import TBps_to_Bps, us_to_s

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def read_catalog(name: str) -> dict:
    return tomllib.loads((resources.files("perfmodel") / "catalog" / f"{name}.toml").read_text())


@dataclass(frozen=True, kw_only=True)
class GemmShape:
    """A GEMM's time from its shape, as cuBLAS runs it: the m x n output cut into ``tile`` x
    ``tile`` tiles, dealt to ``sm_count`` SMs in waves (a partial tile or a partial last wave
    costs a whole one); each wave takes k steps of a tile at ``peak_fraction`` of one SM's peak;
    plus ``fixed_s`` per kernel (launch and tail). The operands and result must also cross HBM
    (2 (mk + kn + mn) elements) at the streaming bandwidth (plus split-K's partial sums, ``split_k``:
    a grid of fewer tiles than SMs); the two times combine as a soft
    roofline, sqrt(compute^2 + memory^2), so a square GEMM is compute-bound and a thin one
    (n or k of a few hundred, as h / tp is in small models) approaches its traffic time."""

    sm_count: int
    tile: int
    peak_fraction: float
    fixed_s: float

    def time_s(self, m: float, n: float, k: float, peak_flops_per_s: float, elem_bytes: int,
               stream_Bps: float) -> float:
        tiles = math.ceil(m / self.tile) * math.ceil(n / self.tile)
        slices = self.split_k(tiles, k)
        waves = math.ceil(tiles * slices / self.sm_count)
        sm_flops_per_s = peak_flops_per_s / self.sm_count * self.peak_fraction
        compute = waves * 2.0 * self.tile * self.tile * (k / slices) / sm_flops_per_s + self.fixed_s
        partials = 2 * 4 * m * n * (slices - 1) if slices > 1 else 0.0   # fp32 partial sums, written and read
        memory = (elem_bytes * (m * k + k * n + m * n) + partials) / stream_Bps
        return math.hypot(compute, memory)

    def split_k(self, tiles: int, k: float) -> int:
        """Slices of k a grid of fewer tiles than SMs is cut into (cuBLAS's and CUTLASS's split-K:
        the slices run on idle SMs and their partial sums are added), at least one ``tile`` deep."""
        return max(1, min(self.sm_count // max(tiles, 1), int(k // self.tile)))


@dataclass(frozen=True, kw_only=True, eq=False)
class Device:
    """A GPU as the model sees it (SI units)."""

    key: str
    name: str
    peak_flops_per_s: dict
    hbm_bytes: float
    hbm_Bps: float
    stream_Bps: float
    launch_s: float
    gemm_efficiency: tuple = ()   # ((cube-root size, fraction of peak), ...) ascending
    gemm_shape: GemmShape | None = None   # a GEMM's time from its shape (tiles over SMs); None: the table
    gemm_kernels: dict = field(default_factory=dict)   # {kernel: GemmKernel}: low-precision GEMMs
    #                                                    (catalog/precisions.toml [gemm.*])
    host_op_s: float = 0.0        # host (framework) seconds to issue one kernel; 0: not modelled
    eager_score_s: float | None = None   # eager attention's seconds per score beyond its GEMMs, forward and
    #                                      backward (measured: realrun calibrate); None: its counted passes
    arch: str = ""                # volta, ampere, hopper, blackwell, ... (NCCL's per-generation constants)
    source: str = ""
    board_power_W: float | None = None   # maximum board power (TDP), datasheet: energy's upper bound
    power_source: str = ""

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s of ``dtype``; a GPU without it is a clear error."""
        if dtype not in self.peak_flops_per_s:
            raise InputError("dtype", dtype, f"one of {', '.join(self.peak_flops_per_s)} on {self.key}")
        return self.peak_flops_per_s[dtype]

    def peak_key(self, dtype: str) -> str:
        """The peak a GEMM of ``dtype`` runs at: a low-precision kernel's (mxfp8 -> fp8), else ``dtype``."""
        kernel = self.gemm_kernels.get(dtype)
        return kernel.peak if kernel is not None else dtype

    def efficiency(self, m: float, n: float, k: float, dtype: str | None = None) -> float:
        """Fraction of peak a GEMM of m x n x k reaches: interpolated in log size (cube root of
        m*n*k) on the measured table, clamped at both ends; a low-precision kernel's own table, or
        the bf16 table times its ratio (``GemmKernel``), where ``dtype`` names one."""
        size = max(1.0, m * n * k) ** (1.0 / 3.0)
        kernel = self.gemm_kernels.get(dtype)
        if kernel is not None and kernel.table:
            return interpolate(kernel.table, size)
        return interpolate(self.gemm_efficiency, size) * (kernel.ratio if kernel is not None else 1.0)

    def gemm_time_s(self, m: float, n: float, k: float, dtype: str) -> float:
        """Time of one GEMM (2mnk FLOPs) in ``dtype`` (a peak key, or a low-precision kernel of
        ``gemm_kernels``): the table's time for its volume; where the device has
        ``gemm_shape``, stretched by how much longer the shape model says this shape takes than the
        cube of the same volume (thin shapes: partial waves, traffic), never shortened (the table
        is the measured envelope of square shapes)."""
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        table = self.table_gemm_time_s(m, n, k, dtype)
        if self.gemm_shape is None:
            return table
        c = (m * n * k) ** (1.0 / 3.0)
        kernel = self.gemm_kernels.get(dtype)
        peak = self.peak(self.peak_key(dtype))
        size = kernel.element_bytes if kernel is not None else DTYPE_BYTES.get(dtype, 2)
        shape = self.gemm_shape.time_s(m, n, k, peak, size, self.stream_Bps)
        cube = self.gemm_shape.time_s(c, c, c, peak, size, self.stream_Bps)
        return table * max(1.0, shape / cube)

    def table_gemm_time_s(self, m: float, n: float, k: float, dtype: str) -> float:
        """Time of one GEMM at the cube-root table's efficiency (attention's batched products use
        it on every device: flash attention is not a cuBLAS tile grid)."""
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        return 2.0 * m * n * k / (self.peak(self.peak_key(dtype)) * self.efficiency(m, n, k, dtype))

    def kernel_time_s(self, traffic_bytes: float, launches: int = 1) -> float:
        """Memory-bound kernel: launches x launch overhead + traffic / streaming bandwidth (a codec's traffic is
        its family's, or the equivalent traffic of a published measurement: ``Codec.on``)."""
        if traffic_bytes <= 0 and launches <= 0:
            return 0.0
        return launches * self.launch_s + traffic_bytes / self.stream_Bps


@cache
def gpu_catalog() -> dict[str, Device]:
    out, kernels = {}, read_catalog("precisions")["gemm"]
    for key, d in read_catalog("gpus").items():
        out[key] = Device(key=key, name=d["name"],
                          peak_flops_per_s={k: v * 1e12 for k, v in d["peak_tflops"].items()},
                          hbm_bytes=d["hbm_GiB"] * 2**30, hbm_Bps=TBps_to_Bps(d["hbm_TBps"]),
                          stream_Bps=TBps_to_Bps(d["stream_TBps"]), launch_s=us_to_s(d["kernel_launch_us"]),
                          gemm_efficiency=_size_table(d["gemm_efficiency"]),
                          gemm_shape=_gemm_shape(d.get("gemm_shape")), host_op_s=us_to_s(d.get("host_op_us", 0.0)),
                          gemm_kernels=gemm_kernels(kernels, key, d.get("arch", "")),
                          arch=d.get("arch", ""), source=d["source"], board_power_W=d.get("board_power_W"),
                          power_source=d.get("power_source", ""))
    return out


def interpolate(table: tuple, size: float) -> float:
    """A ((size, fraction), ...) table at ``size``: linear in log size, proportional below the
    first entry, the last one beyond."""
    if size <= table[0][0]:
        return table[0][1] * size / table[0][0]
    for (s0, e0), (s1, e1) in zip(table, table[1:]):
        if size <= s1:
            w = math.log(size / s0) / math.log(s1 / s0)
            return e0 + w * (e1 - e0)
    return table[-1][1]


@dataclass(frozen=True, kw_only=True)
class GemmKernel:
    """A low-precision GEMM kernel on one GPU (catalog/precisions.toml [gemm.*]): the peak it runs at,
    its operands' bytes per element, and its efficiency: its own table, or the GPU's bf16 table
    times ``ratio`` (1.0 where the catalog has neither for this GPU: an assumption)."""

    peak: str
    element_bytes: float
    table: tuple = ()
    ratio: float = 1.0
    source: str = ""


def gemm_kernels(kernels: dict, key: str, arch: str) -> dict[str, GemmKernel]:
    """The low-precision GEMM kernels (``kernels``: precisions.toml's [gemm] table) of GPU ``key``
    (architecture ``arch``): each kernel's entry for the GPU, else for its architecture."""
    out = {}
    for name, body in kernels.items():
        entry = body.get(key) or body.get(arch) or {}
        out[name] = GemmKernel(peak=body["peak"], element_bytes=body["element_bytes"],
                               table=_size_table(entry.get("efficiency", {})),
                               ratio=entry.get("relative_to_bf16", 1.0),
                               source=entry.get("source", "assumption: the GPU's bf16 table"))
    return out


def _size_table(body: dict) -> tuple:
    """A catalog's {size: fraction} efficiency table as ((size, fraction), ...) ascending."""
    return tuple(sorted((float(s), e) for s, e in body.items()))


def _gemm_shape(body: dict | None) -> GemmShape | None:
    if not body:
        return None
    return GemmShape(sm_count=int(body["sm_count"]), tile=int(body["tile"]), peak_fraction=body["peak_fraction"],
                     fixed_s=us_to_s(body["fixed_us"]))


def device(key: str) -> Device:
    devices = gpu_catalog()
    if key not in devices:
        raise InputError("gpu", key, "one of " + ", ".join(devices))
    return devices[key]


@dataclass(frozen=True, kw_only=True)
class Protocol:
    """One NCCL-like protocol on one tier class."""

    name: str
    base_s: float
    step_s: float
    bw_fraction: float
    max_Bps: float = math.inf   # an absolute cap (NCCL's per-architecture maxima), beside the fraction
    # True where step_s is NCCL's measured per-step latency on NVLink inside an NVSwitch node (its
    # hwLat), which already covers the GPU-switch-GPU path: the topology's path latency, which
    # otherwise takes over where longer, does not (perfmodel.collectives.fabric.Link.terms)
    step_includes_path: bool = False


PROTOCOL_NAMES = ("LL", "LL128", "Simple")


@cache
def nccl_arch() -> dict:
    """catalog/nccl_arch.toml: NCCL's per-architecture NVLink constants (its header says how)."""
    return read_catalog("nccl_arch")


def nvlink_for_arch(table: dict, arch: str) -> dict:
    """The nvlink class's protocols on ``arch`` (catalog/nccl_arch.toml), from ``table`` (the A100
    fit): Ampere and unlisted architectures keep it as is; an architecture with ``nccl_protocols``
    gets NCCL's own ring tuning (``nccl_ring_protocols``); any other has LL and LL128 capped at the
    fit's bandwidth scaled by NCCL's ratio of the architecture's cap to Ampere's. Simple's fraction
    of the link is scaled by NCCL's per-link NVLink rate over the line rate, relative to Ampere's
    (``simple_fraction``)."""
    consts = nccl_arch()
    if arch not in consts or arch == "ampere":
        return table
    if consts[arch].get("nccl_protocols"):
        return nccl_ring_protocols(arch, simple_fraction(table, arch))
    ref, mine, amp = consts["reference_GBps"] * 1e9, consts[arch], consts["ampere"]
    ratio = {"LL": mine["ll_max_GBps"] / amp["ll_max_GBps"],
             "LL128": mine["ll128_channel_GBps"] / amp["ll128_channel_GBps"]}
    out = {name: replace(p, max_Bps=p.bw_fraction * ref * ratio[name]) if name in ratio else p
           for name, p in table.items()}
    out["Simple"] = replace(out["Simple"], bw_fraction=simple_fraction(table, arch))
    return out


def simple_fraction(table: dict, arch: str) -> float:
    """Simple's fraction of the spec NVLink bandwidth on ``arch``: the A100 fit's (measured, 0.96 of
    NCCL's per-link rate there) at NCCL's per-link rate of ``arch`` over its line rate."""
    consts = nccl_arch()
    mine, amp = consts[arch], consts["ampere"]
    scale = (mine["nccl_link_GBps"] / mine["spec_link_GBps"]) / (amp["nccl_link_GBps"] / amp["spec_link_GBps"])
    return table["Simple"].bw_fraction * scale


def nccl_ring_protocols(arch: str, simple: float) -> dict:
    """NCCL's ring protocols on NVLink inside one node of ``arch``, as its tuning model prices them
    (catalog/nccl_arch.toml [ring_tuning], from src/graph/tuning.cc): base latency baseLat, per-step
    latency hwLat (which covers the GPU-switch-GPU path), and Simple's bus bandwidth (``simple``, a
    fraction of the spec link) times the protocol's factor, LL capped at llMaxBw and LL128 at
    nChannels x perChMaxRingLL128Bw."""
    consts = nccl_arch()
    tuning, mine = consts["ring_tuning"], consts[arch]
    caps = {"LL": mine["ll_max_GBps"] * 1e9, "LL128": mine["ring_channels"] * mine["ll128_channel_GBps"] * 1e9}
    return {name: Protocol(name=name, base_s=us_to_s(tuning["base_us"][name]),
                           step_s=us_to_s(tuning["step_us"][name]), bw_fraction=simple * tuning["bw_factor"][name],
                           max_Bps=caps.get(name, math.inf), step_includes_path=True) for name in PROTOCOL_NAMES}


def nvls_protocols(arch: str) -> dict | None:
    """NVLS's protocol on ``arch`` (Simple only, as NCCL runs it): ``nvls_latency_us`` once per
    collective (NCCL's NVLS latency, with no base latency beside it), ``nvls_loop_sync_us`` per
    pipeline loop (``perfmodel.collectives.nvls``; fitted as the whole cost of a loop's
    synchronization, so the topology's path latency does not lengthen it); ``nvls_efficiency`` of
    NCCL's own NVLink bandwidth (tuning.cc multiplies the efficiency with the NVLS graph's bandwidth,
    which is NCCL's per-link rate times the links, ``nccl_link_GBps`` of ``spec_link_GBps`` per
    link); None where the architecture has no NVLS."""
    consts = nccl_arch().get(arch, {})
    if not consts.get("nvls_efficiency"):
        return None
    nccl_rate = consts["nccl_link_GBps"] / consts["spec_link_GBps"]
    proto = Protocol(name="Simple", base_s=us_to_s(consts["nvls_latency_us"]),
                     step_s=us_to_s(consts["nvls_loop_sync_us"]), bw_fraction=consts["nvls_efficiency"] * nccl_rate,
                     step_includes_path=True)
    return {"Simple": proto}


@dataclass(frozen=True, kw_only=True)
class NvlsPipeline:
    """How NCCL runs NVLS on one node of an architecture: ``channels`` CTAs, chunks of at most
    ``max_chunk_bytes``, and ``fill_loops`` loops of pipeline fill (catalog/nccl_arch.toml)."""

    channels: int
    max_chunk_bytes: int
    fill_loops: int


@cache
def nvls_pipeline(arch: str) -> NvlsPipeline | None:
    """NVLS's pipeline shape on ``arch``, or None where the architecture has no NVLS. Cached: every
    NVLS all-reduce priced asks for it."""
    consts = nccl_arch().get(arch, {})
    if not consts.get("nvls_efficiency"):
        return None
    return NvlsPipeline(channels=int(consts["nvls_channels"]), max_chunk_bytes=int(consts["nvls_chunk_KiB"]) * 1024,
                        fill_loops=int(consts["nvls_fill_loops"]))


@cache
def protocol_table() -> dict[str, dict[str, Protocol]]:
    """{tier class: {protocol name: Protocol}} for classes nvlink, pcie, net."""
    out = {}
    for cls, body in read_catalog("protocols").items():
        out[cls] = {name: Protocol(name=name, base_s=us_to_s(body[name]["base_us"]),
                                   step_s=us_to_s(body[name]["step_us"]),
                                   bw_fraction=body[name]["bw_fraction"]) for name in PROTOCOL_NAMES}
    return out


def tier_class(tier: str) -> str:
    """Map a tier name to its protocol class: nvlink/xgmi -> nvlink; pcie/xbus -> pcie; tcp-* (gloo
    over TCP, realrun's emulated clusters) -> tcp; else net."""
    if tier in ("nvlink", "xgmi"):
        return "nvlink"
    if tier in ("pcie", "xbus"):
        return "pcie"
    if tier.startswith("tcp"):
        return "tcp"
    return "net"
