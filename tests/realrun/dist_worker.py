"""Worker run by test_comm.py in every rank: exercises the compressed collectives and
writes what it saw to OUT/rank{r}.json. Run as: python dist_worker.py RANK WORLD PORT OUT."""
import hashlib
import json
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from realrun.comm import RUNTIME_ALGORITHMS, allgather, allreduce, broadcast, recv, reduce_scatter, send
from topologies.errors import InputError

SPECS = ("none", "lossless", "fp16", "bf16", "int8", "topk(0.5)")
LENGTHS = (1, 7, 1001)


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.numpy().tobytes()).hexdigest()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm((a - b).double()) / max(float(torch.linalg.norm(b.double())), 1e-30))


def main(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=90))
    local = 2 if world % 2 == 0 else world
    rows = []
    for n in LENGTHS:
        x = torch.from_numpy(np.random.default_rng(100 * rank + n).standard_normal(n).astype(np.float32))
        exact = x.clone()
        dist.all_reduce(exact)
        for spec in SPECS:
            for alg in ("auto",) + RUNTIME_ALGORITHMS:
                y = allreduce(x, spec, alg, local_size=local)
                rows.append({"op": "allreduce", "n": n, "spec": spec, "alg": alg, "digest": digest(y),
                             "shape": list(y.shape), "error": rel(y, exact)})
            if spec in ("int8", "topk(0.5)", "none"):
                for chunks in (2, 5):
                    y = allreduce(x, spec, "allgather", chunks=chunks)
                    rows.append({"op": "allreduce", "n": n, "spec": spec, "alg": f"allgather/{chunks}",
                                 "digest": digest(y), "shape": list(y.shape), "error": rel(y, exact)})
            g = allgather(x, spec)
            rows.append({"op": "allgather", "n": n, "spec": spec, "digest": digest(g), "shape": list(g.shape),
                         "error": 0.0})
            r = reduce_scatter(x, spec)
            full = torch.cat([torch.from_numpy(np.zeros(0, np.float32))] + [r])
            rows.append({"op": "reduce_scatter", "n": n, "spec": spec, "digest": "", "shape": list(full.shape),
                         "error": rel(r, exact[_part(n, world, rank)])})
            if 1 < local < world:   # ZeRO++ qgZ: in-node, then across nodes
                h = reduce_scatter(x, spec, local_size=local)
                rows.append({"op": "reduce_scatter", "alg": "hierarchical", "n": n, "spec": spec, "digest": "",
                             "shape": list(h.shape), "error": rel(h, exact[_part(n, world, rank)]),
                             "same_part": list(h.shape) == list(r.shape)})
            b = broadcast(x, spec, src=world - 1)
            rows.append({"op": "broadcast", "n": n, "spec": spec, "digest": digest(b), "shape": list(b.shape),
                         "error": 0.0})
    for bad in (dict(spec="sz3(abs=1e-3)", algorithm="allgather"), dict(spec="int8", algorithm="two_phase")):
        try:
            allreduce(torch.ones(8), chunks=2, **bad)
            refused = False
        except InputError:
            refused = True
        rows.append({"op": "chunks_refused", "n": 8, "spec": bad["spec"], "digest": "", "shape": [], "error": 0.0,
                     "refused": refused})
    if world > 1:   # a pipeline boundary: rank r sends to r + 1
        msg = torch.arange(50, dtype=torch.float32) * (rank + 1)
        if rank + 1 < world:
            send(msg, "int8", rank + 1)
        if rank > 0:
            got = recv(msg, "int8", rank - 1)
            rows.append({"op": "sendrecv", "n": 50, "spec": "int8", "digest": "", "shape": list(got.shape),
                         "error": rel(got, torch.arange(50, dtype=torch.float32) * rank)})
    with open(f"{out}/rank{rank}.json", "w") as handle:
        json.dump(rows, handle)
    dist.barrier()
    dist.destroy_process_group()


def _part(n: int, p: int, rank: int) -> slice:
    base, extra = divmod(n, p)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
