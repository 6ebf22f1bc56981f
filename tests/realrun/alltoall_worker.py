"""Worker run by test_alltoall.py in every rank: the compressed all-to-all against what each
rank sent (every rank's input is drawn from its rank's seed, so any rank can rebuild it), and
writes what it saw to OUT/rank{r}.json. Run as: python alltoall_worker.py RANK WORLD STORE OUT."""
import json
import sys
from functools import cache
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from perfmodel.compression import compile_spec
from realrun.comm import Comm, CommStats, alltoall
from topologies.errors import InputError

SPECS = ("none", "lossless", "fp16", "bf16", "fp8", "int8")
WIDTH = 48   # values per row (a token's hidden vector)


def rows_to(src: int, dst: int) -> int:
    """Rows rank ``src`` sends to rank ``dst`` (uneven, some zero)."""
    return (3 * src + 5 * dst) % 7 * 9


@cache
def data(src: int, p: int) -> torch.Tensor:
    n = sum(rows_to(src, j) for j in range(p))
    return torch.from_numpy(np.random.default_rng(src).standard_normal((n, WIDTH)).astype(np.float32) * (src + 1))


def chunk(src: int, dst: int, p: int) -> torch.Tensor:
    start = sum(rows_to(src, j) for j in range(dst))
    return data(src, p)[start:start + rows_to(src, dst)]


def main(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    comm, x, rows = Comm(), data(rank, world), []
    splits = [rows_to(rank, j) for j in range(world)]
    out_splits = [rows_to(i, rank) for i in range(world)]
    torch_out = torch.empty(sum(out_splits), WIDTH)
    dist.all_to_all_single(torch_out, x, out_splits, splits)
    for spec in SPECS:
        for known in (True, False):
            stats = CommStats()
            counts = np.array(splits) if known else splits   # numpy counts are row counts too
            y = comm.alltoall(x, spec, list(counts), out_splits if known else None, key="tokens", stats=stats)
            edges = np.cumsum([0, *out_splits])
            errors = [rel(y[edges[i]:edges[i + 1]], chunk(i, rank, world)) for i in range(world)]
            sent = [rows_to(rank, j) * WIDTH for j in range(world) if j != rank]
            codec = compile_spec(spec)
            wire = sum(n * 4 if codec.is_none else codec.wire_bytes(n, 4) for n in sent) if codec.exact or \
                codec.is_none else None
            rows.append({"spec": spec, "known": known, "shape": list(y.shape), "errors": errors,
                         "max_abs": [amax(y[edges[i]:edges[i + 1]] - chunk(i, rank, world)) for i in range(world)],
                         "absmax": [amax(chunk(i, rank, world)) for i in range(world)],
                         "equal_torch": bool(torch.equal(y, torch_out)), "bytes_out": stats.bytes_out,
                         "bytes_in": stats.bytes_in, "wire": wire, "sent": sum(sent) * 4})
    even = torch.arange(world * 6 * 4, dtype=torch.float32).reshape(world * 6, 4) + 1000 * rank
    y = alltoall(even, "none")   # default splits: equal shares, every rank the same length
    want = torch.cat([torch.arange(world * 6 * 4, dtype=torch.float32).reshape(world * 6, 4)[6 * rank:6 * rank + 6]
                      + 1000 * i for i in range(world)])
    rows.append({"spec": "default", "equal": bool(torch.equal(y, want)), "shape": list(y.shape)})
    refused = []
    for bad in (dict(splits=[1] * (world + 1)), dict(splits=[-1] + [0] * (world - 1)), dict(algorithm="hierarchical"),
                dict(splits=[len(x) + 1] + [0] * (world - 1)), dict(spec="fp9"), dict(out_splits=[1])):
        try:
            comm.alltoall(x, **{"spec": "int8", **bad})
            refused.append(False)
        except InputError as exc:
            refused.append(len(str(exc).splitlines()) == 1)
    rows.append({"spec": "refused", "refused": refused})
    with open(f"{out}/rank{rank}.json", "w") as handle:
        json.dump(rows, handle)
    dist.barrier()
    dist.destroy_process_group()


def amax(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm((a - b).double()) / max(float(torch.linalg.norm(b.double())), 1e-30))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
