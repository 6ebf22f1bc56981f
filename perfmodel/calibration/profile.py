"""Calibration profiles: measured numbers that replace catalog defaults.

A profile is JSON with a versioned schema (``SCHEMA``) and provenance; everything else is
optional and overrides only what it names:

    {
      "schema": "commpress.calibration/1",
      "provenance": {"machine": "...", "date": "2026-12-01", "packages": {"commpress": "0.1.0"}},
      "devices": {"a100-sxm-80gb": {"stream_TBps": 1.55, "kernel_launch_us": 6.0,
                                    "gemm_efficiency": {"1024": 0.4, "8192": 0.8}},
                  "host-cpu": {"fp32_TFLOPS": 0.042, "gemm_efficiency": {"81": 0.3, "233": 1.0}}},
      "protocols": {"net": {"Simple": {"base_us": 9.0, "step_us": 11.0, "bw_fraction": 0.92}}},
      "compressors": {"sz3": {"ratio": 5.2}, "lossless": {"ratio": 1.08}},
      "kernels": {"int8": {"compress_GBps": 2.1, "decompress_GBps": 4.8,
                           "shared": {"4": {"compress_GBps": 0.9, "decompress_GBps": 1.3}}}},
      "overlap_slowdown": 0.07,
      "runtime": {"calls": {"allreduce:two_phase": {"call_us": 900.0, "ns_per_byte": 0.3}},
                  "transport": {"cpu_us": 40.0, "cpu_ns_per_byte": 1.1}}
    }

``kernels`` gives a spec's measured throughput on the profile's device, per direction (GB/s
of uncompressed bytes, one rank alone); it replaces the traffic model of that spec. Where
ranks share a machine's cores (emulated clusters), ``shared`` gives what each of N ranks
computing at once measured; other rank counts use the explicit core share (perfmodel
``cpu_share``) of the alone numbers. ``in_run`` ({message bytes: factor}) is how much longer
the spec's kernels took inside compressed collectives on N ranks than ``shared`` predicts, by
message size (measured in calibration's compressed runs: ranks not in lockstep, inputs that
no longer fit in cache; on hosts with a fixed CPU share the codec's CPU over the share, as the
kernel numbers themselves are, not its wall seconds, which hold the machine's other load:
``perfmodel.calibration.fit.kernel_seconds``); between sizes it is interpolated in log size, outside them the
nearest measured size holds. It applies where the shared numbers do.

``runtime`` is the runtime's own cost, measured where it runs (realrun on gloo): ``calls`` per
``op:algorithm`` of its compressed collectives the seconds a call takes beyond its wire time and
kernels (Python, payload assembly and parsing, the extra tensor copies), ``call_us +
ns_per_byte x message bytes`` (on hosts with a fixed CPU share the calling thread's CPU beyond
its kernels over the share: ``perfmodel.calibration.fit.call_seconds``); ``transport`` the CPU its socket transport burns per call and
per byte a rank sends, which a host with a fixed CPU share takes from the compute beside an
overlapped transfer (perfmodel.engines.analytical). Both may carry ``*_sd`` (standard errors)
and ``records``.

Every perfmodel command takes ``--calibration PROFILE.json``; a bad or foreign file is one
clear error, as is a number outside its declared bound (``topologies.bounds``: a device's rates,
kernel throughputs, protocol costs), which ``perfmodel calibrate`` also checks before it writes
one. Compressor ratios apply to specs that do not give their own ``ratio``.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache

from perfmodel.devices import PROTOCOL_NAMES, Device, Protocol, gpu_catalog, protocol_table
from perfmodel.collectives.fabric import PAIR
from perfmodel.collectives.transfers import PRIMITIVES
from perfmodel.compression.codec import Codec, compile_spec
from perfmodel.compression.families import data_dependent
from perfmodel.collectives.library import DEFAULT as DEFAULT_LIBRARY
from perfmodel.collectives.library import Library, libraries, library
from topologies import bounds
from topologies.errors import InputError
from topologies.units import TBps_to_Bps, us_to_s

SCHEMA = "commpress.calibration/1"
TOP = ("schema", "provenance", "devices", "protocols", "primitives", "compressors", "kernels", "fits",
       "overlap_slowdown", "runtime")
CALL_KEYS = ("call_us", "ns_per_byte")
TRANSPORT_KEYS = ("cpu_us", "cpu_ns_per_byte")
KERNEL_KEYS = ("compress_GBps", "decompress_GBps")
# a device's measured numbers and their declared bounds (topologies.bounds); gemm_efficiency: a table of (0, 1]
DEVICE_BOUNDS = {"stream_TBps": "memory_TBps", "hbm_TBps": "memory_TBps", "kernel_launch_us": "kernel_launch_us",
                 "fp32_TFLOPS": "fp32_TFLOPS", "eager_score_ns": "eager_score_ns"}
DEVICE_KEYS = (*DEVICE_BOUNDS, "gemm_efficiency")
# how much longer a spec's kernels may take inside a run than alone: 1000x is no contention but a
# mislabelled record (measured: 1-3x)
MAX_IN_RUN = 1e3
PROTOCOL_KEYS = ("base_us", "step_us", "bw_fraction")


@dataclass(frozen=True, kw_only=True, eq=False)
class Calibration:
    path: str
    provenance: dict
    devices: dict
    protocols: dict
    ratios: dict
    overlap_slowdown: float | None
    primitives: dict = field(default_factory=dict)  # {tier class: {primitive: {"step_us", "bw_fraction"}}}
    # {canonical spec (profile ratios applied): {ranks: (compress_Bps, decompress_Bps)}}
    kernels: dict = field(default_factory=dict)
    in_run: dict = field(default_factory=dict)   # {canonical spec: ((message bytes, factor), ...)}
    calls: dict = field(default_factory=dict)    # {(op, algorithm): (seconds per call, seconds per byte)}
    transport: tuple | None = None               # (CPU seconds per call, CPU seconds per byte sent)
    library: Library | None = None               # the collective library (perfmodel.collectives.library); None: NCCL

    @property
    def lib(self) -> Library:
        return self.library or library(DEFAULT_LIBRARY)

    def call_cost(self, op: str, algorithm: str, size_bytes: float) -> float:
        """Seconds a runtime's compressed ``op`` by ``algorithm`` takes beyond wire and kernels
        (0.0 where the profile did not measure it)."""
        found = self.calls.get((op, algorithm))
        return found[0] + found[1] * size_bytes if found else 0.0

    def transport_cpu_s(self, calls: float, sent_bytes: float) -> float | None:
        """CPU seconds the socket transport takes for ``calls`` calls sending ``sent_bytes`` in
        all, or None where the profile did not measure it."""
        return None if self.transport is None else self.transport[0] * calls + self.transport[1] * sent_bytes

    def in_run_factor(self, spec_text: str, size_bytes: float) -> float:
        """How much longer the spec's kernels take inside a run of this message size than the
        shared benchmark says (1.0 where not measured; log-size interpolation, ends held)."""
        table = self.in_run.get(spec_text)
        if not table or size_bytes <= 0:
            return 1.0
        if size_bytes <= table[0][0]:
            return table[0][1]
        for (s0, f0), (s1, f1) in zip(table, table[1:]):
            if size_bytes <= s1:
                return f0 + (f1 - f0) * math.log(size_bytes / s0) / math.log(s1 / s0)
        return table[-1][1]

    def kernel(self, spec_text: str, ranks: int = 1):
        """((compress_Bps, decompress_Bps), measured with ``ranks`` sharing the machine?) for a
        canonical spec, or None: the numbers for ``ranks`` where measured, else alone."""
        table = self.kernels.get(spec_text)
        if not table:
            return None
        return (table[ranks], True) if ranks in table else (table[1], False)

    def device(self, dev: Device) -> Device:
        return _calibrated_device(self, dev)

    def _device(self, dev: Device) -> Device:
        over = self.devices.get(dev.key)
        if not over:
            return dev
        changes = {}
        if "stream_TBps" in over:
            changes["stream_Bps"] = TBps_to_Bps(over["stream_TBps"])
        if "hbm_TBps" in over:
            changes["hbm_Bps"] = TBps_to_Bps(over["hbm_TBps"])
        if "kernel_launch_us" in over:
            changes["launch_s"] = us_to_s(over["kernel_launch_us"])
        if "gemm_efficiency" in over:
            changes["gemm_efficiency"] = tuple(sorted((float(k), v) for k, v in over["gemm_efficiency"].items()))
            changes["gemm_shape"] = None     # a measured table replaces the catalog's shape model
        if "eager_score_ns" in over:   # eager ring attention's elementwise work, timed (perfmodel.step.compute)
            changes["eager_score_s"] = over["eager_score_ns"] * 1e-9
        if "fp32_TFLOPS" in over:   # a measured peak (a CPU's, whose clock the catalog cannot know)
            changes["peak_flops_per_s"] = {**dev.peak_flops_per_s, "fp32": over["fp32_TFLOPS"] * 1e12}
        return replace(dev, **changes)

    def protocol_table(self, tier_class: str) -> dict:
        """The library's protocols of ``tier_class`` with the profile's measured constants over them
        (a measured protocol the library does not have, NCCL's LL under MPI, does not apply)."""
        table = dict(self.lib.table(tier_class))
        for name, over in self.protocols.get(tier_class, {}).items():
            if name not in table:
                continue
            p = table[name]
            table[name] = Protocol(name=name, base_s=us_to_s(over.get("base_us", p.base_s * 1e6)),
                                   step_s=us_to_s(over.get("step_us", p.step_s * 1e6)),
                                   bw_fraction=over.get("bw_fraction", p.bw_fraction), max_Bps=p.max_Bps)
        return table

    def primitive_table(self, tier_class: str) -> dict:
        """{primitive: Protocol} measured for a runtime's primitives on a tier class (may be empty)."""
        return _primitive_table(self, tier_class)

    def spec(self, text: str) -> str:
        """``text``'s canonical form with the profile's ratio on every data-dependent stage that has none."""
        return self.codec(compile_spec(text)).text

    def codec(self, codec: Codec) -> Codec:
        """``codec`` with the profile's ratios applied (the same object when there are none)."""
        return codec if not self.ratios else _calibrated_codec(self, codec)


@lru_cache(maxsize=4096)
def _calibrated_codec(calib: Calibration, codec: Codec) -> Codec:
    return codec.with_ratios(calib.ratios)


@lru_cache(maxsize=64)
def _calibrated_device(calib: Calibration, dev: Device) -> Device:
    return calib._device(dev)


@lru_cache(maxsize=64)
def _primitive_table(calib: Calibration, tier_class: str) -> dict:
    return {name: Protocol(name=name, base_s=0.0, step_s=us_to_s(v["step_us"]), bw_fraction=v["bw_fraction"])
            for name, v in calib.primitives.get(tier_class, {}).items()}


def _fail(key, value, allowed):
    raise InputError(f"calibration.{key}", value, allowed)


def _number(key, value, low=0.0, high=float("inf")):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low < value <= high:
        _fail(key, value, f"a finite number in ({low}, {high}]")
    return float(value)


def _declared(key: str, value, name: str) -> float:
    """``value`` within the declared bound ``name`` (topologies.bounds), above its lowest value."""
    return _number(key, value, *bounds.bound(name)[1:])


def _gemm_size(key: str, size: str) -> None:
    """A key of a GEMM efficiency table: the GEMM's size (a number, within its declared bound)."""
    try:
        value = float(size)
    except ValueError:
        _fail(key, size, "GEMM sizes as keys (numbers such as \"1024\"), " + bounds.describe("gemm_size"))
    if not bounds.bound("gemm_size")[1] <= value <= bounds.bound("gemm_size")[2]:
        _fail(key, size, "GEMM sizes as keys, " + bounds.describe("gemm_size"))


def _section(raw: dict, key: str, depth: int = 1) -> dict:
    """``raw[key]`` (default empty), refused unless it is a JSON object, as are its values
    ``depth`` levels down."""
    value = raw.get(key, {})
    if not isinstance(value, dict):
        _fail(key, value, "a JSON object")
    if depth > 1:
        for sub, inner in value.items():
            if not isinstance(inner, dict):
                _fail(f"{key}.{sub}", inner, "a JSON object")
    return value


def _check_kernel(key: str, over, optional: set) -> None:
    if not isinstance(over, dict) or not set(KERNEL_KEYS) <= set(over) <= set(KERNEL_KEYS) | optional:
        _fail(key, over, "{" + ", ".join(f'"{k}": GB/s' for k in KERNEL_KEYS)
              + (", \"shared\": {RANKS: {...}}" if optional else "") + "}")
    for k in KERNEL_KEYS:
        _declared(f"{key}.{k}", over[k], k)


def _check(raw: dict) -> None:
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        _fail("schema", raw.get("schema") if isinstance(raw, dict) else raw, f"'{SCHEMA}'")
    for key in raw:
        if key not in TOP:
            _fail(key, raw[key], "not a profile key; allowed: " + ", ".join(TOP))
    for key in ("devices", "protocols", "compressors", "primitives", "kernels"):
        _section(raw, key, depth=2)
    _section(raw, "provenance")
    gpus = gpu_catalog()
    for gpu, over in raw.get("devices", {}).items():
        if gpu not in gpus:
            _fail(f"devices.{gpu}", over, "a GPU of the catalog: " + ", ".join(gpus))
        for k, v in over.items():
            if k not in DEVICE_KEYS:
                _fail(f"devices.{gpu}.{k}", v, "one of " + ", ".join(DEVICE_KEYS))
            if k == "gemm_efficiency":
                if not isinstance(v, dict):
                    _fail(f"devices.{gpu}.gemm_efficiency", v, "a JSON object of GEMM size: efficiency")
                for size, eff in v.items():
                    _gemm_size(f"devices.{gpu}.gemm_efficiency", size)
                    _number(f"devices.{gpu}.gemm_efficiency.{size}", eff, 0.0, 1.0)
            else:
                _declared(f"devices.{gpu}.{k}", v, DEVICE_BOUNDS[k])
    for cls, protos in raw.get("protocols", {}).items():
        if cls not in protocol_table():
            _fail(f"protocols.{cls}", protos, "one of " + ", ".join(protocol_table()))
        for name, over in protos.items():
            if name not in _protocol_names() or not isinstance(over, dict):
                _fail(f"protocols.{cls}.{name}", over, "an object for one of " + ", ".join(_protocol_names()))
            for k, v in over.items():
                if k not in PROTOCOL_KEYS:
                    _fail(f"protocols.{cls}.{name}.{k}", v, "one of " + ", ".join(PROTOCOL_KEYS))
                _number(f"protocols.{cls}.{name}.{k}", v, -1e-12 if k != "bw_fraction" else 0.0,
                        1.0 if k == "bw_fraction" else bounds.bound(k)[2])
    for family, over in raw.get("compressors", {}).items():
        if family not in data_dependent() or set(over) != {"ratio"}:
            _fail(f"compressors.{family}", over, "{\"ratio\": R} for one of " + ", ".join(data_dependent()))
        _number(f"compressors.{family}.ratio", over["ratio"], 0.999999, bounds.bound("size_bytes")[2])
    for cls, prims in raw.get("primitives", {}).items():
        if cls not in protocol_table():
            _fail(f"primitives.{cls}", prims, "one of " + ", ".join(protocol_table()))
        for name, over in prims.items():
            if name.removesuffix(PAIR) not in PRIMITIVES or not isinstance(over, dict) \
                    or set(over) != {"step_us", "bw_fraction"}:
                _fail(f"primitives.{cls}.{name}", over, "{\"step_us\": us, \"bw_fraction\": f} for one of "
                      + ", ".join(PRIMITIVES) + f" (or NAME{PAIR}: two ranks on two hosts)")
            _number(f"primitives.{cls}.{name}.step_us", over["step_us"], -1e-12, bounds.bound("step_us")[2])
            _number(f"primitives.{cls}.{name}.bw_fraction", over["bw_fraction"], 0.0, 1.0)
    for spec, over in raw.get("kernels", {}).items():
        _check_kernel(f"kernels.{spec}", over, {"shared", "in_run"})
        for size, factor in _section(over, "in_run").items():
            if not size.isdigit() or int(size) < 1:
                _fail(f"kernels.{spec}.in_run.{size}", factor, "a message size in bytes as the key")
            _number(f"kernels.{spec}.in_run.{size}", factor, 0.0, MAX_IN_RUN)
        for ranks, shared in _section(over, "shared").items():
            if not ranks.isdigit() or int(ranks) < 2:
                _fail(f"kernels.{spec}.shared.{ranks}", shared, "a rank count >= 2 as the key")
            _check_kernel(f"kernels.{spec}.shared.{ranks}", shared, set())
    if "overlap_slowdown" in raw:
        _number("overlap_slowdown", raw["overlap_slowdown"], -1e-12, 0.999)
    _check_runtime(_section(raw, "runtime"))


def _check_terms(key: str, over, names: tuple) -> None:
    """``over`` holds the non-negative terms ``names`` (each may carry its ``*_sd``) and ``records``."""
    allowed = set(names) | {f"{n}_sd" for n in names} | {"records"}
    if not isinstance(over, dict) or not set(names) <= set(over) <= allowed:
        _fail(key, over, "{" + ", ".join(f'"{n}": number' for n in names) + "} (optionally *_sd and records)")
    for k, v in over.items():
        _number(f"{key}.{k}", v, -1e-12, 1e9)


def _check_runtime(runtime: dict) -> None:
    for k in runtime:
        if k not in ("calls", "transport"):
            _fail(f"runtime.{k}", runtime[k], "calls or transport")
    for name, over in _section(runtime, "calls").items():
        op, _, alg = name.partition(":")
        if op not in PRIMITIVES or not alg:
            _fail(f"runtime.calls.{name}", over, "a key OP:ALGORITHM (allreduce:two_phase)")
        _check_terms(f"runtime.calls.{name}", over, CALL_KEYS)
    if "transport" in runtime:
        _check_terms("runtime.transport", runtime["transport"], TRANSPORT_KEYS)


@lru_cache(maxsize=16)
def _load(path: str, mtime: float) -> Calibration:
    try:
        with open(path) as handle:
            raw = json.load(handle)
    except OSError as err:
        raise InputError("calibration", path, f"a readable profile file ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise InputError("calibration", path, f"a JSON calibration profile ({err.msg} at line {err.lineno})") from None
    except UnicodeDecodeError:
        raise InputError("calibration", path, "a UTF-8 JSON calibration profile") from None
    except RecursionError:
        raise InputError("calibration", path, "a JSON profile nested at most a few levels") from None
    return from_profile(raw, path)


def from_profile(raw: dict, path: str = "<profile>") -> Calibration:
    """A Calibration from a profile already in memory (checked as a file would be)."""
    _check(raw)
    ratios = {k: v["ratio"] for k, v in raw.get("compressors", {}).items()}
    kernels, in_run = {}, {}
    for spec, over in raw.get("kernels", {}).items():
        try:
            text = compile_spec(spec).with_ratios(ratios).text
        except InputError as err:
            raise InputError(f"calibration.kernels.{spec}", spec, f"a compressor spec ({err})") from None
        kernels[text] = {int(r): (v["compress_GBps"] * 1e9, v["decompress_GBps"] * 1e9)
                         for r, v in [("1", over)] + sorted(over.get("shared", {}).items())}
        if over.get("in_run"):
            in_run[text] = tuple(sorted((int(k), float(v)) for k, v in over["in_run"].items()))
    runtime = raw.get("runtime", {})
    calls = {tuple(k.split(":", 1)): (v["call_us"] * 1e-6, v["ns_per_byte"] * 1e-9)
             for k, v in runtime.get("calls", {}).items()}
    t = runtime.get("transport")
    return Calibration(path=path, provenance=raw.get("provenance", {}), devices=raw.get("devices", {}),
                       protocols=raw.get("protocols", {}), ratios=ratios, primitives=raw.get("primitives", {}),
                       overlap_slowdown=raw.get("overlap_slowdown"), kernels=kernels, in_run=in_run, calls=calls,
                       transport=(t["cpu_us"] * 1e-6, t["cpu_ns_per_byte"] * 1e-9) if t else None)


def _protocol_names() -> tuple:
    """Protocol names a profile may measure: NCCL's and every library's."""
    return tuple(dict.fromkeys(PROTOCOL_NAMES + tuple(n for lib in libraries().values() for n in lib.protocol_names())))


def load_profile(path, library_name: str | None = None) -> Calibration | None:
    """The profile at ``path`` (or none; a Calibration already built, ``from_profile``, as it is)
    priced with the collective library ``library_name`` (``perfmodel.collectives.library``; None or nccl:
    NCCL, and None without a profile, as before)."""
    lib = library(library_name)
    calib = path if isinstance(path, Calibration) else load_calibration(path)
    if lib.name == DEFAULT_LIBRARY:
        return calib
    return _with_library(calib, lib)


@lru_cache(maxsize=64)
def _with_library(calib: Calibration | None, lib: Library) -> Calibration:
    """``calib`` (or an empty profile) with ``lib``: one object per pair, so caches keyed on it hold."""
    return replace(calib or from_profile({"schema": SCHEMA}, f"<library {lib.name}>"), library=lib)


def load_calibration(path: str | None) -> Calibration | None:
    """The validated profile at ``path`` (None for None); reloaded when the file changes."""
    if path is None:
        return None
    if not os.path.isfile(path):
        raise InputError("calibration", path, "an existing calibration profile (JSON)")
    return _load(os.path.abspath(path), os.path.getmtime(path))
