"""``realrun validate --training``: predict training steps, train for real, compare.

Each case is a (plan, policy, bandwidth) of ``realrun train`` on the emulated cluster's hosts
(one rank per host). perfmodel predicts it first (the calibration profile, the run's own
plan: fp32, gradients reduced after backward, ``TrainConfig.plan``), then it runs ``repeats``
times for ``steps`` steps each; a run's measurement is its median step after ``WARMUP_STEPS``
and outside the steps that measure errors (``realrun.train.report.steady``: their exact reference
collectives are no part of a training step; with them, 2 of a quick run's 5 steady steps took
twice as long and every plan's median was its slowest clean step), the case's the median of
its runs, its spread max/min - 1 of them. Nothing here is fitted:
the profile comes from ``realrun calibrate`` (compressors, a step's compute, uncompressed
collectives at 200 and 500 Mbit/s), the grid runs at 100 Mbit/s and 1 Gbit/s.

Repeats are separate runs (a launch of ``realrun train`` each), round-robin over the cases of a
bandwidth: every case's first run, then every case's second, so a slow drift of the machine
falls on every case alike. Not timed windows of one run: the run-to-run difference is what this
testbed's noise is (the same case run twice: 0.380 then 0.330 s, where the scheduler put the
run's four ranks on two cores; docs/design.md), and windows of one run share its placement and
would report a floor the next run does not keep. It costs a launch per repeat (most of a
short run's time); each run warms up on its own (its first ``WARMUP_STEPS``). Losses, the
validation loss and time to target are the first run's (runs are deterministic: the same
losses in every run); measured relative errors are the median over all runs' steps.

Phases compared: those a run measures (``realrun.train.phases.MEASURED``, perfmodel's names:
compute, tp, pp, ep, cp, dp exposed, compression, optimizer), ``predicted_<phase>`` beside
``measured_<phase>``, both sides folded alike (``realrun.train.phases.compared``): the predicted
bubble inside pp (a run's send/recv waits hold it), the overlap slowdown inside the optimizer, and
the dp and zero kernels inside the dp phase (the trainer times them inside its reduction); the
measured side is each phase's median over the run's steps, then the median over the runs (ep and
cp 0 in plans without them).

Besides the grid's plans, ``--plans`` accepts ``extra_plans``: expert parallelism (``ep2xdpN``,
the MoE model ``TRAIN_MOE_MODEL``, ep carved from dp as ``realrun train --ep`` does) and
context parallelism (``cp2xdpN``), each on all the cluster's hosts, and the routing-imbalance case
(below). Outputs in ``DIR``: ``results_training.csv`` (with
``repeats``, ``spread`` and every run's step time, ';'-joined, in ``measured_step_all_s``),
``report.md`` (spread per case, starred above 5%, noise floor beside the MAPE),
``step_predicted_vs_measured.png`` (the runs' range as error bars), ``loss_curves.png`` (one
plan, every policy).

Presets (``--policies presets``, ``PRESETS_WORD``: ``cases_for``, ``preset_cases``): every policy preset
(``perfmodel.compression.policy.PRESETS``: hybrid, zeropp, deepseek, ..., the recipes powersgd, loco,
onebit-adam, zero-one-adam and sdp4bit), each beside ``none`` on one plan: of the grid's and the
``extra_plans``, the first that carries the most axes the preset compresses at every size, then at all
(``exercised``: hybrid's tp and pp specs start at 1 MiB, more than the small model's activations), among those
``realrun train`` runs it on (a recipe's ``Recipe.check_zero``: sdp4bit on the ZeRO-1 plan, the four DDP
recipes on the dp plan; deepseek on ``ep2xdpN``); with ``--plans``, on every named plan. 0/1 Adam runs as
``zero-one-adam,var_update_scaler=1`` (``PRESET_TEXT``: the default's first 16 steps are uncompressed).
A (plan, policy) that ``realrun train`` refuses (its ``TrainConfig``'s one line) or perfmodel does not
predict is skipped before anything runs, its reason in the summary's ``skipped`` and report.md, never an
error (unless nothing is left). Every row of a preset (``preset_rows``: also the default grid's hybrid,
zeropp and mzhybrid) is in report.md's Presets table and the summary's ``presets``: predicted and
measured speedup over ``none`` of the same plan and bandwidth, the measured one's range over the runs
(run i of none over run i of the preset: the runs are round-robin), whether the predicted speedup is on
the measured one's side of 1 (judged where that differs from 1 by more than ``SIGN_MARGIN``) and the
preset's step MAPE.

Routing imbalance (``ep2xdpNxdropless``, plan text ``tp1-pp1-dpN-ep2-dropless``: ``imbalance_plans``):
the expert-parallel plan on the MoE model made dropless (``DROPLESS_MOE_MODEL``: no capacity, no
padding), so each expert computes, and each dispatch and combine carries, what realrun's learned
router sends it, unevenly (4 hosts, 7 steps: the busiest expert 1.8 times its fair share).
The case's first run writes its routing histogram (``realrun train --routing-out``) into ``DIR``
(``histogram_name``), over the steps its times are medians of (from ``WARMUP_STEPS`` on). It is
predicted twice: first, with every other case, under ``balanced`` routing (the
``predicted_balanced_step_s`` and ``predicted_balanced_<ep phase>`` columns), and after its first run
with that run's histogram (``perfmodel predict --routing FILE``), which is the case's prediction
(``predicted_*``, its error, the summary's MAPE; the ``routing`` column names the file). That one
prediction follows a run because its input is one: how many tokens the router sent each expert,
which nothing predicts; the file holds those counts only, no time, so no measured time reaches a
prediction. ``routing_expert_max_mean`` and ``routing_rank_max_mean``: the histogram's busiest
expert and busiest expert-parallel rank over their fair shares (mean over its MoE layers); every
other row's ``routing`` is its model file's (``capacity:1.25`` for ``ep2xdpN``, empty for a dense
model). ``repredict`` reads the histogram the row names beside the stored file and copies it beside
its own.
"""
from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import re
import shutil
import statistics
import sys
from dataclasses import dataclass, replace

from perfmodel.axes import active_axes
from perfmodel.calibration import tables
from perfmodel.compression import split_top_level
from perfmodel.compression.policy import PRESETS, parse_policy
from perfmodel.plan.degrees import Degrees
from perfmodel.plan.routing import of_model, parse as parse_routing, rank_shares
from perfmodel.prediction import predict as predict_step
from perfmodel.workload import load_model
from realrun.calibrate import TRAIN_MBS, TRAIN_MODEL, TRAIN_MOE_MODEL
from realrun.report import (REPEATS, SPREAD_NOTE, check_repeats, csv_cells, error_bars, noise, noise_text, repeated,
                            restored, spread_cell)
from realrun.train.config import TrainConfig
from realrun.train.phases import MEASURED, OPTIONAL, compared, phase_of, upgraded
from realrun.train.report import WARMUP_STEPS, steady
from topologies.clikit import atomic_write
from topologies.errors import InputError

MBIT, GBIT = 10**6, 10**9
MICROBATCHES = 2          # per replica and step: a pipeline of 2 stages has a bubble of 1/3
GRID_POLICIES = ("none", "naive:fp16", "naive:int8", "dp=ef(topk(0.01))+int8", "hybrid", "zeropp", "mzhybrid")
QUICK_POLICIES = ("none", "naive:fp16", "naive:int8", "dp=ef(topk(0.01))+int8")
BANDWIDTHS = (100 * MBIT, 1 * GBIT)
STEPS, QUICK_STEPS = 12, 7
SIDES = ("predicted_", "measured_")   # the prefixes of a results row's columns
COMPARED_PHASES = MEASURED   # the phases compared: predicted_<phase> and measured_<phase> (module doc)
# the axes whose relative error a run measures and validation compares (zero's gathers are not
# measured; ep, ep_combine and cp run in the grid's extra plans, whose errors the trainer records)
COMPARED_ERRORS = ("dp", "tp", "pp")
# the routing-imbalance case (module doc): its model, its name's suffix, its ep phase, its prediction's other routing
DROPLESS_MOE_MODEL = f"{TRAIN_MOE_MODEL}:moe_capacity_factor=0,moe_pad_to_capacity=false"
DROPLESS = "dropless"
EP_PHASE = phase_of("ep")
BALANCED = "balanced"
PRESETS_WORD = "presets"   # --policies presets: every preset on its plan (module doc)
# 0/1 Adam as the preset cases run it: its first 16 steps are uncompressed variance updates (zoadam.py
# var_update_scaler 16; Recipe.modes), so a run of 7-12 steps would time none of its 1-bit steps; at 1 its
# variance steps are 1, 2, 4 and 8, and most of a run's steady steps (from WARMUP_STEPS on) are 1-bit ones
PRESET_TEXT = {"zero-one-adam": "zero-one-adam,var_update_scaler=1"}
SIGN_MARGIN = 0.05   # the speedup's sign is judged where the measured speedup differs from 1 by more


@dataclass(frozen=True)
class TrainCase:
    degrees: Degrees   # ep > 1: expert parallelism (of dp), on TRAIN_MOE_MODEL
    zero: int
    policy: str
    bandwidth: int
    dropless: bool = False   # ep > 1 only: DROPLESS_MOE_MODEL, predicted with its run's routing histogram

    def __post_init__(self):
        if self.dropless and self.degrees.ep == 1:
            raise InputError("dropless", self.dropless, f"a plan with expert parallelism (ep > 1; {self.plan} "
                             "routes nothing)")

    def __getattr__(self, name: str):
        """A degree read through the case: ``case.tp`` is ``case.degrees.tp``."""
        if name in Degrees.names():
            return getattr(self.degrees, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def name(self) -> str:
        return plan_name(self.degrees, self.zero, self.dropless)

    @property
    def plan(self) -> str:
        """The plan as results files write it: ``tp1-pp1-dp4``, ``tp1-pp1-dp4-ep2``, ``tp1-pp1-dp2-cp2``,
        ``tp1-pp1-dp4-zero1``, ``tp1-pp1-dp4-ep2-dropless`` (``_case_of`` reads it back)."""
        return (self.degrees.describe("-", form="{}{}") + (f"-zero{self.zero}" if self.zero else "")
                + (f"-{DROPLESS}" if self.dropless else ""))

    @property
    def model(self) -> str:
        if self.dropless:
            return DROPLESS_MOE_MODEL
        return TRAIN_MOE_MODEL if self.ep > 1 else TRAIN_MODEL

    def config(self, steps: int, routing_out: str | None = None) -> TrainConfig:
        """The run of ``steps`` steps; ``routing_out``: its routing histogram's file, over the steps
        after ``WARMUP_STEPS`` (those its times are medians of; every step in a shorter run)."""
        return TrainConfig(model=self.model, degrees=self.degrees, zero=self.zero, mbs=TRAIN_MBS,
                           gbs=TRAIN_MBS * self.dp * MICROBATCHES, steps=steps, policy=self.policy, eval_every=steps,
                           error_every=max(1, steps // 2), device="cpu", routing_out=routing_out,
                           routing_steps=max(0, steps - WARMUP_STEPS) if routing_out else 0)


def plans(hosts: int) -> list[tuple[Degrees, int]]:
    """(degrees, zero) on ``hosts`` ranks: all dp; tp 2; pp 2; tp 2 x pp 2; ZeRO-1."""
    out = [((1, 1, hosts), 0), ((2, 1, hosts // 2), 0), ((1, 2, hosts // 2), 0), ((2, 2, hosts // 4), 0),
           ((1, 1, hosts), 1)]
    return [(Degrees(tp=tp, pp=pp, dp=dp), zero) for (tp, pp, dp), zero in out
            if tp * pp * dp == hosts and dp >= 1 and (zero == 0 or dp > 1)]


def extra_plans(hosts: int) -> list[tuple[Degrees, int]]:
    """(degrees, zero) on ``hosts`` ranks that ``--plans`` may name beside the grid's: ep 2 of
    dp = hosts (the MoE model), cp 2 x dp = hosts / 2."""
    if hosts % 2:
        return []
    return [(Degrees(dp=hosts, ep=2), 0), (Degrees(dp=hosts // 2, cp=2), 0)]


def imbalance_plans(hosts: int) -> list[tuple[Degrees, int]]:
    """(degrees, zero) of the routing-imbalance cases ``--plans`` may name (``ep2xdpNxdropless``):
    the expert-parallel plans of ``extra_plans``, run dropless (module doc)."""
    return [(d, zero) for d, zero in extra_plans(hosts) if d.ep > 1]


def plan_name(degrees: Degrees, zero: int = 0, dropless: bool = False) -> str:
    """A plan as users write it, its ``realrun train`` flags: ``dp4``, ``tp2xdp2``, ``tp2xpp2``,
    ``tp2xpp2xdp2``, ``dp4xzero1``, ``cp2xdp2``, ``ep2xdp4`` (ep is carved from dp, as
    ``--ep`` is: 4 ranks, 2 replicas of each expert half), ``ep2xdp4xdropless`` (the same, the
    MoE layer dropless: the routing-imbalance case)."""
    return degrees.label("x") + (f"xzero{zero}" if zero else "") + (f"x{DROPLESS}" if dropless else "")


def select(cases: list[TrainCase], plan_names=None, policies=None) -> list[TrainCase]:
    """The cases of ``plan_names`` (``plan_name`` form) and ``policies`` (None: all); a name that
    selects nothing is an error naming what the grid has."""
    have = list(dict.fromkeys(c.name for c in cases))
    for name in plan_names or ():
        if name not in have:
            raise InputError("plans", name, "plans of this cluster's grid: " + ", ".join(have))
    out = [c for c in cases if not plan_names or c.name in plan_names]
    if policies:
        out = [replace(c, policy=policy) for c in out if c.policy == "none" for policy in policies]
    return out


def grid(hosts: int, quick: bool, plan_names=None, policies=None) -> list[TrainCase]:
    """Every (bandwidth, plan, policy) of the grid on ``hosts`` ranks, optionally only
    ``plan_names`` (which may also name ``extra_plans`` and ``imbalance_plans``) and, instead of the
    grid's policies, ``policies`` (none is kept as the speedups' baseline)."""
    cases = [TrainCase(*p, policy, bw, dropless=dropless) for bw in bandwidths(quick)
             for *p, dropless in layouts(hosts, bool(plan_names))
             for policy in (QUICK_POLICIES if quick else GRID_POLICIES)]
    if policies:
        policies = ["none", *(p for p in policies if p != "none")]
    return select(cases, plan_names, policies)


def bandwidths(quick: bool) -> tuple[int, ...]:
    return BANDWIDTHS[:1] if quick else BANDWIDTHS


def layouts(hosts: int, extra: bool) -> list[tuple[Degrees, int, bool]]:
    """(degrees, zero, dropless) of the grid's plans, with ``extra`` also ``extra_plans`` and
    ``imbalance_plans``."""
    out = [(*p, False) for p in plans(hosts)]
    return out + ([(*p, False) for p in extra_plans(hosts)] + [(*p, True) for p in imbalance_plans(hosts)]
                  if extra else [])


def cases_for(hosts: int, quick: bool, plan_names=None, policies=None) -> tuple[list[TrainCase], list[dict]]:
    """(the cases, the skipped): ``grid``'s, where ``policies`` holds ``PRESETS_WORD`` also every
    preset on its plan (``preset_cases``) and only those if it holds nothing else; a case realrun
    train refuses is skipped (``runnable``)."""
    others = [p for p in policies or () if p != PRESETS_WORD]
    cases = grid(hosts, quick, plan_names, others) if others or not policies else []
    skipped: list[dict] = []
    if PRESETS_WORD in (policies or ()):
        found, skipped = preset_cases(hosts, bandwidths(quick), plan_names)
        cases = list(dict.fromkeys(cases + found))
    cases, refused = runnable(cases)
    return cases, skipped + refused


def preset_policies() -> list[str]:
    """Every policy preset (``perfmodel.compression.policy.PRESETS``) as the preset cases run it
    (``PRESET_TEXT``)."""
    return [PRESET_TEXT.get(name, name) for name in PRESETS]


def preset_of(policy: str) -> str | None:
    """The preset a policy starts with (``loco``, ``zero-one-adam`` of ``zero-one-adam,var_update_scaler=1``);
    None for ``none`` and a policy of axis items."""
    first = split_top_level(policy)[0].strip() if policy else ""
    return first if first in PRESETS else None


def refusal(case: TrainCase) -> str | None:
    """Why ``realrun train`` refuses the case (its ``TrainConfig``'s one line), None where it runs it."""
    try:
        case.config(QUICK_STEPS)
    except InputError as err:
        return str(err)
    return None


def runnable(cases: list[TrainCase]) -> tuple[list[TrainCase], list[dict]]:
    """(the cases realrun train runs, the others as ``{plan, policy, reason}``)."""
    reasons = {c: refusal(c) for c in cases}
    return ([c for c in cases if reasons[c] is None],
            [skip(c.name, c.policy, reasons[c]) for c in cases if reasons[c] is not None])


def skip(plan: str, policy: str, reason: str) -> dict:
    return {"plan": plan, "policy": policy, "reason": reason}


def exercised(case: TrainCase) -> tuple[int, int]:
    """How much of what the case's policy compresses its plan carries (``perfmodel.axes.active_axes``):
    (the axes whose spec applies to every message, all such axes). An axis compressed only from a size
    (hybrid's tp and pp: ``min_bytes`` 1 MiB) counts second: the small model's activations are smaller,
    so such a plan would time the preset uncompressed."""
    cfg, policy = case.config(QUICK_STEPS), parse_policy(case.policy)
    axes = [policy.axis(a) for a in active_axes(cfg, load_model(cfg.model)) if not policy.axis(a).codec.is_none]
    return sum(a.min_bytes == 0 for a in axes), len(axes)


def preset_cases(hosts: int, rates, plan_names=None) -> tuple[list[TrainCase], list[dict]]:
    """Every preset (``preset_policies``) at each of ``rates`` with ``none`` beside it on its plan,
    and the presets (or, with ``plan_names``, the pairs) skipped with why (module doc)."""
    if plan_names:
        select([TrainCase(d, z, "none", rates[0], dropless=x) for d, z, x in layouts(hosts, True)], plan_names)
    places = [p for p in layouts(hosts, True) if (plan_name(*p) in plan_names if plan_names else not p[2])]
    cases, skipped = [], []
    for policy in preset_policies():
        chosen, why = _preset_plans(policy, places, bool(plan_names))
        skipped += why
        cases += [TrainCase(d, z, p, bw, dropless=x) for bw in rates for d, z, x in chosen for p in ("none", policy)]
    order = {p: i for i, p in enumerate(places)}
    rank = {p: i for i, p in enumerate(["none", *preset_policies()])}
    cases = sorted(dict.fromkeys(cases), key=lambda c: (c.bandwidth, order[(c.degrees, c.zero, c.dropless)],
                                                       rank[c.policy]))
    return cases, skipped


def _preset_plans(policy: str, places: list, every: bool) -> tuple[list, list[dict]]:
    """(the plans a preset runs on, what is skipped): ``every`` plan of ``places`` realrun train runs
    it on (each it refuses skipped), or the first that carries the most axes it compresses."""
    scored, refused = [], []
    for d, z, x in places:
        case = TrainCase(d, z, policy, BANDWIDTHS[0], dropless=x)
        reason = refusal(case)
        if reason is not None:
            refused.append(skip(case.name, policy, reason))
        else:
            scored.append((exercised(case), (d, z, x)))
    if every:
        return [p for _, p in scored], refused
    best = max((n for n, _ in scored), default=(0, 0))
    if best[1]:
        return [next(p for n, p in scored if n == best)], []
    if scored:
        names = ", ".join(plan_name(*p) for _, p in scored)
        why = f"no plan here that realrun train runs it on carries an axis it compresses ({names})"
    else:
        why = "realrun train refuses it on every plan here: " + "; ".join(f"{r['plan']}: {r['reason']}"
                                                                          for r in refused)
    return [], [skip("-", policy, why)]


def predict(case: TrainCase, runner, calibration: str | None, steps: int, engine: str = "analytical",
            routing: str | None = None):
    """perfmodel's StepRecord of the case: the run's own plan on the cluster at its bandwidth,
    on the analytical or the discrete-event engine, under ``routing`` (perfmodel's ``--routing``:
    ``balanced`` or a histogram file; None: the model file's)."""
    cfg = case.config(steps)
    plan = cfg.plan()
    return predict_step(cfg.model, runner.topology(cfg.world, case.bandwidth), gpus=cfg.world,
                        **plan.degrees.as_dict(), zero=plan.zero, mbs=plan.mbs, gbs=plan.gbs, seq=plan.seq,
                        schedule=plan.schedule, policy=case.policy, compute_dtype=plan.compute_dtype,
                        grad_dtype=plan.grad_dtype, bucket_bytes=plan.bucket_bytes, dp_overlap=plan.dp_overlap,
                        kernels=plan.kernels, allow_oom=True, calibration=calibration, engine=engine,
                        routing=routing)


def first_prediction(case: TrainCase, runner, calibration: str | None, steps: int, engine: str = "analytical"):
    """The prediction made before any run: the routing-imbalance case's under ``balanced`` routing,
    every other case's its only one (module doc)."""
    return predict(case, runner, calibration, steps, engine, BALANCED if case.dropless else None)


def histogram_name(case: TrainCase) -> str:
    """The file name of a routing-imbalance case's histogram: ``routing-PLAN-BWmbit-POLICY-HASH.json``
    (the policy's letters and digits, and a hash of its text: two policies never share a file)."""
    slug = re.sub(r"[^a-z0-9]+", "_", case.policy.lower()).strip("_")[:40]
    digest = hashlib.sha1(case.policy.encode()).hexdigest()[:6]
    return f"routing-{case.plan}-{case.bandwidth / MBIT:g}mbit-{slug}-{digest}.json"


def measured_histogram(case: TrainCase, folder: str) -> str:
    """The routing histogram the case's first run wrote into ``folder``; one line if it wrote none."""
    path = os.path.join(folder, histogram_name(case))
    if not os.path.isfile(path):
        raise InputError("routing", path, f"the routing histogram of {case.name} {case.policy}'s first run "
                         "(realrun train --routing-out), which it did not write")
    return path


def measure(cases: list[TrainCase], runner, steps: int, repeats: int = REPEATS, routing_dir: str | None = None) -> dict:
    """{case: records of each of its ``repeats`` runs}, bandwidth by bandwidth, round-robin over
    a bandwidth's cases (module doc); a routing-imbalance case's first run writes its histogram
    into ``routing_dir`` (``histogram_name``; none where that is None)."""
    out: dict = {}
    order = [(r, c) for bw in sorted({c.bandwidth for c in cases}) for r in range(repeats)
             for c in dict.fromkeys(cases) if c.bandwidth == bw]
    try:
        for i, (r, case) in enumerate(order):
            runner.set_bandwidth(case.bandwidth)
            print(f"validate --training: {i + 1}/{len(order)} {case.plan} {case.policy} at "
                  f"{case.bandwidth / MBIT:g} Mbit/s, run {r + 1}/{repeats}", file=sys.stderr, flush=True)
            routing_out = (os.path.abspath(os.path.join(routing_dir, histogram_name(case)))
                           if case.dropless and r == 0 and routing_dir is not None else None)
            if routing_out and os.path.exists(routing_out):
                os.remove(routing_out)   # an earlier validation's: never read as this run's
            out.setdefault(case, []).append(runner.train(case.config(steps, routing_out)))
    finally:
        runner.restore()
    return out


def _median(records: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in steady(records))   # ep_* and cp_*: 0 without them


def predicted_phases(predicted) -> dict:
    """perfmodel's breakdown as a run measures it (``realrun.train.phases.compared``): the bubble
    inside pp, the overlap slowdown inside the optimizer, the dp and ZeRO kernels inside the dp phase."""
    return compared(predicted.breakdown, {axis: sum(k.values()) for axis, k in predicted.kernel_s.items()})


def measured_phases(records: list[dict]) -> dict:
    """One run's phases, folded as ``predicted_phases`` folds perfmodel's: each phase and each
    axis's kernels the median over the run's steady steps (older records under today's names)."""
    records = [upgraded(r) for r in records]
    kernels = {k.removesuffix("_kernel_s"): _median(records, k) for k in records[0] if k.endswith("_kernel_s")}
    return compared({phase: _median(records, phase) for phase in COMPARED_PHASES}, kernels)


def row(case: TrainCase, predicted, runs: list[list[dict]], balanced=None, histogram: str | None = None) -> dict:
    """One results row from the case's runs (each its step records): the case, predicted and
    measured step (``repeated``) and phases, the first run's losses; a routing-imbalance case's
    also its ``balanced`` prediction and the ``histogram`` file ``predicted`` used (``routing_columns``)."""
    pred = predicted_phases(predicted)
    out = {"plan": case.plan, "policy": case.policy, "bandwidth": case.bandwidth,
           "predicted_step_s": predicted.step_time_s,
           **repeated([_median(records, "step_s") for records in runs], "measured_step_s")}
    measured = [measured_phases(records) for records in runs]
    for phase in COMPARED_PHASES:
        out[f"predicted_{phase}"] = pred[phase]
        out[f"measured_{phase}"] = statistics.median(m[phase] for m in measured)
    out["error"] = (out["predicted_step_s"] - out["measured_step_s"]) / out["measured_step_s"]
    first = runs[0]
    out["val_loss"] = next((r["val_loss"] for r in reversed(first) if r.get("val_loss") is not None), None)
    out["losses"] = [r["loss"] for r in first]
    _errors(out, predicted, {axis: [r[f"{axis}_rel_error"] for records in runs for r in records
                                    if r.get(f"{axis}_rel_error") is not None] for axis in COMPARED_ERRORS})
    routing_columns(out, case, balanced, histogram)
    return out


def routing_columns(out: dict, case: TrainCase, balanced=None, histogram: str | None = None) -> None:
    """The row's routing columns (module doc): ``routing`` (the histogram's file name, or the model
    file's routing), the ``balanced`` prediction's step and ep phase and the histogram's busiest
    expert and rank over their fair shares (None but for the routing-imbalance case); ``histogram``
    keeps the file's path (no column: ``repredict`` copies the file)."""
    out["routing"] = os.path.basename(histogram) if histogram else model_routing(case.model)
    out["histogram"] = histogram
    out["predicted_balanced_step_s"] = balanced.step_time_s if balanced is not None else None
    out[f"predicted_balanced_{EP_PHASE}"] = predicted_phases(balanced)[EP_PHASE] if balanced is not None else None
    expert, rank = imbalance(histogram, case.ep) if histogram else (None, None)
    out["routing_expert_max_mean"], out["routing_rank_max_mean"] = expert, rank


def model_routing(model: str) -> str:
    """The routing a prediction without ``--routing`` takes from the model file (``capacity:1.25``);
    empty for a dense model."""
    spec = load_model(model)
    return of_model(spec).describe() if spec.is_moe else ""


def imbalance(histogram: str, ep: int) -> tuple[float, float]:
    """(busiest expert, busiest of ``ep`` ranks) over its fair share, the mean over the histogram's
    MoE layers (a rank holds a contiguous block of experts: ``perfmodel.plan.routing.rank_shares``)."""
    shares = parse_routing(histogram).shares
    expert = statistics.fmean(len(s) * max(s) for s in shares)
    rank = statistics.fmean(ep * max(rank_shares(s, ep)) for s in shares)
    return expert, rank


def _errors(out: dict, predicted, measured: dict) -> None:
    for axis in COMPARED_ERRORS:
        out[f"measured_{axis}_error"] = statistics.median(measured[axis]) if measured.get(axis) else None
        out[f"predicted_{axis}_error"] = predicted.error_estimate.get(axis)


class StoredCluster:
    """The emulated cluster a stored run ran on, as perfmodel names it (no cluster needed)."""

    def topology(self, hosts: int, bandwidth: int | None = None) -> str:
        from topologies.units import format_rate

        return f"emulated:hosts={hosts}" + (f",bandwidth={format_rate(bandwidth)}" if bandwidth else "")


STORED = "a results_training.csv of realrun validate --training"


def read_stored(path: str) -> list[tuple[str, dict]]:
    """[(``FILE:LINE``, row)] of a stored ``results_training.csv`` (``perfmodel.calibration.tables``),
    an older file's columns under today's names, every column ``repredict`` needs present; a file
    that is no such table is one line naming it (its line and column where a row is malformed)."""
    stored = [(where, upgraded(r, SIDES)) for where, r in tables.read_table(path, "measured", STORED)]
    required = [f for f in FIELDS if f.removeprefix("predicted_").removeprefix("measured_") not in OPTIONAL]
    tables.require(path, stored, required, "measured", STORED)
    return stored


def repredict(results_csv: str, calibration: str | None, out_dir: str, runner=None,
              engine: str = "analytical") -> dict:
    """Predict the cases of a stored ``results_training.csv`` again (a changed model or another
    profile) against its measured columns; writes ``report.md``, ``results_training.csv`` and
    ``step_predicted_vs_measured.png`` into ``out_dir`` (losses come from the stored run: the
    loss-curve picture needs the run itself). No training runs. A file written before repeats
    were recorded counts one run per case, its spread unknown. Every cell read is checked first
    (``stored_case``): a malformed file is one line naming its line, column and value, and
    nothing is written."""
    folder = os.path.dirname(os.path.abspath(results_csv))
    rows = [_restored_row(where, m, runner or StoredCluster(), calibration, engine, folder)
            for where, m in read_stored(results_csv)]
    add_speedups(rows)
    summary = summarize(rows)
    os.makedirs(out_dir, exist_ok=True)
    _copy_histograms(rows, out_dir)
    _write_tables(out_dir, rows, summary)
    plot_steps(rows, os.path.join(out_dir, "step_predicted_vs_measured.png"))
    return summary


def _restored_row(where: str, m: dict, runner, calibration: str | None, engine: str, folder: str) -> dict:
    """A results row of the stored row ``m`` (at ``where``, FILE:LINE) predicted again: every cell
    read is checked first (``stored_case``), and a case the model refuses (a policy it does not
    know) is one line naming ``where`` too. A routing-imbalance case is predicted with the
    histogram its ``routing`` cell names in ``folder`` (the stored file's), and balanced."""
    case, measured = stored_case(where, m)
    histogram = _stored_histogram(where, m, folder) if case.dropless else None
    try:
        balanced = first_prediction(case, runner, calibration, STEPS, engine) if case.dropless else None
        predicted = predict(case, runner, calibration, STEPS, engine, histogram)
    except InputError as err:
        raise tables.located(where, err) from None
    pred = predicted_phases(predicted)
    out = {"plan": case.plan, "policy": case.policy, "bandwidth": case.bandwidth,
           "predicted_step_s": predicted.step_time_s, **measured}
    for phase in COMPARED_PHASES:
        out[f"predicted_{phase}"] = pred[phase]
    out["error"] = (out["predicted_step_s"] - out["measured_step_s"]) / out["measured_step_s"]
    _errors(out, predicted, {axis: [v] for axis in COMPARED_ERRORS if (v := measured[f"measured_{axis}_error"])
                             is not None})
    routing_columns(out, case, balanced, histogram)
    return out


def _stored_histogram(where: str, m: dict, folder: str) -> str:
    """The histogram file a stored routing-imbalance row's ``routing`` cell names, in ``folder``."""
    name = tables.text(where, m, "routing").strip()
    path = os.path.join(folder, name)
    if os.path.basename(name) != name or not name.endswith(".json") or not os.path.isfile(path):
        raise InputError(f"{where}.routing", name, f"the case's routing histogram, a .json file in {folder} (the "
                         "results file's folder, where validate --training wrote it)")
    return path


def _copy_histograms(rows: list[dict], out_dir: str) -> None:
    """The routing-imbalance rows' histograms beside the results file written into ``out_dir``."""
    for r in rows:
        if r.get("histogram"):
            target = os.path.join(out_dir, r["routing"])
            if not os.path.exists(target) or not os.path.samefile(r["histogram"], target):
                shutil.copyfile(r["histogram"], target)


def stored_case(where: str, m: dict) -> tuple[TrainCase, dict]:
    """(the case, its measurement) of a stored row (``where``: FILE:LINE), every cell read checked
    (``perfmodel.calibration.tables``): the plan as ``TrainCase.plan`` writes it, the bandwidth an
    emulated link's rate, the step times seconds within ``topologies.bounds`` measured_s
    (``restored``), the phases, validation loss, time to target and relative errors finite numbers
    of at least 0 (an empty cell: none measured; a phase's: 0). One line naming the file, line,
    column and value else."""
    text = tables.text(where, m, "plan").strip()
    policy = tables.text(where, m, "policy").strip()
    bandwidth = tables.integer(where, m, "bandwidth", "link_bits_per_s")
    try:
        case = _case_of(text, policy, bandwidth)
    except InputError as err:
        raise tables.located(where, err) from None
    measured = restored(m, "measured_step_s", where)
    for phase in COMPARED_PHASES:
        measured[f"measured_{phase}"] = _measured(where, m, f"measured_{phase}") or 0.0
    measured["val_loss"] = _measured(where, m, "val_loss")
    measured["stored_time_to_target_s"] = _measured(where, m, "time_to_target_s")
    for axis in COMPARED_ERRORS:
        measured[f"measured_{axis}_error"] = _measured(where, m, f"measured_{axis}_error")
    return case, measured


def _measured(where: str, m: dict, column: str) -> float | None:
    """A stored measurement that may be absent: a finite number of at least 0, None where empty."""
    return tables.number(where, m, column, required=False, positive=False)


PLAN_TEXT = "tpT-ppP-dpD[-epE][-cpC][-zeroZ][-dropless] as validate --training writes it"


def _case_of(text: str, policy: str, bandwidth: int) -> TrainCase:
    """The case of ``TrainCase.plan``'s text (a routing-imbalance case's ends in ``-dropless``)."""
    dropless = text.endswith(f"-{DROPLESS}")
    try:
        degrees, zero = _plan_of(text.removesuffix(f"-{DROPLESS}"))
    except InputError:
        raise InputError("plan", text, PLAN_TEXT) from None
    return TrainCase(degrees, zero, policy, bandwidth, dropless=dropless)


def _plan_of(text: str) -> tuple[Degrees, int]:
    """(degrees, zero) of ``TrainCase.plan``'s text."""
    found = re.fullmatch(r"tp(\d+)-pp(\d+)-dp(\d+)(?:-ep(\d+))?(?:-cp(\d+))?(?:-zero(\d))?", text)
    if not found:
        raise InputError("plan", text, PLAN_TEXT)
    return (Degrees(tp=int(found[1]), pp=int(found[2]), dp=int(found[3]), ep=int(found[4] or 1),
                    cp=int(found[5] or 1)), int(found[6] or 0))


def add_speedups(rows: list[dict]) -> None:
    """Speedup over ``none`` of the same (plan, bandwidth), predicted and measured; time to the
    ``none`` run's final loss (first step at or below it, times the measured step)."""
    base = {(r["plan"], r["bandwidth"]): r for r in rows if r["policy"] == "none"}
    for r in rows:
        b = base.get((r["plan"], r["bandwidth"]))
        r["predicted_speedup"] = b["predicted_step_s"] / r["predicted_step_s"] if b else None
        r["measured_speedup"] = b["measured_step_s"] / r["measured_step_s"] if b else None
        runs = zip(b["measured_step_all_s"], r["measured_step_all_s"]) if b and len(b["measured_step_all_s"]) == \
            len(r["measured_step_all_s"]) else ()
        r["measured_speedup_all"] = [x / y for x, y in runs]   # run i of none over run i (round-robin: side by side)
        r["none_val_loss"] = b["val_loss"] if b else None
        if "losses" not in r:   # re-predicted from a stored run: its measured time to target stands
            r["time_to_target_s"] = r.get("stored_time_to_target_s")
            continue
        target = b["losses"][-1] if b else None
        hit = next((i for i, loss in enumerate(r["losses"]) if target is not None and loss <= target), None)
        r["time_to_target_s"] = (hit + 1) * r["measured_step_s"] if hit is not None else None


def summarize(rows: list[dict], skipped=()) -> dict:
    errors = [abs(r["error"]) for r in rows]
    sign_cases = [r for r in rows if r["policy"] != "none" and r["measured_speedup"] is not None
                  and abs(r["measured_speedup"] - 1) > 0.05]
    sign_ok = sum((r["predicted_speedup"] - 1) * (r["measured_speedup"] - 1) > 0 for r in sign_cases)
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["plan"], r["bandwidth"]), []).append(r)
    fastest = [(min(g, key=lambda r: r["predicted_step_s"])["policy"], min(g, key=lambda r: r["measured_step_s"])
                ["policy"]) for g in groups.values()]
    phase_misses = []
    for r in rows:
        for phase in COMPARED_PHASES:
            m, p = r[f"measured_{phase}"], r[f"predicted_{phase}"]
            if m >= 0.1 * r["measured_step_s"] and abs(p - m) > 0.25 * m:
                phase_misses.append((r["plan"], r["policy"], r["bandwidth"], phase, p, m))
    return {"cases": len(rows), "mape": sum(errors) / len(errors) if errors else math.nan, **noise(rows),
            "worst": max(rows, key=lambda r: abs(r["error"])) if rows else None,
            "sign_agree": sign_ok, "sign_total": len(sign_cases),
            "fastest_agree": sum(p == m for p, m in fastest), "fastest_total": len(fastest),
            "phase_misses": phase_misses,
            "phases_checked": sum(r[f"measured_{ph}"] >= 0.1 * r["measured_step_s"]
                                  for r in rows for ph in COMPARED_PHASES),
            "imbalance": [r for r in rows if r.get("predicted_balanced_step_s") is not None],
            "presets": preset_rows(rows), "skipped": list(skipped)}


def sign_right(r: dict) -> bool | None:
    """Whether the predicted speedup over none is on the measured one's side of 1; None where the
    measured speedup is within ``SIGN_MARGIN`` of 1 (or has no baseline)."""
    m, p = r.get("measured_speedup"), r.get("predicted_speedup")
    if m is None or p is None or abs(m - 1) <= SIGN_MARGIN:
        return None
    return (p - 1) * (m - 1) > 0


def preset_rows(rows: list[dict]) -> list[dict]:
    """Per case of a preset (``preset_of``): its plan, bandwidth, predicted and measured speedup
    over none (the measured one's range over the runs, run i of none over run i), whether the sign is
    right (``sign_right``), the step's error and, per preset, the MAPE over its cases (``preset_mape``)."""
    out = []
    for r in rows:
        name = preset_of(r["policy"])
        if name is None:
            continue
        runs = r.get("measured_speedup_all") or []
        out.append({"preset": name, "policy": r["policy"], "plan": r["plan"], "bandwidth": r["bandwidth"],
                    "predicted_step_s": r["predicted_step_s"], "measured_step_s": r["measured_step_s"],
                    "error": r["error"], "predicted_speedup": r["predicted_speedup"],
                    "measured_speedup": r["measured_speedup"], "measured_speedup_min": min(runs, default=None),
                    "measured_speedup_max": max(runs, default=None), "sign_right": sign_right(r)})
    for p in out:
        mine = [abs(q["error"]) for q in out if q["preset"] == p["preset"]]
        p["preset_mape"] = sum(mine) / len(mine)
    return out


def validate_training(runner, calibration: str | None, out_dir: str, quick: bool = False,
                      cases: list[TrainCase] | None = None, steps: int | None = None,
                      engine: str = "analytical", repeats: int = REPEATS, plans=None, policies=None) -> dict:
    """Predict, train (every case ``repeats`` runs, 1-20; ``quick`` has fewer cases, as many
    runs), compare; write the outputs into ``out_dir``; return the summary (with
    ``noise_floor``, ``flagged`` and ``repeats``). ``plans`` (names as ``plan_name`` writes them)
    and ``policies`` narrow the grid (``cases_for``: ``presets`` there is every preset on its plan); a
    case realrun train refuses or perfmodel does not predict is skipped, its reason in the summary's
    ``skipped`` and the report, before anything runs."""
    check_repeats(repeats)
    cases, skipped = runnable(cases) if cases else cases_for(runner.hosts, quick, plans, policies)
    steps = steps or (QUICK_STEPS if quick else STEPS)
    first, cases = _first_predictions(cases, runner, calibration, steps, engine, skipped)
    if not cases:
        raise InputError("policies", policies, "a case realrun train runs and perfmodel predicts; skipped: "
                         + "; ".join(f"{s['plan']} {s['policy']}: {s['reason']}" for s in skipped))
    os.makedirs(out_dir, exist_ok=True)
    measured = measure(cases, runner, steps, repeats, routing_dir=out_dir)
    rows = []
    for c in cases:
        if c.dropless:   # predicted again with its first run's routing (module doc)
            histogram = measured_histogram(c, out_dir)
            rows.append(row(c, predict(c, runner, calibration, steps, engine, histogram), measured[c], first[c],
                            histogram))
        else:
            rows.append(row(c, first[c], measured[c]))
    add_speedups(rows)
    summary = summarize(rows, skipped)
    write_outputs(out_dir, rows, summary)
    return summary


def _first_predictions(cases, runner, calibration, steps, engine, skipped: list) -> tuple[dict, list]:
    """({case: its first prediction}, the cases predicted); a case perfmodel refuses is added to
    ``skipped`` with its one line, before anything runs."""
    first = {}
    for c in cases:
        try:
            first[c] = first_prediction(c, runner, calibration, steps, engine)
        except InputError as err:
            skipped.append(skip(c.name, c.policy, f"perfmodel: {err}"))
    return first, [c for c in cases if c in first]


FIELDS = ("plan", "policy", "bandwidth", "predicted_step_s", "measured_step_s", "error", "predicted_speedup",
          "measured_speedup", *(f"{side}{phase}" for phase in COMPARED_PHASES for side in SIDES),
          "val_loss", "none_val_loss", "time_to_target_s", "predicted_dp_error", "measured_dp_error",
          "predicted_tp_error", "measured_tp_error", "predicted_pp_error", "measured_pp_error")
REPEAT_FIELDS = ("repeats", "spread", "measured_step_all_s")   # written too; a file from before repeats lacks them
# written too (module doc): what the prediction's routing was; a routing-imbalance case's balanced prediction and
# its histogram's imbalance (a file from before them lacks them: its rows are no such case)
ROUTING_FIELDS = ("routing", "predicted_balanced_step_s", f"predicted_balanced_{EP_PHASE}", "routing_expert_max_mean",
                  "routing_rank_max_mean")


def write_outputs(out_dir: str, rows: list[dict], summary: dict) -> None:
    _write_tables(out_dir, rows, summary)
    plot_steps(rows, os.path.join(out_dir, "step_predicted_vs_measured.png"))
    plot_loss_curves(rows, os.path.join(out_dir, "loss_curves.png"))


def _write_tables(out_dir: str, rows: list[dict], summary: dict) -> None:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=FIELDS + REPEAT_FIELDS + ROUTING_FIELDS, lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    writer.writerows(csv_cells(r, "measured_step_s") for r in rows)
    atomic_write(os.path.join(out_dir, "results_training.csv"), lambda h: h.write(text.getvalue().encode()))
    atomic_write(os.path.join(out_dir, "report.md"), lambda h: h.write(report_md(rows, summary).encode()))


def summary_lines(s: dict) -> list[str]:
    lines = [f"step time: MAPE {100 * s['mape']:.1f}% over {s['cases']} cases (target 10%); {noise_text(s)}"]
    if s["worst"]:
        w = s["worst"]
        lines.append(f"worst: {w['plan']} {w['policy']} at {w['bandwidth'] / MBIT:g} Mbit/s: predicted "
                     f"{w['predicted_step_s']:.3f} s, measured {w['measured_step_s']:.3f} s ({100 * w['error']:+.0f}%)")
    lines.append(f"speedup sign right in {s['sign_agree']}/{s['sign_total']} cases where it differs from 1 by > 5%")
    lines.append(f"fastest policy right in {s['fastest_agree']}/{s['fastest_total']} (plan, bandwidth) "
                 "(target 90%)")
    lines.append(f"phases (>= 10% of the step) within 25%: {s['phases_checked'] - len(s['phase_misses'])}/"
                 f"{s['phases_checked']}")
    lines += [imbalance_line(r) for r in s.get("imbalance", ())]
    presets = s.get("presets") or []
    if presets:
        judged = [p for p in presets if p["sign_right"] is not None]
        mape, right = sum(abs(p["error"]) for p in presets) / len(presets), sum(p["sign_right"] for p in judged)
        lines.append(f"presets: step MAPE {100 * mape:.1f}% over {len(presets)} cases; speedup sign right in "
                     f"{right}/{len(judged)} where it differs from 1 by > {100 * SIGN_MARGIN:.0f}%")
        lines += [preset_line(p) for p in presets]
    lines += [f"skipped: {k['policy']} on {k['plan']}: {k['reason']}" for k in s.get("skipped", ())]
    return lines


def preset_line(p: dict) -> str:
    """One preset case: speedups predicted and measured (its runs' range), the sign, the step's error."""
    sign = {True: "sign right", False: "sign WRONG", None: f"sign not judged (within {100 * SIGN_MARGIN:.0f}%)"}
    return (f"  {p['policy']} on {p['plan']} at {p['bandwidth'] / MBIT:g} Mbit/s: speedup predicted "
            f"{_fmt(p['predicted_speedup'])}, measured {_fmt(p['measured_speedup'])} ({_speedup_range(p)}), "
            f"{sign[p['sign_right']]}; step {100 * p['error']:+.0f}% (preset MAPE {100 * p['preset_mape']:.1f}%)")


def _speedup_range(p: dict) -> str:
    lo, hi = p["measured_speedup_min"], p["measured_speedup_max"]
    return "runs -" if lo is None else f"runs {lo:.2f}-{hi:.2f}"


def imbalance_line(r: dict) -> str:
    """A routing-imbalance case: measured step and ep phase beside the predictions with its histogram
    and with balanced routing."""
    step, ep = r["measured_step_s"], r[f"measured_{EP_PHASE}"]
    histogram, balanced = r["predicted_step_s"], r["predicted_balanced_step_s"]
    return (f"routing imbalance, {r['plan']} {r['policy']} at {r['bandwidth'] / MBIT:g} Mbit/s (histogram "
            f"{r['routing']}: busiest expert {r['routing_expert_max_mean']:.2f}x, busiest ep rank "
            f"{r['routing_rank_max_mean']:.2f}x its fair share): step measured {step:.3f} s, predicted "
            f"{histogram:.3f} s with the histogram ({100 * (histogram / step - 1):+.0f}%), {balanced:.3f} s balanced "
            f"({100 * (balanced / step - 1):+.0f}%); ep phase measured {ep:.3f} s, predicted "
            f"{r[f'predicted_{EP_PHASE}']:.3f} s with the histogram, {r[f'predicted_balanced_{EP_PHASE}']:.3f} s "
            "balanced")


def report_md(rows: list[dict], summary: dict) -> str:
    out = ["# realrun validate --training", "", *[f"- {line}" for line in summary_lines(summary)], "",
           f"measured s: the median of the case's {summary['repeats']} runs; {SPREAD_NOTE}", "",
           "| plan | policy | Mbit/s | predicted s | measured s | error | spread | speedup pred | speedup meas "
           "| val loss | time to target s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['plan']} | `{r['policy']}` | {r['bandwidth'] / MBIT:g} | {r['predicted_step_s']:.3f} | "
                   f"{r['measured_step_s']:.3f} | {100 * r['error']:+.0f}% | {spread_cell(r)} | "
                   f"{_fmt(r['predicted_speedup'])} | {_fmt(r['measured_speedup'])} | {_fmt(r['val_loss'], '.4f')} | "
                   f"{_fmt(r['time_to_target_s'])} |")
    out += ["", "## Phases (seconds per step, predicted / measured)", "",
            "| plan | policy | Mbit/s | " + " | ".join(COMPARED_PHASES) + " |",
            "|---|---|---:|" + "---:|" * len(COMPARED_PHASES)]
    for r in rows:
        cells = [f"{r[f'predicted_{p}']:.3f} / {r[f'measured_{p}']:.3f}" for p in COMPARED_PHASES]
        out.append(f"| {r['plan']} | `{r['policy']}` | {r['bandwidth'] / MBIT:g} | " + " | ".join(cells) + " |")
    if summary.get("imbalance"):
        out += ["", "## Routing imbalance (dropless expert parallelism)", "",
                "predicted s and the phases above: with the case's measured routing histogram (`routing`); "
                "balanced: the same plan under balanced routing, predicted before the runs. Expert and rank: "
                "the histogram's busiest over its fair share (mean over the MoE layers).", "",
                f"| plan | policy | Mbit/s | routing | expert max/mean | rank max/mean | measured s | histogram s "
                f"| balanced s | measured {EP_PHASE} | histogram {EP_PHASE} | balanced {EP_PHASE} |",
                "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        numbers = ("routing_expert_max_mean", "routing_rank_max_mean", "measured_step_s", "predicted_step_s",
                   "predicted_balanced_step_s", f"measured_{EP_PHASE}", f"predicted_{EP_PHASE}",
                   f"predicted_balanced_{EP_PHASE}")
        for r in summary["imbalance"]:
            out.append(f"| {r['plan']} | `{r['policy']}` | {r['bandwidth'] / MBIT:g} | {r['routing']} | "
                       + " | ".join(f"{r[k]:.{2 if k.startswith('routing') else 3}f}" for k in numbers) + " |")
    out += preset_section(summary)
    return "\n".join(out) + "\n"


def preset_section(summary: dict) -> list[str]:
    """report.md's presets table (``preset_rows``) and the cases skipped with why."""
    out = []
    if summary.get("presets"):
        out += ["", "## Presets", "",
                "Each preset against `none` on the same plan and bandwidth: speedup = none's step / the preset's; "
                "measured: the median runs' ratio, the range run i of none over run i of the preset; sign: "
                f"judged where the measured speedup differs from 1 by more than {100 * SIGN_MARGIN:.0f}%; "
                "MAPE: the preset's cases' mean |error| of the step.", "",
                "| preset | policy | plan | Mbit/s | speedup pred | speedup meas | runs | sign | predicted s "
                "| measured s | error | preset MAPE |", "|---|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|"]
        for p in summary["presets"]:
            sign = {True: "right", False: "**wrong**", None: "-"}[p["sign_right"]]
            out.append(f"| {p['preset']} | `{p['policy']}` | {p['plan']} | {p['bandwidth'] / MBIT:g} | "
                       f"{_fmt(p['predicted_speedup'])} | {_fmt(p['measured_speedup'])} | "
                       f"{_speedup_range(p).removeprefix('runs ')} | {sign} | {p['predicted_step_s']:.3f} | "
                       f"{p['measured_step_s']:.3f} | {100 * p['error']:+.0f}% | {100 * p['preset_mape']:.1f}% |")
    if summary.get("skipped"):
        out += ["", "## Skipped", "", "| plan | policy | why |", "|---|---|---|"]
        out += [f"| {k['plan']} | `{k['policy']}` | {k['reason']} |" for k in summary["skipped"]]
    return out


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def plot_steps(rows: list[dict], path: str) -> None:
    """Predicted against measured step time per bandwidth, log-log, y = x and +-10%; the
    measured side's error bars span the case's runs (min..max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for bw, marker in zip(sorted({r["bandwidth"] for r in rows}), "os^"):
        sel = [r for r in rows if r["bandwidth"] == bw]
        ax.errorbar([r["measured_step_s"] for r in sel], [r["predicted_step_s"] for r in sel],
                    xerr=error_bars(sel, "measured_step_s"), fmt=marker, ms=5, elinewidth=0.8, capsize=2,
                    label=f"{bw / MBIT:g} Mbit/s")
    lo = min(min(*r["measured_step_all_s"], r["predicted_step_s"]) for r in rows) * 0.8
    hi = max(max(*r["measured_step_all_s"], r["predicted_step_s"]) for r in rows) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey", alpha=0.2, label="+-10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    atomic_write(path, lambda h: fig.savefig(h, format="png", dpi=120))
    plt.close(fig)


def plot_loss_curves(rows: list[dict], path: str) -> None:
    """Loss per step of every policy on the first plan at the lowest bandwidth."""
    from realrun.train.report import plot_losses

    first = rows[0]
    runs = {r["policy"]: [{"step": i, "loss": loss} for i, loss in enumerate(r["losses"])] for r in rows
            if r["plan"] == first["plan"] and r["bandwidth"] == first["bandwidth"]}
    plot_losses(runs, path)
