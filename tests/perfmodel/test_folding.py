"""MoE parallel folding (etp, ep folded over tp x cp x dp, edp), ep with every ZeRO stage, and
uneven pipeline stages (first/last stage layers, the embedding and loss counted, Megatron's
layout string): degrees, mesh, memory, events, engines, search, CLI and Python API."""
import argparse
import math

import pytest

from perfmodel import predict
from perfmodel.axes import active_axes, step_events
from perfmodel.explore.sweep import candidate_plans
from perfmodel.plan import stages
from perfmodel.plan.degrees import Degrees, add_arguments
from perfmodel.plan.memory import expert_shards, memory_per_gpu, stage_param_split
from perfmodel.plan.mesh import mesh_for
from perfmodel.plan.parallel import PlanRequest, make_plan
from perfmodel.stage import StageContext
from perfmodel.workload import load_model
from topologies.errors import InputError

MIXTRAL = load_model("mixtral-8x7b")
V3 = load_model("deepseek-v3")


def _events(model, plan, stage=0, gpus_per_host=8):
    layers = plan.stage_layers(model.num_layers)
    return step_events(StageContext(model=model, plan=plan, mesh=mesh_for(plan), stage=stage, layers=layers[stage],
                                    gpus_per_host=gpus_per_host))


# --- Megatron-LM's rank groups, ported as the oracle (megatron/core/parallel_state.py:
# generate_masked_orthogonal_rank_groups and RankGenerator.get_ranks, order "tp-cp-ep-dp-pp") ---

def _prefix_product(a):
    out = [1]
    for v in a:
        out.append(out[-1] * v)
    return out


def _decompose(index, shape):
    stride = _prefix_product(shape)
    return [(index // d) % s for s, d in zip(shape, stride)]


def _megatron_groups(sizes: dict, token: str) -> list:
    """RankGenerator(order="tp-cp-ep-dp-pp", **sizes).get_ranks(token), as Megatron-LM computes it."""
    order = ["tp", "cp", "ep", "dp", "pp"]
    size = [sizes.get(n, 1) for n in order]
    mask = [n in token.split("-") for n in order]
    masked = [s for s, m in zip(size, mask) if m]
    unmasked = [s for s, m in zip(size, mask) if not m]
    stride = _prefix_product(size)
    m_stride = [d for d, m in zip(stride, mask) if m]
    u_stride = [d for d, m in zip(stride, mask) if not m]
    group = _prefix_product(masked)[-1]
    world = _prefix_product(size)[-1]
    out = []
    for g in range(world // group):
        gi = _decompose(g, unmasked)
        out.append([sum(x * y for x, y in zip(_decompose(r, masked), m_stride))
                    + sum(x * y for x, y in zip(gi, u_stride)) for r in range(group)])
    return sorted(tuple(x) for x in out)


@pytest.mark.parametrize("tp, cp, dp, pp, ep, etp", [
    (2, 1, 8, 2, 8, 1), (2, 2, 4, 2, 4, 2), (1, 2, 8, 1, 16, 1), (4, 1, 4, 2, 8, 2), (2, 1, 32, 1, 64, 1)])
def test_the_mesh_is_megatron_cores_two_rank_generators(tp, cp, dp, pp, ep, etp):
    """With Megatron-Core's order (pp outermost) the dense groups are its decoder RankGenerator's
    and the expert groups its expert RankGenerator's (tp=etp, ep, dp=edp, cp=1) over the same ranks."""
    d = Degrees(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, order=("tp", "cp", "ep", "dp", "pp")).check()
    mesh = d.mesh()
    dense, expert = dict(tp=tp, cp=cp, dp=dp, pp=pp), dict(tp=etp, ep=ep, dp=d.edp, pp=pp)
    for kind, sizes, token in (("tp", dense, "tp"), ("cp", dense, "cp"), ("pp", dense, "pp"), ("dp", dense, "cp-dp"),
                               ("etp", expert, "tp"), ("ep", expert, "ep"), ("edp", expert, "dp")):
        assert sorted(mesh.groups[kind]) == _megatron_groups(sizes, token), kind
    assert d.edp == tp * cp * dp // (etp * ep)


# --- the degrees record ---

def test_etp_follows_tp_unless_given():
    assert Degrees(tp=2).etp == 2 and Degrees(tp=2) == Degrees(tp=2, etp=2)
    assert Degrees(tp=2, ep=8, dp=8).with_(tp=4).etp == 4          # following tp
    assert Degrees(tp=2, etp=1, ep=8, dp=8).with_(tp=4).etp == 1   # given apart
    assert Degrees.of({"tp": 4, "dp": 2}).etp == 4                 # a record written before etp
    assert PlanRequest.of(tp=2).with_(tp=8).degrees.etp == 8


def test_labels_name_etp_only_apart_from_tp():
    assert Degrees(tp=2, ep=8, dp=8).label() == "tp2xep8xdp8"
    assert Degrees(tp=2, etp=1, ep=8, dp=8).label() == "tp2xep8xetp1xdp8"
    assert Degrees(tp=2, etp=1, ep=8, dp=8).describe() == "tp=2 pp=1 dp=8 ep=8 etp=1"


def test_ep_folds_over_tp_cp_dp():
    """ep x etp divides tp x cp x dp; ep need not divide dp (it refused ep 64 on dp 32)."""
    Degrees(tp=2, etp=1, ep=64, dp=32).check()
    with pytest.raises(InputError) as e:
        Degrees(tp=1, ep=64, dp=32).check()
    assert e.value.field == "ep" and "tp x cp x dp = 32" in str(e.value)
    with pytest.raises(InputError) as e:
        Degrees(tp=2, etp=3).check()
    assert e.value.field == "ep"


def test_cli_flag_etp_defaults_to_tp():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert Degrees.of(parser.parse_args(["--tp", "4"])).etp == 4
    assert Degrees.of(parser.parse_args(["--tp", "4", "--etp", "1"])).etp == 1
    assert "--expert-tensor-parallel-size" in parser.format_help().replace("\n", "").replace(" ", "")


def test_plans_check_etp_and_ep_against_the_model():
    plan = make_plan(MIXTRAL, 8, tp=2, etp=1, ep=8)                # 8 experts over tp x dp = 8 ranks
    assert (plan.ep, plan.etp, plan.edp, plan.dp) == (8, 1, 1, 4)
    for kw, field in ((dict(model=load_model("gpt3-1.3b"), tp=2, etp=1), "etp"),
                      (dict(model=MIXTRAL, tp=2, etp=3, gpus=12), "etp"),
                      (dict(model=MIXTRAL, ep=16), "ep")):
        model, gpus = kw.pop("model"), kw.pop("gpus", 16)
        with pytest.raises(InputError) as e:
            make_plan(model, gpus, **kw)
        assert e.value.field == field


# --- the mesh ---

def test_deepseek_on_h100_folds_ep_over_tp():
    """Megatron-Bridge's DeepSeek-V3 on 1024 H100: tp 2, etp 1, ep 64, pp 8: an ep group spans
    both ranks of each tp group (32 of them), edp 2."""
    plan = make_plan(V3, 1024, tp=2, etp=1, pp=8, ep=64, sequence_parallel=True, gbs=8192)
    mesh = mesh_for(plan)
    ep = mesh.group_of("ep", 0)
    assert len(ep) == 64 and {0, 1} <= set(ep) and plan.edp == 2
    assert all(len(g) == 1 for g in mesh.groups["etp"]) and len(mesh.group_of("edp", 0)) == 2
    assert mesh.coords(1)["ep"] == 1 and mesh.coords(1)["tp"] == 1


def test_etp_equal_to_tp_and_ep_one_is_the_dense_layout():
    mesh = mesh_for(make_plan(load_model("gpt3-1.3b"), 32, tp=2, pp=2))
    assert mesh.groups["etp"] == mesh.groups["tp"] and mesh.groups["edp"] == mesh.groups["dp"]


def test_the_default_order_keeps_the_expert_groups_inside_a_node():
    plan = make_plan(MIXTRAL, 64, tp=2, etp=1, pp=2, ep=8)
    ep = mesh_for(plan).group_of("ep", 0)
    assert ep == tuple(range(8))                                     # tp x the dp block, one node


# --- memory ---

def test_experts_split_over_ep_x_etp_and_zero_over_edp():
    a = make_plan(MIXTRAL, 16, tp=2, etp=1, ep=8, zero=1)            # ep x etp = 8, edp 2
    b = make_plan(MIXTRAL, 16, tp=2, ep=4, zero=1)                   # ep x etp = 8, edp 2
    (da, ea), (db, eb) = (stage_param_split(MIXTRAL, p, 32, True, True) for p in (a, b))
    assert da == db and ea == pytest.approx(eb)
    assert expert_shards(a, "optimizer") == a.edp == 2 and expert_shards(a, "weights") == 1
    z3 = make_plan(MIXTRAL, 16, tp=2, etp=1, ep=8, zero=3)
    mem, mem1 = memory_per_gpu(MIXTRAL, z3, 0, 32), memory_per_gpu(MIXTRAL, a, 0, 32)
    assert mem["weights"] == pytest.approx(mem1["weights"] * (da / 8 + ea / 2) / (da + ea))


# --- events ---

def test_expert_tensor_parallelism_gathers_the_dispatched_rows_over_etp():
    sp = dict(sequence_parallel=True, gbs=64)
    folded = make_plan(MIXTRAL, 16, tp=2, ep=4, **sp)                # etp = tp = 2
    apart = make_plan(MIXTRAL, 16, tp=2, etp=1, ep=8, **sp)
    experts = [e for e in _events(MIXTRAL, folded) if ".experts." in e.name]
    a2a = next(e for e in _events(MIXTRAL, folded) if e.op == "alltoall")
    assert {e.op for e in experts} == {"allgather", "reduce_scatter"} and len(experts) == 4
    assert all(e.axis == "tp" and e.nbytes == 2 * a2a.nbytes and e.group == mesh_for(folded).group_of("etp")
               for e in experts)
    assert not [e for e in _events(MIXTRAL, apart) if ".experts." in e.name]
    assert len(next(e for e in _events(MIXTRAL, apart) if e.op == "alltoall").group) == 8


def test_experts_apart_reduce_and_gather_over_edp():
    """etp other than tp puts the experts apart even with ep 1: their gradients reduce over edp
    (the tp ranks too), apart from the dense ones over dp x cp; ZeRO-1 gathers likewise."""
    plan = make_plan(MIXTRAL, 16, tp=2, etp=1, zero=1, gbs=64)
    mesh, events = mesh_for(plan), _events(MIXTRAL, plan)
    by = {e.name: e for e in events}
    assert by["dp.reduce_scatter.buckets"].group == mesh.group_of("dp") and len(mesh.group_of("dp")) == 8
    assert by["dp.reduce_scatter.expert_buckets"].group == mesh.group_of("edp") and len(mesh.group_of("edp")) == 16
    assert by["zero.allgather.expert_params"].group == mesh.group_of("edp")
    assert by["zero.allgather.params"].group == mesh.group_of("dp")


def test_zero3_with_ep_gathers_dense_over_dp_and_experts_over_edp():
    """torchtitan's FSDP2 with expert parallelism: ep 8, ZeRO-3 (refused before)."""
    plan = make_plan(MIXTRAL, 32, ep=8, zero=3, gbs=64)
    mesh, events = mesh_for(plan), _events(MIXTRAL, plan)
    by = {e.name: e for e in events}
    for name, kind in (("zero.allgather.fwd", "dp"), ("zero.allgather.bwd.experts", "edp"),
                       ("dp.reduce_scatter.bwd", "dp"), ("dp.reduce_scatter.bwd.experts", "edp")):
        assert by[name].group == mesh.group_of(kind) and by[name].where == "zero3"
    dense, experts = stage_param_split(MIXTRAL, plan, 32, True, True)
    assert by["zero.allgather.fwd.experts"].nbytes == pytest.approx(experts / 32 * 2, rel=1e-6)
    r = predict("mixtral-8x7b", "dgx-h100", gpus=32, ep=8, zero=3, gbs=64, allow_oom=True)
    assert r.step_time_s > 0 and "zero.allgather.fwd.experts" in r.collectives


def test_experts_replicated_over_tp_have_gradients_to_reduce():
    """tp 2 with etp 1 on 2 GPUs: dp x cp is 1, but both tp ranks hold every expert (edp 2)."""
    assert "dp" in active_axes(make_plan(MIXTRAL, 2, tp=2, etp=1), MIXTRAL)
    assert "dp" not in active_axes(make_plan(MIXTRAL, 2, tp=2), MIXTRAL)


# --- engines, API, CLI ---

def test_both_engines_time_a_folded_plan():
    kw = dict(gpus=64, tp=2, etp=1, pp=2, ep=8, zero=1, gbs=128, sequence_parallel=True, allow_oom=True)
    a = predict("mixtral-8x7b", "dgx-h100", **kw)
    d = predict("mixtral-8x7b", "dgx-h100", engine="des", **kw)
    assert a.plan["etp"] == 1 and a.plan["ep"] == 8 and math.isfinite(a.step_time_s)
    assert d.step_time_s == pytest.approx(a.step_time_s + d.breakdown["contention_s"], rel=1e-9)


def test_dense_plans_predict_as_before_with_etp_spelled_out():
    kw = dict(gpus=32, tp=2, pp=2, gbs=64, zero=1, policy="dp=int8")
    assert predict("gpt3-1.3b", "dgx-a100", **kw).to_dict() == predict("gpt3-1.3b", "dgx-a100", etp=2, **kw).to_dict()


def test_the_cli_takes_etp_and_the_stage_split(cli):
    out = cli("perfmodel", "predict", "--model", "deepseek-v3", "--cluster", "gb200-nvl72", "--gpus", "256",
              "--pp", "4", "--ep", "64", "--etp", "1", "--schedule", "interleaved:4", "--gbs", "4096",
              "--pipeline-model-parallel-layout", "Et*4|(t*4|)*14tL", "--allow-oom", check_rc=0).stdout
    assert "uneven stages: 16/16/16/13 layers" in out and "ep=64" in out
    bad = cli("perfmodel", "predict", "--model", "deepseek-v3", "--cluster", "gb200-nvl72", "--gpus", "256",
              "--pp", "16", "--ep", "8", "--first-stage-layers", "5", "--last-stage-layers", "1", "--allow-oom")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "first_stage_layers" in bad.stderr


# --- uneven pipeline stages ---

def test_deepseek_layouts_as_megatron_bridge_runs_them():
    """61 layers: pp 4 x V 4 'Et*4|(t*4|)*14tL' (Megatron-Bridge's DeepSeek-V3 recipes, MTP left
    out) and pp 16 with first 4 and last 1; the same 16 virtual stages on pp 16 x V 1."""
    plan = make_plan(V3, 256, pp=4, ep=64, schedule="interleaved:4", gbs=4096, pipeline_layout="Et*4|(t*4|)*14tL")
    assert plan.layout == (4,) * 15 + (1,) and plan.stage_layers(61) == (16, 16, 16, 13)
    assert [plan.stage_first_layer(s, 61) for s in range(4)] == [0, 16, 32, 48]
    ends = make_plan(V3, 256, pp=16, ep=8, gbs=4096, first_stage_layers=4, last_stage_layers=1)
    assert ends.stage_layers(61) == (4,) * 15 + (1,)
    flat = make_plan(V3, 256, pp=16, ep=8, gbs=4096, pipeline_layout="Et*4|(t*4|)*14tL")
    assert flat.stage_layers(61) == ends.stage_layers(61)


@pytest.mark.parametrize("layers, pp, v, first, last, expect", [
    (24, 4, 1, 3, 3, (3, 9, 9, 3)), (24, 4, 1, None, 6, (6, 6, 6, 6)), (28, 3, 2, 8, None, (4, 5, 5, 4, 5, 5)),
    (10, 2, 1, 4, 6, (4, 6))])
def test_first_and_last_stage_layers_as_megatron_splits_them(layers, pp, v, first, last, expect):
    """``get_num_layers_to_build`` (transformer_block.py): the middle stages split the rest, each
    stage's count over its V chunks."""
    assert stages.fixed_ends(layers, pp, v, first, last) == expect


@pytest.mark.parametrize("layers, pp, v, emb, loss, expect", [
    (126, 8, 1, True, True, (15,) + (16,) * 6 + (15,)), (30, 4, 2, True, True, (3, 4, 4, 4, 4, 4, 4, 3)),
    (31, 4, 1, True, False, (7, 8, 8, 8))])
def test_embedding_and_loss_counted_as_layers(layers, pp, v, emb, loss, expect):
    assert stages.accounted_split(layers, pp, v, emb, loss) == expect


@pytest.mark.parametrize("kw, field", [
    (dict(first_stage_layers=5, last_stage_layers=1), "first_stage_layers"),
    (dict(first_stage_layers=-1), "first_stage_layers"),
    (dict(first_stage_layers=4, account_for_loss=True), "account_for_embedding"),
    (dict(account_for_embedding=True), "account_for_embedding"),
    (dict(pipeline_layout="Et*61L|"), "pipeline_layout"),
    (dict(pipeline_layout="t*61|EL"), "pipeline_layout"),
    (dict(pipeline_layout="Et*60|" + "|" * 14 + "L"), "pipeline_layout"),
    (dict(pipeline_layout="Et*61" + "|" * 15 + "mL"), "pipeline_layout"),
    (dict(pipeline_layout="E(t*4|)*15t*9999999999L"), "pipeline_layout"),
    (dict(pipeline_layout="Ex*4"), "pipeline_layout"),
    (dict(pipeline_layout=""), "pipeline_layout"),
    (dict(pipeline_layout="Et*61" + "|" * 15 + "L", first_stage_layers=4), "first_stage_layers")])
def test_a_bad_split_is_one_line_naming_its_field(kw, field):
    with pytest.raises(InputError) as e:
        make_plan(V3, 256, pp=16, ep=8, gbs=4096, **kw)
    assert e.value.field == field and "\n" not in str(e.value)
    if "pipeline_layout" in kw and field == "pipeline_layout":
        assert repr(kw["pipeline_layout"]) in str(e.value)            # the text as given, not a count


def test_stages_keep_their_own_memory_and_time():
    kw = dict(gpus=256, pp=16, ep=8, gbs=1024, allow_oom=True)
    even = predict("deepseek-v3", "gb200-nvl72", **kw)
    uneven = predict("deepseek-v3", "gb200-nvl72", first_stage_layers=4, last_stage_layers=1, **kw)
    assert even.stage_layers == (4,) * 13 + (3,) * 3 and uneven.stage_layers == (4,) * 15 + (1,)
    plan = make_plan(V3, 256, pp=16, ep=8, gbs=1024, first_stage_layers=4, last_stage_layers=1)
    first, last = memory_per_gpu(V3, plan, 0, 4), memory_per_gpu(V3, plan, 15, 1)
    assert last["weights"] < first["weights"] and last["activations"] < first["activations"]
    assert uneven.step_time_s != even.step_time_s


def test_the_python_api_takes_every_new_field():
    r = predict("deepseek-v3", "gb200-nvl72", gpus=256, pp=4, ep=64, etp=1, schedule="interleaved:4", gbs=4096,
                pipeline_layout="Et*4|(t*4|)*14tL", zero=3, allow_oom=True)
    assert r.plan["layout"] == (4,) * 15 + (1,) and r.plan["zero"] == 3 and r.plan["etp"] == 1


# --- search ---

def test_the_sweep_enumerates_etp_and_folded_ep_for_moe_only():
    moe = candidate_plans("mixtral-8x7b", "dgx-h100", 16, None, 64)
    assert any(p["etp"] == 1 and p["tp"] == 2 and p.get("ep") == 8 and p["dp"] == 8 for p in moe)
    assert any(p.get("ep", 1) > p["dp"] for p in moe) and any(p["zero"] == 3 and p.get("ep", 1) > 1 for p in moe)
    assert all(p.get("ep", 1) % p["tp"] == 0 for p in moe if p["etp"] != p["tp"])
    assert not any("etp" in p for p in candidate_plans("gpt3-1.3b", "dgx-a100", 16, None, 64))


def test_a_dense_search_row_keeps_etp_equal_to_tp_and_its_label_names_no_etp(cli, tmp_path):
    """A plan that leaves etp out follows its tp (Degrees.of), in a search's rows as in predict."""
    import csv

    out = tmp_path / "all.csv"
    proc = cli("perfmodel", "search", "--model", "gpt2-small", "--cluster", "dgx-a100", "--gpus", "8", "--gbs", "16",
               "--candidates", "dp=none", "--schedules", "1f1b", "--max-mbs", "1", "--workers", "1", "--top", "50",
               "--csv", str(out), check_rc=0)
    rows = list(csv.DictReader(out.open()))
    assert any(r["tp"] == "2" for r in rows) and all(r["etp"] == r["tp"] for r in rows)
    assert "etp" not in proc.stdout
