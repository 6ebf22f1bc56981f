"""DDP with the compression hook on gloo ranks (marker: distributed)."""
import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the real extra)")
pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = Path(__file__).with_name("ddp_worker.py")
# Stated tolerance: final loss (mean of the last 10 steps) within these factors of uncompressed.
TOLERANCE = {"ef(int8)": 1.10, "ef(topk(0.01))": 1.6}


def _train(spec: str, world: int, tmp_path, run_ranks, port: int) -> dict:
    out = tmp_path / f"{spec}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}   # one thread a rank, as realrun runs
    run_ranks([[sys.executable, str(WORKER), str(r), str(world), str(port), spec, str(out)] for r in range(world)],
              300, env)
    return json.loads(out.read_text())


def test_compressed_ddp_trains_like_uncompressed(tmp_path, launch_ranks, free_port):
    base = _train("none", 2, tmp_path, launch_ranks, free_port())
    final = sum(base["losses"][-10:]) / 10
    assert final < 0.5 * base["losses"][0]          # it learns
    for spec, factor in TOLERANCE.items():
        run = _train(spec, 2, tmp_path, launch_ranks, free_port())
        assert sum(run["losses"][-10:]) / 10 <= factor * final, (spec, run["losses"][-10:], final)
        stats = run["stats"]
        assert stats["bytes_out"] < stats["bytes_in"] and stats["buckets"] > 0 and run["steps"] > 100
