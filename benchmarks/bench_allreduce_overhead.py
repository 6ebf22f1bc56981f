#!/usr/bin/env python3
"""realrun's uncompressed all-reduce against plain in-place ``torch.distributed.all_reduce``.

4 local gloo ranks (one thread each, as ``realrun bench`` starts them), each size timed
``--iters`` times per variant after a barrier; the slowest rank's median counts. Variants:
``plain`` (``dist.all_reduce(x)`` in place), ``realrun`` (``Comm().allreduce(x, "none")``:
a new tensor, what the collectives API returns) and ``realrun inplace``. Target: realrun
within 1.2x of plain.

Usage: python benchmarks/bench_allreduce_overhead.py [--world 4] [--sizes 1,16,64] [--iters 9]
(sizes in MiB)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def worker(rank: int, world: int, store: str, sizes_mib: list[int], iters: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from realrun.comm import Comm

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    comm = Comm()
    variants = {"plain": lambda x: dist.all_reduce(x), "realrun": lambda x: comm.allreduce(x, "none"),
                "realrun inplace": lambda x: comm.allreduce(x, "none", inplace=True)}
    rows = []
    for mib in sizes_mib:
        x = torch.randn(mib * 2**20 // 4)
        for name, call in variants.items():
            times = []
            for _ in range(iters + 1):
                dist.barrier()
                start = time.perf_counter()
                call(x)
                times.append(time.perf_counter() - start)
            worst = torch.tensor(times[1:], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            rows.append({"size_MiB": mib, "variant": name, "time_s": statistics.median(worst.tolist())})
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(rows, handle)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--sizes", default="1,16,64", help="MiB, comma separated")
    ap.add_argument("--iters", type=int, default=9)
    args = ap.parse_args()
    from realrun import procs

    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        out, store = os.path.join(tmp, "rows.json"), os.path.join(tmp, "store")
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
        argv = [sys.executable, os.path.abspath(__file__), "--worker"]
        ranks = [procs.start(argv + [str(r), str(args.world), store, args.sizes, str(args.iters), out], env=env)
                 for r in range(args.world)]
        try:
            procs.wait_all(ranks, 1800)
        finally:
            procs.stop_all(ranks)
        with open(out) as handle:
            rows = json.load(handle)
    print(f"{args.world}-rank gloo all-reduce on loopback, median of {args.iters} (slowest rank)")
    for mib in sizes:
        plain = next(r["time_s"] for r in rows if r["size_MiB"] == mib and r["variant"] == "plain")
        for r in (r for r in rows if r["size_MiB"] == mib):
            print(f"  {mib:4d} MiB  {r['variant']:16s} {r['time_s'] * 1e3:9.2f} ms  {r['time_s'] / plain:5.2f}x plain")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        r, w, store, sizes, iters, out = sys.argv[2:8]
        worker(int(r), int(w), store, [int(s) for s in sizes.split(",")], int(iters), out)
    else:
        main()
