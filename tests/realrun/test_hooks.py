"""DDP with the compression hook on gloo ranks (marker: distributed)."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the real extra)")
pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = Path(__file__).with_name("ddp_worker.py")
# Stated tolerance: final loss (mean of the last 10 steps) within these factors of uncompressed.
TOLERANCE = {"ef(int8)": 1.10, "ef(topk(0.01))": 1.6}


def _train(spec: str, world: int, tmp_path) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / f"{spec}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}   # one thread a rank, as realrun runs
    argv = [str(WORKER), str(world), str(port), spec, str(out)]
    procs = [subprocess.Popen([sys.executable, argv[0], str(r), *argv[1:]], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for r in range(world)]
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in procs]
    tails = "\n".join(f"rank {r}: {log[-1500:]}" for r, log in enumerate(logs))
    assert codes == [0] * world, f"{spec}: exit codes {codes}\n{tails}"
    return json.loads(out.read_text())


def test_compressed_ddp_trains_like_uncompressed(tmp_path):
    base = _train("none", 2, tmp_path)
    final = sum(base["losses"][-10:]) / 10
    assert final < 0.5 * base["losses"][0]          # it learns
    for spec, factor in TOLERANCE.items():
        run = _train(spec, 2, tmp_path)
        assert sum(run["losses"][-10:]) / 10 <= factor * final, (spec, run["losses"][-10:], final)
        stats = run["stats"]
        assert stats["bytes_out"] < stats["bytes_in"] and stats["buckets"] > 0 and run["steps"] > 100
