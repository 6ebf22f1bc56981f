import pytest

from perfmodel.workload import MODEL_KEYS, load_model, model_catalog
from topologies.errors import InputError

PUBLISHED = {"gpt3-175b": 175.0e9, "gpt-neox-20b": 20.6e9, "llama2-7b": 6.74e9, "llama3-8b": 8.03e9,
             "llama3-70b": 70.6e9, "llama3-405b": 405.9e9, "gpt2-small": 124e6}


@pytest.mark.parametrize("name, published", sorted(PUBLISHED.items()))
def test_parameter_counts_match_published_within_1_percent(name, published):
    assert load_model(name).params == pytest.approx(published, rel=0.01)


def test_catalog_has_every_model_of_the_issue():
    names = {"gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-large", "gpt3-1.3b", "gpt3-2.7b",
             "gpt3-6.7b", "gpt3-13b", "gpt3-175b", "gpt-neox-20b", "llama2-7b", "llama2-13b", "llama2-70b",
             "llama3-8b", "llama3-70b", "llama3-405b"}
    assert names <= set(model_catalog())


def test_llama_layer_params_by_hand():
    m = load_model("llama3-8b")
    h, kv, f = 4096, 1024, 14336
    assert m.layer_params() == 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h


def test_model_flops_convention():
    m = load_model("gpt3-175b")
    assert m.model_flops_per_token() == 6 * m.params + 12 * 96 * 12288 * 2048


def test_activation_bytes_follow_korthikanti_with_flash_attention():
    """Korthikanti's 34 sbh; the s x s scores are not kept (flash-style attention keeps an fp32
    log-sum-exp per head and token instead), so the bytes grow linearly with the sequence."""
    m = load_model("gpt3-175b")
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    assert m.activation_bytes_per_layer(b, s, t, False, "none") == pytest.approx(
        s * b * h * (10 + 24 / t) + 4 * a * s * b / t)
    assert m.activation_bytes_per_layer(b, 4 * s, t, False, "none") == pytest.approx(
        4 * m.activation_bytes_per_layer(b, s, t, False, "none"))
    assert m.activation_bytes_per_layer(b, s, t, True, "selective") == pytest.approx(s * b * h * 34 / t)
    assert m.activation_bytes_per_layer(b, s, t, True, "full") == pytest.approx(2 * s * b * h / t)


def _write(tmp_path, body):
    path = tmp_path / "m.toml"
    path.write_text(body)
    return str(path)


GOOD = """hidden_size = 512
num_layers = 4
num_heads = 8
num_kv_heads = 8
ffn_hidden_size = 2048
vocab_size = 1000
seq_len = 256
activation = "gelu"
norm = "layernorm"
tied_embeddings = true
"""


def test_user_model_file(tmp_path):
    m = load_model(_write(tmp_path, GOOD))
    assert m.name == "m" and m.num_layers == 4


@pytest.mark.parametrize("edit, field", [
    (lambda t: t + "dropout = 0.1\n", "model.dropout"),
    (lambda t: t.replace("vocab_size = 1000\n", ""), "model.vocab_size"),
    (lambda t: t.replace('"gelu"', '"relu"'), "model.activation"),
    (lambda t: t.replace("num_kv_heads = 8", "num_kv_heads = 3"), "model.num_kv_heads"),
    (lambda t: t.replace("num_layers = 4", "num_layers = 0"), "model.num_layers"),
    (lambda t: t.replace("tied_embeddings = true", "tied_embeddings = 1"), "model.tied_embeddings"),
])
def test_bad_model_files_name_the_field(tmp_path, edit, field):
    with pytest.raises(InputError) as err:
        load_model(_write(tmp_path, edit(GOOD)))
    assert err.value.field == field


def test_model_keys_are_exactly_the_issue_list():
    assert MODEL_KEYS == ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size",
                          "vocab_size", "seq_len", "activation", "norm", "tied_embeddings")


MOE_PUBLISHED = {"mixtral-8x7b": (46.7e9, 12.9e9, 0.01), "olmoe-1b-7b": (6.9e9, 1.3e9, 0.02),
                 # MLA modelled as MHA: the attention is 10% larger, so active parameters 4.5% above 37B
                 "deepseek-v3": (671e9, 37e9, 0.05)}


@pytest.mark.parametrize("name", sorted(MOE_PUBLISHED))
def test_moe_parameter_counts_match_published_totals_and_active(name):
    total, active, rel = MOE_PUBLISHED[name]
    m = load_model(name)
    assert m.params == pytest.approx(total, rel=0.01)
    assert m.active_params == pytest.approx(active, rel=rel)


def test_moe_layers_every_other_and_first_dense():
    v3 = load_model("deepseek-v3")
    assert v3.num_moe_layers == 58 and not v3.is_moe_layer(2) and v3.is_moe_layer(3)
    assert v3.moe_layers_in(0, 4) == 1 and v3.moe_layers_in(3, 10) == 10
    from dataclasses import replace
    other = replace(load_model("mixtral-8x7b"), moe_layer_freq=2)
    assert other.num_moe_layers == 16 and other.is_moe_layer(0) and not other.is_moe_layer(1)


def test_moe_flops_scale_with_top_k_and_params_with_experts():
    from dataclasses import replace
    m = load_model("mixtral-8x7b")
    more_k, more_e = replace(m, moe_top_k=4), replace(m, num_experts=16)
    expert = m.expert_params() * m.num_moe_layers
    assert more_k.active_params - m.active_params == 2 * expert and more_k.params == m.params
    assert more_e.params - m.params == pytest.approx(8 * expert, rel=1e-3) and more_e.active_params \
        == pytest.approx(m.active_params, rel=1e-4)        # only the router grows
    assert more_k.model_flops_per_token() - m.model_flops_per_token() == 6 * 2 * expert


def test_dense_models_have_no_moe_and_active_equals_total():
    m = load_model("llama3-8b")
    assert not m.is_moe and m.active_params == m.params and m.num_moe_layers == 0


@pytest.mark.parametrize("extra, field", [("num_experts = 0\nmoe_top_k = 1\nmoe_ffn_hidden_size = 64\n",
                                           "model.num_experts"),
                                          ("num_experts = 4\nmoe_top_k = 5\nmoe_ffn_hidden_size = 64\n",
                                           "model.moe_top_k"),
                                          ("num_experts = 4\nmoe_top_k = 2\nmoe_ffn_hidden_size = 64\n"
                                           "moe_load_imbalance = 0.5\n", "model.moe_load_imbalance"),
                                          ("num_experts = 4\nmoe_top_k = 2\nmoe_ffn_hidden_size = 64\n"
                                           "moe_capacity_factor = 0.5\n", "model.moe_capacity_factor"),
                                          ("num_experts = 4\nmoe_top_k = 2\nmoe_ffn_hidden_size = 64\n"
                                           "moe_pad_to_capacity = 1\n", "model.moe_pad_to_capacity"),
                                          ("num_experts = 4\nmoe_top_k = 2\n", "model.moe_ffn_hidden_size")])
def test_bad_moe_keys_name_the_field(tmp_path, extra, field):
    with pytest.raises(InputError) as err:
        load_model(_write(tmp_path, GOOD + extra))
    assert err.value.field == field


def test_a_user_moe_file_and_expert_load(tmp_path):
    m = load_model(_write(tmp_path, GOOD + "num_experts = 8\nmoe_top_k = 2\nmoe_ffn_hidden_size = 512\n"
                          "moe_load_imbalance = 1.5\nmoe_capacity_factor = 1.25\n"))
    assert m.is_moe and m.expert_load == 1.25 and m.expert_copies == 2


def test_padded_to_capacity_every_expert_computes_and_sends_its_capacity():
    """Padding (realrun's layer, Megatron-Core's --moe-pad-expert-input-to-capacity): the rows are
    the capacity's whatever the imbalance; unpadded, a row per token copy."""
    from dataclasses import replace

    m = replace(load_model("mixtral-8x7b"), moe_capacity_factor=1.25, moe_load_imbalance=1.1)
    padded = replace(m, moe_pad_to_capacity=True)
    assert m.dispatched_rows(512) == 1024 and m.expert_load == 1.1
    assert padded.dispatched_rows(512) == 8 * 160 and padded.expert_load == 1.25   # ceil(1.25 x 512 x 2 / 8)
    assert padded.dispatched_rows(7) == 8 * 3                                       # ceil(2.1875)
    dropless = replace(padded, moe_capacity_factor=0.0)
    assert dropless.dispatched_rows(512) == 8 * 512 and dropless.expert_load == 4.0  # every expert: all tokens
    wide = replace(padded, moe_capacity_factor=5.0)   # a capacity past all the tokens: every expert's tokens
    assert wide.dispatched_rows(512) == 8 * 512 and wide.expert_load == 4.0
    assert wide.expert_load == wide.dispatched_rows(512) / (512 * wide.moe_top_k)
    tiny = load_model("gpt-tiny-moe")
    assert tiny.moe_pad_to_capacity and tiny.dispatched_rows(512) == 1280
