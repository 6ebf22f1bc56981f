"""Overlapped expert communication (perfmodel.step.expert_overlap): batch-level overlap, DualPipe and the
all-to-all kernels' SM tax, in the plan, both engines, memory and the published Megatron-Bridge rows."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from perfmodel import predict
from perfmodel.calibration.bridge import recipe, recipe_plan
from perfmodel.calibration.published import row_plan
from perfmodel.step import expert_overlap
from perfmodel.step.timing import StageTime
from topologies.errors import InputError

# a MoE plan small enough to be quick: Mixtral on 64 H100, ep 8 across nodes, pp 2 x 2 virtual stages
# (Megatron-Core's batch overlap needs virtual stages where pp > 1)
MIXTRAL = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=64, pp=2, ep=8, zero=1, recompute="full",
               gbs=256, order="tp,pp,dp,ep", schedule="interleaved:2")


def _run(**kw):
    return predict(**{**MIXTRAL, **kw})


def _phase(rec, name: str) -> float:
    return rec.breakdown.get(name, 0.0)


def test_paired_fraction_follows_the_1f1b_warmup():
    plan = SimpleNamespace(ep_overlap="batch", schedule="1f1b", microbatches=8, virtual_stages=1, pp=4)
    # stage 0: 3 warm-up forwards, 5 of 8 forwards paired; the last stage: none, the first cannot pair: 7
    assert expert_overlap.paired_fraction(plan, 0) == pytest.approx(5 / 8)
    assert expert_overlap.paired_fraction(plan, 3) == pytest.approx(7 / 8)
    assert expert_overlap.paired_fraction(SimpleNamespace(**{**vars(plan), "schedule": "gpipe"}), 0) == 0.0
    assert expert_overlap.paired_fraction(SimpleNamespace(**{**vars(plan), "ep_overlap": "dualpipe"}), 0) == 1.0
    assert expert_overlap.paired_fraction(SimpleNamespace(**{**vars(plan), "ep_overlap": "none"}), 0) == 0.0


def test_a_pair_hides_at_most_its_compute():
    assert expert_overlap.hidden_per_pair(1.0, 1.0, 3.0, 5.0) == (1.0, 1.0)          # all hidden
    f, b = expert_overlap.hidden_per_pair(4.0, 4.0, 1.0, 2.0)                       # compute-bound: 3 of 8
    assert f + b == pytest.approx(3.0) and f == pytest.approx(b)


def test_sm_tax_by_kernels():
    dev = SimpleNamespace(key="h100-sxm", gemm_shape=None)
    assert expert_overlap.sm_tax("deepep", dev, 0.1) == pytest.approx(24 / 132)
    gb200 = SimpleNamespace(key="gb200", gemm_shape=None)
    assert expert_overlap.sm_tax("hybridep", gb200, 0.1) == pytest.approx(32 / 148)
    assert expert_overlap.sm_tax("deepep-ll", dev, 0.1) == 0.0
    assert expert_overlap.sm_tax("nccl", dev, 0.1) == 0.1


def test_batch_overlap_hides_ep_and_charges_its_tax():
    base, batch = _run(), _run(ep_overlap="batch")
    assert batch.step_time_s < base.step_time_s
    assert _phase(batch, "ep_comm_s") < _phase(base, "ep_comm_s")
    assert _phase(batch, "overlap_slowdown_s") > _phase(base, "overlap_slowdown_s")
    # the SM-free kernels hide the same seconds for less; DeepEP's 24 SMs cost more than NCCL's 0.1
    ll, deepep = _run(ep_overlap="batch", ep_kernels="deepep-ll"), _run(ep_overlap="batch", ep_kernels="deepep")
    assert ll.step_time_s < batch.step_time_s < deepep.step_time_s


def test_kernels_cost_nothing_without_overlap():
    assert _run(ep_kernels="deepep").step_time_s == _run().step_time_s


def test_batch_overlap_needs_megatrons_order():
    for schedule in ("gpipe", "1f1b"):
        with pytest.raises(InputError, match="ep_overlap"):
            _run(schedule=schedule, ep_overlap="batch")
    assert _run(pp=1, schedule="1f1b", ep_overlap="batch").step_time_s < _run(pp=1, schedule="1f1b").step_time_s


def test_dualpipe_hides_more_and_doubles_the_weights():
    base, batch, dual = _run(schedule="1f1b"), _run(ep_overlap="batch"), _run(schedule="1f1b", ep_overlap="dualpipe")
    assert dual.step_time_s < batch.step_time_s < base.step_time_s
    assert dual.memory_breakdown["weights"] == pytest.approx(2 * base.memory_breakdown["weights"], rel=1e-4)


def test_des_engine_runs_the_hidden_all_to_alls():
    alone = _run(ep_overlap="batch", engine="des")
    analytical = _run(ep_overlap="batch")
    # the hidden all-to-alls cross nodes: flows on the NIC beside the gradient buckets, never faster
    assert alone.step_time_s >= analytical.step_time_s - 1e-9
    assert _phase(alone, "contention_s") >= -1e-9


def test_des_equals_analytical_without_shared_links():
    """ep inside the node (NVLink, not shared in the simulation) and no DP overlap: the hidden all-to-alls
    contend with nothing (pp 1: the engines agree; pp 2: the same contention as without the overlap)."""
    kw = dict(order="tp,ep,pp,dp", dp_overlap=False)
    single = dict(kw, pp=1, schedule="1f1b", ep_overlap="batch")
    assert _run(engine="des", **single).step_time_s == pytest.approx(_run(**single).step_time_s, rel=1e-9)
    with_overlap = _run(engine="des", ep_overlap="batch", **kw).breakdown["contention_s"]
    assert with_overlap == pytest.approx(_run(engine="des", **kw).breakdown["contention_s"], abs=1e-9)


def test_des_trace_holds_the_hidden_flows():
    from perfmodel.engines.des import EVENTS
    from perfmodel.prediction import _policy, _setup, request_and_options
    kw = {k: v for k, v in MIXTRAL.items() if k not in ("model", "cluster")}
    request, options = request_and_options(**kw, ep_overlap="batch")
    step = _setup("mixtral-8x7b", "dgx-h100", request, options).inputs(_policy("none"))
    timing = EVENTS.time_step(step)
    hidden = timing.simulation.hidden_comm
    # of m x V chunk forwards, stage 0 of 2 pairs all but its 2 (p - 1) + (V - 1) p = 4 warm-up ones, the last
    # stage all but its 2 and the first steady one (expert_overlap.paired_fraction)
    n = step.plan.microbatches * 2
    assert len([h for h in hidden if h[0] == 0]) == n - 4
    assert len([h for h in hidden if h[0] == 1]) == n - 3
    assert all(end > start for _, _, start, end in hidden)


@pytest.mark.parametrize("field, value", [("ep_overlap", "both"), ("ep_kernels", "nvshmem")])
def test_unknown_names_are_refused(field, value):
    with pytest.raises(InputError, match=field):
        _run(**{field: value})


def test_dense_models_and_odd_dualpipe_are_refused():
    with pytest.raises(InputError, match="ep_overlap"):
        predict(model="llama3-8b", cluster="dgx-h100", gpus=8, ep_overlap="batch")
    with pytest.raises(InputError, match="dualpipe"):
        _run(pp=1, schedule="1f1b", ep_overlap="dualpipe")
    with pytest.raises(InputError, match="dualpipe"):
        _run(ep_overlap="dualpipe")          # interleaved


def test_cli_flags(capsys):
    from perfmodel.cli import main
    args = ["predict", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--pp", "2", "--ep", "8",
            "--zero", "1", "--recompute", "full", "--gbs", "256", "--schedule", "interleaved:2", "--json"]
    assert main(args) in (0, None)
    base = capsys.readouterr().out
    assert main(args + ["--ep-overlap", "batch", "--ep-kernels", "deepep"]) in (0, None)
    overlapped = capsys.readouterr().out
    assert '"ep_overlap": "batch"' in overlapped and base != overlapped
    with pytest.raises(SystemExit) as err:
        main(args + ["--ep-overlap", "nope"])
    assert err.value.code == 2


def test_bridge_rows_take_their_recipes_overlap():
    def overlap(*key):       # (container, model, system, precision) as the table names them
        plan = recipe_plan(recipe(*key))
        return plan["ep_overlap"], plan["ep_kernels"]
    assert overlap("26.08", "DeepSeekV3", "DGX-GB200", "MXFP8") == ("batch", "hybridep")
    assert overlap("26.04.01", "DeepSeekV3", "DGX-GB200", "MXFP8") == ("none", "hybridep")
    assert overlap("25.09", "DeepSeekV3 (dropless)", "DGX-H100", "") == ("batch", "deepep")
    assert overlap("26.08", "Qwen3_30B_a3B", "DGX-GB200", "MXFP8") == ("batch", "hybridep")
    row = dict(precision="mxfp8", tp="1", pp="4", dp="64", cp="1", ep="64", mbs="1", gbs="4096", seq_len="4096",
               recompute="none", sequence_parallel="False", tp_overlap="False", dp_overlap="", ep_overlap="batch",
               ep_kernels="hybridep")
    plan = row_plan(row)
    assert plan["ep_overlap"] == "batch" and plan["ep_kernels"] == "hybridep"
    assert "ep_overlap" not in row_plan({**row, "ep_overlap": "none"})


def test_stage_time_total_counts_the_tax():
    st = StageTime(compute=1.0, ep_tax=0.25)
    assert st.total == pytest.approx(1.25)


def test_the_trace_shows_the_hidden_all_to_alls_of_the_event_engine(tmp_path):
    import json

    import perfmodel

    path = tmp_path / "trace.json"
    kw = dict(gpus=64, ep=8, pp=2, schedule="interleaved:2", gbs=256, zero=1, recompute="full", engine="des")
    perfmodel.predict("mixtral-8x7b", "dgx-h100", ep_overlap="batch", trace=str(path), **kw)
    events = json.loads(path.read_text())["traceEvents"]
    hidden = [e for e in events if e.get("cat") == "hidden all-to-alls"]
    assert hidden and all(e["dur"] > 0 for e in hidden)
    perfmodel.predict("mixtral-8x7b", "dgx-h100", trace=str(path), **kw)
    names = {e["args"]["name"] for e in json.loads(path.read_text())["traceEvents"] if e["name"] == "thread_name"}
    assert "hidden all-to-alls" not in names                    # no overlap: no such track


def test_every_ep_kernels_name_the_plan_takes_has_its_sm_count():
    """The plan's names (perfmodel.plan.parallel.EP_KERNELS) and the SM tax's table agree."""
    from perfmodel.plan.parallel import EP_KERNELS
    from perfmodel.step.expert_overlap import KERNEL_SMS

    assert set(KERNEL_SMS) == set(EP_KERNELS)


def test_segments_hide_each_all_to_all_behind_its_own_compute():
    from perfmodel.step.expert_overlap import segment_hidden
    # one layer: attention 1 s each way, MLP 4 s each way; dispatch and combine 1 s each way: all hidden
    assert segment_hidden((1, 1.0, 4.0, 1.0, 4.0), 2.0, 2.0, 0.5) == pytest.approx((2.0, 2.0))
    # combines of 3 s against 1 s of attention: 2 s of each stay exposed, whatever the MLP's seconds
    h_fwd, h_bwd = segment_hidden((1, 1.0, 40.0, 1.0, 40.0), 4.0, 4.0, 0.25)
    assert h_fwd + h_bwd == pytest.approx(8.0 - 4.0)
    # per layer: two layers with the stage's totals hide what one layer of half of everything hides, twice
    one = sum(segment_hidden((1, 0.5, 1.0, 0.5, 1.0), 1.5, 1.0, 0.4))
    two = sum(segment_hidden((2, 1.0, 2.0, 1.0, 2.0), 3.0, 2.0, 0.4))
    assert two == pytest.approx(2 * one)
    assert segment_hidden((0, 0, 0, 0, 0), 1.0, 1.0, 0.5) == (0.0, 0.0)


def test_batch_overlap_hides_no_more_than_the_pairs_totals():
    kw = dict(gpus=64, pp=2, ep=8, zero=1, recompute="full", gbs=256, schedule="interleaved:2")
    none = predict("mixtral-8x7b", "dgx-h100", **kw)
    batch = predict("mixtral-8x7b", "dgx-h100", **kw, ep_overlap="batch")
    assert batch.step_time_s < none.step_time_s
    assert batch.breakdown["ep_comm_s"] > 0          # the combines longer than the attention beside them
