"""``perfmodel advise``: will compression pay off on this job, by how much, how sure, and if not, why not.

For one job (model, cluster, plan: from flags, a DeepSpeed config or an imported launch script) it
predicts the plan uncompressed and under every applicable candidate: each policy preset whose
recipe runs under the plan's ZeRO stage, and each single-axis spec of the search's default
candidates (``perfmodel.explore.search.DEFAULT_CANDIDATES``) on an axis that moves bytes in this
plan. Each option gets

* its step speedup and its speedup in time to the uncompressed loss (``convergence.record_cost``:
  the steps inflation of its error, a recipe's uncompressed warm-up), ranked by the latter;
* an uncertainty band on both (``perfmodel.explore.uncertainty``: the model's error on published
  runs of the nearest regime, or the user's calibration's), and a verdict on the time to target:
  ``pays`` where the band's low end is above 1 and the gain at least ``MIN_GAIN``, ``negligible``
  where it is surely above 1 but smaller, ``no`` where the band's high end is below 1 (or it does not
  fit), else ``within error``;
* its memory delta and whether it still fits;
* for an option that does not pay (``negligible`` included), the first of the reasons in
  ``why_not`` that holds, from the uncompressed step's breakdown (memory; the steps its error adds;
  compute-bound; communication already hidden by overlap; traffic only inside the NVLink domain;
  codec kernels costing more than the wire time they save; a gain under ``MIN_GAIN``);
* for the best lossy option that does not pay, what would change the answer: the codec throughput
  at which it reaches ``TARGET_SPEEDUP`` per step (``perfmodel.explore.breakeven``).

It also times the other uncompressed plans of the same GPUs, pipeline depth, micro-batch, ZeRO stage
and recompute (``perfmodel.explore.sweep.candidate_plans``): where one is faster than the job's by more than
``PLAN_MARGIN``, the first advice is to change the plan.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from perfmodel.axes import AXES
from perfmodel.compression.policy import PRESETS, parse_policy
from perfmodel.explore.convergence import record_cost
from perfmodel.explore.uncertainty import RegimeError, calibration_error, family_of, nearest, speedup_band
from perfmodel.plan.parallel import PlanRequest
from perfmodel.prediction import PredictOptions, compare, predict, request_and_options
from perfmodel.workload import load_model
from topologies import InputError
from topologies.attrs import INTRA_TIERS

TARGET_SPEEDUP = 1.10        # the break-even question: what would make the best option worth 10%
HIDDEN_SHARE = 0.03          # an axis exposing under 3% of the step has little left to save
PLAN_MARGIN = 0.05           # another plan faster by more than this is worth saying first
MIN_GAIN = 0.02              # a gain under 2% is reported as negligible, however sure


@dataclass(frozen=True, kw_only=True)
class Option:
    """One candidate policy on the job (module doc)."""

    policy: str
    axes: tuple                     # the axes it compresses that move bytes here
    step_time_s: float
    speedup: float                  # over the same plan uncompressed, per step
    speedup_band: tuple
    to_target_s: float              # seconds per uncompressed step of progress
    speedup_to_target: float
    to_target_band: tuple
    steps_inflation: float
    warmup: float
    memory_delta_GiB: float
    fits: bool
    error: dict                     # {axis: relative RMS error}
    verdict: str                    # pays, negligible, within error, no
    breakdown: dict = field(default_factory=dict)   # its step's seconds by phase
    why_not: str = ""
    breakeven: str = ""


@dataclass(frozen=True, kw_only=True)
class Advice:
    model: str
    cluster: str
    gpus: int
    plan: dict
    step_time_s: float
    breakdown: dict
    memory_GiB: float
    regime: dict                    # the error the bands use (uncertainty.RegimeError)
    options: list = field(default_factory=list)
    best_plan: dict | None = None   # a faster uncompressed plan: {plan, step_time_s, speedup}

    def to_dict(self) -> dict:
        return asdict(self)


def candidate_policies(plan, model) -> list[str]:
    """The presets whose recipe runs under the plan's ZeRO stage and compresses some active axis, then
    one policy per (active axis, default candidate spec), in the search's order."""
    from perfmodel.axes import active_axes
    from perfmodel.explore.search import DEFAULT_CANDIDATES, parse_candidates

    active = set(active_axes(plan, model))
    out = []
    for name in PRESETS:
        pol = parse_policy(name)
        if pol.recipe is not None and plan.zero not in pol.recipe.zero_stages:
            continue
        if any(pol.asks_for(a) for a in active):
            out.append(name)
    for axis, specs in parse_candidates(DEFAULT_CANDIDATES).items():
        if axis in active:
            out += [f"{axis}={s}" for s in specs if s != "none"]
    return out


def advise(model: str, cluster: str, plan: PlanRequest | None = None, options: PredictOptions | None = None,
           policies: list[str] | None = None, check_plans: bool = True, breakeven: bool = True,
           progress=None, **kw) -> Advice:
    """Advice for one job (module doc). ``plan``, ``options`` and keywords as ``perfmodel.predict``
    takes them; ``policies``: the candidates (default ``candidate_policies``); ``check_plans``: also
    time the job's other uncompressed plans; ``breakeven``: solve the best lossy option's codec
    throughput for ``TARGET_SPEEDUP``; ``progress(done, total)`` after each stage of the work."""
    request, opts = request_and_options(plan, options, **kw)
    base = predict(model, cluster, request, opts)
    spec = load_model(model)
    names = policies if policies is not None else candidate_policies(_plan_of(model, cluster, request), spec)
    regime = calibration_error(opts.calibration) or nearest(base.cluster, base.gpu, family_of(spec))
    records = compare(model, cluster, ["none", *names], request, opts)[1:] if names else []
    if progress:
        progress(1, 3)
    options_ = sorted((_option(base, r, regime) for r in records), key=lambda o: -o.speedup_to_target)
    if breakeven:
        options_ = _with_breakeven(options_, model, cluster, request, opts)
    if progress:
        progress(2, 3)
    best = _best_plan(model, cluster, request, opts, base) if check_plans else None
    if progress:
        progress(3, 3)
    return Advice(model=base.model, cluster=base.cluster, gpus=base.gpus, plan=base.plan,
                  step_time_s=base.step_time_s, breakdown=base.breakdown,
                  memory_GiB=base.memory_per_gpu_bytes / 2**30, regime=asdict(regime) | {"text": regime.text},
                  options=options_, best_plan=best)


def _plan_of(model, cluster, request):
    """The built ParallelPlan of a request (what ``active_axes`` reads)."""
    from perfmodel.prediction import _setup

    return _setup(model, cluster, request, PredictOptions()).plan


def _option(base, r, regime: RegimeError) -> Option:
    cost = record_cost(r)
    t0 = base.step_time_s
    band = speedup_band(t0, r.step_time_s, regime.mape)
    target_band = speedup_band(t0, cost["effective_step_time_s"], regime.mape)
    axes = tuple(a for a, v in r.policy_axes.items() if v["spec"] != "none" and a in r.wire_bytes)
    speedup_to_target = t0 / cost["effective_step_time_s"]
    verdict = _verdict(speedup_to_target, target_band, r.fits)
    opt = Option(policy=r.policy, axes=axes, step_time_s=r.step_time_s, speedup=t0 / r.step_time_s,
                 speedup_band=band, to_target_s=cost["effective_step_time_s"], speedup_to_target=speedup_to_target,
                 to_target_band=target_band, steps_inflation=cost["steps_inflation"], warmup=cost["warmup"],
                 memory_delta_GiB=(r.memory_per_gpu_bytes - base.memory_per_gpu_bytes) / 2**30, fits=r.fits,
                 error={a: e for a, e in r.error_estimate.items() if e}, verdict=verdict,
                 breakdown=dict(r.breakdown))
    if verdict == "pays":
        return opt
    return replace(opt, why_not=why_not(base, r, opt))


def _verdict(speedup: float, band: tuple, fits: bool) -> str:
    """``pays``, ``negligible`` (surely above 1 but under ``MIN_GAIN``), ``within error`` or ``no``."""
    if not fits or band[1] < 1:
        return "no"
    if band[0] <= 1:
        return "within error"
    return "pays" if speedup >= 1 + MIN_GAIN else "negligible"


def why_not(base, r, opt: Option) -> str:
    """Why ``r`` (the option ``opt``) does not pay over ``base`` (module doc): memory; else the steps its
    error adds, where they eat the step's gain, and why the step itself gains little, where it does."""
    if not r.fits:
        return f"does not fit: its state adds {opt.memory_delta_GiB:.1f} GiB per GPU"
    if not opt.axes:
        return "it compresses no axis that moves bytes in this plan"
    reasons = []
    if opt.steps_inflation >= 1 + MIN_GAIN and opt.speedup_to_target < (1 - MIN_GAIN) * opt.speedup:
        warm = f", {opt.warmup:.0%} warm-up" if opt.warmup else ""
        reasons.append(f"the steps its error adds (x {opt.steps_inflation:.3f}{warm}) "
                       + (f"eat the step's {opt.speedup:.3f}x" if opt.speedup >= 1 + MIN_GAIN else
                          f"on a step no faster ({opt.speedup:.3f}x)"))
    if opt.speedup < 1 + MIN_GAIN:
        reasons.append(_step_reason(base, r, opt))
    return "; ".join(reasons) or f"the gain ({opt.speedup_to_target:.3f}x) is within the model's error here"


def _step_reason(base, r, opt: Option) -> str:
    """Why the compressed step is not faster by ``MIN_GAIN``: the first of hidden by overlap,
    compute-bound, intra-node only, codec kernels dearer than the wire time saved, a small saving."""
    t0 = base.step_time_s
    phases = {AXES[a].phase.name for a in opt.axes}        # dp and zero, ep and ep_combine share one
    exposed = sum(base.breakdown.get(p, 0.0) for p in phases)
    moved = sum(sum(base.wire_bytes.get(a, {}).values()) for a in opt.axes) / 1e9
    axes = ", ".join(opt.axes)
    if exposed < HIDDEN_SHARE * t0:
        if _overlapped(base.plan, opt.axes) and moved > 0:
            return (f"communication already hidden by overlap: {axes} move {moved:.2f} GB per GPU per step but "
                    f"expose {1e3 * exposed:.1f} ms ({exposed / t0:.1%} of the step)")
        return f"compute-bound: {axes} expose {1e3 * exposed:.1f} ms ({exposed / t0:.1%} of the step)"
    kernels = sum(v for a in opt.axes for v in r.kernel_s.get(a, {}).values())
    saved = exposed - sum(r.breakdown.get(p, 0.0) for p in phases)
    cost = f"{1e3 * kernels:.1f} ms of kernels for {1e3 * max(saved, 0.0):.1f} ms of exposed communication saved"
    tiers = {t for a in opt.axes for t, b in base.wire_bytes.get(a, {}).items() if b > 0}
    if tiers and tiers <= set(INTRA_TIERS):
        return f"intra-node only: {axes} travel on {', '.join(sorted(tiers))} alone ({cost})"
    if kernels >= saved:
        return f"codec kernels cost more than the wire time saved: {cost}"
    return (f"a gain under {MIN_GAIN:.0%}: {1e3 * max(saved, 0.0):.1f} ms of {axes} communication saved "
            f"of a {t0:.3f} s step")


def _overlapped(plan: dict, axes) -> bool:
    """Whether the plan overlaps any of ``axes``' communication with compute."""
    flags = {"dp": plan.get("dp_overlap"), "zero": plan.get("dp_overlap"), "tp": plan.get("tp_overlap"),
             "ep": plan.get("ep_overlap", "none") != "none", "ep_combine": plan.get("ep_overlap", "none") != "none",
             "cp": True}
    return any(flags.get(a) for a in axes)


def _with_breakeven(options: list[Option], model, cluster, request, opts) -> list[Option]:
    """The best lossy option that does not pay gains the codec throughput at which it would reach
    ``TARGET_SPEEDUP`` per step (what would change the answer)."""
    from perfmodel.explore.breakeven import breakeven

    for i, o in enumerate(options):
        if not o.error or not o.fits or o.verdict == "pays" or o.speedup >= TARGET_SPEEDUP:
            continue
        try:
            found = breakeven(model, cluster, TARGET_SPEEDUP, request, opts, families="all", policy=o.policy)
        except InputError:
            continue
        text = (f"its codecs at >= {found.compress_GBps:,.0f} GB/s would give {TARGET_SPEEDUP:.2f}x per step"
                if found.reachable else
                f"no codec speed gives {TARGET_SPEEDUP:.2f}x (free kernels: {found.limit_speedup:.3f}x): "
                "the wire time left is the limit")
        options[i] = replace(o, breakeven=text)
        break
    return options


def _best_plan(model, cluster, request, opts, base) -> dict | None:
    """The fastest uncompressed plan of the same GPUs, pipeline depth, micro-batch, ZeRO stage and
    recompute (tp, cp, ep and dp vary: another pipeline depth reschedules every micro-batch, which
    would take ``advise`` past seconds on 1024 GPUs), where it beats the job's by more than
    ``PLAN_MARGIN`` (None otherwise)."""
    from perfmodel.explore.sweep import candidate_plans

    p = base.plan
    plans = [c for c in candidate_plans(model, cluster, request.gpus, request.nodes, p["gbs"], p["mbs"],
                                        p["recompute"], (p["zero"],), p["seq"])
             if c["mbs"] == p["mbs"] and c["pp"] == p["pp"]]
    best = None
    for c in plans:
        try:
            r = predict(model, cluster, request.with_(**c), opts)
        except InputError:
            continue
        if best is None or r.step_time_s < best.step_time_s:
            best = r
    if best is None:
        return None
    gain = base.step_time_s / best.step_time_s
    if gain < 1 + PLAN_MARGIN:
        return None
    keys = ("tp", "pp", "dp", "cp", "ep", "etp", "mbs", "zero")
    return {"plan": {k: best.plan[k] for k in keys if k in best.plan}, "step_time_s": best.step_time_s,
            "speedup": gain}
