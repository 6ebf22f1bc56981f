"""What the example scripts and configs of Megatron-LM, torchtitan and DeepSpeedExamples use, in small files of
their formats (scripts/import_examples.py tallies the real ones; docs/importers.md has the table)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfmodel.importers import load, read
from perfmodel.plan.deepspeed import map_config
from topologies.errors import InputError

ROOT = Path(__file__).resolve().parents[2]

# the shapes of Megatron-LM's examples/gptoss/02_train.sh and examples/post_training/modelopt/train.sh
GPT_OSS = """#!/bin/bash
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MODEL_ARGS=(
    --num-layers 4 --hidden-size 512 --num-attention-heads 8
    --seq-length 1024 --vocab-size 32000
    --enable-gpt-oss
    --export-force-local-attention
    --cp-comm-type p2p
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size ${GBS:-64}
    --use-distributed-optimizer ${EXTRA_ARGS}
)
source "$(dirname "$(readlink -f "$0")")/conf/arguments.sh"
DATETIME=`date +%s`
torchrun --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py \\
    "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" \\
    --tensor-model-parallel-size ${TP} \\
    --save /ckpt/$DATETIME
"""
SRUN = """#!/bin/bash
CMD="python -u ${MEGATRON_CODE_DIR}/pretrain_gpt.py ${MEGATRON_PARAMS}"
srun -l --container-image "nvcr.io#nvidia/pytorch:20.12-py3" --output=logs/%x.log sh -c "${CMD}"
"""


@pytest.fixture()
def clean_env(monkeypatch):
    for name in ("TP", "GBS", "EXTRA_ARGS", "MEGATRON_PARAMS", "MEGATRON_CODE_DIR", "GPUS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_variable_the_script_leaves_to_the_environment(tmp_path, clean_env):
    script = tmp_path / "train.sh"
    script.write_text(GPT_OSS)
    with pytest.raises(InputError) as err:
        read(f"megatron:{script}")
    assert err.value.refused == ["megatron: cannot honour --tensor-model-parallel-size $TP: a value: the script "
                                 "does not set TP (it sources $COMMAND/conf/arguments.sh, which is not read); set "
                                 "it in the environment"]
    clean_env.setenv("TP", "2")
    imported = read(f"megatron:{script}")
    assert imported.plan["tp"] == 2 and imported.plan["gbs"] == 64 and imported.plan["zero"] == 1
    assert "megatron: $TP 2 -> from the environment (the script does not set it)" in imported.lines
    assert "megatron: $EXTRA_ARGS (not set) -> no arguments (an unset variable expands to none)" in imported.lines
    assert any(line.startswith("megatron: --enable-gpt-oss ignored") for line in imported.lines)
    assert any(line.startswith("megatron: --cp-comm-type p2p ignored") for line in imported.lines)


def test_other_context_parallel_communication_is_refused(clean_env):
    with pytest.raises(InputError) as err:
        load("megatron:--num-layers 2 --context-parallel-size 2 --cp-comm-type a2a")
    assert err.value.refused[0].startswith("megatron: cannot honour --cp-comm-type a2a: p2p")


def test_a_command_kept_in_a_variable_and_run_by_srun(tmp_path, clean_env):
    script = tmp_path / "SRUN.sh"
    script.write_text(SRUN)
    with pytest.raises(InputError) as err:
        read(f"megatron:{script}")
    assert err.value.refused == ["megatron: cannot honour arguments $MEGATRON_PARAMS: Megatron flags: the script "
                                 "passes variables it does not set; set it in the environment"]
    clean_env.setenv("MEGATRON_PARAMS", "--num-layers 24 --tensor-model-parallel-size 4 --micro-batch-size 2")
    imported = read(f"megatron:{script}")
    assert imported.model["num_layers"] == 24 and imported.plan["tp"] == 4 and imported.plan["mbs"] == 2


def test_torchtitan_v01_and_the_transformers_backend(tmp_path):
    v01 = tmp_path / "llama3_8b.toml"
    v01.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
                   'compile = false\n[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "op"\n')
    imported = read(f"torchtitan:{v01}")
    assert imported.name == "llama3-8b" and imported.plan["seq"] == 8192
    assert any(line.startswith("torchtitan: training.compile false ignored (torch.compile") for line in imported.lines)
    backend = tmp_path / "full.toml"
    backend.write_text('[model]\nname = "transformers_modeling_backend"\nflavor = "full"\n[hf_transformers]\n'
                       'model = "Qwen/Qwen3-4B-Instruct-2507"\n[activation_checkpoint]\nmode = "full"\n')
    imported = read(f"torchtitan:{backend}")
    assert not imported.model and imported.plan["recompute"] == "full"
    assert any("hf_transformers.model Qwen/Qwen3-4B-Instruct-2507 ignored" in line for line in imported.lines)


def test_deepspeed_auto_values_are_left_to_the_command_line():
    ds = map_config({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                     "zero_optimization": {"stage": 2}, "fp16": {"enabled": "auto"}}, 8, 64)
    assert ds.plan == {"zero": 2}
    assert 'train_micro_batch_size_per_gpu="auto" -> left to the command line (the HF Trainer fills it from its ' \
           'arguments: --mbs, --gbs, --compute-dtype give it here)' in ds.mapped


def test_deepspeed_autotuning_is_one_refusal():
    with pytest.raises(InputError) as err:
        map_config({"train_micro_batch_size_per_gpu": "auto", "autotuning": {"enabled": True, "fast": True,
                    "arg_mappings": {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"}}}, 8, 64)
    assert err.value.value == "autotuning.enabled=true" and "\n" not in str(err.value)
    assert map_config({"autotuning": {"enabled": False, "fast": True}, "zero_optimization": {"stage": 1}},
                      8, 64).plan == {"zero": 1}


def test_import_examples_tallies_a_repository(tmp_path, clean_env):
    repo = tmp_path / "Megatron-LM"
    (repo / "examples" / "gpt").mkdir(parents=True)
    (repo / "examples" / "gpt" / "train.sh").write_text(GPT_OSS.replace("${TP}", "${TP:-1}"))
    (repo / "examples" / "gpt" / "SRUN.sh").write_text(SRUN)
    (repo / "examples" / "bert.sh").write_text("python pretrain_bert.py --num-layers 2\n")
    (tmp_path / "ds").mkdir()
    ds = tmp_path / "ds" / "training"
    ds.mkdir()
    (ds / "ds_config.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto"}))
    for git in (repo, tmp_path / "ds"):
        subprocess.run(["git", "init", "-q", str(git)], check=True)
        subprocess.run(["git", "-C", str(git), "add", "."], check=True)
        subprocess.run(["git", "-C", str(git), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                       check=True)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_examples.py"), "--megatron",
                           str(repo / ".git"), "--deepspeed", str(tmp_path / "ds" / ".git")],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    tally = [line for line in done.stdout.splitlines() if " @ " in line]
    assert tally[0].split(": ", 1)[1] == "ok 1, out of scope 1, refused 1"
    assert tally[1].split(": ", 1)[1] == "ok 1"
    assert "refused  megatron:examples/gpt/SRUN.sh  [arguments $MEGATRON_PARAMS]" in done.stdout
    predicted = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_examples.py"), "--megatron",
                                str(repo / ".git"), "--deepspeed", str(tmp_path / "ds" / ".git"), "--predict",
                                "dgx-h100", "--model", "gpt3-1.3b"], capture_output=True, text=True,
                               env={"PATH": "/usr/bin:/bin"})
    assert predicted.returncode == 0, predicted.stderr
    tally = [line.split(": ", 1)[1] for line in predicted.stdout.splitlines() if " predict @ " in line]
    assert tally == ["predicts 1", "predicts 1"], predicted.stdout


def test_a_mapped_flag_under_an_ignored_prefix_is_said_once():
    imported = read("megatron:--num-layers 2 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads")
    assert imported.plan["zero"] == 2
    said = [line for line in imported.lines if "--data-parallel-sharding-strategy" in line]
    assert said == ["megatron: --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads -> zero 2"]


@pytest.mark.parametrize("name, flavor, catalog", [("deepseek_v3", "16B", "deepseek-v2-lite"),
                                                   ("deepseek_v3", "671B", "deepseek-v3"),
                                                   ("qwen3", "30B-A3B", "qwen3-30b-a3b")])
def test_torchtitan_v022_flavors_in_the_catalog(tmp_path, name, flavor, catalog):
    job = tmp_path / "job.toml"
    job.write_text(f'[model]\nname = "{name}"\nflavor = "{flavor}"\n[activation_checkpoint]\nmode = "full"\n')
    imported = read(f"torchtitan:{job}")
    assert imported.name == catalog and imported.model["num_layers"] > 0


def test_torchtitan_qwen3_dense_flavor_shapes(tmp_path):
    from perfmodel.importers import load

    job = tmp_path / "qwen3_0.6b.toml"
    job.write_text('[model]\nname = "qwen3"\nflavor = "0.6B"\n[activation_checkpoint]\nmode = "none"\n')
    model, _, lines = load(f"torchtitan:{job}")
    assert model.name == "qwen3-0.6b" and model.tied_embeddings and model.head_dim == 128
    assert 0.59e9 < model.params < 0.61e9              # Qwen3-0.6B: 0.6B parameters, embeddings tied


@pytest.mark.parametrize("call", ['"${ARR[@]}"', "${ARR[@]}", '"${NONE[@]}" "${ARR[@]}"'])
def test_array_elements_with_parentheses_quotes_and_comments(call):
    from perfmodel.importers.shell import read_args

    script = ('ARR=(\n  --moe-layer-freq "([0]*3+[1]*58)"   # a comment (with parentheses)\n'
              '  --data-path "my data/x" \'it"s\'\n  --lr 1e-4\n)\nNONE=()\n'
              f"torchrun pretrain_gpt.py --use-distributed-optimizer {call} --num-layers 4\n")
    assert read_args(script, env={}) == ["--use-distributed-optimizer", "--moe-layer-freq", "([0]*3+[1]*58)",
                                         "--data-path", "my data/x", 'it"s', "--lr", "1e-4", "--num-layers", "4"]


# the keys of NeMo 1's megatron_qwen2_config.yaml and megatron_gemma_config.yaml (NVIDIA/NeMo @ 8cfedd7203) that
# their importer refused before: a Qwen2-like and a Gemma-like model in a few lines
NEMO1 = """restore_from_path: null
trainer: {devices: 8, num_nodes: 1, precision: bf16}
model:
  micro_batch_size: 1
  global_batch_size: 64
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  encoder_seq_length: 4096
  num_layers: 4
  hidden_size: 1024
  ffn_hidden_size: 4096
  num_attention_heads: 16
  num_query_groups: 4
  normalization: rmsnorm
  activation: {activation}
  bias: false
  qkv_bias: true
  apply_embedding_scaling: true
  override_vocab_size: 151936
  share_embeddings_and_output_weights: false
"""


@pytest.mark.parametrize("activation", ["geglu", "fast-geglu", "fast-swiglu"])
def test_nemo1_qwen2_and_gemma_keys(tmp_path, activation):
    path = tmp_path / "megatron_qwen2_config.yaml"
    path.write_text(NEMO1.replace("{activation}", activation))
    imported = read(f"nemo:{path}")
    assert imported.model["activation"] == "swiglu" and imported.model["vocab_size"] == 151936
    assert imported.model["num_kv_heads"] == 4 and imported.plan["tp"] == 2
    assert any(line.startswith("nemo: model.qkv_bias true ignored (the query, key and value biases")
               for line in imported.lines)
    assert any(line.startswith("nemo: restore_from_path null ignored") for line in imported.lines)


def test_a_step_before_the_launch_with_unset_arguments_does_not_take_its_place():
    from perfmodel.importers.shell import read_args

    script = "python tools/prepare.py $INPUT\ntorchrun pretrain_gpt.py --num-layers 4\n"
    assert read_args(script, env={}) == ["--num-layers", "4"]


def test_torchtitan_python_config_registry_is_one_refusal(tmp_path):
    registry = tmp_path / "config_registry.py"
    registry.write_text("def llama3_8b():\n    return None\n")
    with pytest.raises(InputError) as err:
        read(f"torchtitan:{registry}")
    assert "config_registry.py is Python" in str(err.value) and "\n" not in str(err.value)
