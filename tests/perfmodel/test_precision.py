"""Precision as part of the plan: low-precision GEMMs at their own peak and efficiency, their
quantization as memory-bound work, their memory, the two MFUs, and the fp8 parameter gather."""
from dataclasses import replace

import pytest

from perfmodel import predict
from perfmodel.compression.policy import PRESET_SOURCES, parse_policy
from perfmodel.devices import device
from perfmodel.plan.memory import low_precision_params, memory_per_gpu, peak_memory
from perfmodel.plan.parallel import make_plan
from perfmodel.plan.precision import allowed_precisions, recipe, recipes
from perfmodel.report.text import catalog_report, step_report
from perfmodel.step.compute import stage_compute
from perfmodel.workload import load_model
from topologies.errors import InputError

H100, B200 = device("h100-sxm"), device("b200")
PLAN70 = dict(tp=4, pp=8, schedule="interleaved:5", mbs=1, gbs=128, sequence_parallel=True, zero=1)


def _llama70(precision, policy="none"):
    return predict("llama3-70b", "dgx-h100", gpus=64, precision=precision, policy=policy, **PLAN70)


def _stage(precision, dev=H100, name="llama3-70b", gpus=64, layers=10, first=True, last=False, **kw):
    model = load_model(name)
    plan = make_plan(model, gpus, precision=precision, **(kw or PLAN70))
    return stage_compute(model, plan, dev, layers, first, last)


def test_fp8_speeds_a_gemm_bound_model_on_h100_but_less_than_twofold():
    """The GEMMs run at the fp8 peak (twice bf16's) at fp8's lower measured efficiency; attention stays
    bf16 and the casts add memory-bound work, so the step gains well under 2x."""
    bf16, fp8 = _llama70("bf16"), _llama70("fp8-tensorwise")
    speedup = bf16.step_time_s / fp8.step_time_s
    assert 1.15 < speedup < 2.0
    assert fp8.compute_detail["gemm_s"] < 0.7 * bf16.compute_detail["gemm_s"]
    assert fp8.compute_detail["attention_s"] == pytest.approx(bf16.compute_detail["attention_s"])
    assert fp8.compute_detail["memory_bound_s"] > bf16.compute_detail["memory_bound_s"]


def test_the_flops_are_the_same_in_every_precision():
    flops = {p: _stage(p).hardware_flops for p in ("bf16", "fp8-delayed", "fp8-tensorwise", "fp8-blockwise")}
    assert len(set(flops.values())) == 1
    assert _llama70("fp8-delayed").model_tflops_per_gpu * _llama70("fp8-delayed").step_time_s == pytest.approx(
        _llama70("bf16").model_tflops_per_gpu * _llama70("bf16").step_time_s)


def test_mfu_is_against_bf16_and_mfu_precision_against_the_precisions_own_peak():
    bf16, fp8 = _llama70("bf16"), _llama70("fp8-delayed")
    assert bf16.mfu_precision == bf16.mfu
    assert fp8.mfu == pytest.approx(fp8.model_tflops_per_gpu * 1e12 / H100.peak("bf16"))
    assert fp8.mfu_precision == pytest.approx(fp8.mfu * H100.peak("bf16") / H100.peak("fp8"))
    text = step_report(fp8)
    assert "fp8-delayed (bf16 activations)" in text and "of bf16 peak" in text and "of fp8)" in text


def test_a_precision_the_gpu_lacks_is_refused_naming_what_it_allows():
    with pytest.raises(InputError) as err:
        predict("llama3-8b", "dgx-h100", gpus=8, zero=1, precision="nvfp4")
    assert err.value.field == "precision" and "fp8-tensorwise" in str(err.value) and "nvfp4" not in \
        str(err.value).split(":", 1)[1]
    with pytest.raises(InputError, match="precision"):
        predict("llama3-8b", "dgx-h100", gpus=8, zero=1, precision="mxfp8")      # MX needs Blackwell
    with pytest.raises(InputError, match="precision"):
        predict("gpt3-1.3b", "dgx-a100", gpus=8, precision="fp8-delayed")
    assert "nvfp4" in allowed_precisions(B200) and "mxfp8" in allowed_precisions(B200)
    r = predict("llama3-8b", "dgx-b200", gpus=8, zero=1, mbs=1, gbs=64, precision="nvfp4")
    assert r.mfu_precision == pytest.approx(r.mfu * B200.peak("bf16") / B200.peak("fp4"))


def test_mxfp8_writes_two_scaled_copies_and_quantizes_more_than_delayed_fp8():
    """MXFP8 writes a row-wise and a column-wise copy, each with an e8m0 scale per 32 elements; per-tensor
    FP8 on Blackwell writes one (any GEMM layout), on Hopper a transposed second one; current scaling
    reads its input once more for the amax."""
    mx, delayed, tensorwise = recipe("mxfp8"), recipe("fp8-delayed"), recipe("fp8-tensorwise")
    assert mx.quantize_bytes("activation", "blackwell") == pytest.approx(2 + 2 * (1 + 1 / 32))
    assert delayed.quantize_bytes("activation", "blackwell") == 3 and delayed.quantize_bytes("weight", "hopper") == 4
    assert tensorwise.quantize_bytes("gradient", "hopper") == 6
    written = {r.name: r.copies_on("blackwell") * r.stored_bytes("activation") for r in (mx, tensorwise)}
    assert written["mxfp8"] > 2 * written["fp8-tensorwise"]
    kw = dict(dev=B200, name="llama3-8b", gpus=8, layers=32, last=True, zero=1, mbs=1, gbs=64)
    assert _stage("mxfp8", **kw).memory_bound_s > _stage("fp8-delayed", **kw).memory_bound_s


def test_nvfp4_adds_the_hadamard_transform_and_amax_passes_of_the_wgrad_inputs():
    nv = recipe("nvfp4")
    assert nv.quantize_bytes("activation", "blackwell") == pytest.approx(8 + 2 * (0.5 + 1 / 16))
    assert nv.quantize_bytes("weight", "blackwell") == pytest.approx(4 + 2 * (0.5 + 1 / 16))
    assert nv.quantize_kernels("gradient") == 4 and nv.quantize_kernels("weight") == 2


def test_gemms_use_the_dtypes_own_table_and_peak():
    assert H100.efficiency(8192, 8192, 8192, "fp8") == pytest.approx(0.6519)
    assert H100.efficiency(8192, 8192, 8192) == H100.efficiency(8192, 8192, 8192, "bf16")
    ratio = H100.gemm_time_s(8192, 8192, 8192, "bf16") / H100.gemm_time_s(8192, 8192, 8192, "fp8")
    assert 1.6 < ratio < 2.0
    assert B200.peak_key("mxfp8") == "fp8" and B200.efficiency(4096, 4096, 4096, "mxfp8") == pytest.approx(
        0.876 * B200.efficiency(4096, 4096, 4096))


def test_fp8_weight_copies_cost_a_byte_per_parameter_each_and_the_saved_inputs_shrink():
    model = load_model("llama3-70b")
    plan = make_plan(model, 64, precision="fp8-delayed", **PLAN70)
    bf16 = make_plan(model, 64, **PLAN70)
    low = low_precision_params(model, plan, 10, True, False)
    hopper, blackwell = memory_per_gpu(model, plan, 0, 10, arch="hopper"), memory_per_gpu(model, plan, 0, 10,
                                                                                            arch="blackwell")
    plain = memory_per_gpu(model, bf16, 0, 10)
    assert hopper["low_precision_weights"] == pytest.approx(2 * low)        # the weight and its transpose
    assert blackwell["low_precision_weights"] == pytest.approx(low)
    assert hopper["weights"] == plain["weights"] and hopper["optimizer"] == plain["optimizer"]
    assert hopper["activations"] < plain["activations"]
    gathered = memory_per_gpu(model, plan, 0, 10, arch="hopper", fp8_params=True)
    assert hopper["weights"] - gathered["weights"] == pytest.approx(2 * low)  # the bf16 copy goes
    assert peak_memory(model, bf16)["low_precision_weights"] == 0


def test_fp8_param_gather_halves_the_gathers_and_costs_no_kernel_under_an_fp8_recipe():
    assert "fp8-param-gather" in PRESET_SOURCES and "fp8-param-gather" in catalog_report("policies")
    plain, fp8 = _llama70("fp8-tensorwise"), _llama70("fp8-tensorwise", "fp8-param-gather")
    bf16 = _llama70("bf16", "fp8-param-gather")
    zero = lambda r: sum(r.wire_bytes["zero"].values())   # noqa: E731
    assert zero(fp8) == pytest.approx(zero(plain) / 2, rel=1e-3)
    assert fp8.kernel_s.get("zero", {}).get("critical_s", 0.0) == 0.0
    assert sum(fp8.kernel_s.get("zero", {"": 0.0}).values()) == 0.0
    assert sum(bf16.kernel_s["zero"].values()) > 0                          # under bf16 the cast is a kernel
    assert fp8.policy_axes["zero"]["spec"] == "fp8(gemm=true)" and bf16.policy_axes["zero"]["spec"] == "fp8"
    assert fp8.error_estimate["zero"] == pytest.approx(2.0 ** -4 / 3 ** 0.5)
    assert fp8.memory_per_gpu_bytes < plain.memory_per_gpu_bytes
    assert parse_policy("fp8-param-gather").under(False).under(True).axes["zero"].codec.families[0].gemm


def test_layers_a_recipe_keeps_in_bf16_run_at_bf16(monkeypatch):
    kw = dict(dev=B200, name="llama3-8b", gpus=8, layers=32, last=True, zero=1, mbs=1, gbs=64)
    every = _stage("nvfp4", **kw)
    monkeypatch.setitem(recipes(), "nvfp4", replace(recipe("nvfp4"), bf16_layers_end=8))
    some = _stage("nvfp4", **kw)
    assert every.gemm_s < some.gemm_s < _stage("bf16", **kw).gemm_s
    assert recipe("nvfp4").high_layers(32, False, True) == 8 and recipe("nvfp4").high_layers(32, True, False) == 0


# stage_compute and peak_memory of bf16 plans, computed before precision entered the step (commit 9b2fb18):
# (model, gpu, plan, layers, first, last, moe layers) -> fwd_s, bwd_s, gemm_s, memory_bound_s, hardware_flops,
# host_fwd_s, host_bwd_s, peak memory bytes
BF16_BEFORE = [
    ("llama3-70b", "h100-sxm", 64, PLAN70, 10, True, False, 0,
     (0.060585287341638004, 0.12117057468327601, 0.14131553241523365, 0.012079595519999979, 121633473822720.0,
      0.002052, 0.003564, 84638400512.0)),
    ("gpt3-1.3b", "a100-sxm-80gb", 16, dict(tp=2, mbs=4, gbs=256), 24, True, True, 0,
     (0.077450870166863, 0.154901740333726, 0.14069039303688624, 0.039252523647204995, 37164133908480.0,
      0.0043064999999999996, 0.007965, 23639316480.0)),
    ("llama3-8b", "b200", 8, dict(zero=1, mbs=1, gbs=128, recompute="full"), 32, True, True, 0,
     (0.11516287576266072, 0.3386537871803699, 0.29439721429207766, 0.04929621832597013, 623955668893696.0,
      0.0048465, 0.014445, 68724619264.0)),
    ("mixtral-8x7b", "h100-sxm", 64, dict(tp=2, ep=8, pp=4, mbs=1, gbs=256, sequence_parallel=True, zero=1,
                                            recompute="selective"), 8, False, True, 8,
     # issue 39 changed the MoE layer's compute on purpose (the router's work on its sequence shard, its score
     # kernels, grouped GEMMs per expert: perfmodel.step.compute); memory unchanged
     (0.025365932296511382, 0.05439694407538146, 0.055539274139009775, 0.009563284303448287, 44769665351680.0,
      0.0024435, 0.004347, 33493532672.0)),
]


@pytest.mark.parametrize("name, gpu, gpus, kw, layers, first, last, moe, expected", BF16_BEFORE,
                         ids=[c[0] for c in BF16_BEFORE])
def test_bf16_predictions_are_unchanged(name, gpu, gpus, kw, layers, first, last, moe, expected):
    model = load_model(name)
    plan = make_plan(model, gpus, **kw)
    sc = stage_compute(model, plan, device(gpu), layers, first, last, moe)
    got = (sc.fwd_s, sc.bwd_s, sc.gemm_s, sc.memory_bound_s, sc.hardware_flops, sc.host_fwd_s, sc.host_bwd_s,
           peak_memory(model, plan)["total"])
    assert got == pytest.approx(expected, rel=1e-9)
