"""The step model: hand calculations, conservation of bytes, the uncompressed identity."""
import math
from dataclasses import replace

import pytest

from perfmodel import events as comm
from perfmodel.devices import device
from perfmodel.step.compute import stage_compute
from perfmodel.plan.mesh import mesh_for
from perfmodel.prediction import predict
from perfmodel.plan.parallel import make_plan
from perfmodel.step.schedule import StageCost, run_schedule, stage_ops
from topologies import InputError
from perfmodel.step.timing import StageTime, overlap_buckets, pipeline_time
from perfmodel.workload import load_model


def _simulate(ready, durations, window):
    finish, inside = 0.0, 0.0
    for r, d in zip(ready, durations):
        start = max(r, finish)
        finish = start + d
        inside += max(0.0, min(finish, window) - min(start, window))
    return max(0.0, finish - window), inside


def test_overlap_buckets_by_hand():
    assert overlap_buckets([(1.0, 1.0, 3, 1.0)], window=3.0) == (1.0, 2.0)
    assert overlap_buckets([(0.5, 0.0, 1, 0.2)], window=3.0) == (0.0, pytest.approx(0.2))


@pytest.mark.parametrize("n, spacing, dur, tail", [(10, 0.1, 0.05, 0.01), (10, 0.1, 0.3, 0.2), (1, 1.0, 2.0, 0.0),
                                                  (50, 0.02, 0.02, 0.5)])
def test_overlap_closed_form_matches_simulation(n, spacing, dur, tail):
    window = n * spacing + (0.05 if tail else 0.0)
    ready = [spacing * (k + 1) for k in range(n)] + ([window] if tail else [])
    durations = [dur] * n + ([tail] if tail else [])
    runs = [(spacing, spacing, n, dur)] + ([(window, 0.0, 1, tail)] if tail else [])
    assert overlap_buckets(runs, window) == pytest.approx(_simulate(ready, durations, window))


def _st(fwd, bwd, send=0.0):
    return StageTime(compute=fwd + bwd, fwd_op=fwd, bwd_op=bwd, comm_s={"pp": 2 * send}, send_fwd=send, send_bwd=send)


def test_pipeline_time_by_hand():
    stages = [_st(0.5, 0.5), _st(1.0, 1.0), _st(0.5, 0.5)]
    total, bubble, worst = pipeline_time(stages, 6, 2)        # interleaved: timed too
    assert worst == 1 and total >= 6 * 2.0 and bubble == pytest.approx(total - 12.0)
    # timed: the busiest stage (8 s of work) starts after stage 0's first forward and ends
    # before stage 0's last backward; the closed form m T_max + sum of the others says 10
    total, bubble, worst = pipeline_time(stages, 4, 1)
    assert (total, worst) == (pytest.approx(9.0), 1) and bubble == pytest.approx(1.0)
    uniform = [_st(0.5, 1.0)] * 4
    for schedule in ("1f1b", "gpipe"):
        total, bubble, _ = pipeline_time(uniform, 8, 1, schedule)
        assert total == pytest.approx((8 + 4 - 1) * 1.5) and bubble == pytest.approx(3 * 1.5)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 3), (2, 2, 3)])
def test_interleaved_schedule_gives_the_published_bubble(p, m, v):
    """Uniform stages, free transfers: m T + (p - 1) T / V (Narayanan et al. SC21)."""
    t = run_schedule("interleaved", [StageCost(1.0, 2.0)] * p, m, v)
    assert t.end_s == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v)
    for s in range(p):
        ops = stage_ops("interleaved", s, p, m, v)
        assert sorted(ops) == sorted((k, i, c) for k in "FB" for i in range(m) for c in range(v))
    costly = run_schedule("interleaved", [StageCost(1.0, 2.0, 0.1, 0.1)] * p, m, v)
    assert len(costly.transfers) == 2 * m * (p * v - 1) and costly.end_s > t.end_s


def test_two_stages_four_microbatches_one_f_one_b_by_hand():
    """f = 1, b = 2, each transfer x = 0.5: the fill is F(s0) + x, the drain x + B(s1); in the
    steady state each transfer overlaps the other stage's work except where a stage waits."""
    t = run_schedule("1f1b", [StageCost(1.0, 2.0, 0.5, 0.5)] * 2, 4)
    # s1: F0 at 1.5; then B_i, send g_i with receive a_{i+1} (1 + 0.5 each), F, B ... ; s0 ends on B3
    assert t.busy_s == (12.0, 12.0)
    assert t.end_s == pytest.approx(1.0 + 0.5 + 4 * 3.0 + 3 * 0.5 + 0.5 + 2.0)


def test_free_transfers_give_the_textbook_bubble():
    for p, m in ((2, 4), (4, 8), (8, 3)):
        for name in ("1f1b", "gpipe"):
            t = run_schedule(name, [StageCost(1.0, 2.0)] * p, m)
            assert t.end_s == pytest.approx((m + p - 1) * 3.0)


def test_transfers_are_charged_where_a_stage_waits_not_twice():
    """The closed form (m + p - 1)(f + b + 2x) charges every transfer in the steady state and
    again in the fill and drain; the timed schedule charges less, and never less than the
    work plus one transfer each way."""
    m, x = 2, 0.5
    t = run_schedule("1f1b", [StageCost(1.0, 2.0, x, x)] * 2, m)
    assert 3 * 3.0 + 2 * x < t.end_s < (m + 1) * (3.0 + 2 * x)
    assert t.end_s == pytest.approx(3 * 3.0 + 3 * x)   # worked by hand in docs/design.md


def test_stage_ops_are_what_realrun_runs():
    from realrun.train.pipeline import schedule

    for name in ("1f1b", "gpipe"):
        for s in range(3):
            assert schedule(name, s, 3, 5) == stage_ops(name, s, 3, 5)
    assert stage_ops("1f1b", 0, 2, 3) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]


def test_breakdown_sums_to_the_pipeline_with_costly_transfers():
    r = predict("gpt2-medium", "commodity-25g", nodes=2, tp=1, pp=4, mbs=1, gbs=8)
    b = r.breakdown
    assert b["pp_comm_s"] > 0 and b["bubble_s"] >= 0
    assert sum(b.values()) == pytest.approx(r.step_time_s)


def test_stage_compute_by_hand():
    m = load_model("gpt2-small")
    plan = make_plan(m, 8, tp=2, pp=1, mbs=2, gbs=8, seq=512)
    flat = replace(device("a100-sxm-80gb"), gemm_efficiency=((1.0, 0.5), (1e9, 0.5)), stream_Bps=math.inf,
                   gemm_shape=None, host_op_s=0.0)      # the formulas alone: no shape, no kernel overheads
    sc = stage_compute(m, plan, flat, 12, first=False, last=False)
    T, h, f, tp, peak = 1024, 768, 3072, 2, 312e12
    layer = 2 * T * (3 * h / tp * h + h * h / tp + f / tp * h + h * f / tp)
    attn = 2 * (2 * 12 / tp) * 2 * 512 * 512 * 64
    assert sc.fwd_s == pytest.approx(12 * (layer + attn) / (peak * 0.5), rel=1e-9)
    assert sc.bwd_s == pytest.approx(2 * sc.fwd_s, rel=1e-9)
    assert sc.hardware_flops == pytest.approx(3 * 12 * (layer + attn), rel=1e-9)


def _neox(policy="none", **kw):
    args = dict(gpus=192, tp=4, pp=4, mbs=4, gbs=1056, zero=1, recompute="full")
    args.update(kw)
    return predict("gpt-neox-20b", "lassen", policy=policy, **args)


def test_uncompressed_policy_has_speedup_exactly_one():
    r = _neox()
    assert r.speedup_vs_uncompressed == 1.0
    assert r.breakdown["compression_s"] == 0.0 and all(e == 0 for e in r.error_estimate.values())


@pytest.mark.parametrize("policy", ["none", "naive:int8", "hybrid", "hybrid,dp=ef(topk(0.01))+int8"])
def test_breakdown_sums_to_step_time(policy):
    r = _neox(policy)
    assert sum(r.breakdown.values()) == pytest.approx(r.step_time_s, rel=1e-12)
    assert all(v >= 0 for v in r.breakdown.values())


def test_record_fields_of_the_issue():
    d = _neox("hybrid").to_dict()
    for key in ("step_time_s", "samples_per_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
                "mfu", "breakdown", "wire_bytes", "memory_per_gpu_bytes", "speedup_vs_uncompressed",
                "error_estimate"):
        assert key in d
    assert set(d["breakdown"]) >= {"compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_exposed_s", "compression_s",
                                   "bubble_s", "optimizer_s"}
    assert d["hardware_tflops_per_gpu"] > d["model_tflops_per_gpu"]   # full recompute counted


def test_event_volumes_match_closed_forms():
    m = load_model("gpt-neox-20b")
    plan = make_plan(m, 192, tp=4, pp=4, mbs=4, gbs=1056, zero=0)
    mesh, L = mesh_for(plan), 11
    tp = comm.tp_events(m, plan, mesh, L)
    size = 2048 * 4 * 6144 * 2
    assert {e.nbytes for e in tp} == {size} and sum(e.count for e in tp) == 4 * L * plan.microbatches
    pp = comm.pp_events(m, plan, mesh)
    assert [e.nbytes for e in pp] == [size // 4] * 2 and pp[0].count == plan.microbatches
    params = 1e9
    dp = comm.gradient_buckets(params, plan, mesh)
    assert sum(e.nbytes * e.count for e in dp) == params * 4 and all(e.op == "allreduce" for e in dp)
    zero1 = replace(plan, zero=1)
    z1 = comm.gradient_buckets(params, zero1, mesh) + comm.parameter_gather(params, zero1, mesh)
    rs = sum(e.nbytes * e.count for e in z1 if e.op == "reduce_scatter")
    ag = sum(e.nbytes * e.count for e in z1 if e.op == "allgather")
    assert (rs, ag) == (params * 4, params * 2)


def test_wire_bytes_follow_ring_volumes():
    r = predict("gpt2-medium", "dgx-a100", nodes=1, tp=8, pp=1, mbs=8, gbs=8)
    assert r.collectives["tp.allreduce.fwd.0"].startswith("allreduce:ring:")
    size, count = 1024 * 8 * 1024 * 2, 4 * 24 + 2   # 4 a layer, and the vocab-parallel embedding and head
    # a ring step GPU -> NVSwitch -> GPU crosses two NVLinks
    assert r.wire_bytes["tp"] == {"nvlink": pytest.approx(2 * count * 2 * 7 / 8 * size)}


def test_more_microbatches_shrink_the_bubble_share():
    small, big = _neox(gbs=48 * 4), _neox(gbs=48 * 32)
    assert big.breakdown["bubble_s"] / big.step_time_s < small.breakdown["bubble_s"] / small.step_time_s


def test_compression_pays_where_the_network_is_slow():
    slow = predict("gpt2-medium", "commodity-25g", nodes=4, tp=1, pp=1, mbs=4, gbs=128, zero=1,
                   recompute="selective", policy="dp=ef(topk(0.01))+int8,zero=ef(topk(0.01))+int8")
    assert slow.speedup_vs_uncompressed > 1.5


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_gradients_are_the_dp_axis_at_every_zero_stage(zero):
    """dp = gradient reduction (all-reduce, or reduce-scatter under ZeRO), zero = parameter
    gathering: a dp spec changes the gradient traffic at every stage, a zero spec only gathers."""
    kw = dict(model="gpt-neox-20b", cluster="lassen", gpus=64, tp=4, pp=2, zero=zero, mbs=2, gbs=64,
              recompute="full", allow_oom=True)
    base, grads = predict(**kw), predict(**kw, policy="dp=int8")
    assert sum(grads.wire_bytes["dp"].values()) < 0.3 * sum(base.wire_bytes["dp"].values())
    assert grads.error_estimate["dp"] > 0 and grads.error_estimate.get("zero", 0.0) == 0.0
    if zero:
        params = predict(**kw, policy="zero=int8")
        assert params.wire_bytes["dp"] == base.wire_bytes["dp"] and params.error_estimate["zero"] > 0


def test_without_dp_overlap_every_bucket_is_exposed():
    """realrun train reduces after backward: dp_overlap=False exposes the buckets' whole time
    (and slows no compute beside them); with overlap, part of it hides behind backward."""
    kw = dict(model="gpt-neox-20b", cluster="lassen", gpus=64, tp=4, pp=2, mbs=2, gbs=64, recompute="full",
              allow_oom=True)
    hidden, serial = predict(**kw), predict(**kw, dp_overlap=False)
    assert serial.breakdown["dp_comm_exposed_s"] > hidden.breakdown["dp_comm_exposed_s"]
    assert serial.breakdown["overlap_slowdown_s"] == 0.0 and serial.step_time_s > hidden.step_time_s
    assert serial.plan["dp_overlap"] is False


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("axis", ["dp", "zero", "tp", "pp"])
def test_a_lossy_spec_never_costs_zero_seconds(zero, axis):
    """Compression kernels run on the GPU that computes: on every axis and at every ZeRO stage a
    lossy spec costs kernel seconds in the breakdown, hidden behind compute or not."""
    if axis == "zero" and zero == 0:
        pytest.skip("no parameter gathering without ZeRO")
    kw = dict(model="gpt-neox-20b", cluster="lassen", gpus=64, tp=4, pp=2, zero=zero, mbs=2, gbs=64,
              recompute="full", allow_oom=True)
    for spec in ("int8", "ef(topk(0.01))+int8"):
        r = predict(**kw, policy=f"{axis}={spec}")
        charged = r.kernel_s[axis]["critical_s"] + r.kernel_s[axis]["beside_compute_s"]
        assert charged > 0 and r.breakdown["compression_s"] >= charged * 0.999
        assert sum(r.breakdown.values()) == pytest.approx(r.step_time_s)


def test_hidden_kernels_slow_the_step():
    """DP buckets hidden behind backward still cost their kernels: a policy whose wire time hides
    entirely is slower than uncompressed by about its kernel seconds."""
    kw = dict(model="gpt2-medium", cluster="dgx-a100", nodes=2, tp=1, pp=1, mbs=8, gbs=128)
    base, int8 = predict(**kw), predict(**kw, policy="dp=int8")
    hidden = int8.kernel_s["dp"]["beside_compute_s"]
    assert hidden > 0 and base.breakdown["dp_comm_exposed_s"] < 0.1 * hidden
    assert int8.step_time_s - base.step_time_s > 0.8 * hidden


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_compute_detail_sums_to_the_compute_of_the_busiest_stage(recompute):
    r = predict("gpt-neox-20b", "lassen", gpus=64, tp=4, pp=2, mbs=2, gbs=64, recompute=recompute, allow_oom=True)
    d = r.compute_detail
    assert set(d) == {"gemm_s", "attention_s", "memory_bound_s", "host_bound_s"}
    assert min(d["gemm_s"], d["attention_s"], d["memory_bound_s"]) > 0 and d["host_bound_s"] == 0.0
    assert sum(d.values()) == pytest.approx(r.breakdown["compute_s"])
    assert d["gemm_s"] > d["memory_bound_s"]      # a 20B model's layers are GEMM-bound on V100


def test_the_step_report_shows_compute_by_kind_and_kernels_by_axis():
    from perfmodel.report.text import step_report

    text = step_report(predict("gpt-neox-20b", "lassen", gpus=64, tp=4, pp=2, mbs=2, gbs=64, recompute="full",
                               policy="naive:int8", allow_oom=True))
    for label in ("  gemm", "  attention", "  memory-bound", "  tp kernels", "  pp kernels"):
        assert label in text


def test_a_policy_axis_with_no_traffic_is_reported(cli):
    r = predict("gpt2-medium", "dgx-a100", nodes=1, tp=8, mbs=1, gbs=8, policy="hybrid")
    assert r.idle_policy_axes == ("dp", "zero", "pp")
    assert predict("gpt2-medium", "dgx-a100", nodes=1, tp=8, mbs=1, gbs=8, policy="tp=int8").idle_policy_axes == ()
    proc = cli("perfmodel", "predict", "--model", "gpt2-medium", "--cluster", "dgx-a100", "--nodes", "1", "--tp", "8",
               "--mbs", "1", "--gbs", "8", "--policy", "naive:int8")
    assert proc.returncode == 0
    lines = [line for line in proc.stderr.splitlines() if "has no traffic" in line]
    assert len(lines) == 3 and all("int8" in line for line in lines)


def test_tp_overlap_hides_all_but_a_chunk_behind_the_gemms():
    kw = dict(model="gpt3-1.3b", cluster="commodity-25g", nodes=2, tp=4, pp=1, mbs=2, gbs=64,
              sequence_parallel=True, allow_oom=True)
    plain, hidden = predict(**kw), predict(**kw, tp_overlap=True)
    tp0, tp1 = plain.breakdown["tp_comm_s"], hidden.breakdown["tp_comm_s"]
    assert tp0 / 4 * 0.999 <= tp1 < tp0                       # one chunk of four stays exposed
    assert 0 < plain.step_time_s - hidden.step_time_s <= tp0 - tp1 + 1e-12   # a shorter backward hides less DP
    assert sum(hidden.breakdown.values()) == pytest.approx(hidden.step_time_s)
    none = predict(**kw, tp_overlap=True, overlap_slowdown=0.0)
    assert none.breakdown["tp_comm_s"] < tp1                   # the slowdown is charged to tp_comm
    with pytest.raises(InputError) as err:
        predict(**{**kw, "sequence_parallel": False}, tp_overlap=True)
    assert err.value.field == "tp_overlap"
