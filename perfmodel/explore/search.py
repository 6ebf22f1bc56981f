"""The user's question: which plan and which compression, under an error budget, train fastest?

``search`` predicts every candidate plan (tp, pp, dp, mbs, ZeRO stage, recompute, sequence
parallelism, schedule, hpZ where it exists) under every compression policy built from per-axis
candidate specs, keeps the policies whose every axis is within its error budget, and ranks. It
takes a ``PlanSpace`` (what plans) and ``SearchOptions`` (how to choose among them and where to
run), as ``predict`` takes a PlanRequest and PredictOptions, or their fields as keywords:

* **Candidates** (``--candidates``): ``axis=spec|spec|...`` per axis, ``;`` between axes; axes
  left out stay uncompressed. Plans cover ep, etp and cp degrees where they apply (MoE models,
  their experts folded over tp x cp x dp as Megatron-Core folds them; long sequences:
  ``perfmodel.explore.sweep``), so a dense model's search is what it always was. The
  policies are their product, per plan only over the axes
  that carry traffic in that plan (tp 1 has no TP traffic: its TP candidates collapse to one),
  and the whole policies of ``presets=`` beside it (by default the recipes ``powersgd``, ``loco``,
  ``onebit-adam``, ``zero-one-adam`` and ``sdp4bit``, in the plans whose ZeRO stage each runs under, where dp
  carries traffic: ``perfmodel.compression.recipes``).
* **Error budget** (``--max-error``): the relative RMS error of one application of a spec on
  unit-Gaussian data (the model's ``error`` convention) must be at most the axis's budget. On
  ``dp`` (gradients) a spec with error feedback is compensated across steps: what it drops is
  added back to the next step's gradient, and error-feedback SGD converges for any contraction
  (Stich et al. 2018, Karimireddy et al. 2019: ``||C(x) - x|| < ||x||``), so there the rule is
  error < 1. Defaults and why (``DEFAULT_MAX_ERROR``): activations (tp, pp) and gathered
  parameters (zero) feed the next computation with nothing to correct them, so 1%: blockwise
  int8 (0.8%) and the 16-bit floats pass, fp8 (3.6%) and int4 (14.6%) do not; gradients without
  error feedback 5%: fp8 passes, int4 needs error feedback.
* **Ranking**: by time to target, the step time times the policy's steps inflation (the steps
  it needs to reach the uncompressed run's loss: ``perfmodel.explore.convergence``, ``convergence``
  gives the regime; a recipe's uncompressed warm-up share at the plan's uncompressed step time),
  with the speedup over the *best uncompressed plan* (the number a user comes
  for), over the same plan uncompressed and in time to target; the **Pareto front** of that time
  against the uncompensated error (the errors of axes without error feedback in quadrature, as
  chained stages add: error feedback's own error is paid in the inflation instead).
* **Clusters and cost**: several clusters (and variants of one over a grid of builder arguments,
  ``topologies.variants``) are searched together, every row naming its ``cluster`` and compared with
  that cluster's best uncompressed plan; with a token budget every row also carries the time to
  train it, GPU-hours, cost at a price per GPU-hour and energy at the GPUs' board power
  (``perfmodel.explore.cost``; the steps inflated), and the front weighs (cost, time to train,
  uncompensated error).

Speed: plans that share stage costs share their pipeline evaluation (``run_schedule`` is
cached), collective costs are cached per (cluster, group, size, spec); families of plans (one
pipeline shape each) are spread over ``workers`` processes or a Dask cluster
(``perfmodel.explore.executors``; a family and its rows: ``perfmodel.explore.families``), their rows
streamed to a file as they finish and a killed search resumed from it (``perfmodel.explore.resume``).
``benchmarks/bench_search.py`` prints evaluations per minute.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import lru_cache

from perfmodel.axes import AXES, fed_back
from perfmodel.compression import compile_spec
from perfmodel.explore.convergence import Regime, axis_inflation, load_regime, recipe_cost, recipe_error, run_cost
from perfmodel.explore.cost import board_power_W, parse_prices, parse_tokens, training_cost
from perfmodel.explore.cost import pareto_front as cost_front
from perfmodel.explore.executors import check_executor
from perfmodel.collectives.library import library
from perfmodel.plan.parallel import REQUEST_FIELDS, parse_schedule
from perfmodel.explore.sweep import candidate_plans
from perfmodel.compression.policy import POLICY_AXES, parse_policy
from perfmodel.explore.families import EF_LIMIT, PLAN_KEYS, SEARCH_OPTION_FIELDS, families_of
from perfmodel.explore.resume import check_stream_args, run_families, search_tag
from perfmodel.workload import load_model
from topologies import InputError

PRESETS_KEY = "presets"     # whole policies tried beside the product (recipes: perfmodel.compression.recipes)
DEFAULT_CANDIDATES = ("dp=none|fp16|int8|ef(topk(0.01))+int8|ef(powersgd(rank=4));"
                      "tp=none|fp16|int8;pp=none|fp16|int8;zero=none|int8;"
                      "ep=none|fp8|int8;ep_combine=none|int8;cp=none|fp16|int8;"
                      "presets=powersgd|loco|onebit-adam|zero-one-adam|sdp4bit")
DEFAULT_MAX_ERROR = {name: axis.max_error for name, axis in AXES.items()}   # declared per axis


def parse_candidates(text: str) -> dict[str, list[str]]:
    """``dp=none|int8;tp=none|fp16`` -> {axis: [spec, ...]} (every spec compiled: bad ones refused);
    ``presets=loco|onebit-adam`` adds whole policies (each parsed) tried beside the product, in
    the plans whose ZeRO stage their recipe runs under (``perfmodel.explore.families.plan_policies``)."""
    out: dict[str, list[str]] = {}
    for item in (i.strip() for i in str(text).split(";") if i.strip()):
        axis, sep, specs = item.partition("=")
        axis = axis.strip()
        if not sep or (axis not in POLICY_AXES and axis != PRESETS_KEY):
            raise InputError("candidates", item, "axis=spec|spec|... with axis one of " + ", ".join(POLICY_AXES)
                             + f", or {PRESETS_KEY}=POLICY|POLICY|...")
        if axis in out:
            raise InputError("candidates", item, f"each axis once ({axis} repeats)")
        names = [s.strip() for s in specs.split("|") if s.strip()]
        if not names:
            raise InputError("candidates", item, "at least one spec after =")
        for spec in names:
            parse_policy(spec) if axis == PRESETS_KEY else compile_spec(spec)   # a bad one is one error naming it
        out[axis] = list(dict.fromkeys(names))
    if not out:
        raise InputError("candidates", text, "axis=spec|spec|... items separated by ;")
    return out


def parse_max_error(text: str | dict | None) -> dict[str, float]:
    """``dp=0.05,tp=0.01`` over the defaults -> {axis: budget}."""
    budget = dict(DEFAULT_MAX_ERROR)
    items = text.items() if isinstance(text, dict) else \
        ((k.strip(), v) for k, _, v in (i.partition("=") for i in str(text or "").split(",") if i.strip()))
    for axis, value in items:
        if axis not in POLICY_AXES:
            raise InputError("max_error", f"{axis}={value}", "axis=number with axis one of " + ", ".join(POLICY_AXES))
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InputError("max_error", f"{axis}={value}", "a relative RMS error >= 0") from None
        if not number >= 0 or math.isinf(number):
            raise InputError("max_error", f"{axis}={value}", "a relative RMS error >= 0")
        budget[axis] = number
    return budget


def admits(axis: str, spec: str, budget: dict) -> bool:
    """Whether ``spec`` on ``axis`` is within the budget (module doc: error feedback on dp)."""
    codec = compile_spec(spec)
    if fed_back(axis, codec):
        return codec.error < EF_LIMIT
    return codec.error <= budget[axis]


@dataclass
class SearchResult:
    rows: list                 # one dict per (cluster, plan, policy), fastest first (``within_budget`` or not)
    best_uncompressed: dict | None   # the fastest uncompressed row of any cluster
    pareto: list               # rows on the front, in the order of ``front_keys``
    plans: int                 # candidate plans
    skipped_oom: int           # plans that do not fit
    evaluated: int             # (plan, policy) predictions
    seconds: float
    dropped: dict = field(default_factory=dict)   # {axis: [specs over budget]}
    budget: dict = field(default_factory=dict)
    clusters: list = field(default_factory=list)  # the clusters searched (variants named BASE:key=value,...)
    best_uncompressed_by_cluster: dict = field(default_factory=dict)
    front_keys: tuple = ("uncompensated_error", "effective_step_time_s")   # what the front weighs (``front_keys``)
    tokens: float | None = None                   # the token budget the cost columns are of
    resumed: int = 0                              # plans whose rows came from the stream resumed
    regime: Regime | None = None                  # the training regime of the steps inflation

    @property
    def ranked(self) -> list:
        """The rows within the error budget, fastest first."""
        return [r for r in self.rows if r["within_budget"]]

    @property
    def per_minute(self) -> float:
        return 60.0 * self.evaluated / self.seconds if self.seconds > 0 else 0.0


def plan_space(model: str, cluster: str, gpus, nodes, gbs: int, max_mbs: int = 8, recompute: str = "none",
               zero=(0, 1, 2, 3), schedules=("1f1b", "interleaved:2"), sequence_parallel=(False, True),
               hpz=(False, True), seq: int | None = None) -> list[dict]:
    """Every plan to try: ``perfmodel.explore.sweep.candidate_plans`` times sequence parallelism (tp > 1),
    schedules (interleaving where pp > 1; invalid ones are refused by ``make_plan`` and skipped)
    and hpZ (ZeRO-3 with dp > 1)."""
    out = []
    for base in candidate_plans(model, cluster, gpus, nodes, gbs, max_mbs, recompute, zero, seq):
        sps = sequence_parallel if base["tp"] > 1 else (False,)
        scheds = schedules if base["pp"] > 1 else schedules[:1]
        hpzs = hpz if base["zero"] == 3 and base["dp"] > 1 else (False,)
        for sp, sched, h in itertools.product(sps, scheds, hpzs):
            out.append({**base, "sequence_parallel": sp, "schedule": sched, "hpz": h})
    return out


_VARIED = frozenset({*PLAN_KEYS, "gpus", "nodes", "gbs"})    # what a search varies or sets itself


@dataclass(frozen=True, kw_only=True)
class PlanSpace:
    """What plans a search enumerates (module doc): ``model`` on ``cluster`` (one name, several: a
    list, or comma-separated: ``parse_clusters``), each varied over ``cluster_grid`` where given
    (``topologies.variants``: ``"gpus_per_node=4,8 nic_Gbps=100,200"``); the job's size (``gpus`` or
    ``nodes``) and global batch ``gbs``; every layout ``perfmodel.explore.sweep`` finds with
    microbatches up to ``max_mbs`` and ``recompute`` (``any``: every mode), times the ``zero``
    stages, ``schedules``, ``sequence_parallel`` and ``hpz`` where they apply (``plan_space``).
    ``fixed``: PlanRequest fields every plan shares (``seq``, ``compute_dtype``, ``grad_dtype``, ...)."""

    model: str
    cluster: str | list | tuple
    gbs: int
    gpus: int | None = None
    nodes: int | None = None
    cluster_grid: str | dict | None = None
    max_mbs: int = 8
    recompute: str = "none"
    zero: tuple = (0, 1, 2, 3)
    schedules: tuple = ("1f1b", "interleaved:2")
    sequence_parallel: tuple = (False, True)
    hpz: tuple = (False, True)
    fixed: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "fixed", _names_in("fixed", self.fixed, REQUEST_FIELDS - _VARIED,
                                                    "PlanRequest fields every plan shares"))

    @property
    def seq(self) -> int | None:
        """The sequence length every plan shares (None: the model's)."""
        return self.fixed.get("seq")


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """How to search (module doc): ``candidates``, per-axis specs (``parse_candidates``' text or
    {axis: [spec, ...]}), and ``max_error``, the per-axis budgets over the defaults
    (``parse_max_error``); ``convergence``: the training regime of the steps inflation
    (``perfmodel.explore.convergence``: a ``Regime``, a ``realrun convergence`` file, or None for the
    default); ``tokens`` adds what training that many tokens takes and ``gpu_hour_price`` (USD, one
    number or per cluster) its cost (``perfmodel.explore.cost``). ``executor``: ``local`` (``workers``
    processes, None: every core) or ``dask`` (a LocalCluster of ``workers`` processes, or the Dask
    cluster at ``scheduler``: ``perfmodel.explore.executors``). ``stream``: a CSV file every family's
    rows are appended to as it finishes; ``resume``: continue that file, skipping the families whose
    rows are all there (``perfmodel.explore.stream``; the result is an uninterrupted search's).
    ``progress(done, total)`` in plans of all clusters, after each family of plans (one pipeline
    shape, timed together). ``predict``: PredictOptions fields every prediction shares
    (``calibration``, ``library``, ``engine``, ...)."""

    candidates: str | dict = DEFAULT_CANDIDATES
    max_error: str | dict | None = None
    convergence: str | Regime | None = None
    tokens: float | str | None = None
    gpu_hour_price: float | str | dict | None = None
    executor: str = "local"
    workers: int | None = 1
    scheduler: str | None = None
    stream: str | None = None
    resume: bool = False
    progress: Callable | None = None
    predict: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "predict", _names_in("predict", self.predict, SEARCH_OPTION_FIELDS,
                                                      "PredictOptions fields every prediction shares"))


def _names_in(name: str, given, allowed: frozenset, what: str) -> dict:
    """``given`` as a new dict, each of its keys one of ``allowed`` (else an InputError naming ``name``)."""
    given = dict(given)
    for key in given:
        if key not in allowed:
            raise InputError(name, key, f"{what}: {', '.join(sorted(allowed))}")
    return given


_SPACE_FIELDS = frozenset(f.name for f in fields(PlanSpace)) - {"fixed"}
_SEARCH_FIELDS = frozenset(f.name for f in fields(SearchOptions)) - {"predict"}


def space_and_options(model: str, cluster: str | list, **kw) -> tuple[PlanSpace, SearchOptions]:
    """The keyword form mapped onto the objects: each keyword is a field of PlanSpace or
    SearchOptions, or of PlanRequest (into ``PlanSpace.fixed``) or PredictOptions (into
    ``SearchOptions.predict``)."""
    unknown = set(kw) - _SPACE_FIELDS - _SEARCH_FIELDS - REQUEST_FIELDS - SEARCH_OPTION_FIELDS
    if unknown:
        raise TypeError(f"search() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    space = PlanSpace(model=model, cluster=cluster, **{k: v for k, v in kw.items() if k in _SPACE_FIELDS},
                      fixed={k: v for k, v in kw.items() if k in REQUEST_FIELDS and k not in _SPACE_FIELDS})
    options = SearchOptions(**{k: v for k, v in kw.items() if k in _SEARCH_FIELDS},
                            predict={k: v for k, v in kw.items() if k in SEARCH_OPTION_FIELDS})
    return space, options


def search(space: PlanSpace | str | None = None, options: SearchOptions | str | list | None = None, /,
           **kw) -> SearchResult:
    """Search clusters x plans x policies (module doc): ``search(space, options)`` takes a
    ``PlanSpace`` (what plans) and ``SearchOptions`` (how: candidates, error budget, cost, where it
    runs); the keyword form ``search(model, cluster, gpus=..., gbs=..., candidates=..., workers=...)``
    names their fields, and PlanRequest's (``seq``, ...) or PredictOptions' (``calibration``,
    ``library``, ...) that every prediction shares, mapped onto them in one place
    (``space_and_options``)."""
    if not isinstance(space, PlanSpace):
        space, options = space_and_options(*(a for a in (space, options) if a is not None), **kw)
    elif kw:
        raise TypeError(f"search(space, options) takes no keywords ({', '.join(sorted(kw))})")
    return _search(space, options if options is not None else SearchOptions())


def _search(space: PlanSpace, opts: SearchOptions) -> SearchResult:
    import time

    start = time.perf_counter()
    check_executor(opts.executor, opts.scheduler, opts.workers)
    check_stream_args(opts.stream, opts.resume)
    clusters = cluster_list(space.cluster, space.cluster_grid)
    budget = parse_max_error(opts.max_error)
    costing = _costing(space.model, clusters, space.gbs, space.seq, opts.tokens, opts.gpu_hour_price)
    regime = opts.convergence if isinstance(opts.convergence, Regime) else load_regime(opts.convergence)
    batch_tokens = space.gbs * (space.seq or load_model(space.model).seq_len)
    admitted, dropped = _admitted(opts.candidates, budget)
    for schedule in space.schedules:      # a bad name is an error, not a schedule no plan allows
        parse_schedule(schedule)
    where, fixed = {"gpus": space.gpus, "nodes": space.nodes}, {**space.fixed, **opts.predict}
    plans = {c: plan_space(space.model, c, space.gpus, space.nodes, space.gbs, space.max_mbs, space.recompute,
                           space.zero, tuple(space.schedules), tuple(space.sequence_parallel), tuple(space.hpz),
                           space.seq) for c in clusters}
    library(fixed.get("library"))   # refused here, not in a worker
    jobs = [(space.model, c, where, space.gbs, family, admitted, budget, fixed) for c in clusters
            for family in families_of(plans[c], space.gbs)]
    total = sum(map(len, plans.values()))
    tag = search_tag(space.model, where, space.gbs, {a: sorted(s) for a, s in admitted.items()}, budget, fixed)
    rows, skipped, resumed = run_families(jobs, total, opts.progress, (opts.executor, opts.workers, opts.scheduler),
                                  opts.stream, opts.resume, tag)
    add_accuracy_cost(rows, regime, batch_tokens,
                      math.ceil(costing["tokens"] / costing["tokens_per_step"]) if costing else None)
    result = _result(rows, total, skipped, time.perf_counter() - start, dropped, budget, clusters, costing)
    result.resumed, result.regime = resumed, regime
    return result


def _admitted(candidates: str | dict, budget: dict) -> tuple[dict, dict]:
    """({axis: candidate specs within the budget, or none}, {axis: the specs over it})."""
    cands = parse_candidates(candidates) if isinstance(candidates, str) else {a: list(s) for a, s in candidates.items()}
    # whole policies are held against the budget by their predicted errors (families._within)
    admitted = {a: [s for s in specs if a == PRESETS_KEY or admits(a, s, budget)] for a, specs in cands.items()}
    dropped = {a: [s for s in specs if s not in admitted[a]] for a, specs in cands.items()}
    for axis, specs in admitted.items():
        if not specs:
            admitted[axis] = ["none"]
    return admitted, dropped


def parse_clusters(text: str) -> list[str]:
    """``dgx-a100,dgx-h100:nic_Gbps=200,oversubscription=2,lassen`` -> the cluster names: commas
    separate clusters, except before a ``key=value`` that continues a variant's (or an emulated
    cluster's) options."""
    out: list[str] = []
    for item in (i.strip() for i in str(text).split(",")):
        if out and "=" in item and ":" not in item and ":" in out[-1]:
            out[-1] += "," + item
        elif item:
            out.append(item)
    if not out:
        raise InputError("cluster", text, "one or more catalog clusters or cluster files, comma-separated")
    return list(dict.fromkeys(out))


def cluster_list(cluster: str | list, grid: str | dict | None = None) -> list[str]:
    """The clusters to search: ``cluster`` (``parse_clusters``), each one varied over ``grid``."""
    from topologies import load_spec
    from topologies.catalog import grid_names

    names = parse_clusters(cluster) if isinstance(cluster, str) else list(dict.fromkeys(cluster))
    if not names:
        raise InputError("cluster", cluster, "one or more catalog clusters or cluster files")
    if grid is not None:        # given, it varies something
        if not grid:
            raise InputError("cluster_grid", grid, "at least one key=value,value,... item, e.g. 'gpus_per_node=4,8'")
        names = list(dict.fromkeys(n for base in names for n in grid_names(base, grid)))
    for name in names:
        load_spec(name)             # every cluster checked before any is searched
    return names


def _costing(model: str, clusters: list, gbs: int, seq: int | None, tokens, price) -> dict | None:
    """What ``perfmodel.explore.cost`` needs per cluster, or None without a token budget."""
    if tokens is None:
        if price is not None:
            raise InputError("gpu_hour_price", price, "needs a token budget (tokens, --tokens): cost is of "
                             "training that many tokens")
        return None
    tokens = parse_tokens(tokens)
    prices = parse_prices(price, clusters) if price is not None else {}
    return {"tokens": tokens, "tokens_per_step": gbs * (seq or load_model(model).seq_len),
            "price": prices, "power_W": {c: board_power_W(c) for c in clusters}}


def _result(rows: list, plans: int, skipped: int, seconds: float, dropped: dict, budget: dict,
            clusters: list, costing: dict | None) -> SearchResult:
    # Ties (plans the model cannot tell apart) ordered by the plan itself: the same rows in the same
    # order however many workers finished in whatever order.
    rows.sort(key=lambda r: (r["effective_step_time_s"], r["step_time_s"], r["total_error"], r["policy"], r["cluster"],
                             *(str(r[k]) for k in PLAN_KEYS)))
    best_by_cluster: dict = {}
    for r in rows:
        if r["policy"] == "none":
            best_by_cluster.setdefault(r["cluster"], r)
    for r in rows:          # a cluster's rows compared with its own best uncompressed plan
        best = best_by_cluster.get(r["cluster"])
        r["speedup_vs_best_uncompressed"] = best["step_time_s"] / r["step_time_s"] if best else float("nan")
        r["speedup_to_target"] = best["step_time_s"] / r["effective_step_time_s"] if best else float("nan")
        if costing:
            r.update(training_cost(_run_row(r), costing["tokens"], costing["tokens_per_step"],
                                   costing["price"].get(r["cluster"]), costing["power_W"][r["cluster"]]))
    best = min(best_by_cluster.values(), key=lambda r: r["step_time_s"], default=None)
    keys = front_keys(rows)
    return SearchResult(rows=rows, best_uncompressed=best, pareto=pareto_front([r for r in rows if r["within_budget"]],
                                                                               keys),
                        plans=plans, skipped_oom=skipped, evaluated=len(rows), seconds=seconds, dropped=dropped,
                        budget=budget, clusters=clusters, best_uncompressed_by_cluster=best_by_cluster,
                        front_keys=keys, tokens=costing["tokens"] if costing else None)


def _run_row(row: dict) -> dict:
    """``row`` as ``training_cost`` reads it: a recipe's step time the run's mean (its uncompressed
    steps at the plan's uncompressed time: ``effective_step_time_s`` over ``steps_inflation``)."""
    if _recipe(row["policy"]) is None:
        return row
    return {**row, "step_time_s": row["effective_step_time_s"] / row["steps_inflation"]}


def front_keys(rows: list) -> tuple:
    """What the Pareto front weighs (smaller is better), in the order it is listed: with a token
    budget (cost, time to train, uncompensated error), the cost in USD where priced, else in
    GPU-hours; without one (uncompensated error, time per step of progress). Error feedback's
    own error is not weighed twice: its cost is in the steps inflation the times carry."""
    if not rows or "time_to_train_s" not in rows[0]:
        return ("uncompensated_error", "effective_step_time_s")
    return ("cost_usd" if "cost_usd" in rows[0] else "gpu_hours", "time_to_train_s", "uncompensated_error")


def pareto_front(rows: list, keys: tuple = ("uncompensated_error", "effective_step_time_s")) -> list:
    """Rows no other row beats on every one of ``keys`` (``perfmodel.explore.cost.pareto_front``); by
    default time per step of progress and uncompensated error, by that error."""
    return cost_front(rows, keys)


def add_accuracy_cost(rows: list, regime: Regime, batch_tokens: int, steps: int | None = None) -> None:
    """What each row's policy costs in training (``perfmodel.explore.convergence``): ``steps_inflation``
    (steps to the uncompressed run's loss over its steps), ``effective_step_time_s`` (step time
    times it: seconds per uncompressed step of progress, what the ranking sorts by; a recipe's
    uncompressed steps at the plan's uncompressed step time: its warm-up share, or with the run's
    ``steps`` (a token budget's) its ``Recipe.modes``) and ``uncompensated_error`` (the per-axis
    errors of axes without error feedback in quadrature: what no later step corrects)."""
    phi = regime.deterministic_fraction(batch_tokens)
    for r in rows:
        compressed, feedback = _policy_axes(r["policy"])
        recipe = _recipe(r["policy"])
        factor, uncompensated = 1.0, 0.0
        for axis, spec in compressed:
            error = regime.error(axis, spec, recipe_error(recipe, axis, spec, r[f"error_{axis}"]))
            factor *= axis_inflation(error, axis in feedback, phi)
            if axis not in feedback:
                uncompensated += r[f"error_{axis}"] ** 2
        # a recipe's uncompressed warm-up runs at the same plan's uncompressed step time
        uncompressed_s = r["step_time_s"] * r["speedup_vs_same_plan_uncompressed"]
        if recipe is not None and steps:   # step by step; a local step priced as a synchronised one (no breakdown)
            r["steps_inflation"], r["effective_step_time_s"] = run_cost(
                _modes(r["policy"], steps), factor, r["step_time_s"], uncompressed_s, r["step_time_s"])
        else:
            r["steps_inflation"], r["effective_step_time_s"] = recipe_cost(recipe, factor, r["step_time_s"],
                                                                           uncompressed_s)
        r["uncompensated_error"] = math.sqrt(uncompensated)


@lru_cache(maxsize=64)
def _modes(policy: str, steps: int) -> list:
    """``Recipe.modes`` of ``policy``'s recipe over ``steps`` (cached: rows share their policies)."""
    return parse_policy(policy).recipe.modes(steps)


@lru_cache(maxsize=4096)
def _recipe(policy: str):
    """The recipe of ``policy`` (None: its specs are all it is)."""
    return parse_policy(policy).recipe


@lru_cache(maxsize=4096)
def _policy_axes(policy: str) -> tuple[tuple, frozenset]:
    """((axis, spec) of the axes ``policy`` compresses, the axes among them whose spec feeds its
    error back and whose axis admits it)."""
    axes = parse_policy(policy).axes
    compressed = tuple((a, p.spec) for a, p in axes.items() if not p.codec.is_none)
    return compressed, frozenset(a for a, p in axes.items() if fed_back(a, p.codec))


