"""Catalog files inside perfmodel: GPUs (devices) and collective protocols."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from topologies.errors import InputError
from topologies.units import TBps_to_Bps, us_to_s

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def read_catalog(name: str) -> dict:
    return tomllib.loads((resources.files("perfmodel") / "catalog" / f"{name}.toml").read_text())


@dataclass(frozen=True, kw_only=True)
class Device:
    """A GPU as the model sees it (SI units)."""

    key: str
    name: str
    peak_flops_per_s: dict
    hbm_bytes: float
    hbm_Bps: float
    stream_Bps: float
    launch_s: float
    source: str

    def kernel_time_s(self, traffic_bytes: float, launches: int = 1) -> float:
        """Memory-bound kernel: launches x launch overhead + traffic / streaming bandwidth."""
        if traffic_bytes <= 0 and launches <= 0:
            return 0.0
        return launches * self.launch_s + traffic_bytes / self.stream_Bps


@cache
def gpu_catalog() -> dict[str, Device]:
    out = {}
    for key, d in read_catalog("gpus").items():
        out[key] = Device(key=key, name=d["name"],
                          peak_flops_per_s={k: v * 1e12 for k, v in d["peak_tflops"].items()},
                          hbm_bytes=d["hbm_GB"] * 1e9, hbm_Bps=TBps_to_Bps(d["hbm_TBps"]),
                          stream_Bps=TBps_to_Bps(d["stream_TBps"]), launch_s=us_to_s(d["kernel_launch_us"]),
                          source=d["source"])
    return out


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


PROTOCOL_NAMES = ("LL", "LL128", "Simple")


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
    """Map a tier name to its protocol class: nvlink/xgmi -> nvlink; pcie/xbus -> pcie; else net."""
    if tier in ("nvlink", "xgmi"):
        return "nvlink"
    if tier in ("pcie", "xbus"):
        return "pcie"
    return "net"
