"""The ``analytical`` engine: every event costed on the fabric, closed forms for the overlap.

Per stage, the axes' events (``perfmodel.axes.step_events``) are placed by where they sit
(``CommEvent.where``): ``critical`` ones inside every microbatch's operations (TP, the MoE
all-to-alls) or its transfers (PP); ``attention`` ones (cp's K/V ring) beside the attention of
the same operation, only what it cannot hide exposed (``_overlap_ring``); ``zero3`` ones layer
by layer inside the operations (``step.zero3_forward``, ``zero3_backward``); on stage 0, which
ends the pipeline, ``overlap`` ones (gradient buckets) against its last backward and ``tail``
ones after it. The pipeline is the schedule timed operation by operation
(``timing.pipeline_time``). ``perfmodel.step.timing`` holds the formulas and
says what each assumes.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from perfmodel.axes import AXES, ISSUE_ORDER, step_events
from perfmodel.collectives.predict import collective_on
from perfmodel.collectives.fabric import cpu_share, make_ctx
from perfmodel.stage import StageContext
from perfmodel.phases import BUBBLE, COMPRESSION, COMPUTE, OPTIMIZER, OVERLAP_SLOWDOWN
from perfmodel.step.compute import optimizer_time_s, stage_compute
from perfmodel.engines import StepInputs, StepTiming, register
from perfmodel.plan.framework import framework_profile
from perfmodel.plan.memory import expert_shards, shards, stage_param_split
from perfmodel.plan.mesh import mesh_for
from perfmodel.plan.recompute import reruns_attention
from perfmodel.step import expert_overlap
from perfmodel.step.framework import microbatch_host_s, prefetched, stack_compute, stack_event, step_host_s
from perfmodel.step.timing import (KERNEL_SM_SHARE, Breakdown, StageTime, Tally, exposed_pp, overlap_buckets,
                            pipeline_from, pipeline_spans, split_kernel, zero3_backward, zero3_forward)


def cost(env, event, policy):
    """The collective record of one event under the policy (cached: buckets repeat sizes)."""
    axis = policy.axis(event.axis)
    return _cost_cached(env.built, env.calib, event.op, event.nbytes, axis.codec_for(event.nbytes),
                        axis.spec_for(event.nbytes), event.dtype, event.group, event.concurrent)


@lru_cache(maxsize=65536)
def _cost_cached(built, calib, op, nbytes, codec, label, dtype, group, concurrent):
    ctx = make_ctx(built, group, concurrent, calib)
    return collective_on(built, ctx, op, nbytes, calib.codec(codec) if calib else codec, dtype, label=label)


def stage_events(step: StepInputs, s: int) -> tuple:
    """Every axis's events on stage ``s`` of the step's plan (the same under every policy)."""
    return _stage_events(step.model, step.plan, s, step.env.built.gpus_per_host)


@lru_cache(maxsize=8192)
def _stage_events(model, plan, s: int, gpus_per_host: int) -> tuple:
    ctx = StageContext(model=model, plan=plan, mesh=mesh_for(plan), stage=s,
                       layers=plan.stage_layers(model.num_layers)[s], gpus_per_host=gpus_per_host)
    return tuple(step_events(ctx))


def _critical(step: StepInputs, s: int, layers: int, events: list, tally: Tally | None, profile) -> tuple:
    """(the stage's times but ZeRO-3's, its compute): compute (the stack's costs added) and the
    critical events (TP and the MoE all-to-alls inside the operations, PP in the transfers, cp's
    ring beside attention); stage 0 counts them in ``tally``."""
    plan, env, policy, model = step.plan, step.env, step.policy, step.model
    moe = model.moe_layers_in(plan.stage_first_layer(s, model.num_layers), layers) if model.is_moe else 0
    sc = stage_compute(model, plan, env.dev, layers, s == 0, s == plan.pp - 1, moe)
    sc = stack_compute(profile, sc, model, plan, env.dev, layers, s == 0, s == plan.pp - 1)
    st = StageTime(compute=sc.fwd_s + sc.bwd_s, bwd=sc.bwd_s, fwd_op=sc.fwd_s, bwd_op=sc.bwd_s,
                   hardware_flops=sc.hardware_flops,
                   compute_parts=(sc.gemm_s, sc.attention_s, sc.memory_bound_s, 0.0))
    m = plan.microbatches
    layer_tp = {"fwd": 0.0, "bwd": 0.0}
    for event in (stack_event(profile, plan, e) for e in events if e.where == "critical"):
        rec = cost(env, event, policy)
        wire, kernel = split_kernel(rec)
        per_mb = event.count / m
        st.add_comm(event.axis, wire * per_mb)
        st.compression += kernel * per_mb
        _place(st, event, rec.time_s * per_mb, kernel * per_mb)
        if event.axis == "tp" and ".experts." not in event.name:   # the dispatcher's etp gathers: not TE's overlap
            layer_tp[event.phase] += wire * per_mb
        if event.axis in ("ep", "ep_combine"):
            _inner(st, event.phase, rec.time_s * per_mb, _spans_nodes(event.group, env.built.gpus_per_domain))
            _ep(st, event, rec.time_s * per_mb, kernel * per_mb, env.built.gpus_per_domain)
        if s == 0:
            tally.add(event, rec, event.count)
            tally.add_kernel(event.axis, kernel * event.count)
    if plan.tp_overlap:
        _overlap_tp(st, layer_tp, sc, plan.tp, env.overlap_slowdown)
    ring = [e for e in events if e.where == "attention"]
    if ring:
        _overlap_ring(step, st, ring, sc, tally)
    st = expert_overlap.apply(st, sc, plan, s, env.dev, env.overlap_slowdown)
    _host_floor(st, sc)
    _host_wait(st, microbatch_host_s(profile))
    return st, sc


def _ep(st: StageTime, event, seconds: float, kernel: float, gpus_per_domain: int) -> None:
    """Count an all-to-all's per-microbatch seconds for the expert overlap (``expert_overlap.apply``)."""
    if event.phase == "fwd":
        st.ep_fwd += seconds
    else:
        st.ep_bwd += seconds
    st.ep_kernel += kernel
    st.ep_pair_nic = st.ep_pair_nic or _spans_nodes(event.group, gpus_per_domain)


def _host_floor(st: StageTime, sc) -> None:
    """An operation whose GPU time (compute, critical collectives, kernels) is shorter than the
    host's time to issue its kernels waits for the host (``compute.host_times_s``): the host runs
    ahead of the GPU through asynchronous launches, so the operation takes the longer of the two,
    not their sum. The wait counts as compute (the fourth of ``compute_parts``: host-bound)."""
    wait_fwd = max(0.0, sc.host_fwd_s - st.fwd_op)
    wait_bwd = max(0.0, sc.host_bwd_s - st.bwd_op)
    if wait_fwd + wait_bwd <= 0.0:
        return
    st.fwd_op += wait_fwd
    st.bwd_op += wait_bwd
    st.bwd += wait_bwd
    st.compute += wait_fwd + wait_bwd
    gemm, attention, memory, host = st.compute_parts
    st.compute_parts = (gemm, attention, memory, host + wait_fwd + wait_bwd)


def _host_wait(st: StageTime, seconds: float) -> None:
    """The stack's synchronous host seconds per microbatch (``FrameworkProfile.microbatch_host_ms``:
    the GPU waits for them) in the forward operation, counted as host-bound compute."""
    if seconds <= 0.0:
        return
    st.fwd_op += seconds
    st.compute += seconds
    gemm, attention, memory, host = st.compute_parts
    st.compute_parts = (gemm, attention, memory, host + seconds)


def _with_zero3(st: StageTime, part: tuple, tally: Tally | None) -> StageTime:
    """A copy of ``st`` with ZeRO-3's exposed gathers and kernels (``_zero3_exposed``) in its
    operations; their collectives counted in ``tally`` (stage 0)."""
    fwd, bwd, k_fwd, k_bwd, shape, records = part
    st = replace(st, comm_s=dict(st.comm_s))
    st.zero3_layers = shape
    st.zero3, st.compression = fwd + bwd, st.compression + k_fwd + k_bwd
    st.fwd_op, st.bwd_op = st.fwd_op + fwd + k_fwd, st.bwd_op + bwd + k_bwd
    if tally is not None:
        for e, rec in records:
            tally.add(e, rec, e.count)
            tally.add_kernel(e.axis, split_kernel(rec)[1] * e.count, beside_compute=True)
    return st


def _overlap_tp(st: StageTime, layer_tp: dict, sc, tp: int, slowdown: float) -> None:
    """Megatron's TP communication overlap (``--tp-comm-overlap``, Transformer Engine): each
    layer's all-gathers and reduce-scatters are split into ``tp`` chunks pipelined against the
    GEMMs that consume or produce them, so all but the first chunk hide behind the operation's
    GEMM seconds. The hidden seconds slow the GEMMs by ``overlap_slowdown`` (SMs given to the
    communication, as for DP overlap); the tp seconds keep the exposed part and that slowdown."""
    share = {"fwd": sc.fwd_s, "bwd": sc.bwd_s}
    total = max(sc.fwd_s + sc.bwd_s, 1e-30)
    for phase, seconds in layer_tp.items():
        gemm = sc.gemm_s * share[phase] / total
        saved = min(seconds * (1 - 1 / tp), gemm) * (1 - slowdown)
        st.add_comm("tp", -saved)
        if phase == "fwd":
            st.fwd_op -= saved
        else:
            st.bwd_op -= saved
            st.bwd -= saved


def _spans_nodes(group: tuple, gpus_per_host: int) -> bool:
    return group[0] // gpus_per_host != group[-1] // gpus_per_host


def _inner(st: StageTime, phase: str, seconds: float, across_nodes: bool) -> None:
    """Count an operation's all-to-all or ring seconds where the trace and the des engine see them."""
    if phase == "fwd":
        st.inner_fwd += seconds
        st.nic_fwd += seconds if across_nodes else 0.0
    else:
        st.inner_bwd += seconds
        st.nic_bwd += seconds if across_nodes else 0.0


def _overlap_ring(step: StepInputs, st: StageTime, events: list, sc, tally) -> None:
    """cp's K/V ring beside attention (``perfmodel.events.context_events``): of cp attention blocks
    the ring step of each but the last runs while the block computes, so per operation its wire
    seconds hide behind (cp - 1) / cp of the operation's attention seconds (backward: its own,
    and with recompute a forward's more). What does not hide is exposed; hidden seconds slow
    the attention by ``overlap_slowdown`` (as TP overlap); kernels are charged in full."""
    plan, env = step.plan, step.env
    m, cp = plan.microbatches, plan.cp
    wire = {"fwd": 0.0, "bwd": 0.0}
    kernels = {"fwd": 0.0, "bwd": 0.0}
    for event in events:
        rec = cost(env, event, step.policy)
        w, k = split_kernel(rec)
        wire[event.phase] += w * event.count / m
        kernels[event.phase] += k * event.count / m
        if tally is not None:
            tally.add(event, rec, event.count)
            tally.add_kernel(event.axis, k * event.count)
    behind = {"fwd": sc.attention_fwd_s, "bwd": sc.attention_bwd_s + reruns_attention(plan) * sc.attention_fwd_s}
    for phase, seconds in wire.items():
        hide = behind[phase] * (cp - 1) / cp
        hidden = min(seconds, hide)
        charged = seconds - hidden + env.overlap_slowdown * hidden
        st.add_comm("cp", charged)
        st.compression += kernels[phase]
        _inner(st, phase, charged + kernels[phase], False)
        if phase == "fwd":
            st.fwd_op += charged + kernels[phase]
        else:
            st.bwd_op += charged + kernels[phase]
            st.bwd += charged + kernels[phase]


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


def _zero3_exposed(step: StepInputs, events: list, layers: int, sc, profile) -> tuple:
    """Per microbatch: (forward, backward) exposed communication seconds, (forward, backward)
    kernel seconds, the per-layer shape the event engine runs, and each event with its record.
    A layer's gather, prefetched, hides its wire time behind the previous layer's compute (the
    first one cannot), its gradients' reduce-scatter behind the next layers' (``zero3_forward``,
    ``zero3_backward``); its kernels run on the GPU that computes and are charged in full
    wherever they run (``KERNEL_SM_SHARE``). A stack that prefetches less than a layer
    (``prefetched``) gathers the rest on demand: that part waits in the layer's operation, as
    compute does (the event engine runs the same shape). A layer's dense and expert parts (the
    experts apart over edp: ``perfmodel.events``) are collectives one after the other: their
    seconds add."""
    env, policy = step.env, step.policy
    records = [(e, cost(env, e, policy)) for e in events]
    t: dict = {}
    for e, rec in records:
        wire, kernel = split_kernel(rec)
        w0, k0 = t.get(e.name.removesuffix(".experts"), (0.0, 0.0))
        t[e.name.removesuffix(".experts")] = (w0 + wire, k0 + kernel)
    (ag_f, k_f), (ag_b, k_b), (rs, k_rs) = (t.get(n, (0.0, 0.0)) for n in
                                            ("zero.allgather.fwd", "zero.allgather.bwd", "dp.reduce_scatter.bwd"))
    ahead = prefetched(profile, step.model, step.plan)
    ag_f, late_f, ag_b, late_b = ahead * ag_f, (1.0 - ahead) * ag_f, ahead * ag_b, (1.0 - ahead) * ag_b
    fwd_layer, bwd_layer = sc.fwd_s / max(layers, 1) + late_f, sc.bwd_s / max(layers, 1) + late_b
    fwd = zero3_forward(layers, fwd_layer, ag_f) - sc.fwd_s
    bwd = zero3_backward(layers, bwd_layer, ag_b, rs) - sc.bwd_s
    shape = (layers, fwd_layer, bwd_layer, ag_f, ag_b, rs)
    return fwd, bwd, KERNEL_SM_SHARE * layers * k_f, KERNEL_SM_SHARE * layers * (k_b + k_rs), shape, records


def time_stages(step: StepInputs, profile) -> tuple[list[StageTime], list[list], Tally]:
    """Every stage's times and events under the stack's ``profile``; the tally counts stage 0's (the
    stage that ends the step). Stages alike (``_alike``) are timed once and share their StageTime."""
    layers, events, alike, axes = _plan_stages(step.model, step.plan, step.env.built.gpus_per_host)
    stages: list[StageTime] = []
    tally = None
    for s, n in enumerate(layers):
        if alike[s] < s:
            stages.append(stages[alike[s]])
            continue
        st, counted = _stage(step, s, n, events[s], axes[s], profile)
        stages.append(st)
        tally = counted if s == 0 else tally
    return stages, list(events), tally


_CACHE: dict = {}
_CACHE_MAX = 1 << 15


def _stage(step: StepInputs, s: int, layers: int, events: tuple, axes: tuple, profile) -> tuple:
    """(the stage's times, for stage 0 a fresh tally of its collectives). Its two parts are
    cached apart: the critical path (``_critical``: policies that differ only on dp or zero share
    it) and ZeRO-3's exposed gathers (``_zero3_exposed``: only on dp and zero). Cached results
    are never changed: stages only read them; tallies and ZeRO-3 stages are copies."""
    critical, zero3 = axes
    env, policy = step.env, step.policy
    base = (step.model, step.plan, env.built, env.dev, env.calib, env.overlap_slowdown, s, profile)
    key = base + tuple(policy.axis(a) for a in critical)
    hit = _CACHE.get(key)
    if hit is None:
        tally = Tally() if s == 0 else None
        hit = _store(key, (*_critical(step, s, layers, events, tally, profile), tally))
    st, sc, counted = hit
    tally = counted.copy() if s == 0 else None
    if not zero3:
        return st, tally
    key = base + ("zero3",) + tuple(policy.axis(a) for a in zero3)
    part = _CACHE.get(key)
    if part is None:
        part = _store(key, _zero3_exposed(step, [e for e in events if e.where == "zero3"], layers, sc, profile))
    return _with_zero3(st, part, tally), tally


def _store(key, value):
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = value
    return value


@lru_cache(maxsize=4096)
def _plan_stages(model, plan, gpus_per_host: int) -> tuple:
    """(layers per stage, events per stage, per stage the first stage alike, per stage the axes
    its times depend on): the same layers, events and place (first, last) give the same
    StageTime under any policy."""
    layers = plan.stage_layers(model.num_layers)
    events = tuple(_stage_events(model, plan, s, gpus_per_host) for s in range(len(layers)))
    first: dict = {}
    alike = tuple(first.setdefault((n, s == 0, s == len(layers) - 1, events[s]), s) for s, n in enumerate(layers))
    axes = tuple(tuple(tuple(sorted({e.axis for e in ev if e.where in where}))
                       for where in (("critical", "attention"), ("zero3",))) for ev in events)
    return layers, events, alike, axes


def _pipeline_breakdown(stages: list[StageTime], plan, span: tuple) -> Breakdown:
    """The pipeline's seconds by kind, as seen on its bottleneck stage (they sum to the
    pipeline's time): its operations' parts, its transfers where it waited, the bubble.
    ``span``: (pipeline seconds, busy seconds per stage), evaluated (``timing.pipeline_spans``)."""
    total, bubble, worst = pipeline_from(stages, plan.microbatches, *span)
    b, m = stages[worst], plan.microbatches
    pp, compression = m * b.comm("pp"), m * b.compression
    if plan.virtual_stages == 1:
        exposed, kernel = exposed_pp(b, m, max(0.0, total - bubble - m * (b.fwd_op + b.bwd_op)))
        pp, compression = exposed - kernel, m * (b.compression - b.pp_kernel) + kernel
    out = Breakdown()
    for phase, seconds in ((COMPUTE, m * b.compute), (AXES["pp"].phase, pp), (COMPRESSION, compression),
                           (AXES["zero"].phase, m * b.zero3), (BUBBLE, bubble), (OVERLAP_SLOWDOWN, m * b.ep_tax)):
        out[phase] = seconds
    for name in ISSUE_ORDER:        # the axes inside the operations, each to its phase (pp's: where the stage waited)
        if name != "pp" and b.comm(name):
            out.add(AXES[name].phase, m * b.comm(name))
    return out


def _dp_overlap(buckets, step: StepInputs, window, out: Breakdown, tally: Tally) -> None:
    """Gradient buckets against a backward ``window`` (0: none to hide behind, all exposed).
    Their wire time hides behind the backward where it can (compute beside it slowed by
    ``overlap_slowdown``); their kernels are charged wherever they run: exposed ones in the
    tail, hidden ones as compute they displace (``KERNEL_SM_SHARE``)."""
    env = step.env
    records = [cost(env, e, step.policy) for e in buckets]
    runs = [(e.ready_at * window, e.spacing * window, e.count, r.time_s) for e, r in zip(buckets, records)]
    exposed, hidden = overlap_buckets(runs, window)
    kernel = sum(split_kernel(r)[1] * e.count for e, r in zip(buckets, records))
    busy = exposed + hidden
    k_exposed = kernel * exposed / busy if busy > 0 else 0.0
    k_hidden = (kernel - k_exposed) * KERNEL_SM_SHARE
    out.add(AXES["dp"].phase, exposed - k_exposed)
    out.add(COMPRESSION, k_exposed + k_hidden)
    out.add(OVERLAP_SLOWDOWN, _slowdown(step, buckets, records, hidden, busy, kernel - k_exposed))
    for e, r in zip(buckets, records):
        tally.add(e, r, e.count)
    if buckets:
        tally.add_kernel("dp", k_exposed)
        tally.add_kernel("dp", k_hidden, beside_compute=True)


def _slowdown(step: StepInputs, buckets, records, hidden: float, busy: float, hidden_kernel: float) -> float:
    """What the hidden gradient traffic takes from the backward beside it: where the profile
    measured the runtime's transport CPU (a socket transport on hosts with a fixed CPU share),
    the hidden part of that CPU run at the host's share; else ``overlap_slowdown`` of the hidden
    wire time (SMs and memory bandwidth given to NCCL's kernels)."""
    calib = step.env.calib
    cpu = calib.transport_cpu_s(sum(e.count for e in buckets), sum(e.count * r.sent_bytes
                                                                  for e, r in zip(buckets, records))) \
        if calib else None
    if cpu is None:
        return step.env.overlap_slowdown * max(0.0, hidden - hidden_kernel)
    return cpu * (hidden / busy if busy > 0 else 0.0) / cpu_share(step.env.built, step.plan.gpus)


def _exposed(out: Breakdown, tally: Tally, event, rec, window: float = 0.0, slowdown: float = 0.0) -> float:
    """A collective on the critical path after backward: wire time to its axis's phase (dp's
    exposed tail), kernels to compression (charged in full). ``window``: the seconds of the next
    step's first forward it may hide behind (ZeRO-1/2's parameter all-gather where the stack
    overlaps it, Megatron's ``--overlap-param-gather``); the hidden part slows that forward by
    ``slowdown``. Returns the seconds it hid (what is left of the window for the next one)."""
    wire, kernel = split_kernel(rec)
    seconds = wire * event.count
    hidden = min(seconds, window)
    out.add(AXES[event.axis].phase, seconds - hidden)
    out.add(OVERLAP_SLOWDOWN, slowdown * hidden)
    out.add(COMPRESSION, kernel * event.count)
    tally.add(event, rec, event.count)
    tally.add_kernel(event.axis, kernel * event.count)
    return hidden


def bucket_window(step: StepInputs, stages: list[StageTime]) -> float:
    """The backward window stage 0's gradient buckets hide behind (0 without DP overlap)."""
    return stages[0].bwd if step.plan.dp_overlap else 0.0


class AnalyticalEngine:
    """Closed forms (module doc)."""

    name = "analytical"

    def time_step(self, step: StepInputs) -> StepTiming:
        return self.time_steps([step])[0]

    def time_steps(self, steps: list, profiles: list | None = None) -> list:
        """``time_step`` of each; plans of one pipeline shape (stages, microbatches, chunks,
        schedule) share one evaluation of the schedule's graph (``timing.pipeline_spans``).
        ``profiles``: a stack profile per step (a fit's trial constants, ``scripts/
        fit_framework_profiles.py``); default the catalog's profile of each plan's framework."""
        profiles = profiles or [framework_profile(step.plan.framework) for step in steps]
        timed = [time_stages(step, profile) for step, profile in zip(steps, profiles)]
        shapes: dict = {}
        for i, step in enumerate(steps):
            plan = step.plan
            shapes.setdefault((plan.pp, plan.microbatches, plan.virtual_stages, plan.schedule,
                               plan.ep_overlap == "dualpipe"), []).append(i)
        spans: list = [None] * len(steps)
        for (_, m, v, schedule, dualpipe), index in shapes.items():
            if dualpipe:        # DeepSeek-V3's Table 2 (perfmodel.step.expert_overlap.dualpipe_span)
                ends, busy = zip(*(expert_overlap.dualpipe_span(timed[i][0], m) for i in index))
            else:
                ends, busy = pipeline_spans([timed[i][0] for i in index], m, v, schedule)
            for i, end, b in zip(index, ends, busy):
                spans[i] = (end, b)
        return [_finish(step, *t, span, profile) for step, t, span, profile in zip(steps, timed, spans, profiles)]


def _finish(step: StepInputs, stages: list, events: list, tally: Tally, span, profile) -> StepTiming:
    """The step from its stages: the pipeline (``span``: evaluated), DP overlap, tail (ZeRO-1/2's
    parameter gathers behind the next forward where the stack overlaps them, one after another in
    that one window: the dense one, then the experts' apart), optimizer and the stack's host time
    per step."""
    plan = step.plan
    out = _pipeline_breakdown(stages, plan, span)
    first = events[0]
    _dp_overlap([e for e in first if e.where == "overlap"], step, bucket_window(step, stages), out, tally)
    window = stages[0].fwd_op if profile.param_gather_overlap else 0.0
    for event in (e for e in first if e.where == "tail"):
        behind = window if event.axis == "zero" else 0.0
        window -= _exposed(out, tally, event, cost(step.env, event, step.policy), behind,
                           step.env.overlap_slowdown)
    out[OPTIMIZER] = optimizer_time_s(_optimizer_params(step.model, plan), step.env.dev) + step_host_s(profile)
    return StepTiming(breakdown=out, tally=tally, stages=stages, stage_events=events)


def _optimizer_params(model, plan) -> float:
    """Parameters stage 0's optimizer updates on one GPU: its dense ones over ZeRO's dp x cp shards,
    its routed experts' over their edp shards."""
    dense, experts = stage_param_split(model, plan, plan.stage_layers(model.num_layers)[0], True, plan.pp == 1, 0)
    if not experts:
        return (dense + experts) / shards(plan, "optimizer")
    return dense / shards(plan, "optimizer") + experts / expert_shards(plan, "optimizer")


ANALYTICAL = register(AnalyticalEngine())
