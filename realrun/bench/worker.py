"""One rank of a collective benchmark: times every case, rank 0 writes the records.

Run as ``python -P -m realrun.bench RANK WORLD STORE CONFIG OUT`` (local ranks: a FileStore
rendezvous, no listening socket) or ``... --env CONFIG OUT`` (an env:// launch: torchrun,
``realrun cluster run``); see ``__main__.py``. CONFIG is a ``BenchConfig`` as JSON; OUT receives JSON
Lines in ``perfmodel.calibration.measurements``' schema. Each iteration starts at a barrier and the slowest
rank's time counts; ``time_s`` is the median over iterations. ``cpu_s`` is the CPU the busiest
rank's process (every thread: Python, codecs, the transport's socket threads) spent per call,
median over iterations; ``thread_cpu_s`` the CPU of the thread that called the collective (the
codecs and the runtime's Python: gloo moves the bytes on threads of its own), and
``kernel_cpu_s`` the CPU its compress and decompress calls took (where the wire's statistics
count it: ``CommStats.compress_cpu_s``). On a host with a fixed CPU share these are what
calibration prices kernels and the runtime's own work from (``perfmodel.calibration.fit``):
wall seconds inside a run also hold the time other work on the machine kept the rank waiting.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from datetime import timedelta

import numpy as np

from perfmodel.collectives.record import busbw_factor
from perfmodel.calibration.measurements import make_record
from realrun.bench.config import BenchConfig

def _case(op, spec, alg, x, exact, iters, warmup, threads=None):
    import torch
    import torch.distributed as dist

    from perfmodel.collectives.runtime import runtime_algorithm
    from realrun.comm import Comm, CommStats

    comm = Comm(threads=threads)
    # torch's own all-reduce runs in place on a copy made before the timer (as nccl-tests'
    # in-place mode): a new output tensor per call costs page faults, not communication
    inplace = op == "allreduce" and runtime_algorithm(op, spec, alg) == "torch"
    work = x.clone()
    call = {"allreduce": lambda st: comm.allreduce(work if inplace else x, spec, alg, inplace=inplace, stats=st),
            "allgather": lambda st: comm.allgather(x, spec, stats=st),
            "reduce_scatter": lambda st: comm.reduce_scatter(x, spec, stats=st),
            "broadcast": lambda st: comm.broadcast(x, spec, src=0, stats=st),
            "alltoall": lambda st: comm.alltoall(x, spec, stats=st)}[op]
    times, result = [], None
    for i in range(warmup + iters):
        st = CommStats()
        if inplace:
            work.copy_(x)
        dist.barrier()
        start, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
        result = call(st)
        elapsed, cpu, own = time.perf_counter() - start, time.process_time() - cpu, time.thread_time() - own
        if i >= warmup:
            times.append([elapsed, st.compress_s, st.decompress_s, st.bytes_out, cpu, own, kernel_cpu(st)])
    worst = torch.tensor(times, dtype=torch.float64, device=x.device)   # NCCL reduces device tensors only
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    err = float(torch.linalg.norm((result - exact).double()) / max(float(torch.linalg.norm(exact.double())), 1e-30))
    stats = torch.tensor([err, wrong_elements(spec, result, exact)], dtype=torch.float64, device=x.device)
    dist.all_reduce(stats[:1], op=dist.ReduceOp.MAX)
    dist.all_reduce(stats[1:], op=dist.ReduceOp.SUM)
    return worst.cpu().numpy(), float(stats[0].item()), int(stats[1].item())


def kernel_cpu(stats) -> float:
    """CPU seconds of a call's compress and decompress calls where its statistics count them
    (``compress_cpu_s``, ``decompress_cpu_s``), else NaN (not measured)."""
    parts = (getattr(stats, "compress_cpu_s", None), getattr(stats, "decompress_cpu_s", None))
    return math.nan if None in parts else float(sum(parts))


WRONG_SIGMAS = 10.0      # a lossy result's element is wrong beyond 10x the spec's predicted RMS error
EXACT_RTOL = 1e-5        # an exact spec's, beyond float32 summation-order differences


def wrong_elements(spec: str, result, exact) -> int:
    """nccl-tests' #wrong for compressed collectives: elements that are not finite, or farther
    from the exact result than the spec allows: ``EXACT_RTOL`` of the largest value for exact
    (lossless) specs, else ``WRONG_SIGMAS`` times the relative RMS error perfmodel predicts for
    one application, times the result's RMS."""
    import torch

    from perfmodel.compression import compile_spec

    codec = compile_spec(spec)
    diff = (result - exact).abs().double()
    lossless = codec.is_none or codec.lossless
    scale = float(exact.double().abs().max()) if lossless else float(exact.double().pow(2).mean().sqrt())
    bound = (EXACT_RTOL if lossless else WRONG_SIGMAS * max(codec.error, EXACT_RTOL)) * max(scale, 1e-30)
    return int((~torch.isfinite(result)).sum()) + int((diff > bound).sum())


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
    from realrun.comm.algorithms import split   # (numba and torch only once a rank runs)

    parts = split(len(x), world)   # as realrun.comm splits: earlier ranks one longer
    if op == "alltoall":   # every rank's x in p parts, part j to rank j
        splits = [s.stop - s.start for s in parts]
        out = torch.empty(splits[rank] * world, dtype=x.dtype, device=x.device)
        dist.all_to_all_single(out, x, [splits[rank]] * world, splits)
        return out
    total = x.clone()
    dist.all_reduce(total)
    return total[parts[rank]]


def worker(rank: int, world: int, store: str | None, cfg: BenchConfig, out: str, keep_group: bool = False) -> None:
    """One rank: ``store`` is a FileStore path (local ranks) or None (env://, torchrun)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():   # under torchrun, one group for every benchmark of the process
        init = "env://" if store is None else f"file://{store}"
        dist.init_process_group(cfg.backend, init_method=init, rank=rank, world_size=world,
                                timeout=timedelta(seconds=cfg.op_timeout_s))
    from realrun import threads

    threads.apply(cfg.threads, torch_too=True)   # realrun runs this rank: torch's threads and the codecs'
    records = []
    if cfg.backend == "nccl":   # one GPU per rank: the launcher's local rank, else the rank
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    for i, case in enumerate(cfg.cases):
        size, spec, alg = case.size_bytes, case.compressor, case.algorithm
        x = torch.from_numpy(np.random.default_rng(rank + 17 * i).standard_normal(size // 4).astype(np.float32))
        if cfg.backend == "nccl":
            x = x.cuda()
        exact = _exact(cfg.op, x, world, rank)
        worst, err, wrong = _case(cfg.op, spec, alg, x, exact, cfg.iters, cfg.warmup, cfg.threads)
        if rank == 0:
            records.append({**_record(cfg, size, spec, alg, worst, err, world), "wrong": wrong})
            print(f"bench {cfg.op}: {i + 1}/{len(cfg.cases)} {spec} {alg} {size} B", file=sys.stderr, flush=True)
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
        payload = size * busbw_factor(cfg.op, world)
    return make_record("collective", op=cfg.op, compressor=spec, algorithm=alg, world=world,
                       backend=cfg.backend, size_bytes=size,
                       wire_bytes=payload, time_s=float(np.median(t)),
                       time_min_s=float(t.min()), time_max_s=float(t.max()),
                       compress_s=float(np.median(worst[:, 1])), decompress_s=float(np.median(worst[:, 2])),
                       max_rel_error=err, iters=int(cfg.iters), cpu_s=float(np.median(worst[:, 4])),
                       busbw_factor=busbw_factor(cfg.op, world), **cpu_fields(worst))


def cpu_fields(worst) -> dict:
    """``thread_cpu_s`` and, where measured (not NaN), ``kernel_cpu_s`` of a case: the busiest rank's,
    median over iterations (columns 5 and 6 of ``worst``)."""
    out = {"thread_cpu_s": float(np.median(worst[:, 5]))}
    kernel = worst[:, 6]
    if not np.isnan(kernel).any():
        out["kernel_cpu_s"] = float(np.median(kernel))
    return out
