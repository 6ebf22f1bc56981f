"""The compressed all-to-all (realrun.comm.Comm.alltoall) on gloo with 2-4 processes (marker: distributed)."""
import json
import sys
from pathlib import Path

import pytest

from perfmodel.compression import compile_spec

torch = pytest.importorskip("torch", reason="torch is not installed (the real extra)")
pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("alltoall_worker.py")
LOSSY = ("fp16", "bf16", "fp8", "int8")


def _run(world: int, tmp_path, run_ranks) -> list[list[dict]]:
    if not torch.distributed.is_gloo_available():
        pytest.skip("gloo is not available in this torch build")
    store = tmp_path / "store"
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run_ranks([[sys.executable, "-P", str(WORKER), str(r), str(world), str(store), str(tmp_path)]
               for r in range(world)], 180, env)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_alltoall_is_exact_for_none_and_bounded_per_chunk_for_lossy_specs(world, tmp_path, launch_ranks):
    for rank, rows in enumerate(_run(world, tmp_path, launch_ranks)):
        cases = [r for r in rows if r["spec"] not in ("default", "refused")]
        assert {r["spec"] for r in cases} == {"none", "lossless", *LOSSY}
        for row in cases:
            assert row["shape"][1] == 48
            if row["spec"] in ("none", "lossless"):   # the very bits torch's all_to_all_single moves
                assert row["equal_torch"], row
                assert max(row["errors"]) == 0.0
                continue
            codec = compile_spec(row["spec"])
            assert row["errors"][rank] == 0.0 and row["max_abs"][rank] == 0.0   # the own chunk crosses no link
            others = [i for i in range(world) if i != rank and row["absmax"][i] > 0]
            assert others, row
            for i in others:   # each chunk compressed once: one application's error, per chunk
                assert 0 < row["errors"][i] <= 1.5 * codec.error, (row["spec"], i, row["errors"][i], codec.error)
                if row["spec"] == "int8":     # blockwise absmax: half a step of the block's scale
                    assert row["max_abs"][i] <= row["absmax"][i] / 254 * 1.01, row
                if row["spec"] == "fp8":      # e4m3: 3 mantissa bits under a scale
                    assert row["max_abs"][i] <= row["absmax"][i] / 16, row
        for row in cases:
            assert row["bytes_in"] == row["sent"]     # what this rank sent (its own chunk stays)
            if row["wire"] is not None:               # the model's wire size is the payload's, chunk by chunk
                assert row["bytes_out"] == row["wire"], row
            elif row["spec"] == "lossless":
                assert 0 < row["bytes_out"] < row["sent"] + 64 * world
        known = {(r["spec"], r["known"]): r for r in cases}
        for spec in {r["spec"] for r in cases}:   # the size round changes nothing but its cost
            assert known[spec, True]["errors"] == known[spec, False]["errors"]
        default, refused = (next(r for r in rows if r["spec"] == name) for name in ("default", "refused"))
        assert default["equal"] and default["shape"] == [6 * world, 4]
        assert refused["refused"] == [True] * 6


def test_alltoall_on_one_rank_is_a_copy(tmp_path):
    import torch.distributed as dist

    from realrun.comm import Comm

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 's'}", rank=0, world_size=1)
    try:
        x = torch.randn(5, 3)
        y = Comm().alltoall(x, "fp8")
        assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()
    finally:
        dist.destroy_process_group()
