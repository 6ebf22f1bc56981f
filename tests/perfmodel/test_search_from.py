"""``--from`` on ``perfmodel search`` and ``perfmodel sweep``: the files' model, batch and precision, the
search's layout varied still (perfmodel.cli.search.from_hints)."""
from __future__ import annotations

import json

from perfmodel.cli import main

ARGS = ("megatron:--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --vocab-size 32000 "
        "--global-batch-size 32 --micro-batch-size 1 --bf16 --use-distributed-optimizer --recompute-granularity full "
        "--tensor-model-parallel-size 2 --fp8-format hybrid --fp8-recipe tensorwise")
SEARCH = ["search", "--cluster", "dgx-h100", "--gpus", "8", "--workers", "1", "--candidates", "dp=none|int8"]


def test_search_takes_the_model_batch_and_plan_hints(capsys):
    assert main([*SEARCH, "--from", ARGS]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# megatron-model on dgx-h100, gbs 32:")
    assert "every plan compute_dtype bf16, dp_overlap False, precision fp8-tensorwise, zero 1" in out
    assert "perfmodel: from: tp 2 not used (the search varies the layout: degrees, microbatch, stages)" in err
    assert main([*SEARCH, "--from", ARGS, "--json"]) == 0
    rows = json.loads(capsys.readouterr()[0])["ranked"]
    assert rows and {(r["zero"], r["recompute"]) for r in rows} == {(1, "full")}
    assert {r["tp"] for r in rows} > {2}            # the layout is still searched


def test_a_search_flag_wins_over_the_file(capsys):
    assert main([*SEARCH, "--gbs", "64", "--recompute", "none", "--from", ARGS, "--json"]) == 0
    out, err = capsys.readouterr()
    assert "perfmodel: from: gbs 32 not used (--gbs given)" in err
    assert {r["recompute"] for r in json.loads(out)["ranked"]} == {"none"}


def test_search_deepspeed_config_and_missing_batch(tmp_path, cli):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 64, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}))
    done = cli("perfmodel", *SEARCH, "--model", "gpt3-1.3b", "--from", f"deepspeed:{ds}", "--json", check_rc=0)
    assert {r["zero"] for r in json.loads(done.stdout)["ranked"]} == {3}
    assert "perfmodel: deepspeed: train_batch_size=64 -> --gbs 64" in done.stderr
    bare = cli("perfmodel", *SEARCH, "--from", "hf:tests/perfmodel/data/importers/llama-3.1-8b.json", check_rc=2)
    assert bare.stderr.strip().splitlines()[-1] == "perfmodel: error: gbs=None: a global batch size: --gbs, or a " \
        "--from file that gives one"
    sweep = cli("perfmodel", "sweep", "--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "8", check_rc=2)
    assert "gbs=None: a global batch size: --gbs, or a --from file that gives one" in sweep.stderr


def test_sweep_takes_the_batch_from_the_file(capsys):
    assert main(["sweep", "--cluster", "dgx-h100", "--gpus", "8", "--top", "2", "--from", ARGS, "--json"]) == 0
    rows = json.loads(capsys.readouterr()[0])
    assert rows and all(r["plan"]["gbs"] == 32 and r["plan"]["precision"] == "fp8-tensorwise" for r in rows)
