"""Microbenchmarks, nccl-tests style: compressed collectives across ranks, and kernels alone.

Collectives: ``world`` ranks (started here as processes, or the ranks of a torchrun launch)
run each (compressor, algorithm, size) ``warmup`` + ``iters`` times; every iteration starts
at a barrier and the slowest rank's time counts; ``time_s`` is the median over iterations.
Each case also records compress and decompress time per iteration (slowest rank), payload
bytes a rank produces (``wire_bytes``), and the relative error ||y - exact|| / ||exact||
(worst rank) against the uncompressed result.
Records follow ``perfmodel.records`` (JSON Lines) for calibration.
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np

from perfmodel.records import make_record
from perfmodel.record import busbw_factor
from realrun import procs
from topologies.errors import InputError

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast")


OP_TIMEOUT_S = 60   # a collective that waits longer on a peer ends the run (a stalled or stopped rank)


def run_collectives(config: dict, progress=None) -> list[dict]:
    """Start ``config['world']`` local ranks and return their records (rank 0's view)."""
    world = config["world"]
    if not 1 <= world <= 64:
        raise InputError("world", world, "an integer from 1 to 64")
    if importlib.util.find_spec("torch") is None:
        raise InputError("backend", config.get("backend", "gloo"), "torch installed: pip install 'commpress[real]'")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "config.json")
        with open(cfg, "w") as handle:
            json.dump(config, handle)
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "records.jsonl")
        # Rendezvous through a file (no listening socket), gloo pairs on loopback, one thread a rank.
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": str(config.get("threads", 1)),
               "NUMBA_NUM_THREADS": str(config.get("threads", 1))}
        ranks = []
        try:
            for r in range(world):
                ranks.append(procs.start(procs.python_argv("realrun.bench", str(r), str(world), store, cfg, out),
                                         quiet=r > 0, env=env))
            procs.wait_all(ranks, config.get("timeout_s", 1800))
        finally:
            procs.stop_all(ranks)
        with open(out) as handle:
            return [json.loads(line) for line in handle]


def _case(op, spec, alg, x, exact, iters, warmup):
    import torch
    import torch.distributed as dist

    from perfmodel.runtime import runtime_algorithm
    from realrun.comm import Comm, CommStats

    comm = Comm()
    # torch's own all-reduce runs in place on a copy made before the timer (as nccl-tests'
    # in-place mode): a new output tensor per call costs page faults, not communication
    inplace = op == "allreduce" and runtime_algorithm(op, spec, alg) == "torch"
    work = x.clone()
    call = {"allreduce": lambda st: comm.allreduce(work if inplace else x, spec, alg, inplace=inplace, stats=st),
            "allgather": lambda st: comm.allgather(x, spec, stats=st),
            "reduce_scatter": lambda st: comm.reduce_scatter(x, spec, stats=st),
            "broadcast": lambda st: comm.broadcast(x, spec, src=0, stats=st)}[op]
    times, result = [], None
    for i in range(warmup + iters):
        st = CommStats()
        if inplace:
            work.copy_(x)
        dist.barrier()
        start = time.perf_counter()
        result = call(st)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append([elapsed, st.compress_s, st.decompress_s, st.bytes_out])
    worst = torch.tensor(times, dtype=torch.float64, device=x.device)   # NCCL reduces device tensors only
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    err = float(torch.linalg.norm((result - exact).double()) / max(float(torch.linalg.norm(exact.double())), 1e-30))
    err_t = torch.tensor([err], dtype=torch.float64, device=x.device)
    dist.all_reduce(err_t, op=dist.ReduceOp.MAX)
    return worst.cpu().numpy(), float(err_t.item())


def _exact(op, x, world, rank):
    import torch
    import torch.distributed as dist

    if op == "allreduce":
        out = x.clone()
        dist.all_reduce(out)
        return out
    if op == "allgather":
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        return torch.cat(parts)
    if op == "broadcast":
        out = x.clone()
        dist.broadcast(out, 0)
        return out
    total = x.clone()
    dist.all_reduce(total)
    base, extra = divmod(len(x), world)
    start = rank * base + min(rank, extra)
    return total[start:start + base + (1 if rank < extra else 0)]


def under_torchrun() -> bool:
    """True inside a torchrun (or any env:// launcher) process."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_here(config: dict) -> list[dict]:
    """Run the benchmark in this process as one rank of an env:// launch (torchrun); every
    rank returns rank 0's records."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "records.jsonl")
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, config, out, keep_group=True)
        lines = [""]
        if dist.get_rank() == 0:
            with open(out) as handle:
                lines = [handle.read()]
        dist.broadcast_object_list(lines, src=0)
        dist.destroy_process_group()
    return [json.loads(line) for line in lines[0].splitlines()]


def worker(rank: int, world: int, store, config, out: str, keep_group: bool = False) -> None:
    """One rank: ``store`` is a FileStore path (local ranks) or None (env://, torchrun)."""
    import torch
    import torch.distributed as dist

    if isinstance(config, str):
        with open(config) as handle:
            config = json.load(handle)
    cfg = config
    init = "env://" if store is None else f"file://{store}"
    dist.init_process_group(cfg.get("backend", "gloo"), init_method=init, rank=rank,
                            world_size=world, timeout=timedelta(seconds=cfg.get("op_timeout_s", OP_TIMEOUT_S)))
    records = []
    cases = cfg.get("cases") or [(s, c, a) for s in cfg["sizes"] for c in cfg["compressors"]
                                 for a in (cfg["algorithms"] if cfg["op"] == "allreduce" else ["auto"])]
    if cfg.get("backend") == "nccl":   # one GPU per rank: the launcher's local rank, else the rank
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    for i, (size, spec, alg) in enumerate(cases):
        x = torch.from_numpy(np.random.default_rng(rank + 17 * i).standard_normal(size // 4).astype(np.float32))
        if cfg.get("backend") == "nccl":
            x = x.cuda()
        exact = _exact(cfg["op"], x, world, rank)
        worst, err = _case(cfg["op"], spec, alg, x, exact, cfg["iters"], cfg["warmup"])
        if rank == 0:
            records.append(_record(cfg, size, spec, alg, worst, err, world))
            print(f"bench {cfg['op']}: {i + 1}/{len(cases)} {spec} {alg} {size} B", file=sys.stderr, flush=True)
    if rank == 0:
        with open(out, "w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
    dist.barrier()
    if not keep_group:
        dist.destroy_process_group()


def _record(cfg, size, spec, alg, worst, err, world) -> dict:
    t = worst[:, 0]
    payload = float(statistics.median(worst[:, 3]))
    if payload == 0 and world > 1:   # the plain torch collective: what a ring rank sends
        payload = size * busbw_factor(cfg["op"], world)
    return make_record("collective", op=cfg["op"], compressor=spec, algorithm=alg, world=world,
                       backend=cfg.get("backend", "gloo"), size_bytes=size,
                       wire_bytes=payload, time_s=float(np.median(t)),
                       time_min_s=float(t.min()), time_max_s=float(t.max()),
                       compress_s=float(np.median(worst[:, 1])), decompress_s=float(np.median(worst[:, 2])),
                       max_rel_error=err, iters=int(cfg["iters"]),
                       busbw_factor=busbw_factor(cfg["op"], world))


def run_kernels(sizes, compressors, iters: int = 5, device: str = "cpu", accumulate: bool = False) -> list[dict]:
    """Compressor throughput alone: median compress and decompress seconds, ratio, error; each
    iteration takes the next of ``cold_inputs`` (new data, as in a run, not a cache-hot array).
    ``accumulate``: decompression also adds the values into a float32 sum, as every realrun
    reduction does with what it decodes (what calibration wants to know)."""
    from realrun.compressors import Compressor

    if device != "cpu":
        raise InputError("device", device, "cpu here (cuda kernels run through scripts/gpu_check.sh)")
    out = []
    for size in sizes:
        xs = cold_inputs(size)
        totals = [np.zeros(xs[0].size, np.float32)] if accumulate else None
        for spec in compressors:
            comp, decomp, x, p, y = _timed_calls(Compressor(spec), xs, iters, totals)
            err = float(np.linalg.norm(y - x) / max(float(np.linalg.norm(x)), 1e-30)) if x.size else 0.0
            out.append(make_record("kernel", compressor=spec, device=device, size_bytes=size, wire_bytes=len(p),
                                   compress_s=statistics.median(comp), decompress_s=statistics.median(decomp),
                                   max_rel_error=err, iters=iters, accumulate=accumulate))
    return out


SHARED_MIN_S = 0.25
COLD_BYTES = 96 * 2**20   # inputs cycled per process: 3x this machine's 32 MiB L3, so no case runs cache-hot


def cold_inputs(size: int) -> list[np.ndarray]:
    """Distinct inputs of ``size`` bytes, enough that cycling through them keeps every call's data
    out of the last-level cache, as in a real run where each call sees new data."""
    copies = min(64, max(1, -(-COLD_BYTES // max(size, 1))))
    rng = np.random.default_rng(0)
    return [rng.standard_normal(size // 4).astype(np.float32) for _ in range(copies)]


def _timed_calls(c, xs, iters: int, totals=None, min_s: float = 0.0):
    """Compress and decompress the inputs in turn, at least ``iters`` times and ``min_s``
    seconds; decoded values are added into ``totals`` (cycled) when given. Returns the compress
    and decompress seconds of every call and the last input, payload and output."""
    comp, decomp = [], []
    begin = time.perf_counter()
    while len(comp) < iters or time.perf_counter() - begin < min_s:
        k = len(comp)
        x = xs[k % len(xs)]
        start = time.perf_counter()
        p = c.compress(x)
        comp.append(time.perf_counter() - start)
        start = time.perf_counter()
        y = c.decompress(p, like=x)
        if totals is not None:
            totals[k % len(totals)] += y
        decomp.append(time.perf_counter() - start)
    return comp, decomp, x, p, y


def _shared_worker(barrier, queue, sizes, compressors, iters):
    from realrun.compressors import Compressor

    out = []
    for size in sizes:
        xs = cold_inputs(size)
        totals = [np.zeros(x.size, np.float32) for x in xs]
        for spec in compressors:
            c = Compressor(spec)
            c.compress(xs[0])   # warm: numba caches, workspaces
            barrier.wait()
            # long enough for the scheduler to interleave the processes (a few 4 ms slices each)
            comp, decomp, _, p, _ = _timed_calls(c, xs, iters, totals, SHARED_MIN_S)
            out.append((size, spec, len(p), sum(comp) / len(comp), sum(decomp) / len(decomp)))
    queue.put(out)


def run_kernels_shared(sizes, compressors, iters: int = 5, ranks: int = 2, threads: int = 1) -> list[dict]:
    """Compressor throughput with ``ranks`` processes (``threads`` threads each) computing at once,
    in step (a barrier before every case, each case run for at least ``SHARED_MIN_S`` so the
    scheduler interleaves them), as the ranks of an emulated cluster share this machine;
    decompression accumulates (as in a reduction). Mean times of the median process,
    records marked ``concurrent = ranks``."""
    import multiprocessing as mp

    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    os.environ.update(OMP_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(ranks, timeout=600), ctx.Queue()
    procs = [ctx.Process(target=_shared_worker, args=(barrier, queue, list(sizes), list(compressors), iters))
             for _ in range(ranks)]
    try:
        for proc in procs:
            proc.start()
        results = [queue.get(timeout=3600) for _ in procs]
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        for proc in procs:
            if proc.pid is not None:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
    out = []
    for rows in zip(*results):
        size, spec, wire, comp, decomp = sorted(rows, key=lambda r: r[3] + r[4])[len(rows) // 2]
        out.append(make_record("kernel", compressor=spec, device="cpu", size_bytes=size, wire_bytes=wire,
                               compress_s=comp, decompress_s=decomp, max_rel_error=0.0, iters=iters,
                               accumulate=True, concurrent=ranks))
    return out


if __name__ == "__main__":   # RANK WORLD STORE CONFIG OUT, or --env CONFIG OUT (env:// launch)
    if sys.argv[1] == "--env":
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, sys.argv[2], sys.argv[3])
    else:
        worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
