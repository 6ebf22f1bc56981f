"""perfmodel --from torchtitan:job.toml and --from nemo:config.yaml: torchtitan's job config, a Megatron-Bridge
run_config.yaml and a NeMo 1 YAML as a model and a plan."""
import builtins

import pytest

from perfmodel.cli import main
from perfmodel.importers import load
from perfmodel.importers.nemo import from_config as nemo_config
from perfmodel.importers.torchtitan import from_config as titan_config
from topologies import InputError

DATA = "tests/perfmodel/data/importers"
# torchtitan's own torchtitan/models/llama3/train_configs/llama3_8b.toml @ v0.2.0, its step-time keys
TITAN_8B = {"model": {"name": "llama3", "flavor": "8B", "hf_assets_path": "./assets/hf/Llama-3.1-8B"},
            "optimizer": {"name": "AdamW", "lr": 3e-4}, "training": {"local_batch_size": 1, "seq_len": 8192,
                                                                    "steps": 1000, "dataset": "c4"},
            "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                            "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "context_parallel_degree": 1},
            "compile": {"enable": False, "components": ["model", "loss"]},
            "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"},
            "quantize": {"linear": {"float8": {"enable_fsdp_float8_all_gather": False, "filter_fqns": ["output"]}}}}


def test_torchtitan_job_config_maps_model_and_plan():
    model, plan, lines = load(f"torchtitan:{DATA}/torchtitan_pp.toml")
    assert model.name == "llama3-70b" and (model.num_layers, model.hidden_size, model.num_kv_heads) == (80, 8192, 8)
    assert plan == {"seq": 8192, "compute_dtype": "bf16", "grad_dtype": "fp32", "tp": 8, "pp": 4, "cp": 1, "ep": 1,
                    "sequence_parallel": True, "zero": 2, "dp": 4, "mbs": 1, "gbs": 256, "schedule": "interleaved:2",
                    "recompute": "full", "precision": "fp8-tensorwise", "framework": "torchtitan",
                    "policy_items": ["fp8-param-gather"]}
    assert "torchtitan: parallelism.tensor_parallel_degree 8 -> tp 8" in lines
    assert "torchtitan: optimizer.lr 0.00015 ignored (the optimizer's and learning rate's settings: no effect on " \
           "the step time)" in lines


def test_torchtitan_defaults_and_fsdp():
    out = titan_config(TITAN_8B)
    assert not out.refused and out.name == "llama3-8b"
    assert out.plan["zero"] == 3 and "dp" not in out.plan and out.plan["recompute"] == "selective"
    assert out.plan["mbs"] == 1 and "gbs" not in out.plan and "precision" not in out.plan
    assert "torchtitan: training.mixed_precision_param bfloat16 (torchtitan's default) -> compute_dtype bf16" in out.lines
    ddp = titan_config({**TITAN_8B, "parallelism": {"data_parallel_replicate_degree": 8,
                                                    "data_parallel_shard_degree": 1}})
    assert (ddp.plan["zero"], ddp.plan["dp"], ddp.plan["gbs"]) == (0, 8, 8)
    never = titan_config({**TITAN_8B, "parallelism": {"fsdp_reshard_after_forward": "never"}})
    assert never.plan["zero"] == 2
    inert = titan_config({**TITAN_8B, "quantize": {"grouped_mm": {"float8": {"fqns": ["experts"]}}}})
    assert not inert.refused     # a converter's section without the converter


@pytest.mark.parametrize("change, refused", [
    ({"parallelism": {"data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 4}},
     "parallelism.data_parallel_replicate_degree 2"),
    ({"activation_checkpoint": {"mode": "selective", "selective_ac_option": "3"}}, "selective_ac_option 3"),
    ({"activation_checkpoint": {"mode": "memory_budget"}}, "activation_checkpoint.mode memory_budget"),
    ({"model": {"name": "llama3", "flavor": "8B", "converters": ["float8"]},
      "float8": {"recipe_name": "rowwise"}}, "float8.recipe_name rowwise"),
    ({"training": {"enable_cpu_offload": True}}, "training.enable_cpu_offload"),
    ({"parallelism": {"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "ZBVZeroBubble"}},
     "pipeline_parallel_schedule ZBVZeroBubble"),
    ({"parallelism": {"tensor_parallel_degree": "two"}}, "tensor_parallel_degree two"),
    ({"nonsense": {"key": 1}}, "nonsense.key 1"),
    ({"model": {"name": "llama3", "flavor": "8B", "converters": ["quantize.grouped_mm.float8"]},
      "quantize": {"grouped_mm": {"float8": {"fqns": ["experts"]}}}}, "quantize.grouped_mm.float8"),
])
def test_torchtitan_refusals(change, refused):
    out = titan_config({**TITAN_8B, **change})
    assert any(refused in r for r in out.refused), out.refused


def test_torchtitan_flavor_not_in_the_catalog_takes_the_model_from_hf(tmp_path):
    job = tmp_path / "llama4.toml"
    job.write_text('[model]\nname = "llama4"\nflavor = "17bx16e"\n[training]\nseq_len = 4096\n'
                   '[activation_checkpoint]\nmode = "none"\n')
    model, plan, lines = load(f"torchtitan:{job}")
    assert model is None and plan["seq"] == 4096
    assert any("llama4 17bx16e gives no model keys" in line and "llama3 8B, llama3 70B, llama3 405B" in line
               for line in lines)
    model, plan, _ = load([f"hf:{DATA}/llama-3.1-8b.json", f"torchtitan:{job}"])
    assert model.num_layers == 32 and plan["framework"] == "torchtitan"


def test_torchtitan_default_recompute_is_refused_naming_it():
    out = titan_config({"model": {"name": "llama3", "flavor": "8B"}})
    assert out.refused == ["activation_checkpoint.selective_ac_option 2 (torchtitan's default): op or 1 (every N-th "
                           "layer recomputed is not modelled): set [activation_checkpoint] mode and selective_ac_option"]


def test_torchtitan_bad_toml(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(InputError, match="valid TOML"):
        load(f"torchtitan:{bad}")


def test_bridge_run_config_maps_through_megatron():
    model, plan, lines = load(f"nemo:{DATA}/bridge_run_config.yaml")
    assert (model.num_layers, model.hidden_size, model.num_kv_heads, model.ffn_hidden_size) == (32, 4096, 8, 14336)
    assert (model.vocab_size, model.activation, model.norm, model.tied_embeddings) == (128256, "swiglu", "rmsnorm",
                                                                                         False)
    assert plan == {"seq": 8192, "tp": 2, "pp": 1, "cp": 2, "ep": 1, "sequence_parallel": True, "mbs": 1, "gbs": 128,
                    "compute_dtype": "bf16", "grad_dtype": "bf16", "zero": 1, "dp_overlap": True,
                    "precision": "fp8-tensorwise", "bucket_bytes": 80000000, "framework": "nemo"}
    assert "nemo: model.tensor_model_parallel_size 2 -> tp 2" in lines
    assert "nemo: mixed_precision bf16_with_fp8_current_scaling_mixed -> --bf16 --fp8-format hybrid --fp8-recipe " \
           "tensorwise" in lines
    assert "nemo: model.recompute_granularity null ignored (off or unset)" in lines
    assert "nemo: optimizer.lr 0.0003 ignored (the optimizer's and learning rate's settings: no effect on the step " \
           "time)" in lines


def test_nemo1_config():
    model, plan, lines = load(f"nemo:{DATA}/nemo1_gpt.yaml")
    assert (model.num_layers, model.seq_len, model.vocab_size, model.activation, model.norm) == (24, 2048, 50432,
                                                                                                 "gelu", "layernorm")
    assert plan["gpus"] == 32 and plan["schedule"] == "interleaved:3" and plan["recompute"] == "selective"
    assert (plan["zero"], plan["dp_overlap"], plan["compute_dtype"]) == (1, True, "bf16")
    assert "framework" not in plan and not any(line.startswith("nemo: trainer.devices 8 ignored") for line in lines)


@pytest.mark.parametrize("cfg, refused", [
    ({"model": {"num_layers": 2, "cpu_offloading": True}}, "model.cpu_offloading true"),
    ({"model": {"some_new_field": 3}}, "some_new_field 3"),
    ({"mixed_precision": "bf16_with_fp9"}, "mixed_precision bf16_with_fp9"),
    ({"peft": {"_target_": "LoRA"}}, "peft"),
    ({"surprise": {"a": 1}}, "surprise.a 1"),
    ({"model": {"recompute_granularity": "full", "recompute_method": "block"}}, "model.recompute_method block"),
])
def test_nemo_refusals(cfg, refused):
    out = nemo_config(cfg)
    assert any(refused in r for r in out.refused), out.refused


def test_nemo_without_pyyaml(monkeypatch):
    real = builtins.__import__

    def no_yaml(name, *args, **kwargs):
        if name == "yaml":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_yaml)
    with pytest.raises(InputError, match="PyYAML"):
        load(f"nemo:{DATA}/nemo1_gpt.yaml")


def test_cli_predicts_both(capsys):
    assert main(["predict", "--from", f"torchtitan:{DATA}/torchtitan_pp.toml", "--cluster", "dgx-h100", "--gpus",
                 "128", "--json"]) == 0
    out, err = capsys.readouterr()
    assert '"framework": "torchtitan"' in out and "perfmodel: torchtitan: parallelism.pipeline_parallel_degree 4 " \
                                                  "-> pp 4" in err
    assert main(["predict", "--from", f"nemo:{DATA}/bridge_run_config.yaml", "--cluster", "dgx-h100", "--gpus", "64",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    assert '"tp": 2' in out and "perfmodel: nemo: model.context_parallel_size 2 -> cp 2" in err


def test_cli_refusal_is_one_error(capsys):
    with pytest.raises(InputError) as err:
        main(["import", f"nemo:{DATA}/missing.yaml"])
    assert "nemo" in str(err.value)
