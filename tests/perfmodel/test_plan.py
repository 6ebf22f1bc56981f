import pytest

from perfmodel.plan.mesh import mesh_for
from perfmodel.prediction import predict
from perfmodel.plan.parallel import make_plan
from perfmodel.compression.policy import parse_policy, split_policies
from perfmodel.workload import load_model
from topologies.errors import InputError

NEOX = load_model("gpt-neox-20b")


@pytest.mark.parametrize("kwargs, field", [
    (dict(tp=5), "tp*pp"), (dict(tp=3), "tp"), (dict(tp=6, pp=2), "tp"), (dict(pp=64), "pp"),
    (dict(tp=4, pp=4, dp=10), "dp"), (dict(tp=4, pp=4, mbs=4, gbs=1024), "gbs"),
    (dict(zero=4), "zero"), (dict(recompute="some"), "recompute"), (dict(schedule="zigzag"), "schedule"),
    (dict(schedule="interleaved:1"), "schedule"), (dict(tp=0), "tp"), (dict(order="tp,dp"), "order"),
    (dict(pp=4, tp=4, schedule="interleaved:3", gbs=12), "schedule"),
])
def test_invalid_plans_name_the_field(kwargs, field):
    with pytest.raises(InputError) as err:
        make_plan(NEOX, 192, **kwargs)
    assert err.value.field == field


def test_gbs_error_suggests_valid_values():
    with pytest.raises(InputError, match="nearest: 1008 or 1056"):
        make_plan(NEOX, 192, tp=4, pp=4, mbs=4, gbs=1024)


def test_uneven_layer_split_is_allowed_and_reported():
    plan = make_plan(NEOX, 192, tp=4, pp=3, mbs=1, gbs=16 * 10)
    assert plan.stage_layers(44) == (15, 15, 14)


def test_dp_auto_and_microbatches():
    plan = make_plan(NEOX, 192, tp=4, pp=4, mbs=4, gbs=1056)
    assert (plan.dp, plan.microbatches) == (12, 22)


def test_does_not_fit_is_one_clear_error():
    with pytest.raises(InputError, match=r"does not fit: needs \d+\.\d GiB of 16\.0 GiB"):
        predict("gpt-neox-20b", "lassen", gpus=192, tp=4, pp=4, mbs=4, gbs=1056)
    r = predict("gpt-neox-20b", "lassen", gpus=192, tp=4, pp=4, mbs=4, gbs=1056, allow_oom=True)
    assert not r.fits and r.memory_per_gpu_bytes > 16e9


def test_mesh_places_tp_innermost_then_pp_then_dp():
    mesh = mesh_for(make_plan(NEOX, 32, tp=4, pp=2, mbs=1, gbs=4))
    assert mesh.group_of("tp") == (0, 1, 2, 3)
    assert mesh.group_of("pp") == (0, 4)
    assert mesh.group_of("dp") == (0, 8, 16, 24)
    assert len(mesh.groups["dp"]) == 8 and mesh.stage_pairs(0)[1] == (1, 5)


def test_mesh_other_order():
    mesh = mesh_for(make_plan(NEOX, 32, tp=4, pp=2, mbs=1, gbs=4, order="tp,dp,pp"))
    assert mesh.group_of("dp") == (0, 4, 8, 12) and mesh.group_of("pp") == (0, 16)


def test_policy_presets_and_overrides():
    p = parse_policy("hybrid,dp=topk(0.01)+int8,tp.min=4MiB")
    assert p.axis("dp").spec == "topk(0.01)+int8" and p.axis("tp").min_bytes == 4 << 20
    assert p.axis("pp").spec.startswith("lossless")
    assert parse_policy("naive:int8").axis("tp").spec == "int8"
    assert parse_policy("none").is_none and not p.is_none
    assert p.axis("tp").spec_for(1 << 20) == "none"


@pytest.mark.parametrize("text", ["bogus", "xp=int8", "dp=topk(7)", "naive:foo", "dp.min=-1", ""])
def test_bad_policies(text):
    with pytest.raises(InputError):
        parse_policy(text)


def test_split_policies():
    assert split_policies("none,naive:int8,hybrid,dp=int8") == ["none", "naive:int8", "hybrid,dp=int8"]
    assert split_policies("none;dp=int8;hybrid") == ["none", "dp=int8", "hybrid"]
