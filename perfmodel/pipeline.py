"""``predict``: the data flow of docs/design.md, Data flow in order.

ModelSpec -> workload; ParallelPlan -> mesh; (workload, mesh) -> comm events; policy ->
compressed collectives costed on the fabric -> stage times -> step timeline -> StepRecord.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from perfmodel import comm
from perfmodel.calibration import load_calibration
from perfmodel.catalogs import device
from perfmodel.collective import collective_on
from perfmodel.collectives.fabric import make_ctx
from perfmodel.compression import compile_spec
from perfmodel.compute import optimizer_time_s, stage_compute
from perfmodel.memory import peak_memory, stage_params
from perfmodel.mesh import mesh_for
from perfmodel.plan import DEFAULT_BUCKET_BYTES, make_plan
from perfmodel.policy import parse_policy, split_policies
from perfmodel.simulate.step import StageWork, simulate
from perfmodel.plots import check_picture
from perfmodel.timeline import plot_timeline
from perfmodel.trace import trace_events, write_trace
from perfmodel.step import (DEFAULT_OVERLAP_SLOWDOWN, KERNEL_SM_SHARE, Breakdown, StageTime, Tally, exposed_pp,
                            zero3_backward, zero3_forward,
                            overlap_buckets, pipeline_time, split_kernel)
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


@dataclass(frozen=True, eq=False)
class Env:
    """Where the step runs: the built cluster, its (calibrated) device, the profile if any."""

    built: object
    dev: object
    calib: object
    overlap_slowdown: float


def _cost(env, event, policy):
    """The collective record of one event under the policy (cached: buckets repeat sizes)."""
    axis = policy.axis(event.axis)
    return _cost_cached(env.built, env.calib, event.op, event.nbytes, axis.codec_for(event.nbytes),
                        axis.spec_for(event.nbytes), event.dtype, event.group, event.concurrent)


@lru_cache(maxsize=65536)
def _cost_cached(built, calib, op, nbytes, codec, label, dtype, group, concurrent):
    ctx = make_ctx(built, group, concurrent, calib)
    return collective_on(built, ctx, op, nbytes, calib.codec(codec) if calib else codec, dtype, label=label)


def _stage(arch, plan, env, policy, mesh, s, layers, tally) -> StageTime:
    first, last = s == 0, s == plan.pp - 1
    sc = stage_compute(arch, plan, env.dev, layers, first, last)
    st = StageTime(compute=sc.fwd_s + sc.bwd_s, bwd=sc.bwd_s, fwd_op=sc.fwd_s, bwd_op=sc.bwd_s,
                   hardware_flops=sc.hardware_flops, compute_parts=(sc.gemm_s, sc.attention_s, sc.memory_bound_s))
    m = plan.microbatches
    layer_tp = {"fwd": 0.0, "bwd": 0.0}
    events = comm.tp_events(arch, plan, mesh, layers) + comm.vocab_events(arch, plan, mesh, first, last)
    for event in events + comm.pp_events(arch, plan, mesh):
        rec = _cost(env, event, policy)
        wire, kernel = split_kernel(rec)
        per_mb = event.count / m
        setattr(st, event.axis, getattr(st, event.axis) + wire * per_mb)
        st.compression += kernel * per_mb
        _place(st, event, rec.time_s * per_mb, kernel * per_mb)
        if event.name.startswith("tp."):
            layer_tp[event.phase] += wire * per_mb
        if s == 0:
            tally.add(event, rec, event.count)
            tally.add_kernel(event.axis, kernel * event.count)
    if plan.tp_overlap:
        _overlap_tp(st, layer_tp, sc, plan.tp, env.overlap_slowdown)
    if plan.zero == 3 and plan.dp > 1:
        fwd, bwd, k_fwd, k_bwd, st.zero3_layers = _zero3_exposed(arch, plan, env, policy, mesh, layers, sc,
                                                                  tally if s == 0 else None)
        st.zero3, st.compression = fwd + bwd, st.compression + k_fwd + k_bwd
        st.fwd_op, st.bwd_op = st.fwd_op + fwd + k_fwd, st.bwd_op + bwd + k_bwd
    return st


def _overlap_tp(st: StageTime, layer_tp: dict, sc, tp: int, slowdown: float) -> None:
    """Megatron's TP communication overlap (``--tp-comm-overlap``, Transformer Engine): each
    layer's all-gathers and reduce-scatters are split into ``tp`` chunks pipelined against the
    GEMMs that consume or produce them, so all but the first chunk hide behind the operation's
    GEMM seconds. The hidden seconds slow the GEMMs by ``overlap_slowdown`` (SMs given to the
    communication, as for DP overlap); ``tp_comm`` keeps the exposed part and that slowdown."""
    share = {"fwd": sc.fwd_s, "bwd": sc.bwd_s}
    total = max(sc.fwd_s + sc.bwd_s, 1e-30)
    for phase, seconds in layer_tp.items():
        gemm = sc.gemm_s * share[phase] / total
        saved = min(seconds * (1 - 1 / tp), gemm) * (1 - slowdown)
        st.tp -= saved
        if phase == "fwd":
            st.fwd_op -= saved
        else:
            st.bwd_op -= saved
            st.bwd -= saved


def _place(st: StageTime, event, seconds: float, kernel: float) -> None:
    """Where an event's per-microbatch seconds block: a transfer of its direction (pp) or the
    stage's forward or backward operation; backward ones also count in the DP window."""
    fwd = event.phase == "fwd"
    if event.axis == "pp":
        st.pp_kernel += kernel
        if fwd:
            st.send_fwd += seconds
        else:
            st.send_bwd += seconds
    elif fwd:
        st.fwd_op += seconds
    else:
        st.bwd_op += seconds
    if not fwd:
        st.bwd += seconds


def _zero3_exposed(arch, plan, env, policy, mesh, layers, sc, tally) -> tuple:
    """Per microbatch: (forward, backward) exposed communication seconds, (forward, backward)
    kernel seconds, and the per-layer shape the event engine runs. A layer's gather, prefetched,
    hides its wire time behind the previous layer's compute (the first one cannot), its gradients'
    reduce-scatter behind the next layers' (``zero3_forward``, ``zero3_backward``); its kernels run
    on the GPU that computes and are charged in full wherever they run (``KERNEL_SM_SHARE``)."""
    events = comm.dp_events(arch.layer_params() / plan.tp * layers, arch.layer_params() / plan.tp,
                            plan, mesh, layers, env.built.gpus_per_host)
    t = {e.name: split_kernel(_cost(env, e, policy)) for e in events}
    if tally is not None:
        for e in events:
            rec = _cost(env, e, policy)
            tally.add(e, rec, e.count)
            tally.add_kernel(e.axis, split_kernel(rec)[1] * e.count, beside_compute=True)
    (ag_f, k_f), (ag_b, k_b), (rs, k_rs) = t["zero.allgather.fwd"], t["zero.allgather.bwd"], t["dp.reduce_scatter.bwd"]
    fwd_layer, bwd_layer = sc.fwd_s / max(layers, 1), sc.bwd_s / max(layers, 1)
    fwd = zero3_forward(layers, fwd_layer, ag_f) - sc.fwd_s
    bwd = zero3_backward(layers, bwd_layer, ag_b, rs) - sc.bwd_s
    shape = (layers, fwd_layer, bwd_layer, ag_f, ag_b, rs)
    return fwd, bwd, KERNEL_SM_SHARE * layers * k_f, KERNEL_SM_SHARE * layers * (k_b + k_rs), shape


def _step(arch, plan, env, policy):
    mesh, tally, layers = mesh_for(plan), Tally(), plan.stage_layers(arch.num_layers)
    stages = [_stage(arch, plan, env, policy, mesh, s, n, tally) for s, n in enumerate(layers)]
    out = _pipeline_breakdown(stages, plan)
    params0 = stage_params(arch, plan, layers[0], True, plan.pp == 1)
    if plan.zero < 3:
        events = comm.dp_events(params0, 0, plan, mesh, layers[0])
        _dp_overlap(events, env, policy, stages[0].bwd if plan.dp_overlap else 0.0, out, tally)
    for event in comm.tied_embedding_events(arch, plan, mesh):   # a gradient sum after backward
        _exposed(out, tally, event, _cost(env, event, policy))
    out.optimizer_s = optimizer_time_s(params0 / (plan.dp if plan.zero >= 1 else 1), env.dev)
    return out, tally, stages


def _pipeline_breakdown(stages: list[StageTime], plan) -> Breakdown:
    """The pipeline's seconds by kind, as seen on its bottleneck stage (they sum to the
    pipeline's time): its operations' parts, its transfers where it waited, the bubble."""
    total, bubble, worst = pipeline_time(stages, plan.microbatches, plan.virtual_stages, plan.schedule)
    b, m = stages[worst], plan.microbatches
    pp, compression = m * b.pp, m * b.compression
    if plan.virtual_stages == 1:
        exposed, kernel = exposed_pp(b, m, max(0.0, total - bubble - m * (b.fwd_op + b.bwd_op)))
        pp, compression = exposed - kernel, m * (b.compression - b.pp_kernel) + kernel
    return Breakdown(compute_s=m * b.compute, tp_comm_s=m * b.tp, pp_comm_s=pp, compression_s=compression,
                     dp_comm_exposed_s=m * b.zero3, bubble_s=bubble)


def _dp_overlap(events, env, policy, window, out: Breakdown, tally: Tally) -> None:
    """Gradient buckets against a backward ``window`` (0: none to hide behind, all exposed).
    Their wire time hides behind the backward where it can (compute beside it slowed by
    ``overlap_slowdown``); their kernels are charged wherever they run: exposed ones in the
    tail, hidden ones as compute they displace (``KERNEL_SM_SHARE``)."""
    buckets = [e for e in events if e.where == "overlap"]
    records = [_cost(env, e, policy) for e in buckets]
    runs = [(e.ready_at * window, e.spacing * window, e.count, r.time_s) for e, r in zip(buckets, records)]
    exposed, hidden = overlap_buckets(runs, window)
    kernel = sum(split_kernel(r)[1] * e.count for e, r in zip(buckets, records))
    busy = exposed + hidden
    k_exposed = kernel * exposed / busy if busy > 0 else 0.0
    k_hidden = (kernel - k_exposed) * KERNEL_SM_SHARE
    out.dp_comm_exposed_s += exposed - k_exposed
    out.compression_s += k_exposed + k_hidden
    out.overlap_slowdown_s += env.overlap_slowdown * max(0.0, hidden - (kernel - k_exposed))
    for e, r in zip(buckets, records):
        tally.add(e, r, e.count)
    if buckets:
        tally.add_kernel("dp", k_exposed)
        tally.add_kernel("dp", k_hidden, beside_compute=True)
    for e in events:
        if e.where == "tail":
            _exposed(out, tally, e, _cost(env, e, policy))


def _exposed(out: Breakdown, tally: Tally, event, rec) -> None:
    """A collective on the critical path after backward: wire time to dp_comm_exposed_s, kernels
    to compression_s."""
    wire, kernel = split_kernel(rec)
    out.dp_comm_exposed_s += wire * event.count
    out.compression_s += kernel * event.count
    tally.add(event, rec, event.count)
    tally.add_kernel(event.axis, kernel * event.count)


@lru_cache(maxsize=4096)
def _uncompressed_step(arch, plan, env_key, engine: str = "analytical") -> float:
    built, dev, calib, slowdown = env_key
    env, none = Env(built, dev, calib, slowdown), parse_policy("none")
    out, _, stages = _step(arch, plan, env, none)
    if engine == "des":
        out.contention_s = _contention(arch, plan, env, none, stages)[1]
    return out.total


def predict(model: str = "gpt-neox-20b", cluster: str = "lassen", *, gpus: int | None = None,
            nodes: int | None = None, tp: int = 1, pp: int = 1, dp="auto", zero: int = 0, mbs: int = 1,
            gbs: int | None = None, seq: int | None = None, sequence_parallel: bool = False,
            recompute: str = "none", schedule: str = "1f1b", policy: str = "none",
            compute_dtype: str | None = None, grad_dtype: str = "fp32",
            bucket_bytes: int = DEFAULT_BUCKET_BYTES, order: str = "tp,pp,dp", dp_overlap: bool = True,
            hpz: bool = False, tp_overlap: bool = False, allow_oom: bool = False,
            overlap_slowdown: float | None = None, calibration: str | None = None,
            trace: str | list | None = None, trace_pid: int = 0, engine: str = "analytical",
            timeline: str | None = None) -> StepRecord:
    """Predict one training step of ``model`` on ``cluster`` (see the CLI's ``predict --help``).

    Raises InputError (naming the field) for an invalid plan, and when the plan does not fit
    in GPU memory unless ``allow_oom``. ``calibration`` is a profile path; ``overlap_slowdown``
    defaults to the profile's, else DEFAULT_OVERLAP_SLOWDOWN. ``trace``: a path for the step's
    timeline as Chrome trace-event JSON (``perfmodel.trace``; GPipe and 1F1B), or a list the
    events are appended to (processes numbered from ``trace_pid``). ``engine``: ``analytical``
    (closed forms) or ``des`` (``perfmodel.simulate``: the pipeline and every stage's gradient
    buckets as events, links shared between concurrent traffic; the difference is the
    breakdown's ``contention_s``). ``timeline``: a PNG path for the same events as a picture
    (``perfmodel.timeline``). Output paths are checked before any work.
    """
    _check_outputs(trace, timeline)
    calib = load_calibration(calibration)
    arch = load_model(model)
    built, ranks = cluster_for(cluster, nodes=nodes, gpus=gpus)   # a partial last node where gpus asks
    dev = device(built.gpu_model)
    dev = calib.device(dev) if calib else dev
    if overlap_slowdown is None:
        overlap_slowdown = calib.overlap_slowdown if calib and calib.overlap_slowdown is not None \
            else DEFAULT_OVERLAP_SLOWDOWN
    dtype = compute_dtype or ("bf16" if "bf16" in dev.peak_flops_per_s else "fp16")
    dev.peak(dtype)
    plan = make_plan(arch, ranks, tp=tp, pp=pp, dp=dp, zero=zero, mbs=mbs, gbs=gbs, seq=seq,
                     sequence_parallel=sequence_parallel, recompute=recompute, schedule=schedule,
                     compute_dtype=dtype, grad_dtype=grad_dtype, bucket_bytes=bucket_bytes, order=order,
                     dp_overlap=dp_overlap, hpz=hpz, tp_overlap=tp_overlap)
    if not 0 <= overlap_slowdown < 1:
        raise InputError("overlap_slowdown", overlap_slowdown, "a fraction in [0, 1)")
    pol = parse_policy(policy)
    memory = peak_memory(arch, plan, _hpz_ranks(plan, built))
    fits = memory["total"] <= dev.hbm_bytes
    if not fits and not allow_oom:
        need, have = memory["total"] / 2**30, dev.hbm_bytes / 2**30
        raise InputError("memory", f"{need:.1f} GiB", f"does not fit: needs {need:.1f} GiB of {have:.1f} GiB "
                         "per GPU (more tp/pp, zero, recompute or a smaller mbs; or --allow-oom)")
    if engine not in ENGINES:
        raise InputError("engine", engine, " or ".join(ENGINES))
    env = Env(built, dev, calib, overlap_slowdown)
    out, tally, stages = _step(arch, plan, env, pol)
    sim = None
    if engine == "des":
        sim, out.contention_s = _contention(arch, plan, env, pol, stages)
    if trace is not None or timeline is not None:
        events = trace_events(stages, plan, vars(out), pol.text, trace_pid, sim)
        if isinstance(trace, list):
            trace.extend(events)
        elif trace is not None:
            write_trace(trace, events)
        if timeline is not None:
            plot_timeline(events, timeline, f"{arch.name} on {built.name} ({ranks} GPUs): {pol.text}, {engine}")
    base = out.total if pol.is_none else _uncompressed_step(arch, plan, (built, dev, calib, overlap_slowdown), engine)
    return _record(arch, built, dev, plan, pol, out, tally, stages, memory, fits, base, engine,
                   sim.events if sim else 0)


ENGINES = ("analytical", "des")


def _check_outputs(trace, timeline) -> None:
    """Refuse output paths that cannot be written, or a picture format we do not draw, first."""
    if isinstance(trace, str):
        check_writable(trace, "trace")
    check_picture(timeline, "timeline")


def idle_axes(policy, tally) -> tuple:
    """Axes whose spec compresses but that move nothing in this plan (tp 1, pp 1, dp 1, no ZeRO
    gathers): reported, never silently ignored."""
    return tuple(a for a, ax in policy.axes.items() if not compile_spec(ax.spec).is_none
                 and not sum(tally.wire.get(a, {}).values()))


def _bucket_runs(arch, plan, env, policy, mesh, s: int, layers: tuple) -> tuple:
    """Stage ``s``'s gradient bucket runs (first ready, spacing, count, seconds) as the DP overlap
    prices them (ZeRO-3 reduces per layer inside the operations: none)."""
    if plan.zero >= 3:
        return ()
    params = stage_params(arch, plan, layers[s], s == 0, s == plan.pp - 1)
    events = [e for e in comm.dp_events(params, 0, plan, mesh, layers[s]) if e.where == "overlap"]
    return tuple((e.ready_at, e.spacing, e.count, _cost(env, e, policy).time_s) for e in events)


def _simulate(arch, plan, env, policy, stages):
    """The step's pipeline and every stage's buckets on the event engine (perfmodel.simulate)."""
    mesh, layers = mesh_for(plan), plan.stage_layers(arch.num_layers)
    work = [StageWork(fwd=st.fwd_op, bwd=st.bwd_op, send_fwd=st.send_fwd, send_bwd=st.send_bwd,
                      buckets=_bucket_runs(arch, plan, env, policy, mesh, s, layers), zero3=st.zero3_layers)
            for s, st in enumerate(stages)]
    return simulate(work, plan.schedule, plan.microbatches, overlap=plan.dp_overlap, chunks=plan.virtual_stages)


def _contention(arch, plan, env, policy, stages) -> tuple:
    """(the simulation, its span minus the closed forms' span of the same work)."""
    sim = _simulate(arch, plan, env, policy, stages)
    return sim, sim.end_s - _analytical_span(arch, plan, env, policy, stages)


def _analytical_span(arch, plan, env, policy, stages) -> float:
    """What the closed forms say the simulated part takes: the pipeline, then stage 0's buckets'
    exposed tail."""
    total = pipeline_time(stages, plan.microbatches, plan.virtual_stages, plan.schedule)[0]
    runs = _bucket_runs(arch, plan, env, policy, mesh_for(plan), 0, plan.stage_layers(arch.num_layers))
    window = stages[0].bwd if plan.dp_overlap else 0.0
    return total + overlap_buckets([(f * window, sp * window, n, d) for f, sp, n, d in runs], window)[0]


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


def _record(arch, built, dev, plan, pol, out, tally, stages, memory, fits, base, engine,
            simulated_events: int = 0) -> StepRecord:
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
        error_estimate={a: tally.error.get(a, 0.0) for a in ("dp", "zero", "tp", "pp") if a in tally.error},
        collectives=tally.algorithms, kernel_s=tally.kernels, compute_detail=_compute_detail(stages, plan),
        engine=engine, simulated_events=simulated_events, idle_policy_axes=idle_axes(pol, tally))


def compare(model: str, cluster: str, policies, trace: str | None = None, timeline: str | None = None,
            **plan) -> list[StepRecord]:
    """The same plan under several policies (a list, or a string as ``split_policies`` takes);
    ``trace``: one timeline file with every policy's stages (``perfmodel.trace``); ``timeline``:
    the same as one picture."""
    _check_outputs(trace, timeline)
    names = split_policies(policies) if isinstance(policies, str) else list(policies)
    events: list | None = [] if trace is not None or timeline is not None else None
    records = [predict(model, cluster, policy=p, trace=events, trace_pid=100 * i, **plan) for i, p in enumerate(names)]
    if trace is not None:
        write_trace(trace, events)
    if timeline is not None:
        first = records[0]
        plot_timeline(events, timeline, f"{first.model} on {first.cluster} ({first.gpus} GPUs): "
                      f"{len(records)} policies, {first.engine}")
    return records
