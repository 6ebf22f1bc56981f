"""perfmodel --from megatron:train.sh: a Megatron-LM launch script or argument list as a model and a plan."""
import pytest

from perfmodel.cli import main
from perfmodel.importers import load, merge
from perfmodel.importers.megatron import from_args
from perfmodel.importers.shell import read_args
from topologies import InputError

DATA = "tests/perfmodel/data/importers"


def test_launch_script_maps_model_and_plan():
    model, plan, lines = load(f"megatron:{DATA}/train_moe.sh")
    assert (model.num_layers, model.hidden_size, model.num_heads, model.num_kv_heads) == (16, 2048, 16, 4)
    assert (model.vocab_size, model.activation, model.norm, model.tied_embeddings) == (50176, "swiglu", "rmsnorm",
                                                                                         False)
    assert (model.num_experts, model.moe_top_k, model.moe_ffn_hidden_size, model.moe_shared_experts) == (32, 4, 1024, 1)
    assert (model.moe_first_dense, model.moe_layer_freq) == (2, 1)
    assert plan == {"seq": 4096, "tp": 2, "pp": 2, "ep": 4, "sequence_parallel": True, "zero": 1, "dp_overlap": True,
                    "mbs": 1, "gbs": 256, "compute_dtype": "bf16", "recompute": "selective",
                    "recompute_modules": "moe_act,layernorm", "precision": "fp8-tensorwise", "ep_kernels": "deepep"}
    assert "megatron: --tensor-model-parallel-size 2 -> tp 2" in lines
    assert "megatron: --lr 3e-4 ignored (the optimizer's, learning rate's and numerics' settings: no effect on " \
           "the step time)" in lines
    assert "megatron: --save $1 ignored (checkpointing: no effect on the step time)" in lines


def test_argument_list_and_defaults():
    model, plan, lines = load(f"megatron:{DATA}/args_dense.txt")
    assert (model.activation, model.norm, model.tied_embeddings, model.ffn_hidden_size) == ("gelu", "layernorm",
                                                                                             True, 4096)
    assert plan["dp_overlap"] is False and plan["recompute"] == "full"
    inline, _, _ = load("megatron:--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
                        "--vocab-size 1000 --swiglu")
    assert inline.vocab_size == 1024 and inline.ffn_hidden_size == 640     # int(4h 2/3 / 64) 64


def test_shell_reading():
    script = """
N=${N:-4}
W=$(($N*2))
A=(--num-layers $W   # a comment
   "--hidden-size 512")
if [ "$MODE" == "big" ]; then
    A+=(--num-layers 99)
elif [[ -z "$MODE" ]]; then
    A+=(--seq-length 64)
else
    A+=(--seq-length 1)
fi
CMD="python pretrain_gpt.py ${A[@]} \\
  --bf16"
eval $CMD
"""
    assert read_args(script) == ["--num-layers", "8", "--hidden-size", "512", "--seq-length", "64", "--bf16"]


def test_virtual_pipeline_and_layer_pattern():
    args = "--num-layers 32 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2 " \
        "--num-experts 8 --moe-layer-freq ([0]*2+[1]*30)"
    imp = from_args(args.split())
    assert imp.plan["schedule"] == "interleaved:4" and imp.model["moe_first_dense"] == 2


@pytest.mark.parametrize("args,fragment", [
    ("--cpu-offloading", "--cpu-offloading: not a flag"),
    ("--recompute-granularity full --recompute-method block", "--recompute-method block"),
    ("--moe-token-dispatcher-type allgather", "allgather"),
    ("--fp8-format hybrid --fp8-recipe custom", "--fp8-recipe custom"),
    ("--num-experts 8 --moe-layer-freq [1,1,0,1]", "--moe-layer-freq"),
    ("--tensor-model-parallel-size notanumber", "an integer")])
def test_unsupported_flags_are_refused(args, fragment):
    with pytest.raises(InputError) as err:
        from_args(args.split()).check("args")
    assert any(fragment in line for line in err.value.refused), err.value.refused


def test_unset_variable_in_a_mapped_flag_is_refused(monkeypatch):
    monkeypatch.delenv("TP", raising=False)
    with pytest.raises(InputError) as err:
        load(f"megatron:{DATA}/train_unknown.sh")
    assert "megatron: cannot honour --tensor-model-parallel-size $TP: a value: the script does not set TP; set it " \
        "in the environment" in err.value.refused


def test_later_file_wins_and_defaults_yield():
    both = merge([load_part(f"hf:{DATA}/llama-3.1-8b.json"), load_part(f"megatron:{DATA}/args_dense.txt")])
    assert both.model["num_layers"] == 8 and both.model["activation"] == "swiglu"   # hf's, not Megatron's gelu
    assert both.model["vocab_size"] == 32000


def load_part(spec):
    from perfmodel.importers import read
    return read(spec)


def test_cli_flags_override_imports(capsys):
    for argv in (["--from", f"megatron:{DATA}/train_moe.sh", "--tp", "4"],
                 ["--tp", "4", "--from", f"megatron:{DATA}/train_moe.sh"]):
        assert main(["predict", *argv, "--cluster", "dgx-h100", "--gpus", "32", "--json"]) == 0
        out, err = capsys.readouterr()
        assert '"tp": 4' in out
        assert "perfmodel: from: tp 2 not used (--tp given)" in err
        assert "perfmodel: megatron: --fp8-format hybrid --fp8-recipe tensorwise -> precision fp8-tensorwise" in err


def test_cli_model_needs_a_vocabulary(cli, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
                      "--seq-length 128 --tokenizer-type HuggingFaceTokenizer --tokenizer-model $TOK\n")
    done = cli("perfmodel", "predict", "--from", f"megatron:{script}", "--cluster", "dgx-h100", "--gpus", "8",
               check_rc=2)
    assert done.stderr.strip().splitlines()[-1].startswith("perfmodel: error: model='vocab_size'")
    assert cli("perfmodel", "predict", "--from", f"megatron:{script}", "--model", "gpt3-1.3b", "--cluster",
               "dgx-h100", "--gpus", "8", check_rc=0)


def test_cli_refusal_exit_2(cli):
    done = cli("perfmodel", "compare", "--from", f"megatron:{DATA}/train_unknown.sh", "--cluster", "dgx-h100",
               "--gpus", "8", check_rc=2)
    assert "perfmodel: megatron: cannot honour --cpu-offloading: not a flag" in done.stderr
    assert "Traceback" not in done.stderr
    bad = cli("perfmodel", "predict", "--from", "torch:x", "--cluster", "dgx-h100", check_rc=2)
    assert "FORMAT:PATH with FORMAT one of hf, megatron, deepspeed" in bad.stderr


def test_from_deepspeed_is_the_deepspeed_flag(tmp_path, capsys):
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, '
                  '"zero_optimization": {"stage": 1}}')
    for flag in (["--from", f"deepspeed:{ds}"], ["--deepspeed", str(ds)]):
        assert main(["predict", "--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "8", *flag, "--json"]) == 0
        out, err = capsys.readouterr()
        assert '"zero": 1' in out and "deepspeed: zero_optimization.stage=1 -> --zero 1" in err


def test_import_shows_the_plan_before_a_missing_vocabulary(tmp_path, capsys):
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
                      "--seq-length 128 --tensor-model-parallel-size 2\n")
    with pytest.raises(InputError, match="vocab_size"):
        main(["import", f"megatron:{script}"])
    out = capsys.readouterr().out
    assert "plan: --tp 2" in out and "megatron: --vocab-size absent" in out


def test_every_flag_has_its_line():
    from perfmodel.importers.megatron import groups

    with open(f"{DATA}/train_moe.sh") as handle:
        words = read_args(handle.read())
    lines = from_args(words + ["--make-vocab-size-divisible-by", "64"]).lines
    for flag in [*groups(words), "--make-vocab-size-divisible-by"]:
        assert any(flag in line.split(" -> ")[0] for line in lines), flag


def test_case_statement_takes_its_branch():
    script = """
SCALE="small" # or "big"
case "${SCALE}" in
    "big")
        L=64
        ;;
    small|tiny) L=8 ;;
    *)
        echo "unknown"; exit 1
        ;;
esac
torchrun pretrain_gpt.py --num-layers $L --bf16
"""
    assert read_args(script) == ["--num-layers", "8", "--bf16"]


@pytest.mark.parametrize("value,fragment", [("$((9**9**9))", "not evaluated"), ("$((4/0))", "not evaluated"),
                                            ("$(nproc)", "command substitution")])
def test_hostile_expansions_are_refused_not_run(value, fragment):
    with pytest.raises(InputError) as err:
        from_args(read_args(f"torchrun pretrain_gpt.py --tensor-model-parallel-size {value}")).check("x")
    assert fragment in err.value.refused[0]


def test_hostile_layer_pattern_is_refused_not_built():
    imp = from_args(["--num-layers", "4", "--num-experts", "4", "--moe-layer-freq", "[0]*99999*99999"])
    assert imp.refused and imp.refused[0].startswith("--moe-layer-freq")


@pytest.mark.parametrize("flag", ["--num-query-groups", "--kv-channels", "--vocab-size",
                                  "--make-vocab-size-divisible-by", "--moe-shared-expert-intermediate-size",
                                  "--moe-expert-capacity-factor",
                                  "--num-layers-per-virtual-pipeline-stage", "--ddp-bucket-size",
                                  "--tensor-model-parallel-size", "--moe-layer-freq", "--window-size"])
@pytest.mark.parametrize("value", ["abc", "0", "-3", "[1]"])
def test_hostile_values_give_one_line_errors(flag, value):
    from perfmodel.importers.common import build_model

    args = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-experts 4 " \
        "--moe-ffn-hidden-size 32 --vocab-size 100 --pipeline-model-parallel-size 2 --seq-length 64"
    try:
        build_model(merge([from_args([*args.split(), flag, value]).check("x")]).model, "x", "x")
    except InputError as err:
        assert "\n" not in str(err)
