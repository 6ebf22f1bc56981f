"""Attention kinds (issue 39): heads as wide as the model says, sliding windows, multi-head latent
attention (its parameters, FLOPs, kept activations and tensor-parallel split as Megatron-Core builds
it), DeepSeek-V3's multi-token prediction, the catalog models that use them against their published
sizes, and the Megatron-Bridge MoE rows they let the model predict."""
from dataclasses import replace

import pytest

from perfmodel import predict
from perfmodel.plan.parallel import make_plan
from perfmodel.step.compute import (COLUMN, DUPLICATED, ROW, attention_flops, attention_gemms, attention_kinds,
                                    layer_gemms, quantized_elements, stage_compute)
from perfmodel.devices import device
from perfmodel.workload import ModelSpec, load_model
from topologies.errors import InputError

# (total, active, which active count the publisher gives, tolerance): each publisher's own convention,
# "all" (every parameter a token meets, embeddings in and out) or "no-input-embedding" (the input
# embedding, a lookup, left out), from the model card or report cited in perfmodel/catalog/models.toml
PUBLISHED = {
    "deepseek-v3": (671e9, 37e9, "all", 0.02),             # DeepSeek-V3 report, Table 1 (MTP module left out)
    "deepseek-v2": (236e9, 21e9, "all", 0.02),             # DeepSeek-V2 report, section 3.1.2
    "deepseek-v2-lite": (15.7e9, 2.4e9, "no-input-embedding", 0.025),   # "2.4B": one decimal (2.35-2.45)
    "kimi-k2": (1.04e12, 32.6e9, "all", 0.02),             # Kimi K2 report (arXiv 2507.20534)
    "qwen3-30b-a3b": (30.5e9, 3.3e9, "all", 0.02),         # Qwen3 report, Table 2
    "qwen3-235b-a22b": (235e9, 22e9, "all", 0.02),
    "gpt-oss-120b": (116.83e9, 5.13e9, "no-input-embedding", 0.02),   # gpt-oss model card, Table 1
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_models_match_their_published_total_and_active_parameters(name):
    total, active, convention, rel = PUBLISHED[name]
    m = load_model(name)
    counted = m.active_params - (m.embedding_params() if convention == "no-input-embedding" else 0)
    assert m.params == pytest.approx(total, rel=rel) and counted == pytest.approx(active, rel=rel)


def test_mla_parameters_by_hand():
    """DeepSeek-V3's MLA (config.json): q 7168 -> 1536 -> 128 x 192, kv 7168 -> 512 + 64 -> 128 x (128 + 128),
    output 128 x 128 -> 7168, the two latent norms: 187.1M a layer. V2-Lite has no query latent."""
    v3 = load_model("deepseek-v3")
    h, n = 7168, 128
    query = h * 1536 + 1536 + 1536 * n * 192
    kv = h * (512 + 64) + 512 + 512 * n * (128 + 128)
    assert v3.attention_params() == query + kv + n * 128 * h == 187_107_328
    lite = load_model("deepseek-v2-lite")
    assert lite.attention_params() == 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048
    assert (v3.score_dim, v3.value_dim, v3.q_width, v3.out_width) == (192, 128, n * 192, n * 128)


def test_head_dim_sets_the_projections_apart_from_the_hidden_size():
    """Qwen3-30B-A3B: 32 query heads and 4 kv heads of 128 beside a 2048 hidden."""
    q = load_model("qwen3-30b-a3b")
    assert (q.head_dim, q.q_width, q.kv_dim) == (128, 4096, 512)
    assert q.attention_params() == 2048 * (4096 + 2 * 512) + 4096 * 2048
    plan = make_plan(q, 8, tp=2, mbs=1, gbs=8, seq=4096)
    T = 4096
    assert layer_gemms(q, plan)[:2] == [(T, (4096 + 1024) / 2, 2048), (T, 2048, 4096 / 2)]
    assert q.model_flops_per_token(4096) == 6 * q.active_params + 3 * 48 * 2 * 4096 * 32 * (128 + 128)


def test_a_head_dim_equal_to_the_default_changes_nothing():
    base = load_model("llama3-8b")
    same = replace(base, head_dim=4096 // 32)
    assert (same.params, same.model_flops_per_token(), same.activation_bytes_per_layer(1, 8192, 8, True, "none")) \
        == (base.params, base.model_flops_per_token(), base.activation_bytes_per_layer(1, 8192, 8, True, "none"))
    kw = dict(gpus=16, tp=2, pp=2, gbs=64, precision="fp8-tensorwise")
    assert predict(same, "dgx-h100", **kw).step_time_s == predict("llama3-8b", "dgx-h100", **kw).step_time_s


def test_multi_head_attention_keeps_korthikantis_counts():
    """34 sbh with the softmax statistics, whether the shape comes from the defaults or not."""
    m = load_model("gpt3-175b")
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    assert m.attention_kept_bytes() == (3 * h, 8 * h)
    assert m.activation_bytes_per_layer(b, s, t, False, "none") == pytest.approx(
        s * b * h * (10 + 24 / t) + 4 * a * s * b / t)


def test_mla_tensor_parallel_split_as_megatron_core():
    """Down projections duplicated (whole weight, the rank's sequence shard under sequence parallelism,
    every token without); up projections column-parallel; output row-parallel."""
    v3 = load_model("deepseek-v3")
    sp = make_plan(v3, 16, tp=4, ep=4, mbs=1, gbs=16, seq=4096, sequence_parallel=True)
    T = 4096
    assert attention_kinds(v3) == (DUPLICATED, COLUMN, DUPLICATED, COLUMN, ROW)
    assert attention_gemms(v3, sp) == [(T / 4, 1536, 7168), (T, 128 * 192 / 4, 1536), (T / 4, 512 + 64, 7168),
                                       (T, 128 * 256 / 4, 512), (T, 7168, 128 * 128 / 4)]
    no_sp = make_plan(v3, 16, tp=4, ep=4, mbs=1, gbs=16, seq=4096, sequence_parallel=False)
    assert attention_gemms(v3, no_sp)[0] == (T, 1536, 7168)
    lite = load_model("deepseek-v2-lite")
    assert attention_kinds(lite) == (COLUMN, DUPLICATED, COLUMN, ROW)
    # a MoE layer runs every one of them: a wider kv latent costs its down and up projections' FLOPs
    dev, wider = device("h100-sxm"), replace(v3, kv_lora_rank=1024)
    moe = [stage_compute(m, no_sp, dev, 1, False, False, 1).hardware_flops for m in (v3, wider)]
    # three passes of the down projection on every token (no sequence parallelism) and the up projection's tp share
    assert moe[1] - moe[0] == pytest.approx(3 * 2 * T * (512 * 7168 + 512 * 128 * 256 / 4))
    # the projections' FLOPs over the tp ranks (a duplicated GEMM counted on each rank's shard) are 2 T params
    one = make_plan(v3, 16, tp=1, ep=16, mbs=1, gbs=16, seq=4096)
    norms = 1536 + 512
    assert sum(2 * m * n * k for m, n, k in attention_gemms(v3, one)) == 2 * T * (v3.attention_params() - norms)


def test_mla_quantizes_duplicated_gemms_on_their_shard():
    v3 = load_model("deepseek-v3")
    plan = make_plan(v3, 16, tp=4, ep=4, mbs=1, gbs=16, seq=4096, sequence_parallel=True, precision="mxfp8")
    q = quantized_elements(v3, plan, moe=True)
    T = 4096
    assert q["activation"][:5] == [T / 4 * 7168, T / 4 * 1536, T / 4 * 7168, T / 4 * 512, T * 128 * 128 / 4]
    assert q["gradient"][:5] == [T / 4 * 1536, T * 128 * 192 / 4, T / 4 * 576, T * 128 * 256 / 4, T / 4 * 7168]


def test_mla_scores_over_qk_and_values_over_v():
    v3 = load_model("deepseek-v3")
    plan = make_plan(v3, 8, ep=8, mbs=1, gbs=8, seq=4096)
    assert attention_flops(v3, plan) == 128 * 2.0 * 4096 * 4096 * (192 + 128)
    mha = replace(v3, attention="gqa", head_dim=0, q_lora_rank=0, kv_lora_rank=0, qk_nope_head_dim=0,
                  qk_rope_head_dim=0, v_head_dim=0)
    assert mha.head_dim == 56 and attention_flops(mha, plan) == 128 * 2.0 * 4096 * 4096 * 112


def test_mla_keeps_its_latents_and_wide_heads():
    v3 = load_model("deepseek-v3")
    whole, split = v3.attention_kept_bytes()
    assert whole == 3 * 7168 + 4 * (1536 + 512) + 2 * 64 and split == 2 * (2 * 128 * 192 + 2 * 128 * 128)
    s, b, h = 4096, 1, 7168
    assert v3.activation_bytes_per_layer(b, s, 2, True, "selective") == pytest.approx(
        s * b * ((7 * h + whole) / 2 + (16 * h + split) / 2))


def test_sliding_windows_alternate_as_megatron_core_and_shrink_the_scores():
    """GPT-OSS: window 128 on 1-based odd layers (window_attn_skip_freq 2), full on even ones."""
    g = load_model("gpt-oss-120b")
    assert [g.is_window_layer(i) for i in range(4)] == [True, False, True, False] and g.window_layers == 18
    assert g.score_keys(4096) == (18 * 4096 + 18 * 128) / 36 and g.score_keys(64) == 64
    full = replace(g, sliding_window=0, window_attn_skip_freq=0)
    flops = 3 * 2.0 * 64 * (64 + 64) * 18 * (4096 - 128)          # three passes over the keys the windows save
    assert full.model_flops_per_token(4096) - g.model_flops_per_token(4096) == pytest.approx(flops)
    plan = make_plan(g, 8, ep=8, mbs=1, gbs=8, seq=4096)
    dev = device("h100-sxm")
    windowed, whole = (stage_compute(m, plan, dev, 36, True, True, 36) for m in (g, full))
    assert windowed.attention_s < 0.6 * whole.attention_s and windowed.hardware_flops < whole.hardware_flops
    every = replace(g, window_attn_skip_freq=0)
    assert every.window_layers == 36 and every.score_keys(4096) == 128


def test_mtp_adds_one_last_layer_its_projection_and_norms_on_the_last_stage():
    v3, mtp = load_model("deepseek-v3"), load_model("deepseek-v3:mtp_layers=1")
    h = 7168
    assert mtp.mtp_moe_layers == 1 and mtp.name == "deepseek-v3:mtp_layers=1"
    assert mtp.params - v3.params == v3.moe_dense_params() + v3.moe_routed_params() + 2 * h * h + 3 * h
    assert mtp.active_params - v3.active_params == v3.moe_dense_params() + 8 * v3.expert_params() + 2 * h * h + 3 * h
    assert mtp.stage_layer_params(0, 57) == v3.stage_layer_params(0, 57)       # only where the layers end the model
    last, last_v3 = mtp.stage_layer_params(57, 4), v3.stage_layer_params(57, 4)
    assert last[1] - last_v3[1] == v3.moe_routed_params()
    extra = 3 * (2.0 * 4096 * 128 * (192 + 128) + 2.0 * 129280 * h)            # its scores and LM head pass
    assert mtp.model_flops_per_token(4096) - v3.model_flops_per_token(4096) == pytest.approx(
        6 * (mtp.active_params - v3.active_params) + extra)


def test_mtp_costs_the_last_stage_only():
    v3, mtp = load_model("deepseek-v3"), load_model("deepseek-v3:mtp_layers=1")
    plan = make_plan(v3, 64, pp=4, ep=16, mbs=1, gbs=64, seq=4096)
    dev = device("h100-sxm")
    first = [stage_compute(m, plan, dev, 16, True, False, 13) for m in (v3, mtp)]
    assert first[0] == first[1]
    base, more = (stage_compute(m, plan, dev, 13, False, True, 13) for m in (v3, mtp))
    layer = stage_compute(v3, plan, dev, 1, False, False, 1)
    assert more.fwd_s - base.fwd_s > layer.fwd_s and more.hardware_flops - base.hardware_flops > layer.hardware_flops
    assert more.gemm_s > base.gemm_s
    kept = mtp.mtp_activation_bytes(1, 4096, 1, False, "none")
    assert kept > v3.moe_activation_bytes_per_layer(1, 4096, 1, False, "none") and v3.mtp_activation_bytes(
        1, 4096, 1, False, "none") == 0


@pytest.mark.parametrize("keys, field", [
    (dict(attention="mha"), "model.attention"),
    (dict(kv_lora_rank=512), "model.kv_lora_rank"),
    (dict(attention="mla", qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128), "model.kv_lora_rank"),
    (dict(attention="mla", kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
          head_dim=64), "model.head_dim"),
    (dict(attention="mla", num_kv_heads=4, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
          v_head_dim=128), "model.num_kv_heads"),
    (dict(window_attn_skip_freq=2), "model.window_attn_skip_freq"),
    (dict(sliding_window=-1), "model.sliding_window"),
    (dict(head_dim=0), "model.head_dim"),
    (dict(mtp_layers=1.5), "model.mtp_layers"),
    (dict(num_heads=12), "model.num_heads"),
])
def test_inconsistent_attention_keys_are_one_line_naming_the_key(tmp_path, keys, field):
    body = dict(hidden_size=1024, num_layers=4, num_heads=16, num_kv_heads=16, ffn_hidden_size=4096, vocab_size=32000,
                seq_len=2048, activation='"swiglu"', norm='"rmsnorm"', tied_embeddings="false")
    for key, value in keys.items():
        body[key] = f'"{value}"' if isinstance(value, str) else value
    if "num_kv_heads" in keys:
        body["num_kv_heads"] = keys["num_kv_heads"]
    path = tmp_path / "m.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in body.items()))
    with pytest.raises(InputError) as err:
        load_model(str(path))
    assert err.value.field == field and "\n" not in str(err.value)


def test_a_head_dim_lets_heads_not_divide_the_hidden_size(tmp_path):
    path = tmp_path / "oss.toml"
    path.write_text("hidden_size = 2880\nnum_layers = 2\nnum_heads = 64\nnum_kv_heads = 8\nhead_dim = 64\n"
                    "ffn_hidden_size = 2880\nvocab_size = 1000\nseq_len = 256\nactivation = \"swiglu\"\n"
                    "norm = \"rmsnorm\"\ntied_embeddings = false\n")
    assert load_model(str(path)).q_width == 4096


@pytest.mark.parametrize("name, field", [
    ("deepseek-v3:mtp_layers", "model"), ("deepseek-v3:mtp_layers=x", "model.mtp_layers"),
    ("deepseek-v3:mtp_layers=1,mtp_layers=2", "model"), ("deepseek-v3:head_dim=64", "model.head_dim"),
    ("deepseek-v3:colour=1", "model.colour"), ("nosuch:mtp_layers=1", "model")])
def test_model_names_with_changed_keys_are_checked_as_files(name, field):
    with pytest.raises(InputError) as err:
        load_model(name)
    assert err.value.field == field and "\n" not in str(err.value)


def test_the_cli_takes_attention_kinds_and_refuses_bad_ones_in_one_line(cli):
    ok = cli("perfmodel", "predict", "--model", "kimi-k2", "--cluster", "gb300-nvl72", "--gpus", "256", "--pp", "4",
             "--ep", "64", "--gbs", "4096", "--precision", "mxfp8", "--allow-oom")
    assert ok.returncode == 0 and "kimi-k2 on gb300-nvl72" in ok.stdout, ok.stderr
    bad = cli("perfmodel", "predict", "--model", "qwen3-30b-a3b:kv_lora_rank=512", "--cluster", "dgx-h100",
              "--gpus", "8")
    err = bad.stderr.strip()
    assert bad.returncode == 2 and "model.kv_lora_rank" in err and len(err.splitlines()) == 1


def test_the_python_api_takes_a_model_spec_of_either_kind():
    mla = ModelSpec(name="mla-2b", hidden_size=2048, num_layers=8, num_heads=16, num_kv_heads=16, ffn_hidden_size=8192,
                    vocab_size=32000, seq_len=4096, activation="swiglu", norm="rmsnorm", tied_embeddings=False,
                    attention="mla", kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    gqa = replace(mla, name="gqa-2b", attention="gqa", kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=0,
                  v_head_dim=0, head_dim=128, num_kv_heads=4)
    kw = dict(gpus=8, tp=2, gbs=64)
    a, b = predict(mla, "dgx-h100", **kw), predict(gqa, "dgx-h100", **kw)
    assert a.model == "mla-2b" and b.model == "gqa-2b" and a.step_time_s != b.step_time_s
    with pytest.raises(InputError) as err:
        predict(replace(mla, num_kv_heads=4), "dgx-h100", **kw)
    assert err.value.field == "model.num_kv_heads"


def test_the_bridge_moe_rows_of_the_new_models_are_predicted():
    """Qwen3, GPT-OSS and Kimi-K2 mapped (none skipped as unmodelled), DeepSeek-V3 with its MTP module but
    the '(w/o MTP)' rows, '(tokendrop)' padded to capacity 1."""
    import csv

    from perfmodel.calibration.bridge import bridge_rows
    from perfmodel.calibration.published import PUBLISHED_DIR

    with open(PUBLISHED_DIR / "megatron_bridge_training_throughput.csv") as f:
        rows = bridge_rows(list(csv.DictReader(f)))
    named = {r["model_label"].split(" Pre")[0]: r for r in rows}
    for name in ("Qwen3_30B_a3B", "Qwen3_235B_a22B", "GPT OSS 120B", "Kimi_K2", "DeepSeekV3 (w/ MTP)"):
        assert not named[name]["skip"], name
        load_model(named[name]["model"])
    assert named["DeepSeekV3"]["model"].endswith("mtp_layers=1") and named["DeepSeekV3 (w/o MTP)"]["model"] \
        == "deepseek-v3"
    drop = load_model(named["Qwen3_30B_a3B (tokendrop)"]["model"])
    assert drop.moe_pad_to_capacity and drop.moe_capacity_factor == 1.0
    assert not named["Nemotron_3_Nano"]["skip"] and load_model(named["Nemotron_3_Nano"]["model"]).is_hybrid
    assert "sparse attention" in named["DeepSeekV4 Flash"]["skip"]
