"""Issue 37: unmodified Hugging Face GPT-2 and Llama models in fp32 and bf16 under DDP on two
gloo ranks with realrun's compression hook, against plain DDP from the same weights and batches;
every all-reduce algorithm serves the dtype (marker: distributed). No thread variable is set:
realrun's defaults apply."""
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (the real extra)")
pytest.importorskip("transformers", reason="transformers is not installed (the dev extra)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (the real extra)")
pytestmark = [pytest.mark.distributed]

WORKER = Path(__file__).with_name("hf_ddp_worker.py")
THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "COMMPRESS_CODEC_THREADS", "LOCAL_WORLD_SIZE")
STEPS = 3


def _run(arch: str, dtype: str, spec: str, tmp_path, run_ranks, port: int, world: int = 2) -> dict:
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env.update(GLOO_SOCKET_IFNAME="lo", TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1")
    logs = run_ranks([[sys.executable, str(WORKER), str(r), str(world), str(port), arch, dtype, spec, str(STEPS),
                       str(out)] for r in range(world)], 240, env)
    assert "Traceback" not in "".join(logs), "\n".join(f"rank {r}: {log[-2000:]}" for r, log in enumerate(logs))
    return json.loads(out.read_text())


def _common(run: dict, dtype: str) -> None:
    torch_dtype = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}[dtype]
    assert run["param_dtype"] == torch_dtype and run["grad_dtypes"] == [torch_dtype]
    assert run["ranks_agree"]                                   # every rank applied the same averaged gradients
    assert run["buckets"] > 3
    for alg, res in run["allreduce"].items():
        assert res == {"dtype": torch_dtype, "agree": True}, alg


@pytest.mark.parametrize("arch,dtype,spec", [("gpt2", "bf16", "int8"), ("llama", "fp32", "ef(topk(0.01))+int8"),
                                             ("llama", "bf16", "ef(topk(0.01))+int8")])
def test_hf_models_train_under_ddp_with_a_lossy_hook_close_to_plain(arch, dtype, spec, tmp_path, launch_ranks,
                                                                    free_port):
    run = _run(arch, dtype, spec, tmp_path, launch_ranks, free_port())
    _common(run, dtype)
    assert 0 < run["bytes_out"] < run["bytes_in"]
    assert run["losses"][0] == run["plain"][0]                 # the first forward precedes any exchange
    assert run["losses"] != run["plain"] and max(abs(a - b) for a, b in zip(run["losses"], run["plain"])) < 0.1


@pytest.mark.parametrize("arch,dtype", [("gpt2", "fp32"), ("llama", "bf16")])
def test_a_lossless_hook_trains_exactly_as_plain_ddp(arch, dtype, tmp_path, launch_ranks, free_port):
    run = _run(arch, dtype, "lossless(codec=zstd)", tmp_path, launch_ranks, free_port())
    _common(run, dtype)
    assert run["losses"] == run["plain"]                       # bit-equal, step by step
