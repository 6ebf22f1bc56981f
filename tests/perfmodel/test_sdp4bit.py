"""The ``sdp4bit`` preset (SDP4Bit, Jia et al. 2024): its specs and source, the two-level gradient
reduce-scatter (8 bits inside the node, 4 across), the weight-difference gather's error, the ZeRO
stages it runs under, its place in the search, and that other codecs price as before."""
import math

import pytest

from perfmodel import predict
from perfmodel.collectives.compressed import Msg, hierarchical_reduce_scatter, tiers
from perfmodel.collectives.predict import collective_time, resolve_context
from perfmodel.compression import compile_spec
from perfmodel.compression.policy import PRESET_SOURCES, PRESETS, parse_policy
from perfmodel.compression.quantizers import DEFAULT_WEIGHT_DELTA, sends_differences
from perfmodel.explore.search import DEFAULT_CANDIDATES, parse_candidates
from topologies import InputError, cluster_for

PLAN = dict(model="gpt3-6.7b", cluster="h800", gpus=128, tp=4, mbs=2, gbs=256)   # SDP4Bit's H800 6.7B plan


def test_the_preset_names_its_specs_source_and_zero_stages():
    policy = parse_policy("sdp4bit")
    assert policy.axis("dp").spec.startswith("tlq(") and policy.axis("zero").spec.startswith("qwd(")
    assert "2410.15526" in PRESET_SOURCES["sdp4bit"] and "sdp4bit" in PRESETS
    assert policy.recipe.zero_stages == (1, 2) and policy.recipe.state_bytes(8) == 0
    assert sends_differences(policy.axis("zero").codec) and not sends_differences(compile_spec("int4"))
    tlq = policy.axis("dp").codec.families[0]
    assert (tlq.intra, tlq.inter, tlq.block, tlq.hadamard) == (8, 4, 128, 32)   # the README's arguments
    assert policy.axis("zero").codec.families[0].block == 2048                   # --wq-group-size 2048


def test_the_catalog_lists_it(cli):
    out = cli("perfmodel", "catalog", "policies", check_rc=0).stdout
    assert "sdp4bit" in out and "qwd" in out


def _ctx(nodes: int):
    built, job = cluster_for("h800", nodes=nodes)
    return resolve_context(built, job, "packed", (), None)


def test_the_hierarchical_reduce_scatter_sends_8_bits_inside_and_4_across():
    ctx, size = _ctx(4), 1 << 28
    msgs = {s: Msg(size_bytes=size, dtype_bytes=4, codec=compile_spec(s)) for s in ("tlq", "int8(block=128)",
                                                                                  "int4(block=128)")}
    two, eight, four = (hierarchical_reduce_scatter(ctx, m) for m in msgs.values())
    inside = lambda c: c.rounds[0][0].nbytes  # noqa: E731
    across = lambda c: c.rounds[1][0].nbytes  # noqa: E731
    assert inside(two) == inside(eight) and across(two) == across(four) and across(four) < across(eight)
    assert two.hops == 2
    rec = collective_time("reduce_scatter", size, cluster="h800", nodes=4, compressor="tlq")
    assert rec.algorithm == "hierarchical"


def test_other_codecs_take_one_spec_for_both_tiers():
    m = Msg(size_bytes=1 << 20, dtype_bytes=4, codec=compile_spec("int8"))
    assert tiers(m) == (m, m)
    for spec in ("hadamard+int4", "ef(int4)"):   # a chain or a wrapper is not a two-level codec
        m = Msg(size_bytes=1 << 20, dtype_bytes=4, codec=compile_spec(spec))
        assert tiers(m)[0] is m


def test_the_weight_difference_error_is_the_difference_s_not_the_weights():
    qwd, int4 = compile_spec("qwd(bits=4,block=2048)"), compile_spec("int4(block=2048)")
    assert qwd.error == pytest.approx(int4.error * DEFAULT_WEIGHT_DELTA)
    assert compile_spec("qwd(delta=0.001)").error == pytest.approx(int4.error * 1e-3)
    assert qwd.wire_bytes(1 << 20, 2) == int4.wire_bytes(1 << 20, 2)   # same wire as a 4-bit gather
    assert qwd.error < 0.01 < int4.error                                # the zero axis's budget (axes.py)
    with pytest.raises(InputError):
        compile_spec("qwd(delta=2)")
    with pytest.raises(InputError):
        compile_spec("tlq(intra=6)")
    with pytest.raises(InputError):
        compile_spec("hadamard(block=24)")


def test_the_hadamard_is_fused_into_the_quantizer_by_default():
    fused, apart = compile_spec("hadamard+int8"), compile_spec("hadamard(fused=false)+int8")
    plain = compile_spec("int8")
    n = 1 << 20
    assert fused.apply(n, 4).compress_bytes == plain.apply(n, 4).compress_bytes
    assert apart.apply(n, 4).compress_bytes == plain.apply(n, 4).compress_bytes + 2 * 4 * n
    assert fused.wire_bytes(n, 4) == plain.wire_bytes(n, 4)


def test_predict_runs_it_under_zero_1_and_refuses_0_and_3():
    none = predict(**PLAN, zero=1)
    sdp = predict(**PLAN, zero=1, policy="sdp4bit")
    assert sdp.step_time_s < none.step_time_s
    assert sdp.memory_per_gpu_bytes == none.memory_per_gpu_bytes   # no state beyond the plan's weights
    assert sdp.error_estimate["zero"] < 0.01
    assert sdp.error_estimate["dp"] == pytest.approx(compile_spec("tlq").error * math.sqrt(2))
    for zero in (0, 3):
        with pytest.raises(InputError) as err:
            predict(**PLAN, zero=zero, policy="sdp4bit")
        assert err.value.field == "zero"


def test_the_cli_refuses_zero_3_in_one_line(cli):
    out = cli("perfmodel", "predict", "--model", "gpt3-1.3b", "--cluster", "h800", "--gpus", "16", "--zero", "3",
              "--policy", "sdp4bit", check_rc=2)
    assert len(out.stderr.strip().splitlines()) == 1 and "sdp4bit" in out.stderr


def test_the_search_tries_it_by_default():
    assert "sdp4bit" in parse_candidates(DEFAULT_CANDIDATES)["presets"]
