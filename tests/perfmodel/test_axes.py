"""The axis declarations (perfmodel.axes) are what the rest of the model reads, and they agree
with the events their generators produce."""
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.axes import AXES, ISSUE_ORDER, NAMES, active_axes, step_events
from perfmodel.stage import StageContext
from perfmodel.plan.memory import shards
from perfmodel.plan.mesh import mesh_for
from perfmodel.plan.parallel import GROUP_KINDS, make_plan
from perfmodel.compression.policy import POLICY_AXES, parse_policy
from topologies.errors import InputError
from perfmodel.explore.search import DEFAULT_MAX_ERROR
from perfmodel.step.timing import Breakdown
from perfmodel.workload import load_model


def _events(model, plan, gpus_per_host=8):
    mesh = mesh_for(plan)
    return [step_events(StageContext(model=model, plan=plan, mesh=mesh, stage=s, layers=n,
                                     gpus_per_host=gpus_per_host))
            for s, n in enumerate(plan.stage_layers(model.num_layers))]


def test_every_reader_takes_the_declared_axes():
    assert POLICY_AXES == NAMES and set(ISSUE_ORDER) == set(AXES)
    assert set(DEFAULT_MAX_ERROR) == set(AXES)
    assert set(parse_policy("none").axes) == set(AXES)
    breakdown = {f.name for f in fields(Breakdown)}
    for axis in AXES.values():
        assert axis.mesh_axis in GROUP_KINDS and axis.phase.name in breakdown
        assert set(mesh_for(make_plan(load_model("mixtral-8x7b"), 16, ep=2, cp=2)).groups) == set(GROUP_KINDS)
        assert axis.error in ("reduced", "forwarded") and 0 < axis.max_error < 1


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(["gpt3-1.3b", "llama3-8b", "gpt2-medium"]), tp=st.sampled_from([1, 2, 4]),
       pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 4]), zero=st.sampled_from([0, 1, 2, 3]),
       sp=st.booleans())
def test_an_axis_is_active_exactly_where_its_generator_moves_something(model, tp, pp, dp, zero, sp):
    arch = load_model(model)
    plan = make_plan(arch, tp * pp * dp, tp=tp, pp=pp, zero=zero, mbs=1, gbs=dp * pp * 2, sequence_parallel=sp)
    per_stage = _events(arch, plan)
    moved = {e.axis for stage in per_stage for e in stage}
    assert set(active_axes(plan, arch)) == moved
    for stage in per_stage:                      # each generator yields its own axis only, in issue order
        order = [ISSUE_ORDER.index(e.axis) for e in stage]
        assert order == sorted(order)
        for name, axis in AXES.items():
            assert all(e.axis == name for e in axis.events(StageContext(
                model=arch, plan=plan, mesh=mesh_for(plan), stage=0, layers=plan.stage_layers(arch.num_layers)[0])))


def test_active_axes_reads_plan_dicts_and_tied_embeddings():
    tied = load_model("gpt3-1.3b")
    assert tied.tied_embeddings
    plan = {"tp": 1, "pp": 4, "dp": 1, "zero": 0}
    assert active_axes(plan) == ("pp",)                       # structure alone
    assert active_axes(plan, tied) == ("dp", "pp")            # the tied embedding's gradient sum is dp traffic
    assert active_axes({"tp": 2, "pp": 1, "dp": 2, "zero": 1}) == ("dp", "zero", "tp")


@pytest.mark.parametrize("zero, expected", [(0, (1, 1, 1)), (1, (4, 1, 1)), (2, (4, 4, 1)), (3, (4, 4, 4))])
def test_zero_axis_declares_its_memory_shards(zero, expected):
    plan = make_plan(load_model("gpt3-1.3b"), 8, tp=2, zero=zero, gbs=4)
    assert tuple(shards(plan, k) for k in ("optimizer", "gradients", "weights")) == expected
    assert shards(plan, "params") == 2                        # the tp axis splits every parameter


def test_as_policy_reads_a_preset_an_axis_item_or_a_bare_spec_as_the_runtimes_take_them():
    from perfmodel.compression.policy import as_policy

    cases = {"int8": ("int8", "none"), "zeropp": ("int4", "int8"), "hybrid,dp=int4": ("int4", "int8"),
             "dp=int8,zero=fp8": ("int8", "fp8"), "int8(block=64)": ("int8(block=64)", "none"),
             "naive:fp16": ("fp16", "fp16"), "ef(topk(0.01))+int8": ("ef(topk(0.01))+int8", "none")}
    for text, (dp, zero) in cases.items():
        policy = as_policy(text)
        assert (policy.axis("dp").spec, policy.axis("zero").spec) == (dp, zero), text
    assert as_policy(policy) is policy
    for bad in ("", "int9", "zeropp,dp=int9"):
        with pytest.raises(InputError):
            as_policy(bad)
