"""FP8 attention (Transformer Engine's fp8_dot_product_attention): the plan option, its price in
perfmodel.step.compute, the CLI flag, the Bridge rows that carry it."""
from __future__ import annotations

import json

import pytest

from perfmodel import predict
from perfmodel.calibration.published import row_plan
from perfmodel.cli import main
from perfmodel.devices import device
from perfmodel.plan.parallel import make_plan
from perfmodel.step import compute
from perfmodel.workload import load_model
from topologies.errors import InputError

PLAN = dict(ep=8, mbs=2, gbs=64, seq=4096, precision="mxfp8")


def _stage(fp8: bool) -> compute.StageCompute:
    model = load_model("qwen3-30b-a3b")
    plan = make_plan(model, 8, **PLAN, fp8_attention=fp8)
    return compute.stage_compute(model, plan, device("gb200"), model.num_layers, True, True)


def test_products_faster_by_the_published_ratio_plus_casts():
    bf16, fp8 = _stage(False), _stage(True)
    ratio = bf16.attention_s / fp8.attention_s
    assert 1.0 < ratio < compute.FP8_ATTENTION_SPEEDUP      # the casts cost something
    assert ratio > 0.9 * compute.FP8_ATTENTION_SPEEDUP       # ... but little next to the products at 4k tokens
    assert fp8.gemm_s == pytest.approx(bf16.gemm_s)
    assert fp8.hardware_flops == pytest.approx(bf16.hardware_flops)   # FLOPs are the same in every precision


def test_casts_count_grouped_query_kv_heads():
    model = load_model("qwen3-30b-a3b")
    plan = make_plan(model, 8, **PLAN, fp8_attention=True)
    dev = device("gb200")
    fwd, bwd = compute._fp8_attention_s(model, plan, dev, 0.0, 0.0)
    heads, kv = plan.mbs * model.num_heads, plan.mbs * model.num_kv_heads
    per = plan.local_seq * compute.FP8_CAST_BYTES / dev.stream_Bps
    assert fwd == pytest.approx(per * (heads * model.score_dim + kv * (model.score_dim + model.value_dim)))
    assert bwd == pytest.approx(per * heads * 2 * model.value_dim)


@pytest.mark.parametrize("kw, why", [(dict(precision="bf16"), "low-precision recipe"),
                                     (dict(kernels="eager"), "fused kernels")])
def test_refused_outside_a_low_precision_fused_plan(kw, why):
    model = load_model("qwen3-30b-a3b")
    with pytest.raises(InputError, match=why) as e:
        make_plan(model, 8, **{**PLAN, **kw}, fp8_attention=True)
    assert e.value.field == "fp8_attention"


def test_python_api_and_cli_agree(capsys):
    args = ["predict", "--model", "qwen3-30b-a3b", "--cluster", "gb200-nvl72", "--gpus", "8", "--ep", "8",
            "--mbs", "2", "--gbs", "64", "--seq", "4096", "--precision", "mxfp8", "--allow-oom", "--fp8-attention"]
    assert main(args + ["--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    rec = predict("qwen3-30b-a3b", "gb200-nvl72", gpus=8, **PLAN, fp8_attention=True, allow_oom=True)
    assert out["plan"]["fp8_attention"] is True
    assert out["step_time_s"] == pytest.approx(rec.step_time_s)
    plain = predict("qwen3-30b-a3b", "gb200-nvl72", gpus=8, **PLAN, allow_oom=True)
    assert rec.step_time_s < plain.step_time_s
    assert main(args) in (0, None)
    assert "fp8 attention" in capsys.readouterr().out


def test_cli_refusal_is_one_line(cli):
    bad = cli("perfmodel", "predict", "--model", "qwen3-30b-a3b", "--cluster", "gb200-nvl72", "--gpus", "8",
              "--ep", "8", "--fp8-attention")
    err = bad.stderr.strip()
    assert bad.returncode == 2 and "fp8_attention" in err and len(err.splitlines()) == 1


def test_published_rows_pass_it_on():
    row = dict(tp="1", pp="1", dp="8", cp="1", ep="8", mbs="4", gbs="512", seq_len="4096", recompute="none",
               zero="1", sequence_parallel="False", precision="mxfp8", fp8_attention="True")
    assert row_plan(row)["fp8_attention"] is True
    assert "fp8_attention" not in row_plan({**row, "fp8_attention": "False"})
