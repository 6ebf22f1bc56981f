"""The discrete-event engine (perfmodel.simulate): hand-checked cases, agreement with the
closed forms where nothing shares a link, link sharing where traffic overlaps."""
import json

import pytest

from perfmodel import predict
from perfmodel.step.schedule import StageCost, run_schedule
from perfmodel.simulate.core import HeapCore
from perfmodel.simulate.network import Network
from perfmodel.simulate.step import StageWork, simulate
from perfmodel.step.timing import overlap_buckets


def test_two_flows_on_one_link_take_twice_as_long():
    core, ends = HeapCore(), {}
    net = Network(core)
    net.start(("l",), 1.0, lambda: ends.setdefault("a", core.now))
    net.start(("l",), 1.0, lambda: ends.setdefault("b", core.now))
    net.start(("other",), 1.0, lambda: ends.setdefault("c", core.now))
    core.run()
    assert ends == {"a": pytest.approx(2.0), "b": pytest.approx(2.0), "c": pytest.approx(1.0)}


def test_a_flow_speeds_up_when_its_neighbour_ends():
    core, ends = HeapCore(), {}
    net = Network(core)
    net.start(("l",), 1.0, lambda: ends.setdefault("short", core.now))
    net.start(("l",), 3.0, lambda: ends.setdefault("long", core.now))
    core.run()
    # both at 1/2 until t = 2 (short done), then long alone: 3 - 1 = 2 left -> ends at 4
    assert ends == {"short": pytest.approx(2.0), "long": pytest.approx(4.0)}


@pytest.mark.parametrize("core", ["heap", "simpy"])
def test_two_stages_four_microbatches_bubble(core):
    if core == "simpy":
        pytest.importorskip("simpy")
    r = simulate([StageWork(1.0, 2.0, 0.0, 0.0)] * 2, "1f1b", 4, core=core)
    assert r.end_s == pytest.approx((4 + 2 - 1) * 3.0)
    x = simulate([StageWork(1.0, 2.0, 0.5, 0.5)] * 2, "1f1b", 4, core=core)
    assert x.end_s == pytest.approx(run_schedule("1f1b", [StageCost(1.0, 2.0, 0.5, 0.5)] * 2, 4).end_s)


@pytest.mark.parametrize("duration, exposed", [(0.5, 0.0), (1.5, 0.5)])
def test_one_bucket_overlapping_the_last_backward(duration, exposed):
    """One stage, two microbatches (f 1, b 2): the bucket is ready halfway through the last
    backward (t = 5) and runs on its own stream; it shows only past the backward's end (t = 6)."""
    r = simulate([StageWork(1.0, 2.0, 0.0, 0.0, ((0.5, 0.0, 1, duration),))], "1f1b", 2)
    assert r.end_s == pytest.approx(6.0 + exposed)
    assert r.buckets[0][2:] == pytest.approx((5.0, 5.0, 5.0 + duration))
    assert exposed == pytest.approx(overlap_buckets([(1.0, 0.0, 1, duration)], 2.0)[0])


def test_buckets_and_a_transfer_sharing_a_nic_slow_each_other():
    """Stage 1's buckets run while it sends its last gradient: both on its out-link."""
    alone = simulate([StageWork(1.0, 2.0, 1.0, 1.0)] * 2, "1f1b", 2)
    shared = simulate([StageWork(1.0, 2.0, 1.0, 1.0), StageWork(1.0, 2.0, 1.0, 1.0, ((0.99, 0.0, 1, 1.0),))],
                      "1f1b", 2)
    assert shared.end_s > alone.end_s + 0.4


PLANS = [dict(model=m, cluster=c, nodes=n, tp=tp, pp=1, mbs=mbs, gbs=gbs, zero=z, policy=pol)
         for m in ("gpt2-medium", "gpt3-1.3b") for c, n in (("dgx-a100", 2), ("commodity-25g", 2), ("lassen", 4))
         for tp in (1, 2) for mbs, gbs in ((2, 64),) for z in (0, 1)
         for pol in ("none", "naive:int8", "dp=ef(topk(0.01))+int8")]
PLANS += [dict(model="gpt2-medium", cluster="dgx-a100", gpus=pp * 2, tp=2, pp=pp, mbs=1, gbs=gbs, policy=pol)
          for pp in (2, 4) for gbs in (8, 16) for pol in ("none", "naive:fp16")]
PLANS += [dict(model="gpt2-medium", cluster="dgx-a100", gpus=pp * 2, tp=2, pp=pp, mbs=1, gbs=gbs, policy=pol,
               schedule="interleaved:2") for pp in (2, 4) for gbs in (8, 16) for pol in ("none", "naive:fp16")]


def test_the_engines_agree_where_nothing_shares_a_link():
    """pp = 1 (no transfers beside the buckets) or dp = 1 (no buckets beside the transfers):
    the event engine and the closed forms agree within 1% (here: to rounding)."""
    assert len(PLANS) >= 50
    for kw in PLANS:
        a, d = predict(**kw, allow_oom=True), predict(**kw, allow_oom=True, engine="des")
        assert d.step_time_s == pytest.approx(a.step_time_s, rel=0.01), kw
        assert abs(d.breakdown["contention_s"]) <= 1e-9 * a.step_time_s + 1e-12, kw
        assert d.engine == "des" and a.engine == "analytical"


def test_dp_and_pp_sharing_a_nic_is_where_the_engines_differ():
    kw = dict(model="gpt3-1.3b", cluster="commodity-25g", nodes=4, tp=1, pp=4, mbs=4, gbs=256, allow_oom=True)
    a, d = predict(**kw), predict(**kw, engine="des")
    assert d.breakdown["contention_s"] > 0 and d.step_time_s > a.step_time_s
    assert sum(d.breakdown.values()) == pytest.approx(d.step_time_s)


def test_the_des_trace_draws_the_buckets(tmp_path):
    path = tmp_path / "des.json"
    predict("gpt2-medium", "commodity-25g", nodes=2, tp=1, pp=2, mbs=1, gbs=32, engine="des", trace=str(path))
    events = json.loads(path.read_text())["traceEvents"]
    buckets = [e for e in events if e["ph"] == "X" and e["cat"] == "gradient buckets"]
    assert buckets and {e["pid"] for e in buckets} == {0, 1}


def test_the_cli_takes_the_engine(cli):
    proc = cli("perfmodel", "predict", "--model", "gpt2-medium", "--cluster", "commodity-25g", "--nodes", "2",
               "--pp", "2", "--mbs", "1", "--gbs", "32", "--engine", "des")
    assert proc.returncode == 0 and "contention" in proc.stdout
    bad = cli("perfmodel", "predict", "--engine", "quantum")
    assert bad.returncode == 2 and "engine" in bad.stderr


def test_without_overlap_buckets_wait_for_the_stage_s_last_send():
    """As realrun's trainer reduces: after the stage's whole schedule, its last gradient sent,
    so the buckets share no link with the pipeline."""
    stages = [StageWork(1.0, 2.0, 1.0, 1.0, ((1.0, 0.0, 1, 1.0),))] * 2
    r = simulate(stages, "1f1b", 2, overlap=False)
    sends = {(src, mb): end for kind, mb, src, dst, start, end in r.transfers if kind == "grad"}
    stage1_bucket = next(b for b in r.buckets if b[0] == 1)
    assert stage1_bucket[3] == pytest.approx(sends[(1, 1)])          # starts when its last send ended
    assert r.end_s == pytest.approx(run_schedule("1f1b", [StageCost(1.0, 2.0, 1.0, 1.0)] * 2, 2).end_s + 1.0)


@pytest.mark.parametrize("layers,compute,gather,reduce", [(4, 1.0, 0.5, 0.0), (4, 1.0, 2.0, 0.0), (4, 1.0, 0.3, 0.3),
                                                          (6, 1.0, 1.0, 1.0), (1, 1.0, 0.4, 0.2)])
def test_zero3_layers_by_hand_and_as_events(layers, compute, gather, reduce):
    """One layer of prefetch: the first gather exposed, later ones hidden up to the layer's compute;
    the event engine's layer-by-layer run (gathers and reduce-scatters as flows on the NIC) is the
    same when nothing else uses the NIC."""
    from perfmodel.step.timing import zero3_backward, zero3_forward
    if not reduce:
        assert zero3_forward(layers, compute, gather) == pytest.approx(
            gather + layers * compute + (layers - 1) * max(0.0, gather - compute))
    alone = zero3_backward(layers, compute, gather, reduce)
    if gather + reduce <= compute:
        assert alone == pytest.approx(gather + layers * compute + reduce)
    extra = 0.25                                       # TP and kernels beyond the layers
    fwd, bwd = zero3_forward(layers, compute, gather) + extra, alone + extra
    r = simulate([StageWork(fwd, bwd, 0.0, 0.0, zero3=(layers, compute, compute, gather, gather, reduce))], "1f1b", 2)
    assert r.end_s == pytest.approx(2 * (fwd + bwd))
    kinds = {k for _, k, *_ in r.layer_comm}
    assert kinds == ({"gather", "reduce-scatter"} if reduce else {"gather"})


def test_zero3_gathers_beside_pipeline_transfers_share_the_nic():
    kw = dict(model="gpt3-1.3b", cluster="commodity-25g", nodes=2, tp=1, pp=2, mbs=2, gbs=64, zero=3, allow_oom=True)
    a, d = predict(**kw), predict(**kw, engine="des")
    assert d.simulated_events > 500            # every layer's gather and reduce-scatter, per microbatch
    assert d.step_time_s >= a.step_time_s * (1 - 1e-9)
