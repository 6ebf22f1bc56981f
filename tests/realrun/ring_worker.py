"""Worker run by test_ring.py in every rank: one ring step (realrun.comm.Comm.shift) over the
whole world and over two-rank subgroups, against what the previous rank sent (every rank's
tensor is drawn from its rank's seed), written to OUT/rank{r}.json.
Run as: python ring_worker.py RANK WORLD STORE OUT."""
import json
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from perfmodel.compression import compile_spec
from realrun.comm import Comm, CommStats, shift

SPECS = ("none", "int8")
SHAPE = (2, 3, 40, 8)   # (batch, heads, tokens, head dim): a K/V block


def data(rank: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(rank).standard_normal(SHAPE).astype(np.float32) * (rank + 1))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm((a - b).double()) / torch.linalg.norm(b.double()))


def _case(comm: Comm, members: list[int], rank: int, spec: str) -> dict:
    stats = CommStats()
    y = comm.shift(data(rank), spec, key="kv", stats=stats)
    prev = members[(members.index(rank) - 1) % len(members)]
    codec = compile_spec(spec)
    n = int(np.prod(SHAPE))
    return {"spec": spec, "members": members, "prev": prev, "shape": list(y.shape), "error": rel(y, data(prev)),
            "bytes_out": stats.bytes_out, "wire": n * 4 if codec.is_none else codec.wire_bytes(n, 4)}


def main(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    rows = [_case(Comm(), list(range(world)), rank, spec) for spec in SPECS]
    rows.append({"spec": "module", "equal": bool(torch.equal(shift(data(rank)), data((rank - 1) % world)))})
    if world == 4:   # two rings, (0, 2) and (1, 3): group order, global ranks
        mine = None
        for members in ([0, 2], [1, 3]):
            group = dist.new_group(members)
            if rank in members:
                mine = (group, members)
        rows += [_case(Comm(mine[0]), mine[1], rank, spec) for spec in SPECS]
    with open(f"{out}/rank{rank}.json", "w") as handle:
        json.dump(rows, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
