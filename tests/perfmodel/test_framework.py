"""Framework profiles (perfmodel.plan.framework, perfmodel.step.framework): megatron-core unchanged,
each stack's mechanisms, its overlap defaults under a user's explicit flag, its catalog constants."""
import pytest

from perfmodel import predict
from perfmodel.calibration import published as pub
from perfmodel.plan.parallel import make_plan
from perfmodel.workload import load_model
from perfmodel.plan.framework import (CONSTANT_FIELDS, FRAMEWORK_NAMES, framework_profile, framework_profiles)
from perfmodel.step.framework import prefetched
from topologies import InputError

# predict("gpt3-1.3b", "dgx-a100", **SMALL) before framework profiles existed (commit 9b2fb18), both engines
SMALL = dict(gpus=16, tp=2, pp=2, mbs=1, gbs=32)
STORED = {"analytical": 0.3618085658777455, "des": 0.36191247589712633}
ZERO3 = dict(gpus=16, dp=16, mbs=1, gbs=32, seq=4096, zero=3, recompute="full")   # llama2-7b: 2.4536678462444423 s
# small work per GPU: a 1.3B model, one 1024-token sequence per GPU, ZeRO-3 over 8 GPUs
TINY = dict(gpus=8, dp=8, mbs=1, gbs=8, seq=1024, zero=3)


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_megatron_core_reproduces_the_stored_prediction(engine):
    rec = predict("gpt3-1.3b", "dgx-a100", engine=engine, **SMALL)
    assert rec.step_time_s == STORED[engine]
    assert predict("gpt3-1.3b", "dgx-a100", engine=engine, framework="megatron-core", **SMALL) == rec
    assert predict("llama2-7b", "dgx-a100", **ZERO3).step_time_s == 2.4536678462444423


def test_megatron_core_is_neutral_and_nemo_computes_as_it_does():
    assert framework_profile("megatron-core").neutral
    base = predict("gpt3-1.3b", "dgx-a100", **SMALL)
    nemo = predict("gpt3-1.3b", "dgx-a100", framework="nemo", **SMALL)
    assert nemo.compute_detail == base.compute_detail


@pytest.mark.parametrize("stack", ["torchtitan", "deepspeed"])
def test_eager_stacks_are_slower_on_small_work_by_host_time_and_eager_passes(stack):
    base = predict("gpt3-1.3b", "dgx-a100", **TINY)
    other = predict("gpt3-1.3b", "dgx-a100", framework=stack, **TINY)
    assert other.step_time_s > base.step_time_s
    # the stack's extra kernels and hooks make the step host-bound where Megatron-Core's is not
    assert other.compute_detail["host_bound_s"] > base.compute_detail["host_bound_s"]
    # its unfused elementwise passes move more bytes
    assert other.compute_detail["memory_bound_s"] > base.compute_detail["memory_bound_s"]


def test_deepspeed_prefetch_bucket_exposes_part_of_a_large_layer_gather():
    """DeepSpeed gathers 5e7 parameters ahead: a 7B layer (202M) waits for the rest of its gather."""
    model = load_model("llama2-7b")
    plan = make_plan(model, 16, dp=16, zero=3, gbs=16)
    deepspeed = framework_profile("deepspeed")
    assert prefetched(deepspeed, model, plan) == pytest.approx(5e7 / model.layer_params())
    assert prefetched(deepspeed.with_values(zero3_prefetch_params=0.0), model, plan) == 1.0
    kw = dict(gpus=16, dp=16, mbs=1, gbs=16, seq=1024, zero=3)
    late = predict("llama2-7b", "dgx-a100", framework="deepspeed", **kw)   # exposed gathers: dp and zero share a phase
    assert late.breakdown["dp_comm_exposed_s"] > predict("llama2-7b", "dgx-a100", **kw).breakdown["dp_comm_exposed_s"]


def test_megatron_deepspeed_scores_in_memory_and_a_pause_per_microbatch():
    """No flash attention: the scores cross memory; and the pipeline engine's pause per microbatch."""
    one = predict("gpt3-1.3b", "dgx-a100", framework="megatron-deepspeed", **SMALL)
    base = predict("gpt3-1.3b", "dgx-a100", **SMALL)
    pause = framework_profile("megatron-deepspeed").microbatch_host_ms * 1e-3
    microbatches = one.plan["microbatches"]
    assert one.compute_detail["memory_bound_s"] > base.compute_detail["memory_bound_s"]
    assert one.compute_detail["host_bound_s"] >= microbatches * pause * (1 - 1e-9)


def test_a_profile_sets_the_overlaps_a_request_leaves_open():
    kw = dict(gpus=16, tp=8, sequence_parallel=True, mbs=1, gbs=16)
    assert predict("gpt3-1.3b", "dgx-h100", framework="nemo", tp_overlap=None, **kw).plan["tp_overlap"] is True
    assert predict("gpt3-1.3b", "dgx-h100", framework="megatron-core", tp_overlap=None, **kw).plan["tp_overlap"] \
        is False
    plain = dict(gpus=16, dp=16, mbs=1, gbs=16)
    assert predict("gpt3-1.3b", "dgx-a100", framework="megatron-deepspeed", dp_overlap=None,
                   **plain).plan["dp_overlap"] is False


def test_a_users_explicit_flag_wins_over_the_profiles_default():
    kw = dict(gpus=16, tp=8, sequence_parallel=True, mbs=1, gbs=16)
    assert predict("gpt3-1.3b", "dgx-h100", framework="nemo", tp_overlap=False, **kw).plan["tp_overlap"] is False
    plain = dict(gpus=16, dp=16, mbs=1, gbs=16)
    on = predict("gpt3-1.3b", "dgx-a100", framework="megatron-deepspeed", dp_overlap=True, **plain)
    off = predict("gpt3-1.3b", "dgx-a100", framework="megatron-deepspeed", dp_overlap=None, **plain)
    assert on.plan["dp_overlap"] is True and on.step_time_s < off.step_time_s


def test_an_unknown_framework_is_refused_in_one_line():
    with pytest.raises(InputError) as err:
        predict("gpt3-1.3b", "dgx-a100", framework="jax", **SMALL)
    assert err.value.field == "framework" and "\n" not in str(err.value)
    assert all(name in str(err.value) for name in FRAMEWORK_NAMES)


@pytest.mark.parametrize("stack", FRAMEWORK_NAMES)
def test_the_engines_agree_under_every_profile(stack):
    for kw in (SMALL, dict(gpus=16, dp=16, mbs=1, gbs=32, seq=2048, zero=3, recompute="full")):
        a = predict("gpt3-1.3b", "dgx-a100", framework=stack, **kw)
        d = predict("gpt3-1.3b", "dgx-a100", framework=stack, engine="des", **kw)
        assert d.step_time_s == pytest.approx(a.step_time_s, rel=2e-3)


def test_every_catalog_constant_has_a_source_and_lies_in_its_range():
    sources = pub.load_sources()
    for name, profile in framework_profiles().items():
        assert profile.description, name
        consts = dict(profile.constants)
        assert set(consts) == set(CONSTANT_FIELDS), name
        for field, const in consts.items():
            assert const.source, (name, field)
            if const.range is not None:
                assert const.range[0] <= const.value <= const.range[1], (name, field)
            if const.fitted_on:      # a fitted constant: its standard error and the suite's sources it was fitted on
                assert const.stderr is not None and const.stderr >= 0, (name, field)
                assert set(const.fitted_on) <= set(sources), (name, field)
                assert const.range is not None, (name, field)


def test_each_stacks_sources_stay_within_their_bounds():
    """The sources the profiles were fitted on, predicted as `perfmodel validate --published` does."""
    keys = {k for p in framework_profiles().values() for _, c in p.constants for k in c.fitted_on}
    reports = [r for name in sorted(keys) for r in pub.validate_published(name)]
    assert reports and not pub.check_bounds(reports, pub.load_bounds())
