"""realrun runs the recipe presets of issue 40: LoCo's residual (moving average, int8 state, reset),
1-bit and 0/1 Adam's step schedule, the refusals (ZeRO, the DDP hook's momentum recipes) and a short
``realrun train`` per preset against ``none`` (marker: distributed)."""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from perfmodel.compression.policy import parse_policy
from topologies.errors import InputError

torch = pytest.importorskip("torch")

from realrun.compressors import Compressor  # noqa: E402
from realrun.hooks import compression_hook  # noqa: E402
from realrun.train.config import TrainConfig  # noqa: E402
from realrun.train.onebit import CompressedAdam  # noqa: E402


def test_loco_residual_is_a_moving_average_kept_in_int8_and_reset():
    rng = np.random.default_rng(0)
    x1, x2 = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
    full = Compressor("ef(int4,beta=0.8)", seed=0)
    full.compress(x1, key="k")
    key = next(k for k in full.ctx.state)
    e1 = full.ctx.state[key].copy()
    y = full.decompress(full.compress(x2, key="k").data)
    fresh = (x2 + e1) - y                       # this call's error
    assert np.allclose(full.ctx.state[key], 0.8 * e1 + 0.2 * fresh, atol=1e-6)

    small = Compressor("ef(int4,beta=0.8,state=int8)", seed=0)
    small.compress(x1, key="k")
    codes = [v for k, v in small.ctx.state.items() if k[-1] == "codes"]
    assert len(codes) == 1 and codes[0].dtype == np.int8 and codes[0].size >= 1000

    reset = Compressor("ef(int4,reset=2)", seed=0)
    plain = Compressor("int4", seed=0)
    outs = [reset.decompress(reset.compress(x, key="k").data) for x in (x1, x2, x1)]
    assert np.array_equal(outs[2], plain.decompress(plain.compress(x1).data))   # third call: residual restarted
    assert not np.array_equal(outs[1], plain.decompress(plain.compress(x2).data))


def _adam(policy: str, steps: int) -> CompressedAdam:
    return CompressedAdam([], None, parse_policy(policy).axis("dp"), parse_policy(policy).recipe, 2, steps, 1e-3)


def test_onebit_adam_warms_up_uncompressed_then_compresses_the_momentum():
    opt = _adam("onebit-adam", 20)
    assert [opt.mode(t) for t in range(1, 21)] == ["exact"] * 3 + ["momentum"] * 17   # 15% of 20 steps
    assert [_adam("onebit-adam,warmup=0.5", 10).mode(t) for t in (5, 6)] == ["exact", "momentum"]


def test_zero_one_adam_updates_the_variance_on_its_schedule_then_takes_local_steps():
    opt = _adam("zero-one-adam,var_update_scaler=2,var_freeze=0.5,local_step_scaler=2,local_step_clipper=4", 20)
    modes = [opt.mode(t) for t in range(1, 21)]
    assert modes[:10] == ["exact", "exact", "gradient", "exact", "gradient", "exact", "gradient", "exact",
                          "gradient", "gradient"]
    # the interval doubles every 2 local steps, up to 4: steps 1, 2, 4, 8 after the freeze synchronise
    assert modes[10:] == ["sync", "sync", "local", "sync", "local", "local", "local", "sync", "local", "local"]
    default = _adam("zero-one-adam", 20)      # DeepSpeed's var_update_scaler 16: 16 steps at interval 1, then 2
    assert [default.mode(t) for t in range(1, 21)] == ["exact"] * 16 + ["gradient", "exact"] * 2


@pytest.mark.parametrize("policy,zero,field", [("onebit-adam", 1, "zero"), ("zero-one-adam", 1, "zero"),
                                               ("powersgd", 1, "zero")])
def test_train_refuses_a_zero_stage_the_recipe_does_not_run(policy, zero, field):
    with pytest.raises(InputError) as err:
        TrainConfig.of(model="gpt-tiny", dp=2, zero=zero, mbs=4, seq=64, policy=policy)
    assert err.value.field == field
    TrainConfig.of(model="gpt-tiny", dp=2, zero=1, mbs=4, seq=64, policy="loco")


def test_the_ddp_hook_takes_gradient_recipes_and_refuses_momentum_ones():
    state, _ = compression_hook("powersgd", total_steps=50)
    assert state.spec == "ef(powersgd(rank=1))" and state.warmup_steps == 5     # start_powerSGD_iter: 10%
    assert compression_hook("powersgd", warmup_steps=7)[0].warmup_steps == 7
    assert compression_hook("loco")[0].warmup_steps == 0
    for policy in ("onebit-adam", "zero-one-adam"):
        with pytest.raises(InputError, match="momentum") as err:
            compression_hook(policy, total_steps=50)
        assert err.value.field == "spec_or_policy"
    with pytest.raises(InputError) as err:
        compression_hook("powersgd")          # a share of what run?
    assert err.value.field == "total_steps"


def _train(tmp_path, name, *args):
    exe = shutil.which("realrun", path=os.path.dirname(sys.executable)) or "realrun"
    out = tmp_path / f"{name}.jsonl"
    proc = subprocess.run([exe, "train", "--model", "gpt-tiny", "--seq", "64", "--dp", "2", "--mbs", "4",
                           "--eval-every", "0", "--error-every", "0", "--metrics", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("none"), "none", "--steps", "10", "--policy", "none")


@pytest.mark.distributed
@pytest.mark.parametrize("policy,uncompressed", [
    ("powersgd", {1}), ("loco", set()), ("onebit-adam", {1, 2}),              # 10% and 15% of 10 steps, rounded up
    ("zero-one-adam,var_update_scaler=2", {1, 2, 4, 6, 8})])                  # its variance steps
def test_each_preset_trains_with_its_warmup_honoured(tmp_path, baseline, policy, uncompressed):
    steps = _train(tmp_path, "r", "--steps", "10", "--policy", policy)
    full = baseline[0]["dp_wire_bytes"]
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert {i for i, r in enumerate(steps, 1) if r["dp_wire_bytes"] == full} == uncompressed
    assert all(r["dp_wire_bytes"] < full / 4 for i, r in enumerate(steps, 1) if i not in uncompressed)
    warm = min({11} | (set(range(1, 11)) - uncompressed)) - 1    # steps before the first compressed one
    # identical to none while uncompressed (the momentum recipes run Adam as torch's AdamW does)
    assert [r["loss"] for r in steps[:warm]] == pytest.approx([r["loss"] for r in baseline[:warm]], rel=1e-5)
    assert np.mean([r["loss"] for r in steps[-3:]]) < steps[0]["loss"] - 1.0


@pytest.mark.distributed
def test_zero_one_adam_local_steps_send_nothing(tmp_path, baseline):
    steps = _train(tmp_path, "zo", "--steps", "10", "--policy",
                   "zero-one-adam,var_update_scaler=2,var_freeze=0.5,local_step_scaler=2,local_step_clipper=4")
    sent = [r["dp_wire_bytes"] for r in steps]
    assert sent[0] == sent[1] == baseline[0]["dp_wire_bytes"] and 0 < sent[2] < sent[0] / 4
    assert sent[5:] == [sent[5], sent[6], 0, sent[8], 0] and sent[5] > 0
    assert all(math.isfinite(r["loss"]) for r in steps)
