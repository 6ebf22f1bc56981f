"""realrun train: the model matches perfmodel's description, data is deterministic, data
parallelism through realrun.comm reproduces single-rank training, compressed runs still learn."""
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from perfmodel.workload import ModelSpec, load_model
from topologies.errors import InputError

torch = pytest.importorskip("torch")

from realrun.train.config import TrainConfig  # noqa: E402
from realrun.train.data import VAL_FRACTION, load_corpus, train_batch, val_batches  # noqa: E402
from realrun.train.model import GPT  # noqa: E402
from realrun.train.trainer import buckets  # noqa: E402


def spec(**kw):
    base = dict(name="t", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, ffn_hidden_size=256,
                vocab_size=256, seq_len=64, activation="gelu", norm="layernorm", tied_embeddings=True)
    return ModelSpec(**{**base, **kw})


@pytest.mark.parametrize("kw", [{}, dict(tied_embeddings=False), dict(activation="swiglu", norm="rmsnorm"),
                                dict(num_heads=8, num_kv_heads=2, ffn_hidden_size=176, num_layers=3),
                                dict(vocab_size=1000, hidden_size=96, num_heads=3, num_kv_heads=1)])
def test_parameter_count_equals_perfmodels(kw):
    s = spec(**kw)
    assert GPT(s).num_params() == s.params
    assert GPT(load_model("gpt-tiny")).num_params() == load_model("gpt-tiny").params


def test_flops_per_step_agree_with_perfmodels_count():
    """Matmul FLOPs counted by torch (forward + backward) against perfmodel's 6N + 12 L h s per
    token; norms and biases are in N but are not matmuls, so a few percent apart at most."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    s = spec(seq_len=128)
    model, tokens = GPT(s), torch.randint(0, 256, (2, 128))
    # the math backend runs attention as matmuls the counter sees (the fused CPU kernel has no formula)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens, tokens).backward()
    predicted = s.model_flops_per_token(128) * tokens.numel()
    assert counter.get_total_flops() == pytest.approx(predicted, rel=0.05)


def test_corpus_split_and_batches_are_deterministic():
    c = load_corpus()
    assert c.files > 10 and len(c.val) == pytest.approx(VAL_FRACTION * (len(c.train) + len(c.val)), rel=0.01)
    a = train_batch(c, seed=1, step=3, index=2, rows=4, seq=32)
    b = train_batch(c, seed=1, step=3, index=2, rows=4, seq=32)
    other = train_batch(c, seed=1, step=3, index=1, rows=4, seq=32)
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], other[0])
    assert np.array_equal(a[0][:, 1:], a[1][:, :-1]) and a[0].max() < 256
    assert np.array_equal(val_batches(c, rows=2, seq=16, count=2)[1][0], val_batches(c, rows=2, seq=16, count=2)[1][0])


def test_buckets_cover_every_parameter_last_first():
    params = list(GPT(spec()).parameters())
    groups = buckets(params, 64 * 1024)
    assert [id(p) for g in groups for p in g] == [id(p) for p in reversed(params)] and len(groups) > 1


@pytest.mark.parametrize("kw, field", [(dict(gbs=12, mbs=8, dp=1), "gbs"), (dict(seq=4096), "seq"),
                                       (dict(policy="dp=nope"), "compressor"), (dict(lr=0), "lr"),
                                       (dict(model="nosuch"), "model"), (dict(dp=0), "dp"),
                                       (dict(tp=3), "tp"), (dict(zero=2), "zero"),
                                       (dict(pp=3), "pp"), (dict(schedule="zb"), "schedule"),
                                       (dict(resume=True), "resume")])
def test_bad_configs_name_the_field(kw, field):
    with pytest.raises(InputError, match=field):
        TrainConfig.of(**{"model": "gpt-tiny", **kw})


def _train(tmp_path, name, *args):
    exe = shutil.which("realrun", path=os.path.dirname(sys.executable)) or "realrun"
    out = tmp_path / f"{name}.jsonl"
    proc = subprocess.run([exe, "train", "--model", "gpt-tiny", "--seq", "64", "--metrics", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()], proc


@pytest.mark.distributed
def test_data_parallel_through_realrun_comm_reproduces_one_rank(tmp_path, same_losses, declared_phases):
    """dp=2 (one microbatch each) and dp=1 (both microbatches) read the same global batch; with
    policy none the losses agree to float rounding."""
    two, proc = _train(tmp_path, "two", "--dp", "2", "--mbs", "4", "--gbs", "8", "--steps", "4", "--eval-every", "0")
    one, _ = _train(tmp_path, "one", "--dp", "1", "--mbs", "4", "--gbs", "8", "--steps", "4", "--eval-every", "0")
    same_losses(two, one, rel=1e-5)
    assert "loss first -> final" in proc.stdout and two[0]["dp_rel_error"] == 0.0
    declared_phases(two[0], dp=2)
    declared_phases(one[0], dp=1)
    assert two[0]["compute_s"] == two[0]["forward_s"] + two[0]["backward_s"]


@pytest.mark.distributed
def test_tensor_parallel_reproduces_one_rank(tmp_path, same_losses):
    """Megatron's column/row split over 2 ranks, every reduction through realrun.comm (none):
    the same losses as the unsplit model."""
    two, proc = _train(tmp_path, "tp2", "--tp", "2", "--mbs", "4", "--steps", "4", "--eval-every", "0")
    one, _ = _train(tmp_path, "tp1", "--mbs", "4", "--steps", "4", "--eval-every", "0")
    same_losses(two, one, rel=1e-5)
    assert two[-1]["tp_wire_bytes"] > 0 and one[-1]["tp_wire_bytes"] == 0


@pytest.mark.distributed
def test_vocabulary_parallel_swiglu_untied_model_reproduces_one_rank(tmp_path, same_losses):
    """tp=2 with an untied head, SwiGLU and RMSNorm: embedding rows, head rows and the loss split
    by vocabulary (Megatron's vocab-parallel embedding and cross entropy) give the unsplit losses."""
    toml = tmp_path / "m.toml"
    toml.write_text("hidden_size = 64\nnum_layers = 2\nnum_heads = 4\nnum_kv_heads = 2\nffn_hidden_size = 128\n"
                    "vocab_size = 258\nseq_len = 64\nactivation = \"swiglu\"\nnorm = \"rmsnorm\"\n"
                    "tied_embeddings = false\n")
    args = ("--model", str(toml), "--mbs", "4", "--steps", "3", "--eval-every", "2")
    two, _ = _train(tmp_path, "v2", "--tp", "2", *args)
    one, _ = _train(tmp_path, "v1", *args)
    same_losses(two, one, rel=1e-5)


@pytest.mark.distributed
def test_zero1_reproduces_the_unsharded_step_and_compresses_both_axes(tmp_path, same_losses):
    """Optimizer state sharded over dp=2 (reduce-scatter, shard update, all-gather): with none
    the same losses as the unsharded run; with a zero spec the parameter all-gather shrinks."""
    sharded, _ = _train(tmp_path, "z1", "--dp", "2", "--zero", "1", "--mbs", "4", "--steps", "4", "--eval-every", "0")
    plain, _ = _train(tmp_path, "z0", "--dp", "2", "--mbs", "4", "--steps", "4", "--eval-every", "0")
    same_losses(sharded, plain, rel=1e-5)
    assert sharded[-1]["zero_wire_bytes"] > 0 and plain[-1]["zero_wire_bytes"] == 0
    lossy, proc = _train(tmp_path, "z1q", "--dp", "2", "--zero", "1", "--mbs", "4", "--steps", "20",
                         "--policy", "dp=int8,zero=fp16", "--error-every", "5")
    assert lossy[-1]["zero_wire_bytes"] < 0.6 * sharded[-1]["zero_wire_bytes"]
    assert np.mean([r["loss"] for r in lossy[-3:]]) < np.mean([r["loss"] for r in lossy[:3]]) - 1.0
    assert "axis zero has no traffic" not in proc.stderr


@pytest.mark.distributed
def test_tp_and_dp_compressed_together_still_learn(tmp_path):
    steps, proc = _train(tmp_path, "tpdp", "--tp", "2", "--dp", "2", "--mbs", "4", "--steps", "20",
                         "--policy", "naive:int8", "--error-every", "5")
    assert np.mean([r["loss"] for r in steps[-3:]]) < np.mean([r["loss"] for r in steps[:3]]) - 1.0
    errors = [r["dp_rel_error"] for r in steps if r["dp_rel_error"] is not None]
    assert 0 < np.median(errors) < 0.05 and "axis pp has no traffic" in proc.stderr


@pytest.mark.distributed
@pytest.mark.parametrize("policy", ["naive:int8", "dp=ef(topk(0.01))+int8"])
def test_compressed_gradients_still_learn_and_the_error_is_what_perfmodel_says(tmp_path, policy):
    from perfmodel import compile_spec
    from perfmodel.compression.policy import parse_policy

    steps, _ = _train(tmp_path, "c", "--dp", "2", "--mbs", "4", "--steps", "30", "--policy", policy,
                      "--eval-every", "10", "--error-every", "5")
    first, last = np.mean([r["loss"] for r in steps[:3]]), np.mean([r["loss"] for r in steps[-3:]])
    assert last < first - 1.0   # ln 256 = 5.5 at the start; bytes of Python source are far from random
    measured = np.median([r["dp_rel_error"] for r in steps if r["dp_rel_error"] is not None])
    codec = compile_spec(parse_policy(policy).axis("dp").spec)
    hops = 1 if codec.sparse else 2   # realrun's auto: allgather (one compression) or two_phase (two)
    assert 0.5 < measured / (codec.error * math.sqrt(hops)) < 2.0, measured   # EF adds last step's residual
    assert all(r["dp_wire_bytes"] > 0 for r in steps)


@pytest.mark.distributed
def test_train_runs_under_torchrun(tmp_path):
    out = tmp_path / "m.jsonl"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "realrun.cli", "train", "--model", "gpt-tiny", "--dp", "2", "--seq", "32",
                           "--steps", "3", "--policy", "naive:fp16", "--metrics", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(out.read_text().splitlines()) == 3 and "loss first -> final" in proc.stdout


def test_train_bad_input_is_one_line(cli, tmp_path):
    cases = [(("--gbs", "7", "--dp", "2"), "gbs"), (("--policy", "dp=int8+topk(0.1)"), "compressor"),
             (("--metrics", "/proc/x.jsonl"), "metrics"), (("--checkpoint-every", "-1"), "checkpoint_every")]
    if not torch.cuda.is_available():
        cases.append((("--device", "cuda"), "device"))
    for args, field in cases:
        proc = cli("realrun", "train", *args)
        assert proc.returncode == 2 and field in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("stages, m", [(2, 4), (4, 4), (3, 2), (1, 3)])
def test_pipeline_schedules_order_every_microbatch(stages, m):
    """Each stage runs every microbatch forward then backward; 1F1B keeps at most pp - s in
    flight (GPipe all m); the last stage of 1F1B alternates F and B."""
    from realrun.train.pipeline import schedule

    for s in range(stages):
        for name in ("1f1b", "gpipe"):
            ops = schedule(name, s, stages, m)
            assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(m))
            live = [sum(1 if k == "F" else -1 for k, _ in ops[:j + 1]) for j in range(len(ops))]
            assert max(live) == (min(stages - s, m) if name == "1f1b" else m)
    assert schedule("1f1b", 0, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2),
                                          ("B", 3)]
    assert schedule("1f1b", 1, 2, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


@pytest.mark.distributed
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_parallel_reproduces_one_rank(tmp_path, schedule, same_losses):
    """Two stages (one layer each; the tied embedding's two copies summed between first and last
    stage), two microbatches, every send/recv through realrun.comm (none): the losses and
    validation losses of the unsplit model."""
    args = ("--mbs", "4", "--gbs", "8", "--steps", "4", "--eval-every", "3")
    two, _ = _train(tmp_path, f"pp2{schedule}", "--pp", "2", "--schedule", schedule, *args)
    one, _ = _train(tmp_path, "pp1", *args)
    same_losses(two, one, rel=1e-5)
    assert two[-1]["pp_wire_bytes"] == 2 * 4 * 64 * 128 * 4 and one[-1]["pp_wire_bytes"] == 0


@pytest.mark.distributed
def test_tp_pp_compressed_still_learn_and_pp_payloads_shrink(tmp_path, declared_phases):
    """TP and PP compressed at once: it learns, the pp payload is int8's size, and the error
    measured on each axis is within 2x of perfmodel's estimate (eps x sqrt(hops), eps for
    unit-Gaussian data): pp sends compress once, on every measured step; tp's two-phase sums
    compress twice, within 2x at initialisation, below the estimate later (trained partial
    sums correlate, so the sum's norm grows faster than its error: docs/design.md)."""
    from perfmodel import compile_spec

    steps, proc = _train(tmp_path, "tppp", "--tp", "2", "--pp", "2", "--mbs", "4", "--gbs", "8", "--steps", "15",
                         "--policy", "tp=int8,pp=int8", "--eval-every", "0", "--error-every", "5")
    assert np.mean([r["loss"] for r in steps[-3:]]) < np.mean([r["loss"] for r in steps[:3]]) - 1.0
    eps = compile_spec("int8").error
    pp = [r["pp_rel_error"] / eps for r in steps if r["pp_rel_error"] is not None]
    tp = [r["tp_rel_error"] / (eps * math.sqrt(2)) for r in steps if r["tp_rel_error"] is not None]
    assert len(pp) == len(tp) == 3 and all(0.5 < x < 2.0 for x in pp) and 0.5 < tp[0] < 2.0 and max(tp) < 2.0
    raw = 2 * 4 * 64 * 128 * 4   # two microbatches of fp32 activations, sent by one rank of a stage
    assert 0.2 * raw < steps[-1]["pp_wire_bytes"] < 0.3 * raw and steps[-1]["tp_wire_bytes"] > 0
    assert "axis pp has no traffic" not in proc.stderr
    declared_phases(steps[0], tp=2, pp=2)
    kernels = sum(v for k, v in steps[-1].items() if k.endswith("_kernel_s"))
    assert steps[-1]["compression_s"] == pytest.approx(kernels) and steps[-1]["tp_kernel_s"] > 0


@pytest.mark.distributed
@pytest.mark.parametrize("plan", [("--pp", "2"), ("--dp", "2", "--policy", "dp=ef(topk(0.05))+int8")],
                         ids=["pp2-none", "dp2-error-feedback"])
def test_resume_continues_the_same_loss_curve(tmp_path, plan):
    """Two of four steps, a checkpoint, then --resume to four: the records of an uninterrupted run
    (under error feedback too: the residuals are in the checkpoint)."""
    args = (*plan, "--mbs", "4", "--gbs", "8", "--eval-every", "0")
    whole, _ = _train(tmp_path, "whole", *args, "--steps", "4")
    ck = tmp_path / "ck"
    _train(tmp_path, "part", *args, "--steps", "2", "--checkpoint", str(ck))
    resumed, _ = _train(tmp_path, "part", *args, "--steps", "4", "--checkpoint", str(ck), "--resume")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole]
    assert (ck / "latest").read_text().strip() == "step-00000004" and len(list(ck.glob("step-*"))) == 1


def test_resume_refuses_another_run(cli, tmp_path):
    ck = tmp_path / "ck"
    proc = cli("realrun", "train", "--steps", "2", "--checkpoint", str(ck), "--resume")
    assert proc.returncode == 2 and "checkpoint" in proc.stderr and "Traceback" not in proc.stderr
    ck.mkdir()
    (ck / "latest").write_text("step-00000001\n")
    (ck / "step-00000001").mkdir()
    (ck / "run.json").write_text(json.dumps({"model": "gpt-tiny", "dp": 2, "lr": 0.1}))
    proc = cli("realrun", "train", "--steps", "2", "--checkpoint", str(ck), "--resume")
    assert proc.returncode == 2 and "error: dp=1" in proc.stderr and "Traceback" not in proc.stderr


def test_files_written_before_the_degrees_record_still_load(tmp_path):
    """A checkpoint's run.json and a rank's config JSON keep the degrees flat; one written before
    ep and cp existed (no such keys) continues, or configures, a run with ep = cp = 1."""
    from realrun.train import checkpoint

    cfg = TrainConfig.of(model="gpt-tiny", dp=2, tp=2, mbs=4, seq=64)
    flat = json.loads(cfg.to_json())
    assert {k: flat[k] for k in ("tp", "cp", "ep", "pp", "dp")} == {"tp": 2, "cp": 1, "ep": 1, "pp": 1, "dp": 2}
    assert "degrees" not in flat and TrainConfig.from_json(cfg.to_json()) == cfg
    old = {k: v for k, v in flat.items() if k not in ("ep", "cp")}
    assert TrainConfig.from_json(json.dumps(old)) == cfg and (cfg.tp, cfg.dp, cfg.world) == (2, 2, 4)
    ck = tmp_path / "ck"
    (ck / "step-00000002").mkdir(parents=True)
    (ck / "latest").write_text("step-00000002\n")
    identity = {"model": "gpt-tiny", "dp": 2, "tp": 2, "pp": 1, "schedule": "1f1b", "zero": 0, "mbs": 4,
                "global_batch": 8, "seq_len": 64, "policy": "none", "lr": 3e-3, "seed": 0,
                "bucket_bytes": cfg.bucket_bytes}   # a run.json from before ep and cp
    (ck / "run.json").write_text(json.dumps(identity))
    assert checkpoint.check(str(ck), cfg).endswith("step-00000002")
    with pytest.raises(InputError, match="pp=2: 1, as in the checkpoint"):
        checkpoint.check(str(ck), TrainConfig.of(model="gpt-tiny", dp=2, tp=2, pp=2, mbs=4, seq=64))


def _children(pid: int) -> dict[int, str]:
    """{child pid: command line} of ``pid``, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    cmd = handle.read().replace(b"\0", b" ").decode()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out[int(entry)] = cmd
    return out


@pytest.mark.distributed
def test_a_dead_rank_ends_the_run_with_one_line(tmp_path):
    """SIGKILL to one rank of a pipeline mid-run: the command ends within the op timeout with
    one line naming the rank, and no rank is left behind."""
    import signal
    import time

    exe = shutil.which("realrun", path=os.path.dirname(sys.executable)) or "realrun"
    metrics = tmp_path / "m.jsonl"
    proc = subprocess.Popen([exe, "train", "--pp", "2", "--mbs", "4", "--gbs", "8", "--seq", "64", "--steps", "100000",
                             "--eval-every", "0", "--op-timeout", "10", "--metrics", str(metrics)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
            time.sleep(0.5)
        ranks = {pid: cmd for pid, cmd in _children(proc.pid).items() if "realrun.train 1 " in cmd}
        assert len(ranks) == 1, _children(proc.pid)
        os.kill(next(iter(ranks)), signal.SIGKILL)
        start = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - start < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2 and "realrun: error: rank 1 of" in err and "killed by signal 9" in err
    assert not _children(proc.pid)


def test_compressor_state_survives_a_checkpoint_file(tmp_path):
    """A Comm's residuals and warm starts round-trip through torch.save / weights_only load,
    and a restored wire compresses the next call exactly as the original does."""
    import numpy as np
    import torch

    from realrun.comm import Comm

    a, b = Comm(), Comm()
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    for spec in ("ef(topk(0.01))+int8", "powersgd(2)"):
        a.wire(spec).c.compress(x, key="bucket0")
    torch.save(a.state_dict(), tmp_path / "c.pt")
    b.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=True))
    for spec in ("ef(topk(0.01))+int8", "powersgd(2)"):
        got = [bytes(c.wire(spec).c.compress(x, key="bucket0").data) for c in (a, b)]
        assert got[0] == got[1]
    assert Comm().state_dict() == {}


def _rank_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
    except OSError:
        return None
    return env.get(b"RANK", b"").decode() or None


@pytest.mark.distributed
def test_torchrun_restarts_meet_in_a_store_of_their_own():
    """torchrun keeps one store for every attempt, with the failed attempt's keys in it; the
    restarted ranks (one of them late) still meet: each attempt in a store of its own."""
    worker = os.path.join(os.path.dirname(__file__), "elastic_worker.py")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "--max-restarts", "2", worker], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, [line for line in proc.stderr.splitlines() if "rror" in line][:12]
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("attempt"))
    assert lines == [f"attempt {a} rank {r} sum 3" for a in range(3) for r in range(2)], proc.stdout


@pytest.mark.distributed
def test_torchrun_restarts_survive_a_killed_rank_and_reach_the_same_loss(tmp_path):
    """torchrun --max-restarts 1 with --checkpoint DIR --resume (the same arguments on every
    attempt): rank 1 killed mid-run, torchrun restarts both ranks, they meet in a store of the new
    attempt's own (not the failed attempt's keys) and continue from the last checkpoint; every
    step is recorded once, with exactly the losses of the uninterrupted run started by realrun."""
    import signal
    import time

    args = ("--dp", "2", "--mbs", "4", "--gbs", "8", "--eval-every", "0", "--steps", "16",
            "--policy", "dp=ef(topk(0.05))+int8")
    whole, _ = _train(tmp_path, "whole", *args)
    metrics, ck = tmp_path / "elastic.jsonl", tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "--max-restarts", "1", "-m", "realrun.cli", "train", "--model", "gpt-tiny", "--seq", "64",
                             *args, "--checkpoint", str(ck), "--checkpoint-every", "2", "--resume",
                             "--metrics", str(metrics)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 5):
            time.sleep(0.05)
        victims = [pid for pid, cmd in _children(proc.pid).items() if "realrun.cli train" in cmd
                   and _rank_of(pid) == "1"]
        assert len(victims) == 1 and len(metrics.read_text().splitlines()) < 16, _children(proc.pid)
        os.kill(victims[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            for pid in _children(proc.pid):   # torchrun starts each rank in a session of its own
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, [line for line in err.splitlines() if "rror" in line][:12]
    assert "failed (exitcode: -9) local_rank: 1" in err   # the kill happened; torchrun restarted the ranks
    assert (ck / "latest").read_text().strip() == "step-00000016"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(16))
    # bit for bit: torchrun's ranks run on cfg.threads threads (torch and numba) as realrun's own do
    assert [r["loss"] for r in records] == [r["loss"] for r in whole]
