"""Mixture of experts with expert parallelism (ep, ep_combine) and context parallelism (cp):
events, the all-to-all's cost, placement, memory, compression and search."""
import json
from dataclasses import replace

import pytest

from perfmodel import collective_time, predict
from perfmodel.axes import AXES, active_axes, step_events
from perfmodel.stage import StageContext
from perfmodel.compression import compile_spec
from perfmodel.plan.memory import stage_param_split
from perfmodel.plan.mesh import mesh_for
from perfmodel.plan.parallel import make_plan
from perfmodel.compression.policy import parse_policy
from perfmodel.explore.families import policies_for
from perfmodel.explore.search import plan_space
from perfmodel.workload import load_model
from topologies.errors import InputError

MIXTRAL = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=64, gbs=256, allow_oom=True)


def _events(model, plan, stage=0, gpus_per_host=8):
    layers = plan.stage_layers(model.num_layers)
    return step_events(StageContext(model=model, plan=plan, mesh=mesh_for(plan), stage=stage, layers=layers[stage],
                                    gpus_per_host=gpus_per_host))


@pytest.mark.parametrize("recompute, per_layer", [("none", 4), ("full", 6)])
def test_four_alltoalls_per_moe_layer_and_microbatch(recompute, per_layer):
    """Dispatch and combine, forward and backward (full recompute repeats the forward pair);
    DeepSeek-V3's first three dense layers have none."""
    v3 = load_model("deepseek-v3")
    plan = make_plan(v3, 256, pp=4, ep=8, gbs=256, recompute=recompute)
    m = plan.microbatches
    for stage in range(4):
        events = [e for e in _events(v3, plan, stage) if e.op == "alltoall"]
        layers = plan.stage_layers(61)[stage]
        moe = v3.moe_layers_in(plan.stage_first_layer(stage, 61), layers)
        assert sum(e.count for e in events) == per_layer * m * moe
        assert {e.axis for e in events} == {"ep", "ep_combine"}
        tokens = plan.seq * plan.mbs
        assert all(e.nbytes == tokens * 8 * 7168 * 2 and len(e.group) == 8 for e in events)
    assert v3.moe_layers_in(0, plan.stage_layers(61)[0]) == plan.stage_layers(61)[0] - 3


def test_dense_models_with_ep_and_cp_one_predict_as_without_them():
    kw = dict(model="gpt3-1.3b", cluster="dgx-a100", gpus=32, tp=2, pp=2, gbs=64, policy="dp=int8,tp=fp16")
    plain, explicit = predict(**kw), predict(**kw, ep=1, cp=1)
    assert plain.to_dict() == explicit.to_dict()
    assert plain.breakdown["ep_comm_s"] == plain.breakdown["cp_comm_s"] == 0.0
    assert not any(n.startswith(("ep", "cp")) for n in plain.collectives)
    mesh = mesh_for(make_plan(load_model("gpt3-1.3b"), 32, tp=2, pp=2))
    assert mesh.groups["tp"][0] == (0, 1) and mesh.groups["pp"][0] == (0, 2) and mesh.groups["dp"][0] == tuple(
        range(0, 32, 4)) and mesh.groups["edp"] == mesh.groups["dp"]


def test_ep_is_placed_inside_the_node_unless_the_order_names_it():
    mixtral = load_model("mixtral-8x7b")
    inside = mesh_for(make_plan(mixtral, 64, pp=2, ep=8))
    assert inside.groups["ep"][0] == tuple(range(8))                 # tp, cp, ep, then pp: one node
    assert inside.groups["pp"][0] == (0, 8) and len(inside.groups["edp"][0]) == 4
    across = mesh_for(make_plan(mixtral, 64, pp=2, ep=8, order="tp,pp,dp,ep"))
    assert across.groups["ep"][0] == tuple(range(0, 64, 8))          # one GPU of each node
    # the dense gradients' group: all of dp (ep x dp / ep) on stage 0, every other node
    assert inside.groups["dp"][0] == tuple(r for r in range(64) if (r // 8) % 2 == 0)


def test_ep_shards_the_experts_and_zero_shards_them_over_expert_dp():
    mixtral = load_model("mixtral-8x7b")
    one, eight = (make_plan(mixtral, 64, ep=ep, zero=1) for ep in (1, 8))
    d1, e1 = stage_param_split(mixtral, one, 32, True, True)
    d8, e8 = stage_param_split(mixtral, eight, 32, True, True)
    assert d1 == d8 and e8 == pytest.approx(e1 / 8)
    assert d1 + e1 == pytest.approx(mixtral.params)
    r1, r8 = (predict(**MIXTRAL, ep=ep, zero=1) for ep in (1, 8))
    assert r8.memory_breakdown["weights"] < r1.memory_breakdown["weights"] / 3
    assert r8.memory_breakdown["optimizer"] == pytest.approx(r1.memory_breakdown["optimizer"], rel=1e-6)


def test_expert_gradients_reduce_over_expert_data_parallel_groups():
    mixtral = load_model("mixtral-8x7b")
    plan = make_plan(mixtral, 64, ep=8)
    buckets = [e for e in _events(mixtral, plan) if e.where == "overlap"]
    dense = [e for e in buckets if "expert" not in e.name]
    experts = [e for e in buckets if "expert" in e.name]
    assert {len(e.group) for e in dense} == {64} and {len(e.group) for e in experts} == {8}
    dense_b, expert_b = (int(x) * 4 for x in stage_param_split(mixtral, plan, 32, True, True))
    assert sum(e.nbytes * e.count for e in dense) == dense_b
    assert sum(e.nbytes * e.count for e in experts) == expert_b
    assert max(e.ready_at for e in dense) <= min(e.ready_at for e in experts) <= 1.0


@pytest.mark.parametrize("nodes", [2, 8])
def test_hierarchical_alltoall_is_cheaper_across_nodes_and_keeps_rails(nodes):
    kw = dict(cluster="dgx-h100", nodes=nodes, dtype="bf16")
    for size in (1 << 20, 1 << 26):
        flat = collective_time("alltoall", size, algorithm="direct", **kw)
        deep = collective_time("alltoall", size, algorithm="hierarchical", **kw)
        assert deep.time_s < flat.time_s
        assert "ib-spine" in flat.wire_bytes and "ib-spine" not in deep.wire_bytes   # pairwise crosses rails
    assert collective_time("alltoall", 1 << 26, **kw).algorithm == "hierarchical"


def test_alltoall_cost_grows_with_size_and_is_nic_bound_across_nodes():
    times = [collective_time("alltoall", s, cluster="dgx-h100", nodes=4, dtype="bf16").time_s
             for s in (1 << 16, 1 << 20, 1 << 24, 1 << 28)]
    assert times == sorted(times) and times[0] < times[-1]
    big = collective_time("alltoall", 1 << 30, cluster="dgx-h100", nodes=4, dtype="bf16", algorithm="direct")
    nic = 400e9 / 8                                  # every GPU sends (p - r) / p of S through its 400 Gb/s NIC
    assert big.time_s == pytest.approx((1 << 30) * 24 / 32 / nic, rel=0.15)
    one = collective_time("alltoall", 1 << 30, cluster="dgx-h100", nodes=1, dtype="bf16")
    assert one.time_s < big.time_s / 4                # inside the node: NVLink


def test_policy_ep_combine_follows_ep_unless_set_and_the_deepseek_preset():
    assert parse_policy("ep=fp8").axis("ep_combine").spec == "fp8"
    assert parse_policy("ep=fp8,ep_combine=none").axis("ep_combine").spec == "none"
    assert parse_policy("ep_combine=int8,ep=fp8").axis("ep_combine").spec == "int8"
    ds = parse_policy("deepseek")
    assert ds.axis("ep").spec == "fp8" and ds.axis("ep_combine").spec == "none" and ds.axis("dp").spec == "none"
    assert parse_policy("deepseek,ep=int8").axis("ep_combine").spec == "none"
    assert parse_policy("hybrid").axis("ep").spec == "none"
    assert all(AXES[a].error == "forwarded" for a in ("ep", "ep_combine", "cp"))


def test_fp8_dispatch_speeds_the_step_and_its_error_is_one_quantization():
    base = predict(**MIXTRAL, ep=8, order="tp,pp,dp,ep")
    fp8 = predict(**MIXTRAL, ep=8, order="tp,pp,dp,ep", policy="deepseek")
    assert fp8.breakdown["ep_comm_s"] < base.breakdown["ep_comm_s"] and fp8.speedup_vs_uncompressed > 1
    assert fp8.error_estimate["ep"] == pytest.approx(compile_spec("fp8").error)      # forwarded: once
    assert "ep_combine" not in fp8.error_estimate or fp8.error_estimate["ep_combine"] == 0.0
    assert fp8.kernel_s["ep"]["critical_s"] > 0 and fp8.breakdown["compression_s"] > 0
    both = predict(**MIXTRAL, ep=8, order="tp,pp,dp,ep", policy="ep=fp8")
    assert both.breakdown["ep_comm_s"] < fp8.breakdown["ep_comm_s"]


def test_ep_inside_the_node_is_nvlink_only():
    r = predict(**MIXTRAL, ep=8)
    assert set(r.wire_bytes["ep"]) <= {"nvlink"} and r.breakdown["ep_comm_s"] > 0


def test_moe_compute_follows_the_expert_load():
    mixtral = load_model("mixtral-8x7b")
    skewed = replace(mixtral, moe_load_imbalance=2.0)
    capped = replace(skewed, moe_capacity_factor=1.25)
    from perfmodel.devices import device
    from perfmodel.step.compute import stage_compute
    plan, dev = make_plan(mixtral, 8, ep=8), device("h100-sxm")
    t = [stage_compute(m, plan, dev, 32, True, True, 32).fwd_s for m in (mixtral, capped, skewed)]
    assert t[0] < t[1] < t[2]
    assert stage_compute(mixtral, plan, dev, 32, True, True, 32).hardware_flops == \
        stage_compute(skewed, plan, dev, 32, True, True, 32).hardware_flops


def test_eager_kernels_price_the_ring_scores_and_the_moe_permutation():
    """realrun's eager layers: a cp ring's score blocks make UNFUSED accesses each at the streaming
    rate and its backward recomputes the scores (a fifth product), a MoE layer's permutation its
    dispatched rows' accesses; fused kernels neither, and whole-sequence attention is fused
    either way."""
    from perfmodel.devices import device
    from perfmodel.step.compute import (ACTIVATION_BYTES, EAGER_LAYOUT_ACCESSES, EAGER_PERMUTE_ACCESSES,
                                   UNFUSED_BWD_ACCESSES, UNFUSED_FWD_ACCESSES, attention_heads, score_elements,
                                   stage_compute)
    dev, llama, mixtral = device("h100-sxm"), load_model("llama3-8b"), load_model("mixtral-8x7b")

    def extra(model, gpus, **kw):
        fused, eager = (stage_compute(model, make_plan(model, gpus, kernels=k, **kw), dev, model.num_layers, True,
                                      True, model.num_moe_layers) for k in ("fused", "eager"))
        return eager.fwd_s + eager.bwd_s - fused.fwd_s - fused.bwd_s, eager.attention_s - fused.attention_s

    plan = make_plan(llama, 16, cp=2, seq=16384, kernels="eager")
    total, attn = extra(llama, 16, cp=2, seq=16384)
    scores = (UNFUSED_FWD_ACCESSES + UNFUSED_BWD_ACCESSES) * score_elements(llama, plan) * ACTIVATION_BYTES
    qk = attention_heads(llama, plan) * 2 * dev.table_gemm_time_s(plan.local_seq, plan.local_seq, llama.head_dim,
                                                                  plan.compute_dtype)   # QK^T of cp=2 blocks
    assert total == pytest.approx(llama.num_layers * (scores / dev.stream_Bps + qk)) and attn == pytest.approx(total)
    assert extra(llama, 16, seq=16384) == (0.0, 0.0)
    total, attn = extra(mixtral, 8, ep=8)
    rows = mixtral.dispatched_rows(make_plan(mixtral, 8, ep=8).routed_tokens) * mixtral.hidden_size
    permute = 3 * (EAGER_PERMUTE_ACCESSES + EAGER_LAYOUT_ACCESSES) * rows * ACTIVATION_BYTES   # forward, backward 2x
    assert total == pytest.approx(mixtral.num_moe_layers * permute / dev.stream_Bps) and attn == 0.0
    with pytest.raises(InputError) as err:
        make_plan(llama, 8, kernels="triton")
    assert err.value.field == "kernels"


def test_the_ring_hides_behind_the_backward_attention_as_priced():
    """What cp's backward ring hides behind is the backward attention as priced: twice the
    forward's with fused kernels, eager's own (its accesses and its recomputed scores) with eager."""
    from perfmodel.devices import device
    from perfmodel.step.compute import stage_compute

    llama = load_model("llama3-8b")
    for dev, dtype in ((device("h100-sxm"), "bf16"), (device("host-cpu"), "fp32")):
        for kernels in ("fused", "eager"):
            plan = make_plan(llama, 16, cp=2, seq=16384, kernels=kernels, compute_dtype=dtype)
            sc = stage_compute(llama, plan, dev, llama.num_layers, True, True)
            assert sc.attention_s == pytest.approx(sc.attention_fwd_s + sc.attention_bwd_s)
            ratio = sc.attention_bwd_s / sc.attention_fwd_s
            assert ratio == pytest.approx(2.0) if kernels == "fused" else ratio != pytest.approx(2.0, rel=0.01)


def test_cp_ring_events_and_overlap_with_attention():
    llama = load_model("llama3-8b")
    plan = make_plan(llama, 64, cp=4, seq=32768, gbs=16, recompute="selective")
    ring = [e for e in _events(llama, plan) if e.axis == "cp"]
    assert {e.phase for e in ring} == {"fwd", "bwd"} and all(e.where == "attention" for e in ring)
    assert all(e.count == plan.microbatches * 32 * 3 for e in ring)
    block = 2 * (32768 // 4) * llama.kv_dim * 2
    assert sorted(e.nbytes for e in ring) == [block, block, 2 * block]
    assert active_axes(plan, llama) == ("dp", "cp")
    r = predict("llama3-8b", "dgx-h100", gpus=64, cp=4, seq=32768, gbs=16, recompute="selective", allow_oom=True)
    wire = sum(r.wire_bytes["cp"].values())
    assert wire > 0 and 0 <= r.breakdown["cp_comm_s"] < r.breakdown["compute_s"] / 10


def test_cp_divides_activations_and_attention():
    kw = dict(model="llama3-8b", cluster="dgx-h100", seq=32768, gbs=16, recompute="selective", allow_oom=True)
    one, four = predict(**kw, gpus=16), predict(**kw, gpus=64, cp=4)
    assert four.memory_breakdown["activations"] == pytest.approx(one.memory_breakdown["activations"] / 4, rel=0.01)
    assert four.compute_detail["attention_s"] < one.compute_detail["attention_s"] / 3


@pytest.mark.parametrize("kw, field", [(dict(model="llama3-8b", ep=2), "ep"),
                                       (dict(model="mixtral-8x7b", ep=3), "ep"),
                                       (dict(model="mixtral-8x7b", ep=16, gpus=8), "ep"),
                                       (dict(model="llama3-8b", cp=3), "cp"),
                                       (dict(model="llama3-8b", cp=0), "cp")])
def test_bad_ep_and_cp_name_the_field(kw, field):
    args = {"cluster": "dgx-h100", "gpus": 24 if kw.get("ep") == 3 or kw.get("cp") == 3 else 16, **kw}
    with pytest.raises(InputError) as err:
        predict(**args)
    assert err.value.field == field


def test_cli_takes_ep_and_cp(cli):
    out = json.loads(cli("perfmodel", "predict", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "16",
                         "--ep", "8", "--policy", "deepseek", "--allow-oom", "--json", check_rc=0).stdout)
    assert out["plan"]["ep"] == 8 and out["breakdown"]["ep_comm_s"] > 0
    text = cli("perfmodel", "predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--cp", "2",
               "--seq", "16384", "--allow-oom", check_rc=0).stdout
    assert "cp_comm" in text and "cp=none" in text
    eager = json.loads(cli("perfmodel", "predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                           "--cp", "2", "--seq", "16384", "--kernels", "eager", "--allow-oom", "--json",
                           check_rc=0).stdout)
    fused = json.loads(cli("perfmodel", "predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                           "--cp", "2", "--seq", "16384", "--allow-oom", "--json", check_rc=0).stdout)
    assert eager["plan"]["kernels"] == "eager" and eager["step_time_s"] > fused["step_time_s"]
    proc = cli("perfmodel", "predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--ep", "2")
    assert proc.returncode == 2 and "ep" in proc.stderr and "Traceback" not in proc.stderr


def test_search_covers_ep_for_moe_models_and_cp_for_long_sequences_only():
    dense = plan_space("gpt3-1.3b", "dgx-a100", 16, None, 64, max_mbs=1)
    assert not any("ep" in p or "cp" in p for p in dense)
    moe = plan_space("mixtral-8x7b", "dgx-h100", 16, None, 64, max_mbs=1)
    assert {p.get("ep", 1) for p in moe} == {1, 2, 4, 8} and any(p.get("ep", 1) > 1 and p["zero"] == 3
                                                               for p in moe)   # FSDP2 + EP (torchtitan)
    long = plan_space("llama3-8b", "dgx-h100", 16, None, 64, max_mbs=1, seq=32768)
    assert {p.get("cp", 1) for p in long} == {1, 2, 4, 8, 16}
    cands = {"ep": ["none", "fp8"], "ep_combine": ["none", "int8"]}
    pols = policies_for({"tp": 1, "pp": 1, "dp": 8, "zero": 0, "ep": 8}, cands, load_model("mixtral-8x7b"))
    assert pols == ["none", "ep_combine=int8", "ep=fp8,ep_combine=none", "ep=fp8,ep_combine=int8"]
    assert parse_policy(pols[2]).axis("ep_combine").spec == "none"


def test_des_runs_cross_node_alltoalls_on_the_nic_and_the_trace_draws_them():
    trace: list = []
    r = predict(**MIXTRAL, ep=8, order="tp,pp,dp,ep", engine="des", trace=trace)
    a = predict(**MIXTRAL, ep=8, order="tp,pp,dp,ep")
    assert r.breakdown["contention_s"] >= 0 and r.step_time_s >= a.step_time_s * (1 - 1e-9)
    inner = [e for e in trace if e.get("cat") == "all-to-all, K/V ring"]
    assert len(inner) == 2 * r.plan["microbatches"]
    inside: list = []
    predict(**MIXTRAL, ep=8, trace=inside)
    assert any(e.get("cat") == "all-to-all, K/V ring" for e in inside)


@pytest.mark.parametrize("model", ["mixtral-8x7b", "olmoe-1b-7b", "llama3-8b"])
@pytest.mark.parametrize("ep, cp, zero, pp", [(1, 1, 0, 1), (2, 1, 1, 2), (4, 2, 0, 1), (1, 2, 2, 2), (2, 2, 0, 4)])
def test_the_new_axes_are_active_exactly_where_their_generators_move_something(model, ep, cp, zero, pp):
    arch = load_model(model)
    if ep > 1 and not arch.is_moe:
        ep = 1
    plan = make_plan(arch, 8 * cp * pp, pp=pp, ep=ep, cp=cp, zero=zero, seq=4096, gbs=8 * pp)
    moved = {e.axis for s in range(pp) for e in _events(arch, plan, s)}
    assert set(active_axes(plan, arch)) == moved
