"""Break-even kernel throughput: how fast must a codec be for a policy to reach a target speedup?

The policy's specs of the chosen families (default ``zfp``) get a kernel throughput T (GB/s of
uncompressed bytes) in place of their traffic model, the way a calibration profile's ``kernels``
replace it (``perfmodel.calibration.profile``): compression at T, decompression at T times the spec's own
ratio of decompress to compress throughput, so both scale together. The speedup over the same
plan uncompressed grows with T; ``breakeven`` solves speedup(T) = target by Brent's method on
log T (``scipy.optimize.brentq``) between ``LOW_GBPS`` and ``LIMIT_GBPS``, where kernel traffic
costs nothing next to launches (the limit as T grows without bound), which is what it reports
when the target is out of reach.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from perfmodel.calibration.profile import SCHEMA, from_profile, load_profile
from perfmodel.devices import device
from perfmodel.compression.policy import parse_policy
from perfmodel.prediction import PredictOptions, request_and_options, step_seconds
from topologies import InputError, cluster_for

LOW_GBPS = 1e-3      # the slowest kernel tried (GB/s)
LIMIT_GBPS = 1e12    # stands for an unbounded throughput: kernels cost their launches
RTOL = 1e-6          # relative tolerance on log T


@dataclass(frozen=True, kw_only=True)
class BreakEven:
    model: str
    cluster: str
    policy: str
    library: str
    families: tuple
    specs: tuple                  # canonical specs whose kernels were scaled
    target_speedup: float
    reachable: bool
    compress_GBps: float | None   # the break-even throughput (None: not reachable)
    decompress_GBps: float | None
    speedup_at_solution: float | None
    limit_speedup: float          # as the throughput grows without bound
    model_speedup: float          # with the model's own kernel costs
    model_GBps: dict              # {spec: [compress, decompress]} the model's own throughputs on the device

    def to_dict(self) -> dict:
        return asdict(self)


def parse_target(text) -> float:
    """A target speedup: '+12.7%' or '12.7%' (a gain in percent) or a ratio such as 1.127."""
    raw = str(text).strip()
    try:
        value = 1 + float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InputError("target", text, "a speedup: a gain in percent (+12.7%) or a ratio > 0 (1.127)")
    return value


def breakeven(model: str, cluster: str, target, plan=None, options: PredictOptions | None = None,
              families=("zfp",), **kw) -> BreakEven:
    """Solve for the kernel throughput of ``families``' specs in ``options.policy`` at which the
    predicted speedup over the uncompressed step reaches ``target`` (``parse_target``'s forms).
    ``plan``, ``options`` and keywords as ``perfmodel.predict`` takes them (``policy``, ``library``,
    ``calibration``, ...). Raises InputError when no spec of the policy belongs to ``families``."""
    want = parse_target(target)
    request, opts = request_and_options(plan, options, **kw)
    base = load_profile(opts.calibration, opts.library) or from_profile({"schema": SCHEMA}, "<breakeven>")
    fams = _families(families)
    specs = _specs(opts.policy, fams, base)
    dev = device(cluster_for(cluster, nodes=request.nodes, gpus=request.gpus)[0].gpu_model)
    own = {s: _own_GBps(s, base.device(dev)) for s in specs}
    plain = step_seconds(model, cluster, request, replace(opts, policy="none", calibration=base))

    def speedup(gbps: float) -> float:
        kernels = dict(base.kernels)
        for spec, (comp, decomp) in own.items():
            kernels[spec] = {1: (gbps * 1e9, gbps * decomp / comp * 1e9)}
        calib = replace(base, kernels=kernels, path=f"<breakeven {gbps:g} GB/s>")
        return plain / step_seconds(model, cluster, request, replace(opts, calibration=calib))

    model_speedup = plain / step_seconds(model, cluster, request, replace(opts, calibration=base))
    limit = speedup(LIMIT_GBPS)
    solved = _solve(speedup, want, limit)
    ratio = {s: d / c for s, (c, d) in own.items()}
    first = ratio[specs[0]]
    return BreakEven(model=model, cluster=cluster, policy=opts.policy, library=opts.library, families=fams,
                     specs=specs, target_speedup=want, reachable=solved is not None,
                     compress_GBps=solved, decompress_GBps=None if solved is None else solved * first,
                     speedup_at_solution=None if solved is None else speedup(solved), limit_speedup=limit,
                     model_speedup=model_speedup, model_GBps={s: list(v) for s, v in own.items()})


def _solve(speedup, want: float, limit: float) -> float | None:
    """The throughput (GB/s) where ``speedup`` reaches ``want``; None when even ``limit`` is short."""
    from scipy.optimize import brentq

    if limit < want:
        return None
    if speedup(LOW_GBPS) >= want:
        return LOW_GBPS
    x = brentq(lambda x: speedup(math.exp(x)) - want, math.log(LOW_GBPS), math.log(LIMIT_GBPS), rtol=RTOL)
    return math.exp(x)


def _families(families) -> tuple:
    names = tuple(f.strip() for f in (families.split(",") if isinstance(families, str) else families) if f.strip())
    if not names:
        raise InputError("families", families, "one or more compressor families (zfp, mpc, lossless, ...) or all")
    return names


def _specs(policy: str, families: tuple, calib) -> tuple:
    """Canonical specs (the profile's ratios applied) of the policy's axes with a family in ``families``."""
    pol = parse_policy(policy)
    out = []
    for axis in pol.axes.values():
        codec = calib.codec(axis.codec)
        if codec.is_none or codec.text in out:
            continue
        if "all" in families or any(f.NAME in families for f in codec.families):
            out.append(codec.text)
    if not out:
        raise InputError("families", ",".join(families), f"a family that policy {policy!r} uses on some axis "
                         "(or all)")
    return tuple(out)


def _own_GBps(spec: str, dev) -> tuple:
    """The model's own (compress, decompress) throughput of ``spec`` on fp32 values (GB/s) on ``dev``:
    its memory traffic per input byte (a published kernel measurement's where the catalog holds one,
    ``perfmodel.compression.kernels``) over the device's streaming bandwidth."""
    from perfmodel.compression import compile_spec

    count = 1 << 20
    out = compile_spec(spec).on(dev).apply(count, 4)
    raw, stream_Bps = 4 * count, dev.stream_Bps
    return (stream_Bps * raw / out.compress_bytes / 1e9, stream_Bps * raw / max(out.decompress_bytes, 1.0) / 1e9)
