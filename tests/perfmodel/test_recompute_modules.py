"""Selective recompute of named modules (Megatron-Core's --recompute-modules): names and refusals,
the bytes each module stops keeping, what each reruns, the CLI and the Python API."""
from __future__ import annotations

import json

import pytest

from perfmodel import predict
from perfmodel.devices import device
from perfmodel.plan import recompute as plan_recompute
from perfmodel.plan.parallel import make_plan
from perfmodel.plan.routing import loaded
from perfmodel.step import compute
from perfmodel.step import recompute as step_recompute
from perfmodel.workload import load_model
from topologies.errors import InputError

DSV3 = dict(pp=16, ep=64, gbs=15360, zero=1, precision="fp8-blockwise")


def _plan(name: str, gpus: int, **kw):
    model = load_model(name)
    return model, make_plan(model, gpus, **kw)


def test_names_in_megatrons_order_and_refusals():
    assert plan_recompute.parse("mla_up_proj, layernorm") == ("layernorm", "mla_up_proj")
    with pytest.raises(InputError, match="name moe") as e:
        plan_recompute.parse("shared_experts")
    assert e.value.field == "recompute_modules"
    with pytest.raises(InputError, match="Megatron-Core's names"):
        plan_recompute.parse("layernorms")
    with pytest.raises(InputError, match="only with recompute selective"):
        _plan("llama3-8b", 8, recompute="full", recompute_modules="layernorm")
    with pytest.raises(InputError, match="Megatron-Core stack"):
        _plan("llama3-8b", 8, recompute="selective", recompute_modules="layernorm", framework="torchtitan")


def test_selective_alone_is_core_attn_and_unchanged():
    _, plain = _plan("llama3-8b", 8, recompute="selective")
    model, named = _plan("llama3-8b", 8, recompute="selective", recompute_modules="core_attn")
    assert plain.recompute_modules == named.recompute_modules == ("core_attn",)
    dev = device("h100-sxm")
    a = compute.stage_compute(model, plain, dev, model.num_layers, True, True)
    b = compute.stage_compute(model, named, dev, model.num_layers, True, True)
    assert a == b
    kept = model.activation_bytes_per_layer(plain.mbs, plain.local_seq, 1, False, "selective")
    none = model.activation_bytes_per_layer(plain.mbs, plain.local_seq, 1, False, "none")
    assert plan_recompute.dropped_bytes(model, plain, False) == pytest.approx(none - kept)


def test_layernorm_drops_the_two_norm_outputs_and_reruns_the_norms():
    model, plan = _plan("llama3-8b", 8, tp=2, sequence_parallel=True, recompute="selective",
                        recompute_modules="layernorm")
    tokens = plan.mbs * plan.local_seq
    assert plan_recompute.dropped_bytes(model, plan, False) == pytest.approx(2 * 2 * tokens * model.hidden_size / 2)
    dev = device("h100-sxm")
    r = step_recompute.rerun(model, plan, dev, False)
    norms = 2 * 2 * tokens * model.hidden_size / 2 * 2 / dev.stream_Bps      # read and write h, bf16, seq-split
    assert r.seconds == pytest.approx(norms + 2 * compute.kernel_fixed_s(dev))
    assert r.kernels == 2 and r.flops == 0


def test_mla_up_proj_applies_to_mla_only_and_reruns_its_gemms():
    dsv3, plan = _plan("deepseek-v3", 2048, **DSV3, recompute="selective", recompute_modules="mla_up_proj")
    dev = device("h100-sxm")
    r = step_recompute.rerun(dsv3, plan, dev, True)
    T = plan.mbs * plan.local_seq
    flops = 2 * T * (dsv3.q_width * dsv3.q_lora_rank
                     + dsv3.num_heads * (dsv3.qk_nope_head_dim + dsv3.v_head_dim) * dsv3.kv_lora_rank)
    assert r.flops == pytest.approx(flops) and r.gemm_s > 0 and r.kernels == 3
    assert plan_recompute.dropped_bytes(dsv3, plan, True) == pytest.approx(
        T * 2 * (2 * dsv3.q_width + dsv3.out_width))
    llama, lp = _plan("llama3-8b", 8, recompute="selective", recompute_modules="mla_up_proj")
    assert plan_recompute.dropped_bytes(llama, lp, False) == 0
    assert step_recompute.rerun(llama, lp, dev, False).seconds == 0


def test_moe_act_on_moe_layers_at_the_busiest_ranks_rows():
    model, plan = _plan("qwen3-30b-a3b", 8, ep=8, mbs=2, gbs=64, seq=4096, recompute="selective",
                        recompute_modules="moe_act")
    busy = loaded(model, plan)
    T = plan.mbs * plan.local_seq
    assert plan_recompute.dropped_bytes(busy, plan, True) == pytest.approx(
        T * busy.expert_copies * busy.expert_load * busy.moe_ffn_hidden_size * 2)
    assert plan_recompute.dropped_bytes(busy, plan, False) == 0        # a dense layer has no experts
    dev = device("h100-sxm")
    layers, moe = model.num_layers, model.moe_layers_in(0, model.num_layers)
    base = compute.stage_compute(model, make_plan(model, 8, ep=8, mbs=2, gbs=64, seq=4096), dev, layers, True, True,
                                 moe)
    with_act = compute.stage_compute(model, plan, dev, layers, True, True, moe)
    rerun = step_recompute.rerun(busy, plan, dev, True).seconds * moe
    assert with_act.bwd_s - base.bwd_s == pytest.approx(rerun)
    assert with_act.recompute_s == pytest.approx(rerun)
    assert with_act.fwd_s == pytest.approx(base.fwd_s)


def test_modules_trade_memory_for_time_in_a_prediction():
    base = predict("deepseek-v3", "h800", gpus=2048, **DSV3, recompute="selective", allow_oom=True)
    named = predict("deepseek-v3", "h800", gpus=2048, **DSV3, recompute="selective",
                    recompute_modules=("core_attn", "layernorm", "mla_up_proj"), allow_oom=True)
    assert named.memory_per_gpu_bytes < base.memory_per_gpu_bytes
    assert named.step_time_s > base.step_time_s


def test_cli_flag_and_its_refusal(cli):
    args = ("perfmodel", "predict", "--model", "deepseek-v3", "--cluster", "h800", "--gpus", "2048", "--pp", "16",
            "--ep", "64", "--gbs", "15360", "--zero", "1", "--precision", "fp8-blockwise", "--allow-oom",
            "--recompute", "selective")
    ok = cli(*args, "--recompute-modules", "layernorm,mla_up_proj", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["plan"]["recompute_modules"] == ["layernorm", "mla_up_proj"]
    bad = cli(*args, "--recompute-modules", "shared_experts")
    err = bad.stderr.strip()
    assert bad.returncode == 2 and "recompute_modules" in err and len(err.splitlines()) == 1


def test_moe_reruns_the_layers_mlp_and_its_all_to_alls():
    model, plan = _plan("qwen3-30b-a3b", 8, ep=8, mbs=2, gbs=64, seq=4096, recompute="selective",
                        recompute_modules="moe,moe_act")
    assert plan.recompute_modules == ("moe_act", "moe")
    assert plan_recompute.reruns_experts(plan) and not plan_recompute.reruns_attention(plan)
    busy = loaded(model, plan)
    tokens = plan.mbs * plan.local_seq
    assert plan_recompute.dropped_bytes(busy, plan, True) == pytest.approx(tokens * busy.expert_copies * (
        busy.expert_width * 2 + busy.expert_load * 2 * (busy.expert_up_width + busy.moe_ffn_hidden_size)))
    dev = device("h100-sxm")
    layers, moe = model.num_layers, model.moe_layers_in(0, model.num_layers)
    base = compute.stage_compute(model, make_plan(model, 8, ep=8, mbs=2, gbs=64, seq=4096), dev, layers, True, True,
                                 moe)
    again = compute.stage_compute(model, plan, dev, layers, True, True, moe)
    assert again.recompute_s == pytest.approx(base.moe_split[2])          # the MoE MLPs' forward, once more
    assert again.hardware_flops == pytest.approx(base.hardware_flops + base.moe_split[6])
    plain = predict("qwen3-30b-a3b", "dgx-h100", gpus=8, ep=8, mbs=2, gbs=64, seq=4096, recompute="selective",
                    allow_oom=True)
    rerun = predict("qwen3-30b-a3b", "dgx-h100", gpus=8, ep=8, mbs=2, gbs=64, seq=4096, recompute="selective",
                    recompute_modules="moe", allow_oom=True)
    assert rerun.breakdown["ep_comm_s"] == pytest.approx(plain.breakdown["ep_comm_s"] * 3 / 2, rel=1e-6)
