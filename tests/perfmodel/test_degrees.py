"""perfmodel.plan.degrees: one record of every parallel degree."""
import argparse
from dataclasses import fields

import pytest

from perfmodel.plan.degrees import Degrees, add_arguments
from perfmodel.plan.mesh import mesh_for
from perfmodel.plan.parallel import GROUP_KINDS, ORDER_OPTIONAL, ParallelPlan, PlanRequest, make_plan
from perfmodel.workload import load_model
from topologies.errors import InputError


def test_names_are_the_fields_that_are_degrees_in_label_order():
    assert Degrees.names() == ("tp", "cp", "ep", "etp", "pp", "dp")
    assert set(Degrees.names()) | {"order"} == {f.name for f in fields(Degrees)}


def test_gpus_take_every_degree_but_a_carved_one():
    d = Degrees(tp=2, cp=2, ep=4, pp=3, dp=8)
    assert d.gpus == 2 * 2 * 3 * 8 and Degrees.carved() == {"ep": "dp"}
    # the dp block placed inside pp: lcm(tp x cp, etp x ep) / (tp x cp) = lcm(4, 8) / 4 (perfmodel.plan.mesh)
    assert d.placement() == {"tp": 2, "cp": 2, "ep": 2, "pp": 3, "dp": 4}


@pytest.mark.parametrize("field, value", [("tp", 0), ("cp", -1), ("pp", 1.5), ("dp", "many"), ("ep", True)])
def test_a_bad_degree_names_itself(field, value):
    with pytest.raises(InputError) as e:
        Degrees(**{field: value}).check()
    assert e.value.field == field


def test_ep_divides_dp():
    with pytest.raises(InputError, match="ep"):
        Degrees(ep=3, dp=4).check()


def test_resolved_fills_auto_dp_and_checks_the_product():
    assert Degrees(tp=2, pp=2, dp="auto").resolved(16).dp == 4
    with pytest.raises(InputError) as e:
        Degrees(tp=3, dp="auto").resolved(16)
    assert e.value.field == "tp*pp"
    with pytest.raises(InputError) as e:
        Degrees(tp=2, cp=2, dp=3).resolved(16)
    assert e.value.field == "dp" and "dp x tp x cp x pp" in str(e.value)


@pytest.mark.parametrize("degrees, label", [
    (Degrees(dp=4), "dp4"), (Degrees(tp=2, dp=2), "tp2xdp2"), (Degrees(ep=2, dp=4), "ep2xdp4"),
    (Degrees(cp=2, dp=2), "cp2xdp2"), (Degrees(), "dp1")])
def test_labels_as_users_write_them(degrees, label):
    assert degrees.label() == label


def test_labels_with_degrees_always_shown_in_an_order():
    d = Degrees(ep=2, dp=4)
    assert d.label("-", always=("tp", "pp", "dp"), order=("tp", "pp", "dp", "ep", "cp")) == "tp1-pp1-dp4-ep2"


def test_older_records_read_the_defaults_of_degrees_they_lack():
    old = {"tp": 2, "pp": 1, "dp": 4}          # written before ep and cp existed
    assert Degrees.of(old) == Degrees(tp=2, dp=4)
    assert Degrees.of({"tp": 2, "order": "tp,pp,dp,ep"}).order == ("tp", "pp", "dp", "ep")
    assert Degrees.of(argparse.Namespace(tp=2, pp=None, dp=8)) == Degrees(tp=2, dp=8)


def test_cli_arguments_come_from_the_record():
    parser = argparse.ArgumentParser()
    add_arguments(parser, helps={"cp": "ring attention here"})
    args = parser.parse_args(["--tp", "2", "--ep", "4"])
    assert Degrees.of(args) == Degrees(tp=2, ep=4, dp="auto")
    assert "ring attention here" in parser.format_help()
    strict = argparse.ArgumentParser()
    add_arguments(strict, dp_auto=False)
    assert strict.parse_args([]).dp == 1


def test_plans_hold_one_record_and_read_degrees_through_it():
    plan = make_plan(load_model("mixtral-8x7b"), 16, tp=2, ep=2, cp=2)
    assert isinstance(plan, ParallelPlan) and plan.degrees == Degrees(tp=2, cp=2, ep=2, dp=4)
    assert (plan.tp, plan.cp, plan.ep, plan.pp, plan.dp, plan.gpus) == (2, 2, 2, 1, 4, 16)
    assert plan.as_dict()["tp"] == 2 and "degrees" not in plan.as_dict()
    assert PlanRequest.of(tp=4, zero=1).with_(pp=2).degrees == Degrees(tp=4, pp=2, dp="auto")
    with pytest.raises(AttributeError):
        plan.not_a_field   # noqa: B018


def test_the_mesh_places_what_order_leaves_out_and_has_every_group_kind():
    plan = make_plan(load_model("mixtral-8x7b"), 16, tp=2, ep=2, cp=2)
    mesh = mesh_for(plan)
    assert mesh.order == ("tp", "cp", "ep", "pp", "dp") and set(mesh.groups) == set(GROUP_KINDS)
    assert set(ORDER_OPTIONAL) == {"cp", "ep"}
    assert mesh is plan.degrees.mesh()


def test_the_step_report_names_every_degree_a_plan_uses():
    from perfmodel import predict
    from perfmodel.report.text import step_report

    moe = step_report(predict("mixtral-8x7b", "dgx-h100", gpus=64, tp=2, pp=4, ep=8, allow_oom=True)).splitlines()[1]
    dense = step_report(predict("gpt3-1.3b", "dgx-a100", gpus=8, tp=2)).splitlines()[1]
    assert moe.startswith("plan: tp=2 pp=4 dp=8 ep=8 zero=0") and dense.startswith("plan: tp=2 pp=1 dp=4 zero=0")
