"""Hostile planning input (issue 37): batch sizes that would size an endless pipeline schedule,
DeepSpeed and mixture-of-experts numbers past their bounds, a file in another format given as a
model, a cluster's GPU the model does not know. Each is one line naming the field, the value and
what is allowed (exit code 2), before any work; and a long schedule costs what a short one does."""
import importlib.util
import math
import random
from pathlib import Path

import pytest

from perfmodel.step import schedule
from perfmodel.step.schedule import SCHEDULES, StageCost, run_schedule, settled
from topologies.errors import InputError

CHUNKS = {"gpipe": 1, "1f1b": 1, "interleaved": 3}


def _sibling(name: str):
    """A test module beside this one, for its helpers (tests import in importlib mode: not by name)."""
    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hostile = _sibling("test_hostile_input")     # its commands' arguments and file writers


def _stages(rng, p):
    """Stages of different times, transfers free or costly, some sends dearer than the work."""
    return tuple(StageCost(rng.choice([rng.random(), 1.0, 0.5]), rng.choice([rng.random(), 1.0, 2.0]),
                           rng.choice([0.0, rng.random() * 0.5, 1.0]), rng.choice([0.0, rng.random() * 0.5]))
                 for _ in range(p))


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-9) or (a == b == 0.0)


@pytest.mark.parametrize("name", SCHEDULES)
def test_extrapolated_schedule_equals_the_timed_one(name, monkeypatch):
    """Every schedule, random stage times: past the exact threshold (lowered here to 0) the step time
    comes from a settled shorter schedule, and equals the operation-by-operation one to 1e-9."""
    rng = random.Random(37)
    monkeypatch.setattr(schedule, "EXACT_OPERATIONS", 0)
    used = 0
    for trial in range(12):
        p = rng.randint(1, 5) if trial else 4
        chunks = CHUNKS[name]
        m = (p if name == "interleaved" else 1) * rng.randint(40, 160)
        stages = _stages(rng, p)
        exact = schedule._run_schedule(name, stages, m, chunks, False)
        got = run_schedule(name, stages, m, chunks, record=False)
        used += got != exact
        assert _close(got.end_s, exact.end_s), (name, p, m, stages)
        assert all(map(_close, got.finish_s, exact.finish_s)) and all(map(_close, got.busy_s, exact.busy_s))
    assert used >= 8      # most of them settled: the extrapolation was what was compared


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_million_microbatches_cost_what_a_few_do(name):
    """2^20 micro-batches on 8 stages (past what is timed one by one): the textbook time of uniform
    stages with free transfers, (m + p - 1) T, or m T + (p - 1) T / V interleaved."""
    p, m, chunks = 8, 2**20, CHUNKS[name]
    t = run_schedule(name, [StageCost(1.0, 2.0)] * p, m, chunks, record=False)
    assert t.end_s == pytest.approx(m * 3.0 + (p - 1) * 3.0 / chunks, rel=1e-12)
    assert t.busy_s == pytest.approx([m * 3.0] * p, rel=1e-12)
    assert settled(name, tuple([StageCost(1.0, 2.0, 0.1, 0.2)] * p), 16 * p, chunks) is not None


def test_schedules_listed_one_by_one_are_bounded():
    """A trace (every operation kept) and a schedule that does not settle are listed operation by
    operation: past the declared bound, one line naming the micro-batches and the most allowed."""
    with pytest.raises(InputError, match=r"microbatches=1048576: at most 65536 micro-batches"):
        run_schedule("1f1b", [StageCost(1.0, 2.0)] * 8, 2**20, record=True)
    with pytest.raises(InputError, match="microbatches"):
        schedule.stage_ops("gpipe", 0, 8, 10**20)


def test_a_schedule_that_does_not_settle_is_timed_within_the_bound_or_refused(monkeypatch):
    monkeypatch.setattr(schedule, "settled", lambda *args: None)
    stages = (StageCost(1.0, 2.0, 0.3, 0.1), StageCost(0.5, 1.5))
    m = schedule.EXACT_OPERATIONS          # 2 stages: twice the exact threshold, within the bound
    assert run_schedule("1f1b", stages, m, record=False) == schedule._run_schedule("1f1b", stages, m, 1, False)
    with pytest.raises(InputError, match="microbatches"):
        run_schedule("1f1b", stages, 2**20, record=False)


def _one_line(proc, said):
    err = proc.stderr.strip()
    assert proc.returncode == 2 and said in err and "Traceback" not in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("command, flag, value, said", [
    ("predict", "--gbs", "1048577", "--gbs: '1048577': an integer from 1 to 1048576"),
    ("compare", "--gbs", str(16 * 10**20), "--gbs: '1600000000000000000000'"),
    ("breakeven", "--mbs", "65537", "--mbs: '65537': an integer from 1 to 65536"),
    ("sweep", "--gbs", "1e20", "--gbs: '1e20': an integer from 1 to 1048576"),
])
def test_every_planning_command_bounds_its_batch_sizes(cli, command, flag, value, said):
    extra = ("--target", "+10%") if command == "breakeven" else ("--gbs", "64") if command == "sweep" else ()
    _one_line(cli("perfmodel", command, *hostile.PREDICT, "--gpus", "8", *extra, flag, value), said)


@pytest.mark.parametrize("fields, said", [
    (dict(gbs=2**40), "gbs=1099511627776: an integer from 1 to 1048576"),
    (dict(mbs=10**9), "mbs=1000000000"),
    (dict(mbs=2**16, dp=32), "gbs=2097152: an integer from 1 to 1048576 (the default gbs, mbs 65536 x dp 32"),
    (dict(gbs=64.5), "gbs=64.5"),
    (dict(seq=2**30), "seq=1073741824"),
    (dict(bucket_bytes=2**60), "bucket_bytes="),
])
def test_the_python_api_bounds_batch_sizes_before_any_work(fields, said):
    from perfmodel import predict
    from perfmodel.plan.parallel import PlanRequest

    with pytest.raises(InputError) as err:
        predict("gpt2-small", "dgx-a100", gpus=32, **fields)
    assert said in str(err.value)
    if "dp" not in fields:
        with pytest.raises(InputError):
            PlanRequest.of(**fields)


@pytest.mark.parametrize("config, said", [
    ({"zero_optimization": {"reduce_bucket_size": float("inf")}}, "reduce_bucket_size=Infinity"),
    ({"zero_optimization": {"reduce_bucket_size": float("nan")}}, "reduce_bucket_size=NaN"),
    ({"zero_optimization": {"reduce_bucket_size": 1e300}}, "reduce_bucket_size=1e+300"),
    ({"zero_optimization": {"reduce_bucket_size": "auto"}}, 'reduce_bucket_size="auto"'),
    ({"zero_optimization": {"stage": 1.5}}, "zero_optimization.stage=1.5"),
    ({"zero_optimization": {"zero_hpz_partition_size": float("nan")}}, "zero_hpz_partition_size=NaN"),
    ({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 10**20},
     "gradient_accumulation_steps=100000000000000000000': an integer from 1 to 1048576"),
    ({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1e20}, "gradient_accumulation_steps=1e+20"),
    ({"train_batch_size": 2**21}, "train_batch_size=2097152': an integer from 1 to 1048576"),
    ({"train_micro_batch_size_per_gpu": 2**17}, "train_micro_batch_size_per_gpu=131072': an integer from 1 to 65536"),
    ({"train_micro_batch_size_per_gpu": 64, "gradient_accumulation_steps": 2**20},
     "= 64 x 1048576 x 16 = 1073741824': a global batch (gbs) of at most 1048576 sequences"),
])
def test_deepspeed_numbers_are_whole_and_bounded(config, said):
    from perfmodel.plan.deepspeed import map_config

    with pytest.raises(InputError) as err:
        map_config(config, 8, 16)
    assert said in str(err.value) and err.value.field == "deepspeed"


def test_deepspeed_keys_it_cannot_honour_are_named_with_what_it_takes(cli, tmp_path):
    config = hostile._write(tmp_path, "ds.json", b'{"sparse_attention": {"mode": "fixed"}, '
                            b'"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}}')
    proc = cli("perfmodel", "predict", *hostile.PREDICT, "--gpus", "16", "--deepspeed", config)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert last.startswith("perfmodel: error: deepspeed='sparse_attention.mode, zero_optimization.offload_param"
                           ".device': keys the model cannot honour") and "remove them" in last
    assert "the keys it models are bf16.enabled, fp16.enabled, gradient_accumulation_steps" in last


MOE = dict(num_experts=8, moe_top_k=2, moe_ffn_hidden_size=256)


@pytest.mark.parametrize("changes, said", [
    (dict(num_experts=10**12), "model.num_experts=1000000000000: an integer from 1 to 16384"),
    (dict(moe_ffn_hidden_size=2**40), "model.moe_ffn_hidden_size=1099511627776: an integer from 1 to 1048576"),
    (dict(moe_shared_experts=10**9), "model.moe_shared_experts=1000000000: an integer from 0 to 1024"),
    (dict(moe_top_k=2**20), "model.moe_top_k=1048576"),
    (dict(moe_layer_freq=10**6), "model.moe_layer_freq=1000000"),
    (dict(moe_first_dense=-1), "model.moe_first_dense=-1"),
    (dict(moe_capacity_factor="inf"), "model.moe_capacity_factor=inf"),
    (dict(moe_load_imbalance=1e300), "model.moe_load_imbalance=1e+300"),
    (dict(num_experts=8.0), "model.num_experts=8.0"),
])
def test_moe_keys_are_bounded(tmp_path, changes, said):
    from perfmodel.workload import load_model

    with pytest.raises(InputError) as err:
        load_model(hostile._model(tmp_path, **{**MOE, **changes}))
    assert said in str(err.value)


def test_the_catalog_moe_models_stay_well_inside_the_bounds():
    from perfmodel.workload import MOE_KEYS, model_catalog
    from topologies import bounds

    moe = [m for m in model_catalog().values() if m.is_moe]
    assert any(m.num_experts == 256 for m in moe)        # DeepSeek-V3
    for key in MOE_KEYS:
        if key != "moe_pad_to_capacity":
            assert max(getattr(m, key) for m in moe) * 4 <= bounds.bound(key)[2], key


@pytest.mark.parametrize("text, said", [
    ('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12}',
     "looks like a Hugging Face config.json (model_type 'gpt2')"),
    ('{"hidden_size": 4096, "num_hidden_layers": 32}', "looks like a Hugging Face config.json:"),
    ('{"zero_optimization": {"stage": 1}}', "looks like JSON:"),
    ("hidden_size: 768\nnum_layers: 12\n", "looks like YAML:"),
    ("---\nmodel: gpt2\n", "looks like YAML:"),
    ("hidden_size = \n", "valid TOML (Invalid value"),
])
def test_a_model_file_in_another_format_says_which_and_what_to_pass(cli, tmp_path, text, said):
    path = hostile._write(tmp_path, "config.json", text.encode())
    proc = cli("perfmodel", "predict", "--model", path, "--cluster", "dgx-a100", "--gpus", "8")
    _one_line(proc, said)
    if "looks like" in said:
        assert "a model TOML file" in proc.stderr and "perfmodel catalog models" in proc.stderr
        assert "hidden_size, num_layers" in proc.stderr and "docs/predict.md" in proc.stderr


def test_topologies_and_perfmodel_refuse_the_same_gpus(cli, tmp_path):
    """One check (topologies.clikit.check_gpu): a cluster file's GPU the model does not know is refused by
    topologies show, export and draw as by a prediction, in the same words, before any graph or file."""
    from perfmodel.devices import gpu_catalog
    from topologies.clikit import gpu_keys

    assert gpu_keys() == tuple(gpu_catalog())
    path = hostile._cluster(tmp_path, 'gpu = "v100-pcie-16gb"', 'gpu = "h999"')
    said = "gpu='h999': one of " + ", ".join(gpu_catalog())
    for args in (("topologies", "show", path), ("topologies", "export", path, "-o", str(tmp_path / "never.graphml")),
                 ("perfmodel", "predict", "--model", "gpt2-small", "--cluster", path, "--gpus", "8")):
        proc = cli(*args)
        _one_line(proc, said)
        assert proc.stderr.strip().endswith(said)
    assert not list(tmp_path.glob("never*"))


@pytest.mark.parametrize("args, said", [
    (("realrun", "convergence", "--mbs", "100000"), "--mbs: '100000': an integer from 1 to 65536"),
    (("realrun", "train", "--gbs", str(16 * 10**20)), "--gbs: '1600000000000000000000': an integer from 1 to 1048576"),
    (("realrun", "train", "--mbs", "1e9"), "--mbs: '1e9': an integer from 1 to 65536"),
])
def test_realrun_batch_flags_are_bounded_before_any_run(cli, tmp_path, args, said):
    out = ("--out", str(tmp_path / "never")) if args[1] == "convergence" else ("--metrics", str(tmp_path / "never"))
    _one_line(cli(*args, *out), said)
    assert not (tmp_path / "never").exists()


def test_plans_batched_by_shape_take_the_extrapolated_schedule_past_the_exact_bound():
    """A search batches plans of one shape (``pipeline_spans``); past ``EXACT_OPERATIONS`` each
    distinct one is timed by the extrapolating loop, as the same plan alone is, not refused."""
    from perfmodel.step.schedule import EXACT_OPERATIONS, StageCost, run_schedule
    from perfmodel.step.timing import StageTime, pipeline_spans

    microbatches = 2 * EXACT_OPERATIONS // 4
    shapes = [[StageTime(fwd_op=f, bwd_op=2 * f, send_fwd=1e-4, send_bwd=1e-4) for f in (1e-3, 1.2e-3, 1e-3, 0.9e-3)],
              [StageTime(fwd_op=f, bwd_op=2 * f, send_fwd=2e-4, send_bwd=2e-4) for f in (1e-3, 1e-3, 1.1e-3, 1e-3)]]
    ends, busy = pipeline_spans(shapes + shapes[:1], microbatches, 1)
    for stages, end in zip(shapes + shapes[:1], ends):
        alone = run_schedule("1f1b", [StageCost(s.fwd_op, s.bwd_op, s.send_fwd, s.send_bwd) for s in stages],
                             microbatches, 1, record=False)
        assert end == alone.end_s
    assert ends[0] == ends[2] and busy[0] == busy[2] and ends[0] != ends[1]


@pytest.mark.parametrize("text,looks", [('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}',
                                         "a Hugging Face config.json (model_type 'llama')"),
                                        ('{"nodes": 4}', "JSON"), ("nodes: 4\ngpu: h100\n", "YAML")])
def test_a_cluster_file_in_another_format_says_which_and_what_to_pass(cli, tmp_path, text, looks):
    path = hostile._write(tmp_path, "cluster.json", text.encode())
    for args in (("topologies", "show", path), ("perfmodel", "predict", "--model", "gpt2-small", "--cluster", path,
                                                "--gpus", "8")):
        proc = cli(*args)
        _one_line(proc, f"this looks like {looks}")
        assert "topologies list" in proc.stderr and "Write a cluster file" in proc.stderr
