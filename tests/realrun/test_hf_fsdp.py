"""Issue 37: unmodified Hugging Face GPT-2 and Llama models under FSDP2 on two gloo ranks with
realrun's compressed all-gather and reduce-scatter (``realrun.fsdp``), against plain FSDP2 from
the same weights and batches (marker: distributed); and its refusals."""
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (the real extra)")
pytest.importorskip("transformers", reason="transformers is not installed (the dev extra)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (the real extra)")

WORKER = Path(__file__).with_name("hf_fsdp_worker.py")
STEPS = 3


def _run(arch: str, dtype: str, policy: str, tmp_path, run_ranks, port: int) -> dict:
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_NUM_THREADS", "COMMPRESS_CODEC_THREADS")}
    env.update(GLOO_SOCKET_IFNAME="lo", TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1")
    logs = run_ranks([[sys.executable, str(WORKER), str(r), "2", str(port), arch, dtype, policy, str(STEPS), str(out)]
                      for r in range(2)], 240, env)
    assert "Traceback" not in "".join(logs), "\n".join(f"rank {r}: {log[-2000:]}" for r, log in enumerate(logs))
    return json.loads(out.read_text())


@pytest.mark.distributed
@pytest.mark.parametrize("arch,dtype", [("gpt2", "fp32"), ("llama", "bf16")])
def test_a_lossless_policy_trains_exactly_as_plain_fsdp2(arch, dtype, tmp_path, launch_ranks, free_port):
    run = _run(arch, dtype, "naive:lossless(codec=zstd)", tmp_path, launch_ranks, free_port())
    assert run["modules"] == ["root"] + [m for m in run["modules"] if m != "root"] and len(run["modules"]) == 3
    assert run["compressed"] == run["plain"]                  # bit-equal losses, step by step
    assert run["eval_compressed"] == run["eval_plain"]
    for direction in ("all_gather", "reduce_scatter"):
        s = run["stats"][direction]
        assert s["calls"] >= STEPS * run["blocks"] and s["bytes_in"] > 0 and s["plain_bytes"] == 0, direction


@pytest.mark.distributed
@pytest.mark.parametrize("arch,dtype,policy", [("gpt2", "bf16", "zeropp"), ("llama", "fp32", "dp=ef(int4),zero=fp8")])
def test_lossy_policies_stay_close_to_plain_fsdp2_and_ranks_agree(arch, dtype, policy, tmp_path, launch_ranks,
                                                                 free_port):
    run = _run(arch, dtype, policy, tmp_path, launch_ranks, free_port())
    assert run["compressed"] != run["plain"]                  # the compression did act
    assert max(abs(a - b) for a, b in zip(run["compressed"], run["plain"])) < 0.05
    # every rank decodes every shard, its own too: all compute with the same gathered weights
    assert len(set(run["eval_compressed"])) == 1
    for direction in ("all_gather", "reduce_scatter"):
        s = run["stats"][direction]
        assert 0 < s["bytes_out"] < 0.6 * s["bytes_in"], direction   # 8-bit weights, 4-bit gradients
    # error feedback keeps one residual per parameter group (and reduce-scatter part), nothing else does
    groups = {key.split("/")[0] for key in run["residuals"]}
    assert groups == (set(run["modules"]) if policy.startswith("dp=ef") else set()), run["residuals"]


def test_a_model_without_fsdp2_modules_or_a_bad_policy_is_refused_in_one_line():
    import torch

    from realrun.fsdp import compress_fsdp
    from topologies.errors import InputError

    with pytest.raises(InputError, match="fully_shard"):
        compress_fsdp(torch.nn.Linear(4, 4), "zeropp")
    with pytest.raises(InputError, match="policy"):
        compress_fsdp(torch.nn.Linear(4, 4), "")
    with pytest.raises(InputError):
        compress_fsdp(torch.nn.Linear(4, 4), "int8(block=-1)")
