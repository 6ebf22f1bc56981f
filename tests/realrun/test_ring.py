"""One ring step (realrun.comm.Comm.shift, context parallelism's K/V pass) on gloo with 2-4
processes (marker: distributed)."""
import json
import sys
from pathlib import Path

import pytest

from perfmodel.compression import compile_spec

torch = pytest.importorskip("torch", reason="torch is not installed (the real extra)")
pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("ring_worker.py")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_shift_passes_each_block_to_the_next_rank_compressed_once(world, tmp_path, launch_ranks):
    if not torch.distributed.is_gloo_available():
        pytest.skip("gloo is not available in this torch build")
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    launch_ranks([[sys.executable, "-P", str(WORKER), str(r), str(world), str(tmp_path / "store"), str(tmp_path)]
                  for r in range(world)], 180, env)
    for rank in range(world):
        rows = json.loads((tmp_path / f"rank{rank}.json").read_text())
        cases = [r for r in rows if r["spec"] != "module"]
        assert len(cases) == (4 if world == 4 else 2)
        for row in cases:
            assert row["shape"] == [2, 3, 40, 8] and row["bytes_out"] == row["wire"], row
            if row["spec"] == "none":
                assert row["error"] == 0.0, row          # the previous rank's very bits
            else:
                assert 0 < row["error"] <= 1.5 * compile_spec("int8").error, row
                assert row["wire"] < 0.3 * 2 * 3 * 40 * 8 * 4
        assert next(r for r in rows if r["spec"] == "module")["equal"]
        if world == 4:
            assert {tuple(r["members"]) for r in cases} == {tuple(range(4)), (0, 2) if rank % 2 == 0 else (1, 3)}
