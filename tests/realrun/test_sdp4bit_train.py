"""realrun runs ``sdp4bit`` (SDP4Bit, Jia et al. 2024): the Hadamard smoother and the two-level quantizer
on one tensor, the refusals (ZeRO-0 and ZeRO-3 under train, the DDP hook), and a short ``realrun train
--zero 1`` whose parameter gather sends weight differences (marker: distributed)."""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from topologies.errors import InputError

torch = pytest.importorskip("torch")

from realrun.compressors import Compressor  # noqa: E402
from realrun.hooks import compression_hook  # noqa: E402
from realrun.train.config import TrainConfig  # noqa: E402


def _error(spec: str, x: np.ndarray) -> float:
    c = Compressor(spec)
    y = c.decompress(c.compress(x))
    return float(np.linalg.norm(y.astype(np.float64) - x) / np.linalg.norm(x))


def test_the_hadamard_transform_is_inverted_exactly_and_keeps_huge_values_finite():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)   # 31 whole blocks of 32 and a partial one
    assert _error("hadamard", x) < 1e-6
    huge = np.full(64, 3e38, np.float32)
    c = Compressor("hadamard")
    assert np.allclose(c.decompress(c.compress(huge)), huge, rtol=1e-6)


def test_the_smoother_shrinks_the_error_of_4_bits_on_outliers():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1 << 14).astype(np.float32)
    x[rng.choice(len(x), 64, replace=False)] *= 50      # heavy tails: what the paper's Figure shows of gradients
    assert _error("hadamard+int4(block=128)", x) < 0.7 * _error("int4(block=128)", x)


def test_tlq_on_one_tensor_is_its_intra_node_tier():
    x = np.random.default_rng(2).standard_normal(4096).astype(np.float32)
    a, b = Compressor("tlq"), Compressor("hadamard+int8(block=128)")
    assert np.array_equal(a.decompress(a.compress(x)), b.decompress(b.compress(x)))


@pytest.mark.parametrize("zero", [0])
def test_train_refuses_the_zero_stages_it_does_not_run(zero):
    with pytest.raises(InputError) as err:
        TrainConfig.of(model="gpt-tiny", dp=2, zero=zero, mbs=4, seq=64, policy="sdp4bit")
    assert err.value.field == "zero"
    TrainConfig.of(model="gpt-tiny", dp=2, zero=1, mbs=4, seq=64, policy="sdp4bit")


def test_the_ddp_hook_refuses_it_in_one_line():
    with pytest.raises(InputError) as err:
        compression_hook("sdp4bit", total_steps=10)
    assert "zero 1" in str(err.value)


def _train(tmp_path, policy: str):
    exe = shutil.which("realrun", path=os.path.dirname(sys.executable)) or "realrun"
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "metrics.jsonl"
    proc = subprocess.run([exe, "train", "--model", "gpt-tiny", "--seq", "64", "--dp", "2", "--mbs", "4",
                           "--zero", "1", "--steps", "8", "--eval-every", "0", "--error-every", "0",
                           "--metrics", str(out), "--policy", policy], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.distributed
def test_zero1_trains_with_4_bit_weight_differences(tmp_path):
    none = _train(tmp_path / "none", "none")
    sdp = _train(tmp_path / "sdp", "sdp4bit")
    assert all(math.isfinite(r["loss"]) for r in sdp)
    assert sdp[0]["loss"] == pytest.approx(none[0]["loss"], rel=1e-5)    # the same weights before any gather
    # fp32 weights in 4-bit groups of 2048 (a fp32 scale each): under a seventh of the bytes
    assert all(r["zero_wire_bytes"] < none[0]["zero_wire_bytes"] / 7 for r in sdp)
    assert all(r["dp_wire_bytes"] < none[0]["dp_wire_bytes"] / 3 for r in sdp)
    assert abs(np.mean([r["loss"] for r in sdp[-3:]]) - np.mean([r["loss"] for r in none[-3:]])) < 0.3
