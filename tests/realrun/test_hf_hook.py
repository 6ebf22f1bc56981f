"""Issue 37: an unmodified Hugging Face GPT-2 in bf16 under DDP on two gloo ranks with realrun's
compression hook runs, its ranks agree, and every all-reduce algorithm serves bf16 (marker:
distributed). No thread variable is set: realrun's defaults apply."""
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


def _run(spec: str, steps: int, tmp_path, run_ranks, port: int, world: int = 2) -> dict:
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env.update(GLOO_SOCKET_IFNAME="lo", TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1")
    logs = run_ranks([[sys.executable, str(WORKER), str(r), str(world), str(port), spec, str(steps), str(out)]
                      for r in range(world)], 240, env)
    assert "Traceback" not in "".join(logs), "\n".join(f"rank {r}: {log[-2000:]}" for r, log in enumerate(logs))
    return json.loads(out.read_text())


@pytest.mark.parametrize("spec", ["int8", "ef(topk(0.01))+int8"])
def test_bf16_hf_gpt2_trains_under_ddp_with_the_hook(spec, tmp_path, launch_ranks, free_port):
    run = _run(spec, 3, tmp_path, launch_ranks, free_port())
    assert run["param_dtype"] == "torch.bfloat16" and run["grad_dtypes"] == ["torch.bfloat16"]
    assert run["ranks_agree"]                                   # every rank applied the same averaged gradients
    assert len(run["losses"]) == 3 and all(0 < v < 20 for v in run["losses"])
    assert run["buckets"] > 3 and 0 < run["bytes_out"] < run["bytes_in"]
    for alg, res in run["allreduce"].items():
        assert res == {"dtype": "torch.bfloat16", "agree": True}, alg
