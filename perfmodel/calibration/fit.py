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

4. **Compute**, from compute records (a training step's GEMMs, attention and memory-bound
   work timed on the device): the device's GEMM efficiency table and streaming rate.
5. **The runtime's own costs**: per ``op:algorithm`` of the compressed collective records, the
   seconds beyond what the fitted tiers and kernels explain, ``call + per_byte x size``
   (``runtime.calls``; on hosts with a fixed CPU share the calling thread's CPU beyond its
   kernels over the share, ``call_seconds``, as the in-run kernel factor is the codec's CPU over
   the share, ``kernel_seconds``: wall seconds there hold the machine's other load); from the
   CPU seconds of the uncompressed records (``cpu_s``), the CPU the transport burns,
   ``cpu_call + cpu_per_byte x bytes sent`` (``runtime.transport``). Both with standard errors
   from the fit's Jacobian.

Residuals and R^2 of every fit go into the profile under ``fits``.
"""
from __future__ import annotations

import contextlib
import math
import platform
import statistics
from datetime import date

import numpy as np
from scipy.optimize import least_squares

from perfmodel.calibration.measurements import compute_seconds, has_quota
from perfmodel.calibration.profile import SCHEMA, from_profile
from perfmodel.devices import PROTOCOL_NAMES, tier_class
from perfmodel.devices import device as catalog_device
from perfmodel.collectives.predict import resolve_context
from perfmodel.collectives.fabric import PAIR
from perfmodel.collectives.transfers import evaluate
from perfmodel.collectives.runtime import runtime_cost
from perfmodel.compression import compile_spec
from topologies import build_cluster
from topologies.errors import InputError

def phases_of(record: dict, cluster: str, calibration=None, with_pair: bool = False):
    """The model's AlgoCost of what realrun ran for a collective record (``world`` ranks); with
    ``with_pair``, also whether the group is two ranks on two hosts (its primitives ``@pair``)."""
    ctx, cost = _priced(record, cluster, calibration)
    return (cost, ctx.ranks == 2 and ctx.hosts == 2) if with_pair else cost


def _priced(record: dict, cluster: str, calibration=None) -> tuple:
    """(context, AlgoCost) of what realrun ran for a collective record on ``cluster``."""
    built = build_cluster(cluster)
    if record["world"] > built.gpus:
        raise InputError("world", record["world"], f"at most the {built.gpus} ranks of {cluster}")
    ctx = resolve_context(built, record["world"], "packed", (), calibration)
    return ctx, runtime_cost(record["op"], record["size_bytes"], record["compressor"], record["algorithm"], ctx,
                             calibration)[1]


def _features(cost, pair: bool = False) -> dict:
    """{(tier class, primitive): [steps, seconds at the full link bandwidth]}: the bandwidth-bound
    phase of each stage; a two-host pair's primitives are their own (``NAME@pair``)."""
    out: dict = {}
    for phases in cost.rounds:
        if not phases:
            continue
        ph = max(phases, key=lambda p: p.nbytes / p.link.bandwidth_Bps)
        prim = (ph.primitive or "allreduce") + (PAIR if pair else "")
        row = out.setdefault((ph.link.cls or tier_class(ph.link.tier), prim), [0.0, 0.0])
        row[0] += ph.steps
        row[1] += ph.nbytes / ph.link.bandwidth_Bps
    return out


def _robust(fun, x0, lower):
    """soft_l1 with f_scale 0.05: relative residuals up to ~5% count as squares, larger ones
    linearly (a run disturbed by another process on a shared machine does not steer the fit)."""
    return least_squares(fun, x0, bounds=(lower, np.inf), loss="soft_l1", f_scale=0.05, x_scale="jac")


def _r2(measured, predicted) -> float:
    y, f = np.asarray(measured), np.asarray(predicted)
    total = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - f) ** 2)) / total if total > 0 else 1.0


# pair records fitted from this size up: below it an emulated link's token bucket (128 KiB of
# burst) rather than its rate sets the time, and the pair's bandwidth is what is sought
PAIR_MIN_BYTES = 2**20


def fit_tiers(records: list[dict], cluster: str) -> tuple[dict, dict, dict]:
    """(protocols section, primitives section, fit report) from uncompressed collective records:
    one shared base latency, and per (tier class, primitive) a step latency and a bandwidth
    fraction, and per primitive a bandwidth fraction for a pair of hosts (``NAME@pair``: each
    rank sends to and receives from the same peer; the step latency is the primitive's), the
    pair's from its records of ``PAIR_MIN_BYTES`` and more. A class's protocol takes the values of its
    ``allreduce`` primitive (torch's own all-reduce) where measured, else of its first."""
    rows = [r for r in records if r["kind"] == "collective" and compile_spec(r["compressor"]).is_none
            and r["time_s"] > 0 and r["world"] > 1]
    if not rows:
        return {}, {}, {}
    feats = [_features(*phases_of(r, r.get("cluster", cluster), with_pair=True)) for r in rows]
    times = np.array([r["time_s"] for r in rows])
    small_pair = [any(p.endswith(PAIR) for _, p in f) and r["size_bytes"] < PAIR_MIN_BYTES for f, r in zip(feats, rows)]
    used = [i for i, small in enumerate(small_pair) if not small] or list(range(len(rows)))
    base, fitted = _fit_shared_steps([feats[i] for i in used], times[used])
    pred = np.array([base + sum(v[0] * fitted[k]["step_us"] / 1e6 + v[1] / fitted[k]["bw_fraction"]
                                for k, v in f.items()) for f in feats])
    protocols, primitives = {}, {}
    for cls in sorted({c for c, _ in fitted}):
        prims = {prim: v for (c, prim), v in fitted.items() if c == cls}
        main = prims.get("allreduce") or next((v for k, v in prims.items() if not k.endswith(PAIR)), None) \
            or next(iter(prims.values()))
        protocols[cls] = {name: {"base_us": base * 1e6, **main} for name in PROTOCOL_NAMES}
        primitives[cls] = prims
    report = {"records": len(rows), "parameters": 1 + len(fitted) + len({(c, p.removesuffix(PAIR)) for c, p in fitted}),
              "r2": _r2(times, pred),
              "mape": float(np.mean(np.abs(pred - times) / times)),
              "residuals": [{"size_bytes": r["size_bytes"], "world": r["world"], "algorithm": r["algorithm"],
                             "cluster": r.get("cluster", cluster), "measured_s": float(t), "fitted_s": float(p)}
                            for r, t, p in zip(rows, times, pred)]}
    return protocols, primitives, report


def tier_keys(feats: list[dict]) -> tuple[list, list]:
    """(step keys, bandwidth keys) of the tier fit's columns: a bandwidth per (class, primitive[@pair]),
    a step latency per (class, primitive) shared by its ``@pair`` variant."""
    beta_keys = sorted({k for f in feats for k in f})
    return sorted({(c, p.removesuffix(PAIR)) for c, p in beta_keys}), beta_keys


def tier_design_matrix(feats: list[dict], step_keys: list, beta_keys: list) -> np.ndarray:
    """The tier fit's design: a row per record, columns base, steps per step key, seconds at full link
    bandwidth per bandwidth key (``_fit_shared_steps``; perfmodel.calibration.userfiles reuses it)."""
    return np.array([[1.0] + [sum(v[0] for (c, p), v in f.items() if (c, p.removesuffix(PAIR)) == k)
                              for k in step_keys] + [f.get(k, [0.0, 0.0])[1] for k in beta_keys] for f in feats]
                    ).reshape(len(feats), 1 + len(step_keys) + len(beta_keys))


def _fit_shared_steps(feats: list[dict], times) -> tuple[float, dict]:
    """(base s, {(class, primitive): {step_us, bw_fraction}}): ``t = base + sum of step x steps +
    beta x bytes / bandwidth``, with one step latency per primitive shared by its ``@pair``
    variant (only the bandwidth differs between a pair of hosts and larger groups)."""
    step_keys, beta_keys = tier_keys(feats)
    design = tier_design_matrix(feats, step_keys, beta_keys)
    times = np.asarray(times)

    def residual(x):
        return (design @ x - times) / times

    n = len(step_keys)
    sol = _robust(residual, np.array([1e-4] + [1e-4] * n + [1.0] * len(beta_keys)),
                  [0.0] + [0.0] * n + [1.0] * len(beta_keys))
    steps = {k: sol.x[1 + i] * 1e6 for i, k in enumerate(step_keys)}
    return sol.x[0], {k: {"step_us": steps[(k[0], k[1].removesuffix(PAIR))],
                          "bw_fraction": min(1.0, 1.0 / sol.x[1 + n + i])} for i, k in enumerate(beta_keys)}


def _line(sizes, times) -> tuple[float, float]:
    """(intercept s, throughput B/s) of t = a + size / T, robustly; one size, or a fit that noise
    made meaningless (a above the fastest time, T 10x the largest sizes' rate): a = 0 and the
    largest sizes' rate."""
    sizes, times = np.asarray(sizes, float), np.asarray(times, float)
    naive = float(np.median((sizes / times)[sizes >= np.sort(sizes)[-min(2, len(sizes))]]))
    if len(set(sizes)) == 1:
        return 0.0, naive
    sol = _robust(lambda x: (x[0] + sizes * x[1] - times) / times, np.array([1e-5, 1e-9]), [0.0, 1e-15])
    a, t = float(sol.x[0]), 1.0 / float(sol.x[1])
    if a > times.min() or t > 10 * naive:   # noise made the line meaningless: the large sizes alone
        return 0.0, naive
    return a, t


def _share_scale(r: dict) -> float:
    """Wall seconds at the declared share per measured wall second of a kernel record: the CPU
    it got over its wall time over the share on a host with a quota (``compute_seconds``), else 1."""
    wall = r["compress_s"] + r["decompress_s"]
    return r["cpu_s"] / wall / r["cpu_share"] if has_quota(r) and wall > 0 else 1.0


def fit_kernels(records: list[dict]) -> tuple[dict, float | None, dict, dict]:
    """(kernels section, launch seconds or None, ratios, report) from kernel records; records
    with ``concurrent`` = N > 1 (N ranks computing at once) go to ``shared``."""
    by_spec: dict = {}
    for r in records:
        if r["kind"] == "kernel" and not compile_spec(r["compressor"]).is_none and r["compress_s"] > 0:
            by_spec.setdefault(r["compressor"], {}).setdefault(int(r.get("concurrent", 1)), []).append(r)
    kernels, intercepts, ratios, report = {}, [], {}, {}
    for spec, groups in sorted(by_spec.items()):
        entry: dict = {}
        for ranks, rows in sorted(groups.items()):
            sizes, scale = [r["size_bytes"] for r in rows], [_share_scale(r) for r in rows]
            a_c, t_c = _line(sizes, [r["compress_s"] * f for r, f in zip(rows, scale)])
            a_d, t_d = _line(sizes, [r["decompress_s"] * f for r, f in zip(rows, scale)])
            fit = {"compress_GBps": t_c / 1e9, "decompress_GBps": t_d / 1e9}
            if ranks == 1:
                entry.update(fit)
                intercepts += [a_c, a_d]
                fitted = [a_c + s / t_c for s in sizes]
                report[spec] = {"records": len(rows), "r2_compress": _r2([r["compress_s"] for r in rows], fitted)}
            else:
                entry.setdefault("shared", {})[str(ranks)] = fit
        if "compress_GBps" in entry:
            kernels[spec] = entry
        codec = compile_spec(spec)
        if not codec.exact and len(codec.families) == 1:
            rows = [r for group in groups.values() for r in group]
            ratios[codec.families[0].NAME] = {"ratio": statistics.median(r["size_bytes"] / r["wire_bytes"]
                                                                         for r in rows)}
    launch = statistics.median(intercepts) if intercepts else None
    return kernels, launch, ratios, report


def fit_compute(records: list[dict], dev) -> tuple[dict, dict]:
    """(device overrides, report) from compute records: the GEMM efficiency table (attention as
    its s x s x head_dim GEMMs) at each measured size, FLOPs over time over the device's fp32
    peak, median per size; where a size beats the catalog's peak (a CPU's clock and vector
    units are the machine's, not the catalog's), the fastest size sets a measured peak
    (``fp32_TFLOPS``) and the table is relative to it. Also the streaming rate of the
    memory-bound work (the model's bytes over the time) and, from eager ring-attention blocks,
    the seconds per score beyond their GEMMs (``eager_score_ns``)."""
    rows = [r for r in records if r["kind"] == "compute" and r["time_s"] > 0]
    by_size: dict = {}
    for r in rows:
        if r["op"] in ("gemm", "attention"):
            by_size.setdefault(_size(r), []).append(r["flops"] / compute_seconds(r))
    rate = {size: statistics.median(v) for size, v in sorted(by_size.items())}
    peak = max([dev.peak("fp32"), *rate.values()])
    out: dict = {}
    if rate:
        out["gemm_efficiency"] = {str(size): v / peak for size, v in rate.items()}
        if peak > dev.peak("fp32"):
            out["fp32_TFLOPS"] = peak / 1e12
    rates = [r["bytes"] / compute_seconds(r) for r in rows if r["op"] == "elementwise" and r["bytes"] > 0]
    if rates:
        out["stream_TBps"] = statistics.median(rates) / 1e12
    scores = _eager_scores(rows, rate)
    if scores is not None:
        out["eager_score_ns"] = scores * 1e9
    report = {"records": len(rows), "catalog_fp32_TFLOPS": dev.peak("fp32") / 1e12,
              "measured_fp32_TFLOPS": max(rate.values(), default=0.0) / 1e12}
    granted = [r["cpu_s"] / r["time_s"] for r in rows if has_quota(r)]
    if granted:
        report |= {"declared_share": statistics.median(r["cpu_share"] for r in rows if has_quota(r)),
                   "granted_share": statistics.median(granted)}
    return out, report


def _eager_scores(rows: list[dict], rate: dict) -> float | None:
    """Seconds per score of eager ring attention beyond its GEMMs: each ``scores`` record's time
    less its GEMMs' at the fitted table (the rate of its own size; the block's seven products, its
    backward recomputing the scores), over its scores; the median (None without such records, where
    no GEMM of the block's size was timed, or where the GEMMs take it all)."""
    per = []
    for r in rows:
        if r["op"] == "scores" and r.get("scores") and _size(r) in rate:
            per.append((compute_seconds(r) - r["flops"] / rate[_size(r)]) / r["scores"])
    value = statistics.median(per) if per else None
    return value if value is not None and value > 0 else None


def _size(r: dict) -> int:
    """A GEMM record's size in the efficiency table: the cube root of m x n x k."""
    return round((r["m"] * r["n"] * r["k"]) ** (1.0 / 3.0))


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
    protocols, primitives, t_report = fit_tiers(records, cluster)
    compute, c_report = fit_compute(records, catalog_device(device))
    if not kernels and not protocols and not compute:
        raise InputError("records", f"{len(records)} records",
                         "kernel, compute or uncompressed collective records (realrun bench --json)")
    profile = {"schema": SCHEMA, "provenance": provenance(list(sources))}
    over = dict(compute)
    if launch is not None and launch > 0:
        over["kernel_launch_us"] = max(launch * 1e6, 0.01)
    if over:
        profile["devices"] = {device: over}
    if protocols:
        profile["protocols"] = protocols
        profile["primitives"] = primitives
    if ratios:
        profile["compressors"] = ratios
    if kernels:
        profile["kernels"] = kernels
    in_run = fit_in_run(records, cluster, profile)
    for spec, factor in in_run.items():
        kernels[spec]["in_run"] = factor["in_run"]
    runtime, r_report = fit_runtime(records, cluster, profile)
    if runtime:
        profile["runtime"] = runtime
    profile["fits"] = {"cluster": cluster, "tiers": t_report, "kernels": k_report, "compute": c_report,
                       "in_run": in_run, "runtime": r_report}
    return checked(profile)


def checked(profile: dict) -> dict:
    """``profile`` if every fitted number is within its declared bound, as the profile loader
    checks it; else one line naming the fitted field (no absurd profile is written)."""
    _calibration(profile)
    return profile


def _calibration(profile: dict):
    """The Calibration of a profile fitted so far, refused as ``checked`` says."""
    try:
        return from_profile(profile)
    except InputError as err:
        raise InputError(err.field.replace("calibration.", "fitted profile.", 1), err.value,
                         f"{err.allowed} (fitted from the records: one of them is corrupt or mislabelled)") from None


def _terms(design, y) -> tuple[np.ndarray, np.ndarray, float]:
    """(x >= 0, standard errors, MAPE) of ``design @ x = y`` fitted on relative residuals (the
    robust loss of the other fits); the errors from the Jacobian and the residuals' variance
    (NaN without spare records)."""
    design, y = np.asarray(design, float), np.asarray(y, float)
    scale = np.maximum(np.abs(design).max(axis=0), 1e-30)     # columns of comparable size
    a = design / scale

    def residual(x):
        return (a @ x - y) / np.abs(y)

    sol = _robust(residual, np.full(a.shape[1], float(np.median(np.abs(y)))), [0.0] * a.shape[1])
    jac, res = a / np.abs(y)[:, None], residual(sol.x)
    dof = len(y) - a.shape[1]
    with np.errstate(all="ignore"):
        cov = np.linalg.pinv(jac.T @ jac) * (float(res @ res) / dof if dof > 0 else math.nan)
    return sol.x / scale, np.sqrt(np.abs(np.diag(cov))) / scale, float(np.mean(np.abs(res)))


def kernel_seconds(r: dict) -> float | None:
    """The kernel seconds of a compressed collective record as the model prices kernels: on a host
    with a fixed CPU share, the CPU its compress and decompress calls took inside the run over the
    share (``kernel_cpu_s``; as ``compute_seconds`` prices compute), None where the record has no
    such CPU (its wall seconds also hold the time other work kept the rank off its core: not a
    kernel's cost); elsewhere the wall seconds (``compress_s + decompress_s``)."""
    if not r.get("cpu_share"):
        return r["compress_s"] + r["decompress_s"]
    return r["kernel_cpu_s"] / r["cpu_share"] if r.get("kernel_cpu_s", 0) > 0 else None


def call_seconds(r: dict, timed) -> float | None:
    """The seconds a compressed collective record took beyond what the fitted tiers and kernels
    explain (``timed``: its ``evaluate``): on a host with a fixed CPU share, the CPU of the calling
    thread beyond its kernels (the runtime's Python, payload assembly and copies; gloo moves the
    bytes on threads of its own) over the share, the kernels' CPU measured (``kernel_cpu_s``) or
    else as priced (``timed.kernel_s`` at the share); None without that thread's CPU. Elsewhere
    the wall seconds beyond ``timed``."""
    if not r.get("cpu_share"):
        return r["time_s"] - timed.time_s
    if not r.get("thread_cpu_s", 0) > 0:
        return None
    kernels = r["kernel_cpu_s"] / r["cpu_share"] if r.get("kernel_cpu_s", 0) > 0 else timed.kernel_s
    return r["thread_cpu_s"] / r["cpu_share"] - kernels


def fit_runtime(records: list[dict], cluster: str, profile: dict) -> tuple[dict, dict]:
    """(runtime section, report): the per-call terms of compressed collectives (``call_seconds``)
    and the transport's CPU (module doc, fit 5); each from at least 3 records of 2 sizes or more,
    else left out."""
    calib = _calibration(profile)
    calls, report = {}, {}
    for key, rows in _by_call(records).items():
        excess, sizes = [], []
        for r in rows:
            extra = call_seconds(r, _timed(r, cluster, calib))
            if extra is not None:
                excess.append(extra)
                sizes.append(r["size_bytes"])
        if len(excess) < 3 or len(set(sizes)) < 2 or statistics.median(excess) <= 0:
            continue
        x, sd, mape = _terms([[1.0, size] for size in sizes], excess)
        calls[key] = {"call_us": x[0] * 1e6, "ns_per_byte": x[1] * 1e9, "call_us_sd": sd[0] * 1e6,
                      "ns_per_byte_sd": sd[1] * 1e9, "records": len(excess)}
        report[key] = {"mape_of_excess": mape}
    out = {"calls": calls} if calls else {}
    transport = _fit_transport(records, cluster, calib)
    if transport:
        out["transport"] = transport
    return out, report


def _by_call(records) -> dict:
    """{"op:algorithm": compressed collective records} (realrun's algorithm, 'auto' resolved)."""
    from perfmodel.collectives.runtime import runtime_algorithm

    out: dict = {}
    for r in records:
        if r["kind"] == "collective" and r["world"] > 1 and r["time_s"] > 0 \
                and not compile_spec(r["compressor"]).is_none:
            key = f"{r['op']}:{runtime_algorithm(r['op'], r['compressor'], r['algorithm'])}"
            out.setdefault(key, []).append(r)
    return out


def _timed(record: dict, cluster: str, calib):
    """The model's ``Timed`` of a record from the tiers and kernels fitted so far (no runtime term
    where ``calib`` has none)."""
    ctx, cost = _priced(record, record.get("cluster", cluster), calib)
    return evaluate(cost, ctx.device, chunks=1)


def _fit_transport(records: list[dict], cluster: str, calib) -> dict:
    """CPU seconds per call of uncompressed collective records against the bytes a rank sends."""
    rows = [r for r in records if r["kind"] == "collective" and r["world"] > 1 and r.get("cpu_s", 0) > 0
            and compile_spec(r["compressor"]).is_none]
    sent = [sum(ph.nbytes for st in phases_of(r, r.get("cluster", cluster), calib).rounds for ph in st) for r in rows]
    if len(rows) < 3 or len(set(sent)) < 2:
        return {}
    x, sd, mape = _terms([[1.0, b] for b in sent], [r["cpu_s"] for r in rows])
    return {"cpu_us": x[0] * 1e6, "cpu_ns_per_byte": x[1] * 1e9, "cpu_us_sd": sd[0] * 1e6,
            "cpu_ns_per_byte_sd": sd[1] * 1e9, "records": len(rows)}


def fit_in_run(records: list[dict], cluster: str, profile: dict) -> dict:
    """{spec: {"in_run": {size: factor}, "records"}}: per calibrated spec and message size, the
    median over its compressed collective records of the kernel seconds inside the run
    (``kernel_seconds``: on a host with a fixed share the CPU the codec took over the share, as the
    kernel benchmark's numbers are priced; slowest rank) over those the profile's kernel numbers
    predict for the same algorithm and ranks. A record on such a host without its codec's CPU
    gives no factor (its wall seconds would price the machine's load as the kernels' cost)."""
    rows = [r for r in records if r["kind"] == "collective" and r["world"] > 1
            and r["compressor"] in profile.get("kernels", {}) and (kernel_seconds(r) or 0) > 0]
    if not rows:
        return {}
    calib = _calibration(profile)
    ratios: dict = {}
    for r in rows:
        predicted = _timed(r, cluster, calib).kernel_s
        if predicted > 0:
            by_size = ratios.setdefault(r["compressor"], {})
            by_size.setdefault(str(r["size_bytes"]), []).append(kernel_seconds(r) / predicted)
    return {spec: {"in_run": {size: statistics.median(v) for size, v in sorted(sizes.items(), key=lambda x: int(x[0]))},
                   "records": sum(len(v) for v in sizes.values())} for spec, sizes in sorted(ratios.items())}


def summary(profile: dict) -> list[tuple]:
    """Rows (what, value, fit) for a table of the fitted numbers."""
    rows = []
    tiers = profile.get("fits", {}).get("tiers", {})
    for cls, protos in profile.get("protocols", {}).items():
        rows.append((f"tier {cls}", f"base {protos['Simple']['base_us']:.1f} us",
                     f"R2 {tiers.get('r2', math.nan):.4f}, MAPE {100 * tiers.get('mape', math.nan):.1f}% over "
                     f"{tiers.get('records', 0)} records"))
        for prim, p in profile.get("primitives", {}).get(cls, {}).items():
            rows.append((f"  {cls} {prim}", f"alpha {p['step_us']:.1f} us/step, bw_fraction {p['bw_fraction']:.3f}",
                         ""))
    for dev, over in profile.get("devices", {}).items():
        if "kernel_launch_us" in over:   # absent where the intercepts' median was not positive
            rows.append((f"device {dev}", f"launch {over['kernel_launch_us']:.1f} us", "median intercept"))
        fitted = ", ".join(k for k in over if k != "kernel_launch_us")
        if fitted:
            rows.append((f"device {dev}", fitted, "fitted from compute records"))
    rows += _share_rows(profile.get("fits", {}).get("compute", {}))
    for spec, k in profile.get("kernels", {}).items():
        r2 = profile["fits"]["kernels"].get(spec, {}).get("r2_compress", math.nan)
        rows.append((f"kernel {spec}", f"compress {k['compress_GBps']:.3f} GB/s, decompress "
                     f"{k['decompress_GBps']:.3f} GB/s", f"R2 {r2:.3f}"))
        for ranks, v in k.get("shared", {}).items():
            rows.append((f"  {ranks} ranks at once", f"compress {v['compress_GBps']:.3f} GB/s, decompress "
                         f"{v['decompress_GBps']:.3f} GB/s each", ""))
    for family, r in profile.get("compressors", {}).items():
        rows.append((f"ratio {family}", f"{r['ratio']:.2f}x", "median"))
    rows += _runtime_rows(profile.get("runtime", {}))
    return rows


BUSY = 0.8   # helpers granted less than this fraction of their declared share: the machine was busy


def _share_rows(report: dict) -> list[tuple]:
    """The CPU share the compute helpers were granted against the declared one, flagged where the
    machine could not give it (other work on its cores)."""
    if "granted_share" not in report:
        return []
    declared, granted = report["declared_share"], report["granted_share"]
    note = "priced at the declared share" + (f"; BUSY MACHINE: under {BUSY:.0%} granted, measure again on idle cores"
                                              if granted < BUSY * declared else "")
    return [("compute CPU share", f"granted {granted:.2f} of a core, declared {declared:.2f}", note)]


def _runtime_rows(runtime: dict) -> list[tuple]:
    rows = []
    for key, c in runtime.get("calls", {}).items():
        rows.append((f"runtime call {key}", f"{c['call_us']:.0f} +- {c.get('call_us_sd', math.nan):.0f} us + "
                     f"{c['ns_per_byte']:.3f} +- {c.get('ns_per_byte_sd', math.nan):.3f} ns/B",
                     f"{c.get('records', 0)} compressed records"))
    t = runtime.get("transport")
    if t:
        rows.append(("runtime transport CPU", f"{t['cpu_us']:.0f} +- {t.get('cpu_us_sd', math.nan):.0f} us + "
                     f"{t['cpu_ns_per_byte']:.3f} +- {t.get('cpu_ns_per_byte_sd', math.nan):.3f} ns/B sent",
                     f"{t.get('records', 0)} uncompressed records"))
    return rows


def worst_residuals(profile: dict, count: int = 5) -> list[tuple]:
    """Rows (cluster, algorithm, size, measured, fitted, relative residual) of the tier fit's
    largest relative residuals."""
    rows = profile.get("fits", {}).get("tiers", {}).get("residuals", [])
    rows = sorted(rows, key=lambda r: -abs(r["fitted_s"] - r["measured_s"]) / r["measured_s"])[:count]
    return [(r["cluster"], r.get("algorithm", ""), r["size_bytes"], r["measured_s"], r["fitted_s"],
             f"{100 * (r['fitted_s'] - r['measured_s']) / r['measured_s']:+.1f}%") for r in rows]
