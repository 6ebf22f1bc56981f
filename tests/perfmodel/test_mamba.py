"""Hybrid Mamba-2 / attention / MoE models (issue 39): the layer pattern, the Mamba-2 mixer's cost, LatentMoE,
the Nemotron 3 catalog models."""
from dataclasses import replace

import pytest

from perfmodel import predict
from perfmodel.devices import device
from perfmodel.plan.memory import memory_per_gpu, stage_params
from perfmodel.plan.parallel import make_plan
from perfmodel.plan.precision import recipe
from perfmodel.step import compute, mamba
from perfmodel.workload import HYBRID_SYMBOLS, ModelSpec, load_model
from topologies.errors import InputError

NANO = "nemotron-3-nano"
# (total, active without the input embedding, tolerance): the model card's or report's counts, cited in
# perfmodel/catalog/models.toml (Nano: 31.6B total, 3.2B active; Super 120B / 12B; Ultra 550B / 55B)
PUBLISHED = {"nemotron-3-nano": (31.6e9, 3.2e9), "nemotron-3-super": (120e9, 12e9), "nemotron-3-ultra": (550e9, 55e9)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_nemotron_3_totals_and_active_parameters_match_the_published_within_2_percent(name):
    total, active = PUBLISHED[name]
    m = load_model(name)
    assert m.params == pytest.approx(total, rel=0.02)
    assert m.active_params - m.embedding_params() == pytest.approx(active, rel=0.02)


def test_the_catalog_patterns_have_the_published_layer_counts():
    """Nano 23 Mamba, 23 MoE, 6 attention layers; Super 40, 40, 8 (its config.json); Ultra 48, 48, 12."""
    counts = {n: load_model(n).kinds_in(0, load_model(n).num_layers) for n in PUBLISHED}
    assert counts["nemotron-3-nano"] == {"M": 23, "*": 6, "-": 0, "E": 23}
    assert counts["nemotron-3-super"] == {"M": 40, "*": 8, "-": 0, "E": 40}
    assert counts["nemotron-3-ultra"] == {"M": 48, "*": 12, "-": 0, "E": 48}
    nano = load_model(NANO)
    assert nano.num_moe_layers == 23 and nano.attention_layers == 6 and nano.mamba_layers == 23
    assert [i for i in range(52) if nano.is_moe_layer(i)][:3] == [1, 3, 6]


def test_a_mamba_layer_has_megatrons_parameters_by_hand():
    """Nemotron 3 Nano's mixer (MambaMixer.__init__): 64 heads of 64 (d_inner 4096), 8 groups of d_state 128:
    in_proj 2688 -> 2 x 4096 + 2 x 8 x 128 + 64, conv1d over 4096 + 2048 channels of 4 taps with a bias, A_log,
    D and dt_bias per head, the gated norm over 4096, out_proj 4096 -> 2688, the fused pre-norm."""
    m = load_model(NANO)
    h = 2688
    assert mamba.in_proj_width(m) == 10304 and mamba.conv_channels(m) == 6144 and mamba.inner(m) == 4096
    assert mamba.layer_params(m) == h + h * 10304 + 6144 * 5 + 3 * 64 + 4096 + 4096 * h
    assert m.hybrid_layer_params("M") == mamba.layer_params(m)


def test_hybrid_layers_are_one_mixer_each():
    """An attention layer is a dense layer without its MLP and one norm; a MoE layer its router, shared experts
    and norm; the model's parameters are the sum over its pattern."""
    m = load_model(NANO)
    h = m.hidden_size
    assert m.hybrid_layer_params("*") == m.attention_params() + h
    assert m.hybrid_layer_params("E") == h + h * 128 + 2 * m.shared_expert_params()
    kinds = m.kinds_in(0, 52)
    layers = sum(n * m.hybrid_layer_params(k) for k, n in kinds.items()) + 23 * m.moe_routed_params()
    assert m.params == layers + 2 * m.embedding_params() + h


def test_stages_sum_to_the_model():
    """A stage's parameters and its MoE layers are exact over its slice of the pattern; the stages add up."""
    m = load_model(NANO)
    for start, count in ((0, 26), (26, 26), (0, 13), (13, 39)):
        assert m.moe_layers_in(start, count) == m.hybrid_layer_pattern[start:start + count].count("E")
    halves = [m.stage_layer_params(0, 26), m.stage_layer_params(26, 26)]
    assert tuple(map(sum, zip(*halves))) == m.stage_layer_params(0, 52)


def test_the_ssd_scan_flops_by_hand_and_in_the_model_flops():
    """Per token and layer, forward: 2 Q N per group (C B^T) and per head 2 Q P + 4 N P (the masked product
    with X, the chunk states, their outputs); the model FLOPs add three passes of it per Mamba layer."""
    m = load_model(NANO)
    q, n, p = 128, 128, 64
    assert mamba.ssd_flops_per_token(m) == 2 * q * n * 8 + 64 * (2 * q * p + 4 * n * p)
    s = 8192
    attention = 6 * m.attention_flops_per_token(s)
    scan = 23 * mamba.ssd_flops_per_token(m)
    assert m.model_flops_per_token(s) == pytest.approx(6 * m.active_params + 3 * (attention + scan))


def test_the_scan_is_priced_as_batched_gemms_never_faster_than_its_traffic():
    m, dev = load_model(NANO), device("gb300")
    plan = make_plan(m, 8, ep=8, etp=1, mbs=4, gbs=512, seq=8192, precision="mxfp8")
    fwd, bwd, flops = mamba.ssd_s(m, plan, dev)
    products = sum(dev.table_gemm_time_s(a, b, c, "bf16") for a, b, c in mamba.ssd_products(m, plan))
    traffic = mamba.ssd_traffic_bytes(m, plan) / (dev.stream_Bps * mamba.SSD_BANDWIDTH_FRACTION)
    assert fwd == max(products, traffic) and bwd == 3 * fwd
    tokens, states = 4 * 8192, 4 * 8192 / 128 * 64 * 64 * 128       # x B C dt y, the chunk states, C B^T
    assert mamba.ssd_traffic_bytes(m, plan) == 2 * tokens * (6144 + 64 + 4096) + 12 * states + 8 * tokens * 128 * 8
    assert flops == 4 * 8192 * mamba.ssd_flops_per_token(m)
    # the products' FLOPs are the counted ones
    assert sum(2 * a * b * c for a, b, c in mamba.ssd_products(m, plan)) == pytest.approx(flops)


def test_tp_splits_the_mixer_as_megatron_and_must_divide_its_heads_and_groups():
    m = load_model(NANO)
    plan = make_plan(m, 8, tp=2, ep=4, etp=1, gbs=64, sequence_parallel=True)
    (t, n_in, k_in), (_, n_out, k_out) = mamba.gemms(m, plan)
    assert (n_in, k_in, n_out, k_out) == (10304 / 2, 2688, 2688, 4096 / 2)
    with pytest.raises(InputError) as err:
        mamba.check_tp(replace(m, mamba_num_groups=2, name="g2"), 4)
    assert err.value.field == "tp" and "mamba_num_groups" in str(err.value)


def test_a_stage_sums_its_layers_by_symbol():
    """One stage of the whole model is its E layers' and its share of M and * layers' times; two stages add
    up to it (the ends apart)."""
    m, dev = load_model(NANO), device("gb200")
    plan = make_plan(m, 8, ep=8, etp=1, mbs=2, gbs=64, seq=8192, precision="mxfp8")
    rec = recipe("mxfp8")
    whole = compute.stage_compute(m, plan, dev, 52, True, True, 23)
    low = 52 - rec.high_layers(52, True, True)
    flops = 0.0
    for symbol, n in m.kinds_in(0, 52).items():
        if n:
            for count, r in ((n * low / 52, rec), (n * (52 - low) / 52, recipe("bf16"))):
                flops += count * compute._hybrid_layer(m, plan, dev, r, symbol).flops
    end = compute._ends(m, plan, dev, True, True)[1]
    assert whole.hardware_flops == pytest.approx(3 * (flops + end))
    plan2 = make_plan(m, 8, pp=2, ep=4, etp=1, mbs=2, gbs=64, seq=8192)
    a = compute.stage_compute(m, plan2, dev, 26, True, False, m.moe_layers_in(0, 26))
    b = compute.stage_compute(m, plan2, dev, 26, False, True, m.moe_layers_in(26, 26))
    one = compute.stage_compute(m, plan2, dev, 52, True, True, 23)
    assert a.hardware_flops + b.hardware_flops == pytest.approx(one.hardware_flops)


def test_selective_recompute_reruns_only_the_attention_layers():
    m, dev = load_model(NANO), device("h100-sxm")
    kw = dict(ep=8, etp=1, mbs=1, gbs=64, seq=8192)
    none = compute.stage_compute(m, make_plan(m, 8, **kw), dev, 52, True, True, 23)
    sel = compute.stage_compute(m, make_plan(m, 8, recompute="selective", **kw), dev, 52, True, True, 23)
    attn = compute._layer(m, make_plan(m, 8, **kw), dev, recipe("bf16"), "*")
    assert sel.recompute_s == pytest.approx(6 * attn.attention_fwd)
    assert sel.hardware_flops - none.hardware_flops == pytest.approx(6 * attn.attention_flops)


def test_activation_memory_sums_the_pattern():
    m = load_model(NANO)
    plan = make_plan(m, 8, ep=8, etp=1, mbs=1, gbs=64, seq=8192)
    args = (1, 8192, 1, False, "none")
    per = {k: m.hybrid_activation_bytes(k, *args) for k in HYBRID_SYMBOLS}
    mem = memory_per_gpu(m, plan, 0, 52)
    assert mem["activations"] == pytest.approx(23 * per["M"] + 6 * per["*"] + 23 * per["E"])
    whole, split = mamba.kept_bytes(m)
    assert per["M"] == 8192 * (whole + split)
    full = m.hybrid_activation_bytes("M", 1, 8192, 1, False, "full")
    assert full == 2 * 8192 * 2688 and full == m.hybrid_activation_bytes("E", 1, 8192, 1, False, "full")
    routed = 23 * m.moe_routed_params()
    assert stage_params(m, plan, 52, True, True) == pytest.approx(m.params - routed + routed / 8)


def test_named_recompute_modules_drop_from_the_layers_that_have_them():
    """moe_act drops the E layers' experts' activation inputs, layernorm each layer's one norm input, core_attn the
    attention layers' softmax statistics (perfmodel.plan.recompute.dropped_bytes, on layers of one mixer)."""
    m = load_model(NANO)
    kw = dict(ep=8, etp=1, mbs=1, gbs=64, seq=8192)
    none = memory_per_gpu(m, make_plan(m, 8, **kw), 0, 52)["activations"]
    act = memory_per_gpu(m, make_plan(m, 8, recompute="selective", recompute_modules="moe_act", **kw), 0, 52)
    norm = memory_per_gpu(m, make_plan(m, 8, recompute="selective", recompute_modules="layernorm", **kw), 0, 52)
    attn = memory_per_gpu(m, make_plan(m, 8, recompute="selective", **kw), 0, 52)
    assert none - act["activations"] == pytest.approx(23 * 8192 * m.expert_copies * 1856 * 2)
    assert none - norm["activations"] == pytest.approx(52 * 8192 * 2688 * 2)
    assert none - attn["activations"] == pytest.approx(6 * 4 * 32 * 8192)


def test_latent_moe_experts_run_on_the_latent_width():
    """Super (--moe-latent-size 1024): experts 1024 -> 2688 -> 1024, the projections 4096 <-> 1024 duplicated,
    the shared experts on the full width; the routed GEMMs take latent-wide rows."""
    m = load_model("nemotron-3-super")
    assert m.expert_params() == 2 * 1024 * 2688 and m.shared_expert_params() == 2 * 4096 * 2688
    assert m.latent_params() == 2 * 4096 * 1024
    plan = make_plan(m, 64, ep=64, etp=1, mbs=1, gbs=512, seq=8192)
    shapes = compute.moe_gemms(m, plan)
    assert [s[1:3] for s in shapes[-2:]] == [(2688, 1024), (1024, 2688)]
    assert [s[1:3] for s in shapes[3:5]] == [(1024, 4096), (4096, 1024)]
    assert compute.moe_dense_kinds(m) == compute.MLP_KINDS + (compute.DUPLICATED, compute.DUPLICATED)


def test_lightning_is_nano_with_one_repeated_mtp_module():
    """Two MTP depths running one module's weights (mtp_use_repeated_layer): the parameters hold one attention +
    MoE module, the FLOPs run it twice."""
    nano, light = load_model(NANO), load_model("nemotron-3.5-lightning")
    module = sum(light._mtp_module_params())
    assert module == light.moe_dense_params() + light.moe_routed_params() + 2 * 2688 * 2688 + 3 * 2688
    assert light.mtp_copies == 1 and light.params - nano.params == module
    two = replace(light, mtp_use_repeated_layer=False, name="two")
    assert two.params - light.params == module
    assert two.model_flops_per_token(8192) == pytest.approx(light.model_flops_per_token(8192))


@pytest.mark.parametrize("text, field", [
    ("nemotron-3-nano:hybrid_layer_pattern=\"MEM\"", "model.hybrid_layer_pattern"),
    ("nemotron-3-nano:hybrid_layer_pattern=\"" + "MG" * 26 + "\"", "model.hybrid_layer_pattern"),
    ("nemotron-3-nano:mamba_num_groups=3", "model.mamba_num_groups"),
    ("nemotron-3-nano:mamba_state_dim=0", "model.mamba_state_dim"),
    ("nemotron-3-nano:moe_layer_freq=2", "model.moe_layer_freq"),
    ("nemotron-3-nano:sliding_window=128", "model.sliding_window"),
    ("nemotron-3-nano:moe_latent_size=99999", "model.moe_latent_size"),
    ("nemotron-3-nano:mtp_use_repeated_layer=1", "model.mtp_use_repeated_layer"),
    ("llama3-8b:mamba_state_dim=64", "model.mamba_state_dim"),
    ("llama3-8b:hybrid_layer_pattern=\"" + "M*" * 15 + "\"", "model.hybrid_layer_pattern"),
    ("nemotron-3-nano:activation=\"relu3\"", "model.activation")])
def test_bad_hybrid_keys_are_refused_in_one_line(text, field):
    with pytest.raises(InputError) as err:
        load_model(text)
    assert err.value.field == field and "\n" not in str(err.value)


def test_changed_keys_and_the_python_api_take_hybrid_models():
    small = load_model("nemotron-3-nano:mamba_state_dim=64")
    assert small.mamba_state_dim == 64 and small.params < load_model(NANO).params
    dense = ModelSpec(name="hybrid-2b", hidden_size=2048, num_layers=8, num_heads=16, num_kv_heads=4,
                      ffn_hidden_size=8192, vocab_size=32000, seq_len=4096, activation="relu2", norm="rmsnorm",
                      tied_embeddings=False, hybrid_layer_pattern="M-M*M-M-")
    assert load_model(dense).mamba_layers == 4 and load_model(dense).attention_layers == 1
    assert dense.params == sum(dense.hybrid_layer_params(k) for k in dense.hybrid_layer_pattern) \
        + 2 * dense.embedding_params() + 2048
    step = predict(dense, "dgx-h100", gpus=8, tp=2, gbs=64, sequence_parallel=True)
    assert step.step_time_s > 0 and step.model == "hybrid-2b"


def test_the_cli_predicts_a_nemotron_row_and_refuses_a_tp_the_mixer_cannot_split(cli):
    ok = cli("perfmodel", "predict", "--model", "nemotron-3-super:mtp_layers=2,mtp_use_repeated_layer=true",
             "--cluster", "gb300-nvl72", "--gpus", "64", "--ep", "64", "--etp", "1", "--gbs", "512", "--seq", "8192",
             "--precision", "mxfp8", "--framework", "nemo", "--zero", "1", "--grad-dtype", "bf16")
    assert ok.returncode == 0 and "nemotron-3-super" in ok.stdout, ok.stderr
    bad = cli("perfmodel", "predict", "--model", "nemotron-3-nano:mamba_num_groups=1", "--cluster", "dgx-h100",
              "--gpus", "8", "--tp", "2", "--ep", "4", "--etp", "1", "--gbs", "64", "--sequence-parallel",
              "--allow-oom")
    err = bad.stderr.strip()
    assert bad.returncode == 2 and len(err.splitlines()) == 1 and "mamba_num_groups" in err, err


def test_the_scan_reaches_its_measured_bandwidth_on_the_measured_shape():
    """vLLM #27299's H100 shape (128 heads of 64, one group, d_state 128): the forward's tokens/s comes out at
    the measurement's median (1.18e7), the traffic bound divided by SSD_BANDWIDTH_FRACTION."""
    from dataclasses import replace
    m = replace(load_model(NANO), mamba_num_heads=128, mamba_head_dim=64, mamba_num_groups=1, mamba_state_dim=128)
    plan = make_plan(m, 1, mbs=1, gbs=1, seq=4096)
    fwd, _, _ = mamba.ssd_s(m, plan, device("h100-sxm"))
    assert 4096 / fwd == pytest.approx(1.18e7, rel=0.02)
