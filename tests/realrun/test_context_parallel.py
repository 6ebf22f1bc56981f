"""Context parallelism in realrun train (realrun.train.context_parallel): ring attention over
2 cp chunks per sequence reproduces one rank, alone and with dp; the cp axis compresses."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from perfmodel.axes import AXES
from perfmodel.workload import load_model
from topologies.errors import InputError

torch = pytest.importorskip("torch")

from realrun.train.config import TrainConfig  # noqa: E402
from realrun.train.context_parallel import ContextParallel, kept_chunks, positions  # noqa: E402

GQA_TOML = ("hidden_size = 64\nnum_layers = 2\nnum_heads = 4\nnum_kv_heads = 2\nffn_hidden_size = 128\n"
            "vocab_size = 256\nseq_len = 64\nactivation = \"swiglu\"\nnorm = \"rmsnorm\"\ntied_embeddings = false\n")


@pytest.mark.parametrize("cp, seq", [(1, 8), (2, 64), (3, 60), (4, 64)])
def test_the_kept_chunks_cover_the_sequence_with_equal_causal_work(cp, seq):
    kept = [positions(r, cp, seq) for r in range(cp)]
    assert sorted(np.concatenate(kept).tolist()) == list(range(seq))
    assert len({int((k + 1).sum()) for k in kept}) == 1   # keys each rank's queries see, causal
    assert kept_chunks(0, cp) == (0, 2 * cp - 1)


def test_a_rank_keeps_its_chunks_of_inputs_and_targets():
    tokens = np.arange(2 * 16).reshape(2, 16)
    inputs, targets = ContextParallel(2, 1, None).local((tokens, tokens + 100))
    assert inputs.tolist() == [[4, 5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25, 26, 27]]
    assert (targets == inputs + 100).all()


@pytest.mark.parametrize("kw", [dict(cp=2, tp=2), dict(cp=2, pp=2), dict(cp=2, dp=2, ep=2, model="gpt-tiny-moe"),
                                dict(cp=2, dp=2, zero=1), dict(cp=3, seq=64), dict(cp=0)])
def test_bad_context_parallel_configs_name_the_field(kw):
    with pytest.raises(InputError, match="cp"):
        TrainConfig.of(**{"model": "gpt-tiny", **kw})


def test_train_bad_cp_is_one_line(cli):
    for args in (("--cp", "2", "--tp", "2"), ("--cp", "3", "--seq", "64"), ("--cp", "2", "--pp", "2")):
        proc = cli("realrun", "train", "--model", "gpt-tiny", *args)
        assert proc.returncode == 2 and "cp" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_the_plan_perfmodel_predicts_has_the_cp_ranks():
    cfg = TrainConfig.of(model="gpt-tiny", cp=2, dp=2, mbs=4, seq=64)
    plan = cfg.plan()
    assert (plan.cp, plan.dp, plan.gpus, cfg.world, plan.local_seq) == (2, 2, 4, 4, 32)
    assert cfg.idle_axes() == [] and TrainConfig(model="gpt-tiny", policy="cp=int8").idle_axes() == ["cp"]


def _train(tmp_path, name, *args, model="gpt-tiny"):
    exe = shutil.which("realrun", path=os.path.dirname(sys.executable)) or "realrun"
    out = tmp_path / f"{name}.jsonl"
    proc = subprocess.run([exe, "train", "--model", model, "--metrics", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()], proc


def ring_bytes(model: str, cp: int, seq: int, mbs: int, microbatches: int = 1) -> int:
    """A rank's K/V ring bytes per step as perfmodel.events.context_events counts them: per layer
    and microbatch cp - 1 steps of a (2 x seq / cp x mbs x kv_dim) fp32 block forward, twice
    that backward."""
    spec = load_model(model)
    return 3 * (cp - 1) * spec.num_layers * microbatches * 2 * seq // cp * mbs * spec.kv_dim * 4


@pytest.mark.distributed
def test_context_parallel_reproduces_one_rank(tmp_path, same_losses, declared_phases):
    """cp=2: each rank holds a quarter and the last quarter of every sequence, K/V round the
    ring; with policy none the losses and validation losses equal one rank's."""
    args = ("--seq", "64", "--mbs", "4", "--steps", "10", "--eval-every", "5")
    two, proc = _train(tmp_path, "cp2", "--cp", "2", *args)
    one, _ = _train(tmp_path, "cp1", *args)
    assert len(one) == 10
    same_losses(two, one, rel=1e-4)
    assert sum(r["val_loss"] is not None for r in two) == 3   # steps 0, 5 and 9
    assert all(r["cp_wire_bytes"] == ring_bytes("gpt-tiny", 2, 64, 4) for r in two) and "cp_wire_bytes" not in one[0]
    assert two[0]["cp_rel_error"] == 0.0 and two[0]["cp_comm_s"] > 0 and "cp=2" in proc.stdout
    assert [r["error_step"] for r in two] == [i == 0 for i in range(10)]   # --error-every 10: step 0 measures
    assert two[-1]["dp_wire_bytes"] > 0   # the two cp ranks' gradients reduced
    declared_phases(two[0], cp=2)
    declared_phases(one[0])


@pytest.mark.distributed
def test_context_and_data_parallel_together_reproduce_one_rank(tmp_path, same_losses):
    """cp=2 x dp=2 (4 ranks; each replica one microbatch) against one rank with both microbatches."""
    args = ("--seq", "64", "--mbs", "2", "--gbs", "4", "--steps", "4", "--eval-every", "3")
    four, _ = _train(tmp_path, "cp2dp2", "--cp", "2", "--dp", "2", *args)
    one, _ = _train(tmp_path, "one", *args)
    same_losses(four, one, rel=1e-4)


@pytest.mark.distributed
def test_a_longer_ring_with_grouped_query_attention_reproduces_one_rank(tmp_path, same_losses):
    """cp=3 (the dK/dV accumulator travels two steps behind its block) on a GQA swiglu model
    (K/V travel at 2 heads, repeated for 4 query heads where attention computes)."""
    toml = tmp_path / "gqa.toml"
    toml.write_text(GQA_TOML)
    args = ("--seq", "60", "--mbs", "2", "--steps", "4", "--eval-every", "3")
    three, _ = _train(tmp_path, "cp3", "--cp", "3", *args, model=str(toml))
    one, _ = _train(tmp_path, "one", *args, model=str(toml))
    same_losses(three, one, rel=1e-4)
    assert three[0]["cp_wire_bytes"] == ring_bytes(str(toml), 3, 60, 2)


@pytest.mark.distributed
def test_compressed_ring_sends_fewer_bytes_and_still_learns(tmp_path):
    args = ("--cp", "2", "--seq", "64", "--mbs", "4", "--eval-every", "0", "--error-every", "3")
    int8, _ = _train(tmp_path, "int8", "--policy", "cp=int8", "--steps", "12", *args)
    exact = ring_bytes("gpt-tiny", 2, 64, 4)
    assert all(r["cp_wire_bytes"] < 0.3 * exact for r in int8)   # int8 and its block scales: about a quarter
    errors = [r["cp_rel_error"] for r in int8 if r["cp_rel_error"] is not None]
    assert len(errors) == 4 and all(0 < e < AXES["cp"].max_error for e in errors)
    # the last steps' mean, not one step's loss: which bytes a step draws is the stdlib's source of the
    # Python that runs (the corpus), and one hard batch (step 11 here under Python 3.11) lifts one loss by 1
    assert sum(r["loss"] for r in int8[-4:]) / 4 < int8[0]["loss"] - 1.0


@pytest.mark.distributed
def test_resume_with_context_parallelism_continues_the_same_loss_curve(tmp_path, resume_continues):
    """Each cp rank's file holds its state; resuming with another cp is refused in one line."""
    args = ("--cp", "2", "--seq", "64", "--mbs", "2", "--eval-every", "0", "--policy", "cp=int8")
    ck = resume_continues(_train, tmp_path, args)
    exe = shutil.which("realrun", path=os.path.dirname(sys.executable)) or "realrun"
    proc = subprocess.run([exe, "train", "--model", "gpt-tiny", "--seq", "64", "--mbs", "2",
                           "--policy", "cp=int8", "--steps", "6", "--checkpoint", str(ck), "--resume"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "cp" in proc.stderr and "Traceback" not in proc.stderr
