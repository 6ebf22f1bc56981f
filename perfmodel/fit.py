"""Fit a calibration profile from measurement records (``perfmodel calibrate``).

Three fits, each a small least-squares problem (scipy, robust ``soft_l1`` loss on relative
residuals, so one noisy run does not move the answer and small messages weigh as much as
large ones):

1. **Kernels**, per compressor spec and direction: ``t = launch + bytes / throughput`` over the
   sizes of the kernel records -> ``kernels[spec]`` (GB/s) and the device's
   ``kernel_launch_us`` (median of the per-spec intercepts).
2. **Ratios** of data-dependent specs (zfp tolerance or precision, sz3, lossless): the median
   measured ``size / wire`` -> ``compressors[family].ratio``.
3. **Tiers**, from uncompressed collective records: the model's own decomposition of each
   record's algorithm into phases on links gives, per tier class, the steps and the
   bytes-over-link-bandwidth it pays; ``t = base + alpha x steps + beta' x bytes / bandwidth``
   is linear in (base, alpha, 1 / bw_fraction) -> ``protocols[class]`` (one measured
   protocol: all three protocol names get the fitted values).

Residuals and R^2 of every fit go into the profile under ``fits``.
"""
from __future__ import annotations

import math
import platform
import statistics
from datetime import date

import numpy as np
from scipy.optimize import least_squares

from perfmodel.calibration import SCHEMA
from perfmodel.catalogs import PROTOCOL_NAMES, tier_class
from perfmodel.collective import DTYPES, _resolve, candidates
from perfmodel.collectives.compressed import Msg
from perfmodel.compression import compile_spec
from topologies import build_cluster
from topologies.errors import InputError
import contextlib

SPARSE = ("topk", "randk")
CAST = ("fp16", "bf16")


def model_algorithm(op: str, compressor: str, algorithm: str) -> str:
    """The model's algorithm for what realrun ran: ``auto`` is torch's ring for ``none`` and the
    casts (reducible), the all-gather path for sparse specs and two-phase for the rest."""
    if algorithm != "auto":
        return algorithm
    names = [f.NAME for f in compile_spec(compressor).families]
    if not names or names == ["none"] or (len(names) == 1 and names[0] in CAST) or op != "allreduce":
        return "ring"
    return "allgather" if set(names) & set(SPARSE) else "two_phase"


def phases_of(record: dict, cluster: str, calibration=None) -> tuple:
    """The model's AlgoCost for a collective record on ``cluster`` (``world`` hosts' ranks)."""
    built = build_cluster(cluster)
    if record["world"] > built.gpus:
        raise InputError("world", record["world"], f"at most the {built.gpus} ranks of {cluster}")
    ctx = _resolve(built, record["world"], "packed", (), calibration)
    codec = compile_spec(calibration.spec(record["compressor"]) if calibration else record["compressor"])
    table = candidates(record["op"], codec, ctx, nccl_only=False)
    alg = model_algorithm(record["op"], record["compressor"], record["algorithm"])
    if alg not in table:
        raise InputError("algorithm", record["algorithm"], "one of " + ", ".join(sorted(table)))
    msg = Msg(size_bytes=record["size_bytes"], dtype_bytes=DTYPES["fp32"], codec=codec)
    return table[alg](ctx, msg), ctx


def _features(cost) -> dict:
    """{tier class: [steps, seconds at the full link bandwidth]} (bandwidth-bound phase per stage)."""
    out: dict = {}
    for phases in cost.stages:
        if not phases:
            continue
        ph = max(phases, key=lambda p: p.nbytes / p.link.bandwidth_Bps)
        row = out.setdefault(tier_class(ph.link.tier), [0.0, 0.0])
        row[0] += ph.steps
        row[1] += ph.nbytes / ph.link.bandwidth_Bps
    return out


def _robust(fun, x0, lower):
    return least_squares(fun, x0, bounds=(lower, np.inf), loss="soft_l1", f_scale=0.05, x_scale="jac")


def _r2(measured, predicted) -> float:
    y, f = np.asarray(measured), np.asarray(predicted)
    total = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - f) ** 2)) / total if total > 0 else 1.0


def fit_tiers(records: list[dict], cluster: str) -> tuple[dict, dict]:
    """(protocols section, fit report) from uncompressed collective records."""
    rows = [r for r in records if r["kind"] == "collective" and compile_spec(r["compressor"]).is_none
            and r["time_s"] > 0 and r["world"] > 1]
    if not rows:
        return {}, {}
    feats = [_features(phases_of(r, r.get("cluster", cluster))[0]) for r in rows]
    classes = sorted({c for f in feats for c in f})
    times = np.array([r["time_s"] for r in rows])
    design = np.array([[1.0] + [f.get(c, [0.0, 0.0])[k] for c in classes for k in (0, 1)] for f in feats])

    def residual(x):
        return (design @ x - times) / times

    x0 = np.array([1e-4] + [1e-4, 1.0] * len(classes))
    sol = _robust(residual, x0, [0.0] + [0.0, 1.0] * len(classes))
    base, pred = sol.x[0], design @ sol.x
    out = {}
    for i, cls in enumerate(classes):
        alpha, inv_frac = sol.x[1 + 2 * i], sol.x[2 + 2 * i]
        values = {"base_us": base * 1e6, "step_us": alpha * 1e6, "bw_fraction": min(1.0, 1.0 / inv_frac)}
        out[cls] = {name: dict(values) for name in PROTOCOL_NAMES}
    return out, {"records": len(rows), "classes": classes, "r2": _r2(times, pred),
                 "mape": float(np.mean(np.abs(pred - times) / times)),
                 "residuals": [{"size_bytes": r["size_bytes"], "world": r["world"],
                                "cluster": r.get("cluster", cluster), "measured_s": float(t), "fitted_s": float(p)}
                               for r, t, p in zip(rows, times, pred)]}


def _line(sizes, times) -> tuple[float, float]:
    """(intercept s, throughput B/s) of t = a + size / T, robustly; one size: a = 0."""
    sizes, times = np.asarray(sizes, float), np.asarray(times, float)
    if len(set(sizes)) == 1:
        return 0.0, float(np.median(sizes / times))
    sol = _robust(lambda x: (x[0] + sizes * x[1] - times) / times, np.array([1e-5, 1e-9]), [0.0, 1e-15])
    return float(sol.x[0]), 1.0 / float(sol.x[1])


def fit_kernels(records: list[dict]) -> tuple[dict, float | None, dict, dict]:
    """(kernels section, launch seconds or None, ratios, report) from kernel records."""
    by_spec: dict = {}
    for r in records:
        if r["kind"] == "kernel" and not compile_spec(r["compressor"]).is_none and r["compress_s"] > 0:
            by_spec.setdefault(r["compressor"], []).append(r)
    kernels, intercepts, ratios, report = {}, [], {}, {}
    for spec, rows in sorted(by_spec.items()):
        sizes = [r["size_bytes"] for r in rows]
        a_c, t_c = _line(sizes, [r["compress_s"] for r in rows])
        a_d, t_d = _line(sizes, [r["decompress_s"] for r in rows])
        kernels[spec] = {"compress_GBps": t_c / 1e9, "decompress_GBps": t_d / 1e9}
        intercepts += [a_c, a_d]
        fitted = [a_c + s / t_c for s in sizes]
        report[spec] = {"records": len(rows), "r2_compress": _r2([r["compress_s"] for r in rows], fitted)}
        codec = compile_spec(spec)
        if not codec.exact and len(codec.families) == 1:
            ratios[codec.families[0].NAME] = {"ratio": statistics.median(r["size_bytes"] / r["wire_bytes"]
                                                                         for r in rows)}
    launch = statistics.median(intercepts) if intercepts else None
    return kernels, launch, ratios, report


def provenance(sources: list[str]) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    packages = {}
    for name in ("commpress", "numpy", "scipy", "torch"):
        with contextlib.suppress(PackageNotFoundError):
            packages[name] = version(name)
    return {"machine": f"{platform.node()} {platform.machine()} {platform.system()}",
            "date": date.today().isoformat(), "packages": packages, "records": sources}


def fit_profile(records: list[dict], cluster: str, sources=()) -> dict:
    """A complete profile (schema, provenance, fitted sections, fit report) for ``cluster``."""
    device = build_cluster(cluster).gpu_model
    kernels, launch, ratios, k_report = fit_kernels(records)
    protocols, t_report = fit_tiers(records, cluster)
    if not kernels and not protocols:
        raise InputError("records", f"{len(records)} records",
                         "kernel records or uncompressed collective records (realrun bench --json)")
    profile = {"schema": SCHEMA, "provenance": provenance(list(sources))}
    if launch is not None and launch > 0:
        profile["devices"] = {device: {"kernel_launch_us": max(launch * 1e6, 0.01)}}
    if protocols:
        profile["protocols"] = protocols
    if ratios:
        profile["compressors"] = ratios
    if kernels:
        profile["kernels"] = kernels
    profile["fits"] = {"cluster": cluster, "tiers": t_report, "kernels": k_report}
    return profile


def summary(profile: dict) -> list[tuple]:
    """Rows (what, value, fit) for a table of the fitted numbers."""
    rows = []
    tiers = profile.get("fits", {}).get("tiers", {})
    for cls, protos in profile.get("protocols", {}).items():
        p = protos["Simple"]
        rows.append((f"tier {cls}", f"base {p['base_us']:.1f} us, alpha {p['step_us']:.1f} us/step, "
                     f"bw_fraction {p['bw_fraction']:.3f}", f"R2 {tiers.get('r2', math.nan):.4f}, "
                     f"MAPE {100 * tiers.get('mape', math.nan):.1f}% over {tiers.get('records', 0)}"))
    for dev, over in profile.get("devices", {}).items():
        rows.append((f"device {dev}", f"launch {over['kernel_launch_us']:.1f} us", "median intercept"))
    for spec, k in profile.get("kernels", {}).items():
        r2 = profile["fits"]["kernels"].get(spec, {}).get("r2_compress", math.nan)
        rows.append((f"kernel {spec}", f"compress {k['compress_GBps']:.3f} GB/s, decompress "
                     f"{k['decompress_GBps']:.3f} GB/s", f"R2 {r2:.3f}"))
    for family, r in profile.get("compressors", {}).items():
        rows.append((f"ratio {family}", f"{r['ratio']:.2f}x", "median"))
    return rows
