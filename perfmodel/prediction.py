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
from perfmodel.calibration import load_calibration
from perfmodel.catalogs import device
from perfmodel.engines import Env, StepInputs, engine_for
from perfmodel.memory import peak_memory
from perfmodel.mesh import mesh_for
from perfmodel.plan import PlanRequest
from perfmodel.plots import check_picture
from perfmodel.policy import parse_policy, split_policies
from perfmodel.step import DEFAULT_OVERLAP_SLOWDOWN
from perfmodel.timeline import plot_timeline
from perfmodel.trace import trace_events, write_trace
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
    mfu: float
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
    """How to predict: ``policy`` (``perfmodel.policy``), ``engine`` (``analytical`` or ``des``),
    a ``calibration`` profile path, ``overlap_slowdown`` (default: the profile's, else
    DEFAULT_OVERLAP_SLOWDOWN), ``allow_oom`` (predict a plan that does not fit instead of
    refusing it), ``trace`` (a path for Chrome trace-event JSON, or a list the events are
    appended to, processes numbered from ``trace_pid``) and ``timeline`` (a picture path)."""

    policy: str = "none"
    engine: str = "analytical"
    calibration: str | None = None
    overlap_slowdown: float | None = None
    allow_oom: bool = False
    trace: str | list | None = None
    trace_pid: int = 0
    timeline: str | None = None


_PLAN_FIELDS = {f.name for f in fields(PlanRequest)}
_OPTION_FIELDS = {f.name for f in fields(PredictOptions)}


def request_and_options(plan: PlanRequest | None = None, options: PredictOptions | None = None,
                        **kw) -> tuple[PlanRequest, PredictOptions]:
    """The keyword form mapped onto the objects: each keyword replaces the field of its name."""
    unknown = set(kw) - _PLAN_FIELDS - _OPTION_FIELDS
    if unknown:
        raise TypeError(f"predict() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    plan_kw = {k: v for k, v in kw.items() if k in _PLAN_FIELDS}
    option_kw = {k: v for k, v in kw.items() if k in _OPTION_FIELDS}
    plan = replace(plan, **plan_kw) if plan is not None else PlanRequest(**plan_kw)
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
    calib = load_calibration(opts.calibration)
    arch = load_model(model)
    built, ranks = cluster_for(cluster, nodes=request.nodes, gpus=request.gpus)   # a partial last node
    dev = device(built.gpu_model)
    dev = calib.device(dev) if calib else dev
    slowdown = opts.overlap_slowdown
    if slowdown is None:
        slowdown = calib.overlap_slowdown if calib and calib.overlap_slowdown is not None \
            else DEFAULT_OVERLAP_SLOWDOWN
    dtype = request.compute_dtype or ("bf16" if "bf16" in dev.peak_flops_per_s else "fp16")
    dev.peak(dtype)
    plan = request.build(arch, ranks, dtype)
    if not 0 <= slowdown < 1:
        raise InputError("overlap_slowdown", slowdown, "a fraction in [0, 1)")
    pol = parse_policy(opts.policy)
    memory = peak_memory(arch, plan, _hpz_ranks(plan, built))
    fits = memory["total"] <= dev.hbm_bytes
    if not fits and not opts.allow_oom:
        need, have = memory["total"] / 2**30, dev.hbm_bytes / 2**30
        raise InputError("memory", f"{need:.1f} GiB", f"does not fit: needs {need:.1f} GiB of {have:.1f} GiB "
                         "per GPU (more tp/pp, zero, recompute or a smaller mbs; or --allow-oom)")
    engine = engine_for(opts.engine)
    env = Env(built, dev, calib, slowdown)
    timing = engine.time_step(StepInputs(model=arch, plan=plan, env=env, policy=pol))
    _draw(timing, plan, pol, opts, f"{arch.name} on {built.name} ({ranks} GPUs): {pol.text}, {engine.name}")
    out = timing.breakdown
    base = out.total if pol.is_none else _uncompressed_step(arch, plan, (built, dev, calib, slowdown), engine.name)
    return _record(arch, built, dev, plan, pol, timing, memory, fits, base, engine.name)


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
    return dict(zip(("gemm_s", "attention_s", "memory_bound_s"), (m * x for x in busiest.compute_parts)))


def _hpz_ranks(plan, built) -> int:
    """Ranks of hpZ's secondary partition: the dp group's ranks on one host (1 without hpZ)."""
    if not plan.hpz:
        return 1
    return len(mesh_for(plan).node_groups("dp", built.gpus_per_host)[0])


def _record(arch, built, dev, plan, pol, timing, memory, fits, base, engine) -> StepRecord:
    out, tally, stages = timing.breakdown, timing.tally, timing.stages
    step = out.total
    tokens = plan.gbs * plan.seq
    model_flops = arch.model_flops_per_token(plan.seq) * tokens
    hw_flops = sum(st.hardware_flops for st in stages)
    hw_per_gpu = hw_flops * plan.microbatches / plan.pp
    model_tflops = model_flops / step / plan.gpus / 1e12
    return StepRecord(
        model=arch.name, cluster=built.name, gpu=dev.key, gpus=plan.gpus,
        plan={k: v for k, v in asdict(plan).items()} | {"microbatches": plan.microbatches},
        policy=pol.text, policy_axes=pol.describe(), step_time_s=step, samples_per_s=plan.gbs / step,
        tokens_per_s=tokens / step, model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hw_per_gpu / step / 1e12,
        mfu=model_tflops * 1e12 / dev.peak(plan.compute_dtype), breakdown=vars(out).copy(),
        wire_bytes=tally.wire, memory_per_gpu_bytes=memory["total"], memory_breakdown=memory, fits=fits,
        stage_layers=plan.stage_layers(arch.num_layers), speedup_vs_uncompressed=base / step,
        error_estimate={a: tally.error[a] for a in NAMES if a in tally.error},
        collectives=tally.algorithms, kernel_s=tally.kernels, compute_detail=_compute_detail(stages, plan),
        engine=engine, simulated_events=timing.simulated_events, idle_policy_axes=idle_axes(pol, plan, arch))


def compare(model: str, cluster: str, policies, plan: PlanRequest | None = None,
            options: PredictOptions | None = None, **kw) -> list[StepRecord]:
    """The same plan under several policies (a list, or a string as ``split_policies`` takes);
    ``trace``: one timeline file with every policy's stages (``perfmodel.trace``); ``timeline``:
    the same as one picture. ``plan``, ``options`` and keywords as ``predict`` takes them."""
    request, opts = request_and_options(plan, options, **kw)
    _check_outputs(opts.trace, opts.timeline)
    names = split_policies(policies) if isinstance(policies, str) else list(policies)
    events: list | None = [] if opts.trace is not None or opts.timeline is not None else None
    records = [predict(model, cluster, request, replace(opts, policy=p, trace=events, trace_pid=100 * i,
                                                        timeline=None))
               for i, p in enumerate(names)]
    if opts.trace is not None:
        write_trace(opts.trace, events)
    if opts.timeline is not None:
        first = records[0]
        plot_timeline(events, opts.timeline, f"{first.model} on {first.cluster} ({first.gpus} GPUs): "
                      f"{len(records)} policies, {first.engine}")
    return records
