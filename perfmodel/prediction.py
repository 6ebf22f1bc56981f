"""``predict``: the data flow of docs/design.md, Data flow, assembled in order.

ModelSpec -> workload; PlanRequest -> ParallelPlan -> mesh; (workload, mesh) -> the axes' comm
events; policy -> compressed collectives costed on the fabric -> an engine (``perfmodel.engines``,
by name) times the step -> StepRecord. ``predict(model, cluster, plan, options)`` takes the two
objects; its keyword form (``predict(model, cluster, tp=4, policy="hybrid")``) maps each keyword
onto the field of the same name in one place (``request_and_options``), and the CLI builds the
same objects.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache

from perfmodel.axes import NAMES, active_axes
from perfmodel.calibration.profile import load_profile
from perfmodel.devices import device
from perfmodel.engines import Env, StepInputs, engine_for
from perfmodel.plan.framework import framework_profile
from perfmodel.plan.memory import peak_memory
from perfmodel.plan.mesh import mesh_for
from perfmodel.plan.parallel import REQUEST_FIELDS, PlanRequest
from perfmodel.plan.precision import HIGH_PRECISIONS, peak_dtype, recipe
from perfmodel.report.plots import check_picture
from perfmodel.compression.policy import parse_policy, split_policies
from perfmodel.step.timing import DEFAULT_OVERLAP_SLOWDOWN
from perfmodel.report.timeline import plot_timeline
from perfmodel.report.trace import trace_events, write_trace
from perfmodel.workload import load_model
from topologies import InputError, cluster_for
from topologies.clikit import check_writable


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    model: str
    cluster: str
    gpu: str
    gpus: int
    plan: dict
    policy: str
    policy_axes: dict
    step_time_s: float
    samples_per_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float     # (6 N + 12 L h s) per token, N = all parameters
    hardware_tflops_per_gpu: float  # FLOPs executed, recompute included
    mfu: float                      # model FLOPs against the compute dtype's dense peak: bf16's for every
    #                                 low precision (Megatron-Bridge's and most papers' convention)
    mfu_precision: float            # the same against the peak of the precision's GEMMs (fp8, fp4; datasheets)
    breakdown: dict
    wire_bytes: dict                # {axis: {tier: bytes per rank per step}}
    memory_per_gpu_bytes: float
    memory_breakdown: dict
    fits: bool
    stage_layers: tuple
    speedup_vs_uncompressed: float
    error_estimate: dict            # {axis: relative RMS error of its largest collective}
    kernel_s: dict                  # {axis: {critical_s, beside_compute_s}}: compression kernels per step (stage 0)
    engine: str                     # analytical, or des (perfmodel.simulate: link sharing simulated)
    simulated_events: int           # events the des engine handled for this step (0 for analytical)
    idle_policy_axes: tuple         # axes the policy compresses that carry no traffic in this plan
    compute_detail: dict            # compute_s of the busiest stage as gemm_s, attention_s, memory_bound_s
    collectives: dict               # {event: "op:algorithm:compressor"}

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class PredictOptions:
    """How to predict: ``policy`` (``perfmodel.compression.policy``), ``engine`` (``analytical`` or ``des``),
    a ``calibration`` profile path (or a ``perfmodel.calibration.profile.Calibration``), ``library`` (the
    collective library: nccl, the default, or mpi; ``perfmodel.collectives.library``), ``overlap_slowdown``
    (default: the profile's, else DEFAULT_OVERLAP_SLOWDOWN), ``allow_oom`` (predict a plan that does not fit instead of
    refusing it), ``trace`` (a path for Chrome trace-event JSON, or a list the events are
    appended to, processes numbered from ``trace_pid``) and ``timeline`` (a picture path)."""

    policy: str = "none"
    engine: str = "analytical"
    calibration: str | None = None
    library: str = "nccl"
    overlap_slowdown: float | None = None
    allow_oom: bool = False
    trace: str | list | None = None
    trace_pid: int = 0
    timeline: str | None = None


OPTION_FIELDS = frozenset(f.name for f in fields(PredictOptions))


def request_and_options(plan: PlanRequest | None = None, options: PredictOptions | None = None,
                        **kw) -> tuple[PlanRequest, PredictOptions]:
    """The keyword form mapped onto the objects: each keyword replaces the field of its name."""
    unknown = set(kw) - REQUEST_FIELDS - OPTION_FIELDS
    if unknown:
        raise TypeError(f"predict() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    plan_kw = {k: v for k, v in kw.items() if k in REQUEST_FIELDS}
    option_kw = {k: v for k, v in kw.items() if k in OPTION_FIELDS}
    plan = plan.with_(**plan_kw) if plan is not None else PlanRequest.of(**plan_kw)
    options = replace(options, **option_kw) if options is not None else PredictOptions(**option_kw)
    return plan, options


def predict(model: str = "gpt-neox-20b", cluster: str = "lassen", plan: PlanRequest | None = None,
            options: PredictOptions | None = None, **kw) -> StepRecord:
    """Predict one training step of ``model`` on ``cluster`` (see the CLI's ``predict --help``).

    ``plan`` (PlanRequest) and ``options`` (PredictOptions), or their fields as keywords
    (``predict("gpt3-1.3b", "dgx-a100", gpus=32, tp=2, policy="dp=int8", engine="des")``).
    Raises InputError (naming the field) for an invalid plan, and when the plan does not fit in
    GPU memory unless ``allow_oom``. Output paths are checked before any work.
    """
    request, opts = request_and_options(plan, options, **kw)
    _check_outputs(opts.trace, opts.timeline)
    setup = _setup(model, cluster, request, opts)
    pol = parse_policy(opts.policy)
    _check_fits(setup, opts, [pol])
    engine = engine_for(opts.engine)
    timing = engine.time_step(setup.inputs(pol))
    _draw(timing, setup.plan, pol, opts,
          f"{setup.arch.name} on {setup.built.name} ({setup.ranks} GPUs): {pol.text}, {engine.name}")
    return _finish(setup, pol, timing, engine.name)


def step_seconds(model: str, cluster: str, plan: PlanRequest | None = None, options: PredictOptions | None = None,
                 **kw) -> float:
    """The step time alone of ``predict`` (no uncompressed rerun, no record, no pictures): what a
    solver over one input calls many times (``perfmodel.explore.breakeven``)."""
    request, opts = request_and_options(plan, options, **kw)
    setup = _setup(model, cluster, request, opts)
    pol = _policy(opts.policy)
    _check_fits(setup, opts, [pol])
    return engine_for(opts.engine).time_step(setup.inputs(pol)).breakdown.total


def predict_many(model: str, cluster: str, items: list, options: PredictOptions | None = None) -> list:
    """Many steps at once, as ``predict`` would give them one by one: ``items`` is a list of
    (PlanRequest, [policy text, ...]); per item, its StepRecords in its policies' order, or the
    InputError ``predict`` raises for that plan (invalid, or it does not fit). An engine that
    times steps in batches (``time_steps``: the analytical one evaluates the pipelines of one
    shape together, ``perfmodel.step.makespan``) gets them all; a bad policy raises. ``options``: as
    ``predict``'s, without trace or timeline (its ``policy`` is not used)."""
    opts = options or PredictOptions()
    if opts.trace is not None or opts.timeline is not None:
        raise InputError("trace", opts.trace or opts.timeline, "none in predict_many (predict draws one step)")
    engine = engine_for(opts.engine)
    out, work = [], []
    for request, policies in items:
        pols = [_policy(p) for p in policies]
        try:
            setup = _setup(model, cluster, request, opts)
            _check_fits(setup, opts, pols)
        except InputError as err:
            out.append(err)
            continue
        out.append([])
        work += [(len(out) - 1, setup, pol) for pol in pols]
    batch = getattr(engine, "time_steps", None)
    steps = [setup.inputs(pol) for _, setup, pol in work]
    timings = batch(steps) if batch else [engine.time_step(s) for s in steps]
    plain = {i: t.breakdown.total for (i, _, pol), t in zip(work, timings) if pol.is_none}
    for (i, setup, pol), timing in zip(work, timings):
        out[i].append(_finish(setup, pol, timing, engine.name, plain.get(i)))
    return out


@lru_cache(maxsize=4096)
def _policy(text: str):
    """``parse_policy``, once per text (a search meets each policy on many plans; never changed)."""
    return parse_policy(text)


@lru_cache(maxsize=4096)
def _plan_dict(plan) -> dict:
    return plan.as_dict() | {"microbatches": plan.microbatches}


@dataclass(frozen=True, eq=False)
class _Setup:
    """What a prediction needs before its policy: the model, cluster, device, plan and memory."""

    arch: object
    built: object
    ranks: int
    dev: object
    calib: object
    slowdown: float
    plan: object
    memory: dict

    def inputs(self, pol) -> StepInputs:
        """The step's inputs under ``pol``, its parameter gathers as the plan's precision makes them
        (``CompressionPolicy.under``)."""
        return StepInputs(model=self.arch, plan=self.plan, env=Env(self.built, self.dev, self.calib, self.slowdown),
                          policy=pol.under(recipe(self.plan.precision).eight_bit))


def _setup(model: str, cluster: str, request: PlanRequest, opts: PredictOptions) -> _Setup:
    """``predict``'s checks and objects up to its policy, in its order (cached per request)."""
    calib = load_profile(opts.calibration, opts.library)
    return _setup_cached(model, cluster, request, calib, opts.overlap_slowdown)


@lru_cache(maxsize=4096)
def _setup_cached(model, cluster, request, calib, overlap_slowdown) -> _Setup:
    stack = framework_profile(request.framework)      # the stack's host time (make_plan takes its overlap defaults)
    arch = load_model(model)
    built, ranks = cluster_for(cluster, nodes=request.nodes, gpus=request.gpus)   # a partial last node
    dev = device(built.gpu_model)
    dev = stack.device(calib.device(dev) if calib else dev)
    slowdown = overlap_slowdown
    if slowdown is None:
        slowdown = calib.overlap_slowdown if calib and calib.overlap_slowdown is not None \
            else DEFAULT_OVERLAP_SLOWDOWN
    dtype = request.compute_dtype or (request.precision if request.precision in HIGH_PRECISIONS else None) \
        or next(d for d in ("bf16", "fp16", "fp32") if d in dev.peak_flops_per_s)
    dev.peak(dtype)
    plan = request.build(arch, ranks, dtype)
    if not 0 <= slowdown < 1:
        raise InputError("overlap_slowdown", slowdown, "a fraction in [0, 1)")
    memory = peak_memory(arch, plan, _hpz_ranks(plan, built), dev.arch)
    return _Setup(arch, built, ranks, dev, calib, slowdown, plan, memory)


def _check_fits(setup: _Setup, opts: PredictOptions, policies: list) -> None:
    """The plan against its GPU: its precision runs there (``Recipe.check``), and it fits memory with
    fp8 primary weights where one of ``policies`` gathers them (the record's ``fits`` is per policy)."""
    rec = recipe(setup.plan.precision)
    rec.check(setup.dev)
    for pol in policies:
        if pol.recipe is not None:
            pol.recipe.check_zero(setup.plan.zero)
    memory = _memory(setup, any(p.gathers_fp8_params for p in policies),
                     min((_feedback(setup, p) for p in policies), default=0.0))
    if memory["total"] > setup.dev.hbm_bytes and not opts.allow_oom:
        need, have = memory["total"] / 2**30, setup.dev.hbm_bytes / 2**30
        raise InputError("memory", f"{need:.1f} GiB", f"does not fit: needs {need:.1f} GiB of {have:.1f} GiB "
                         "per GPU (more tp/pp, zero, recompute or a smaller mbs; or --allow-oom)")


def _finish(setup: _Setup, pol, timing, engine: str, plain: float | None = None) -> StepRecord:
    """The record, with the same plan's uncompressed step (``plain``: already timed) for its speedup."""
    s = setup
    if pol.is_none:
        base = timing.breakdown.total
    elif plain is not None:
        base = plain
    else:
        base = _uncompressed_step(s.arch, s.plan, (s.built, s.dev, s.calib, s.slowdown), engine)
    memory = _memory(s, pol.gathers_fp8_params, _feedback(s, pol))
    fits = memory["total"] <= s.dev.hbm_bytes
    return _record(s.arch, s.built, s.dev, s.plan, pol, timing, dict(memory), fits, base, engine)


def _memory(setup: _Setup, fp8_params: bool, feedback: float = 0.0) -> dict:
    """The plan's peak memory on its GPU: the setup's (a low precision's weight copies as the GPU's
    architecture keeps them), with fp8 primary weights where the parameter gathers carry fp8
    (``fp8_params``) into an 8-bit recipe's GEMMs, and a compression recipe's state of ``feedback``
    bytes per parameter (``perfmodel.plan.memory``)."""
    fp8 = fp8_params and recipe(setup.plan.precision).eight_bit
    if not fp8 and not feedback:
        return setup.memory
    return _policy_memory(setup.arch, setup.plan, _hpz_ranks(setup.plan, setup.built), setup.dev.arch, fp8, feedback)


def _feedback(setup: _Setup, pol) -> float:
    """Bytes per parameter of ``pol``'s recipe state on one GPU of the plan's dp group (0: none)."""
    return pol.recipe.state_bytes(setup.plan.dp) if pol.recipe is not None else 0.0


@lru_cache(maxsize=4096)
def _policy_memory(arch, plan, hpz_ranks: int, gpu_arch: str, fp8_params: bool, feedback: float) -> dict:
    return peak_memory(arch, plan, hpz_ranks, gpu_arch, fp8_params=fp8_params, feedback=feedback)


def _draw(timing, plan, pol, opts: PredictOptions, title: str) -> None:
    """The step's trace and timeline picture, where asked for."""
    if opts.trace is None and opts.timeline is None:
        return
    events = trace_events(timing.stages, plan, vars(timing.breakdown), pol.text, opts.trace_pid, timing.simulation)
    if isinstance(opts.trace, list):
        opts.trace.extend(events)
    elif opts.trace is not None:
        write_trace(opts.trace, events)
    if opts.timeline is not None:
        plot_timeline(events, opts.timeline, title)


@lru_cache(maxsize=4096)
def _uncompressed_step(arch, plan, env_key, engine: str = "analytical") -> float:
    built, dev, calib, slowdown = env_key
    step = StepInputs(model=arch, plan=plan, env=Env(built, dev, calib, slowdown), policy=parse_policy("none"))
    return engine_for(engine).time_step(step).breakdown.total


def _check_outputs(trace, timeline) -> None:
    """Refuse output paths that cannot be written, or a picture format we do not draw, first."""
    if isinstance(trace, str):
        check_writable(trace, "trace")
    check_picture(timeline, "timeline")


def idle_axes(policy, plan, model) -> tuple:
    """Axes whose spec compresses but that move nothing in this plan (``perfmodel.axes``:
    tp 1, pp 1, dp 1 without a tied embedding across stages, no ZeRO gathers): reported, never
    silently ignored."""
    active = active_axes(plan, model)
    return tuple(a for a in policy.axes if policy.asks_for(a) and a not in active)


def _compute_detail(stages, plan) -> dict:
    """The busiest stage's compute per step by kind (they sum to its compute seconds)."""
    busiest = max(stages, key=lambda st: st.fwd_op + st.bwd_op)
    m = plan.microbatches
    names = ("gemm_s", "attention_s", "memory_bound_s", "host_bound_s")
    return dict(zip(names, (m * x for x in busiest.compute_parts)))


def _hpz_ranks(plan, built) -> int:
    """Ranks of hpZ's secondary partition: the dp group's ranks on one host (1 without hpZ)."""
    if not plan.hpz:
        return 1
    return len(mesh_for(plan).node_groups("dp", built.gpus_per_host)[0])


def _record(arch, built, dev, plan, pol, timing, memory, fits, base, engine) -> StepRecord:
    """The step's record. ``mfu``: model FLOPs per second per GPU over the compute dtype's dense peak
    (bf16's under every low precision: the convention of Megatron-Bridge's tables and most papers);
    ``mfu_precision``: over the dense peak of the precision's GEMMs (fp8 for the fp8 recipes and
    mxfp8, fp4 for nvfp4; the datasheet figures of catalog/gpus.toml), equal to ``mfu`` in a high
    precision. ``policy`` and its axes as the plan's precision makes them (``CompressionPolicy.under``)."""
    pol = pol.under(recipe(plan.precision).eight_bit)
    out, tally, stages = timing.breakdown, timing.tally, timing.stages
    step = out.total
    tokens = plan.gbs * plan.seq
    model_flops = arch.model_flops_per_token(plan.seq) * tokens
    hw_flops = sum(st.hardware_flops for st in stages)
    hw_per_gpu = hw_flops * plan.microbatches / plan.pp
    model_tflops = model_flops / step / plan.gpus / 1e12
    return StepRecord(
        model=arch.name, cluster=built.name, gpu=dev.key, gpus=plan.gpus,
        plan=dict(_plan_dict(plan)),
        policy=pol.text, policy_axes=pol.describe(), step_time_s=step, samples_per_s=plan.gbs / step,
        tokens_per_s=tokens / step, model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hw_per_gpu / step / 1e12,
        mfu=model_tflops * 1e12 / dev.peak(plan.compute_dtype),
        mfu_precision=model_tflops * 1e12 / dev.peak(peak_dtype(plan.precision, plan.compute_dtype)),
        breakdown=out.as_dict(),
        wire_bytes=tally.wire, memory_per_gpu_bytes=memory["total"], memory_breakdown=memory, fits=fits,
        stage_layers=plan.stage_layers(arch.num_layers), speedup_vs_uncompressed=base / step,
        error_estimate={a: tally.error[a] for a in NAMES if a in tally.error},
        collectives=tally.algorithms, kernel_s=tally.kernels, compute_detail=_compute_detail(stages, plan),
        engine=engine, simulated_events=timing.simulated_events, idle_policy_axes=idle_axes(pol, plan, arch))


def compare(model: str, cluster: str, policies, plan: PlanRequest | None = None,
            options: PredictOptions | None = None, **kw) -> list[StepRecord]:
    """The same plan under several policies (a list, or a string as ``split_policies`` takes);
    ``trace``: one timeline file with every policy's stages (``perfmodel.report.trace``); ``timeline``:
    the same as one picture. ``plan``, ``options`` and keywords as ``predict`` takes them. The plan is
    refused where no policy fits it in memory; a policy that alone does not (a recipe's error-feedback
    state) is timed with ``fits`` False."""
    request, opts = request_and_options(plan, options, **kw)
    _check_outputs(opts.trace, opts.timeline)
    names = split_policies(policies) if isinstance(policies, str) else list(policies)
    _check_fits(_setup(model, cluster, request, opts), opts, [parse_policy(p) for p in names])
    events: list | None = [] if opts.trace is not None or opts.timeline is not None else None
    records = [predict(model, cluster, request, replace(opts, policy=p, trace=events, trace_pid=100 * i,
                                                        timeline=None, allow_oom=True))
               for i, p in enumerate(names)]
    if opts.trace is not None:
        write_trace(opts.trace, events)
    if opts.timeline is not None:
        first = records[0]
        plot_timeline(events, opts.timeline, f"{first.model} on {first.cluster} ({first.gpus} GPUs): "
                      f"{len(records)} policies, {first.engine}")
    return records
