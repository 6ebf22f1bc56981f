"""perfmodel --from hf:config.json and perfmodel import: a Hugging Face config as a model file."""
import json

import pytest

from perfmodel.cli import main
from perfmodel.importers import load, predict
from perfmodel.importers.hf import from_config
from perfmodel.workload import load_model
from topologies import InputError

DATA = "tests/perfmodel/data/importers"


@pytest.mark.parametrize("name,catalog", [
    ("llama-3.1-8b", "llama3-8b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"), ("deepseek-v3", "deepseek-v3:mtp_layers=1"),
    ("gpt-oss-120b", "gpt-oss-120b"), ("mixtral-8x7b", "mixtral-8x7b"), ("deepseek-v2-lite", "deepseek-v2-lite"),
    ("llama-2-7b", "llama2-7b"), ("llama-7b-v1", "llama2-7b:seq_len=2048")])
def test_imported_configs_count_the_catalogs_parameters(name, catalog):
    model, plan, lines = load(f"hf:{DATA}/{name}.json")
    assert plan == {}
    assert abs(model.params / load_model(catalog).params - 1) < 0.005
    assert abs(model.active_params / load_model(catalog).active_params - 1) < 0.005
    assert all(line.startswith("hf: ") for line in lines)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-2-7b", "llama-7b-v1", "qwen3-30b-a3b", "deepseek-v3",
                                  "deepseek-v2-lite", "gpt-oss-120b", "mixtral-8x7b"])
def test_every_key_has_its_line(name):
    with open(f"{DATA}/{name}.json") as handle:
        cfg = json.load(handle)
    imported = from_config(cfg)
    assert not imported.refused
    for key in cfg:
        assert any(line.startswith(f"hf: {key} ") for line in imported.lines), key


def test_deepseek_v3_lines():
    with open(f"{DATA}/deepseek-v3.json") as handle:
        imported = from_config(json.load(handle))
    assert "hf: initializer_range 0.02 ignored (initialisation: no effect on the step time)" in imported.lines
    assert imported.model["attention"] == "mla" and imported.model["mtp_layers"] == 1
    assert imported.model["seq_len"] == 4096          # rope_scaling.original_max_position_embeddings


def test_windows_and_rope_scaling():
    oss, _, lines = load(f"hf:{DATA}/gpt-oss-120b.json")
    assert (oss.sliding_window, oss.window_attn_skip_freq, oss.num_experts, oss.moe_top_k) == (128, 2, 128, 4)
    llama, _, lines = load(f"hf:{DATA}/llama-3.1-8b.json")
    assert llama.seq_len == 8192
    assert any(line.startswith("hf: rope_scaling llama3 ignored") for line in lines)
    mistral = from_config({"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                           "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096})
    assert mistral.model["sliding_window"] == 4096 and "window_attn_skip_freq" not in mistral.model


@pytest.mark.parametrize("cfg,fragment", [
    ({"model_type": "bloom"}, "model_type bloom: one of llama"),
    ({"model_type": "llama", "hidden_act": "gelu"}, "hidden_act gelu"),
    ({"model_type": "llama", "cross_attention_layers": [1]}, "cross_attention_layers"),
    ({"model_type": "qwen3_moe", "decoder_sparse_step": 2}, "decoder_sparse_step 2"),
    ({"model_type": "qwen3_moe", "mlp_only_layers": [5]}, "mlp_only_layers"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window"),
    ({"model_type": "gpt_oss", "sliding_window": 128, "layer_types": ["full_attention", "sliding_attention"]},
     "layer_types")])
def test_unsupported_keys_are_refused(cfg, fragment):
    with pytest.raises(InputError) as err:
        from_config(cfg).check("config.json")
    assert any(fragment in line for line in err.value.refused), err.value.refused


def test_python_predict_of_an_imported_config():
    r = predict(f"hf:{DATA}/llama-3.1-8b.json", "dgx-h100", gpus=16, tp=2, gbs=32, seq=4096, zero=1)
    same = predict(f"hf:{DATA}/llama-3.1-8b.json", "dgx-h100", model="llama3-8b", gpus=16, tp=2, gbs=32, seq=4096,
                   zero=1)
    assert r.step_time_s == pytest.approx(same.step_time_s)


def test_cli_predict_from_hf_prints_the_mapping(capsys):
    assert main(["predict", "--from", f"hf:{DATA}/qwen3-30b-a3b.json", "--cluster", "dgx-h100", "--gpus", "16",
                 "--ep", "8", "--gbs", "64", "--seq", "4096", "--allow-oom"]) == 0
    out, err = capsys.readouterr()
    assert "hf: num_experts 128 -> num_experts 128" in err
    assert out.startswith("qwen3-30b-a3b on dgx-h100")


def test_cli_refusal_is_one_line_and_exit_2(tmp_path, cli):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "t5"}))
    done = cli("perfmodel", "predict", "--from", f"hf:{bad}", "--cluster", "dgx-h100", "--gpus", "8", check_rc=2)
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("perfmodel: error: hf:") and "Traceback" not in done.stderr
    assert "perfmodel: hf: cannot honour model_type t5: one of llama" in done.stderr


def test_import_writes_a_model_toml(tmp_path, capsys):
    out = tmp_path / "v3.toml"
    assert main(["import", f"hf:{DATA}/deepseek-v3.json", "--toml", str(out)]) == 0
    assert load_model(str(out)).params == load_model("deepseek-v3:mtp_layers=1").params
    assert "written to" in capsys.readouterr().out
    assert main(["import", f"hf:{DATA}/mixtral-8x7b.json", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["model"]["num_experts"] == 8 and shown["imported"][0].startswith("hf: model_type mixtral")


def test_transformers_v5_rope_parameters_give_the_pretraining_context():
    with open(f"{DATA}/llama-3.1-8b.json") as handle:
        cfg = json.load(handle)
    cfg["rope_parameters"] = {**cfg.pop("rope_scaling"), "rope_theta": cfg.pop("rope_theta")}
    imported = from_config(cfg).check("config.json")
    assert imported.model["seq_len"] == 8192


@pytest.mark.parametrize("key", ["hidden_size", "head_dim", "qk_nope_head_dim", "layer_types", "moe_layer_freq",
                                 "mlp_only_layers", "rope_scaling", "num_key_value_heads"])
@pytest.mark.parametrize("value", ["x", 0, -1, None, [1], {"a": 1}, 1.5, 10**30])
def test_hostile_values_give_one_line_errors(key, value):
    from perfmodel.importers import merge
    from perfmodel.importers.common import build_model

    with open(f"{DATA}/deepseek-v3.json") as handle:
        cfg = json.load(handle)
    cfg[key] = value
    try:
        build_model(merge([from_config(cfg).check("config.json")]).model, "x", "config.json")
    except InputError as err:
        assert "\n" not in str(err)
