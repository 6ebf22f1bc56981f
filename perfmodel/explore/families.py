"""A search's unit of work: a family of plans (one pipeline shape) under their policies,
predicted together and turned into rows (``perfmodel.explore.search``).

A family's plans share their pipeline evaluation, so one task times them all (``evaluate``,
on any executor: ``perfmodel.explore.executors``). Each plan is tried under its uncompressed
policy first and then under the product of the candidate specs of the axes that carry traffic in
it (``policies_for``). A row (``ROW_COLUMNS``) is one (plan, policy): its plan columns (the
degrees in ``Degrees.display_order``), its step, the error of every axis and whether each is
within the budget (error feedback on gradients: any contraction, ``EF_LIMIT``).
"""
from __future__ import annotations

import itertools
import math
from functools import lru_cache

from perfmodel.axes import active_axes, fed_back
from perfmodel.compression import compile_spec
from perfmodel.compression.policy import POLICY_AXES, parse_policy
from perfmodel.explore.stream import Domain
from perfmodel.plan.degrees import DEFAULT_ORDER, Degrees
from perfmodel.plan.parallel import REQUEST_FIELDS, PlanRequest
from perfmodel.prediction import OPTION_FIELDS, PredictOptions, predict_many
from perfmodel.workload import load_model
from topologies import InputError


EF_LIMIT = 1.0      # error feedback converges for contractions: error < 1


def policies_for(plan: dict, candidates: dict, model=None) -> list[str]:
    """Policy texts for ``plan``: the product of the admitted candidates of its active axes
    (``perfmodel.axes.active_axes``; with ``model``, as its tied embedding makes them)."""
    active = tuple(a for a in active_axes(plan, model) if a in candidates)
    return list(_policy_product(tuple((a, tuple(candidates[a])) for a in active)))


@lru_cache(maxsize=256)
def _policy_product(choices: tuple) -> tuple:
    """``policies_for``'s texts for ((axis, candidate specs), ...): cached, plans share their active axes."""
    choices = [[(a, s) for s in specs] for a, specs in choices]
    out = []
    for combo in itertools.product(*choices):
        specs = dict(combo)
        dispatch = not compile_spec(specs.get("ep", "none")).is_none
        # ep_combine follows ep unless written (perfmodel.compression.policy): an uncompressed combine beside a
        # compressed dispatch is written out
        items = [f"{a}={s}" for a, s in combo if not compile_spec(s).is_none or (a == "ep_combine" and dispatch)]
        out.append(",".join(items) if items else "none")
    return tuple(dict.fromkeys(out))


def _within(record, budget: dict) -> bool:
    """Every axis's error as predicted for its collectives (two quantizations in an all-reduce
    add up) within the budget; error feedback on dp: a contraction."""
    for axis, error in record.error_estimate.items():
        spec = record.policy_axes[axis]["spec"]
        if fed_back(axis, compile_spec(spec)):
            if error >= EF_LIMIT:
                return False
        elif error > budget[axis] * (1 + 1e-12):
            return False
    return True




SEARCH_OPTION_FIELDS = OPTION_FIELDS - {"policy"}   # a search sets the policy itself


# a row's plan columns, where every stream has had them: the degrees every mesh places before the
# plan's other fields, the degrees an order may leave out after them (``Degrees.display_order``)
PLAN_KEYS = (*DEFAULT_ORDER, "mbs", "zero", "recompute", "sequence_parallel", "schedule", "hpz",
              *Degrees.display_order()[len(DEFAULT_ORDER):])


DEGREE_NAMES = frozenset(Degrees.names())


# The columns of ``_row``, in its order (a stream's header), and the types they read back as (float otherwise)
ROW_COLUMNS = ("cluster", "gpus", "policy", *PLAN_KEYS, "step_time_s", "samples_per_s", "mfu",
               "speedup_vs_same_plan_uncompressed", *(f"error_{a}" for a in POLICY_AXES), "total_error",
               "within_budget", "memory_GiB")


STREAM_COLUMNS = ("search", *ROW_COLUMNS)     # a stream's rows name the search they are of (``search_tag``)


ROW_TYPES = {"search": str, "cluster": str, "policy": str, "recompute": str, "schedule": str, "gpus": int,
              **dict.fromkeys(Degrees.names(), int), "mbs": int, "zero": int,
              "sequence_parallel": bool, "hpz": bool, "within_budget": bool}


# What each number of a row can be (a resumed stream's rows are checked against it: ``perfmodel.explore.stream``)
_POSITIVE, _NON_NEGATIVE, _COUNT = Domain(0.0, above=True), Domain(0.0), Domain(1)
ROW_DOMAINS = {"gpus": _COUNT, **dict.fromkeys(Degrees.names(), _COUNT), "mbs": _COUNT, "zero": Domain(0, 3),
               "step_time_s": _POSITIVE, "samples_per_s": _POSITIVE, "mfu": _NON_NEGATIVE,
               "speedup_vs_same_plan_uncompressed": _POSITIVE,
               **dict.fromkeys((f"error_{a}" for a in POLICY_AXES), _NON_NEGATIVE), "total_error": _NON_NEGATIVE,
               "memory_GiB": _NON_NEGATIVE}


def plan_columns(plan: dict) -> dict:
    """A plan's ``PLAN_KEYS`` columns: a degree it leaves out reads its default as ``Degrees.of``
    does (etp: the plan's tp), another field 1."""
    degrees = Degrees.of(plan)
    return {k: getattr(degrees, k) if k in DEGREE_NAMES else plan.get(k, 1) for k in PLAN_KEYS}


def _row(record, plan: dict, budget: dict, cluster: str) -> dict:
    errors = {a: record.error_estimate.get(a, 0.0) for a in POLICY_AXES}
    return {"cluster": cluster, "gpus": record.gpus, "policy": record.policy, **plan_columns(plan),
            "step_time_s": record.step_time_s, "samples_per_s": record.samples_per_s, "mfu": record.mfu,
            "speedup_vs_same_plan_uncompressed": record.speedup_vs_uncompressed,
            **{f"error_{a}": e for a, e in errors.items()},
            "total_error": math.sqrt(sum(e * e for e in errors.values())),
            "within_budget": _within(record, budget), "memory_GiB": record.memory_per_gpu_bytes / 2**30}


def evaluate(job) -> tuple[list, int, int]:
    """Rows of one family of plans (``families_of``) under their policies (each plan's uncompressed
    one first), timed together (``predict_many``); (rows, plans that do not fit, plans)."""
    model, cluster, where, gbs, plans, candidates, budget, fixed = job
    rows, oom = [], 0
    options = PredictOptions(**option_fields(fixed))
    for plan, got in zip(plans, predict_many(model, cluster, family_items(job), options)):
        if refused(got):
            oom += got.field == "memory"
            continue
        rows += [_row(record, plan, budget, cluster) for record in got]
    return rows, oom, len(plans)


def family_items(job, plans=None, with_policies: bool = True) -> list:
    """(PlanRequest, policies) of a family's plans (or of ``plans``): each plan's uncompressed
    policy first; none with ``with_policies`` False (what fits, nothing timed)."""
    model, _, where, gbs, family, candidates, _, fixed = job
    spec = load_model(model)
    return [(PlanRequest.of(**where, gbs=gbs, **plan, **_plan_fields(fixed)),
             plan_policies(plan, candidates, spec) if with_policies else [])
            for plan in (family if plans is None else plans)]


def plan_policies(plan: dict, candidates: dict, spec) -> list[str]:
    """``none``, the product of the plan's candidate specs, then the candidate whole policies
    (``presets``) that compress an axis of this plan under a ZeRO stage their recipe runs."""
    out = ["none"] + [p for p in policies_for(plan, candidates, spec) if p != "none"]
    return out + [p for p in candidates.get("presets", ()) if p not in out and _applies(p, plan, spec)]


def _applies(policy: str, plan: dict, spec) -> bool:
    """Whether whole policy ``policy`` compresses an axis with traffic in ``plan`` under a ZeRO stage
    its recipe runs (``perfmodel.compression.recipes.Recipe.zero_stages``)."""
    pol = parse_policy(policy)
    if pol.recipe is not None and plan.get("zero", 0) not in pol.recipe.zero_stages:
        return False
    return any(pol.asks_for(a) for a in active_axes(plan, spec))


def refused(got) -> bool:
    """Whether ``predict_many`` refused a plan that a search skips: it does not fit (``memory``)
    or its schedule, sequence parallelism or hpZ is a combination it does not allow; other bad
    input is raised."""
    if not isinstance(got, InputError):
        return False
    if got.field not in ("memory", "schedule", "sequence_parallel", "hpz"):
        raise got
    return True


def _plan_fields(fixed: dict) -> dict:
    return {k: v for k, v in fixed.items() if k in REQUEST_FIELDS}


def option_fields(fixed: dict) -> dict:
    return {k: v for k, v in fixed.items() if k in SEARCH_OPTION_FIELDS}


def families_of(plans: list, gbs: int) -> list[list]:
    """Plans grouped by pipeline shape (stages, microbatches, schedule): one task each, whose
    pipelines are evaluated together; in the order their first plan comes."""
    out: dict = {}
    for plan in plans:
        out.setdefault((plan["pp"], gbs // (plan["dp"] * plan["mbs"]), plan["schedule"]), []).append(plan)
    return list(out.values())
