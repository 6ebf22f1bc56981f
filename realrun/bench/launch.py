"""Where a collective benchmark's ranks come from: started here, or a launcher's.

``run_collectives`` starts ``config.world`` local ranks (``realrun.procs``: own process
groups, the interpreter's path only, a FileStore rendezvous, gloo on loopback, ``threads``
threads each) and returns rank 0's records; ``run_here`` runs this process as one rank of
an env:// launch (torchrun, ``realrun cluster run``), every rank returning rank 0's records.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os

from realrun import procs, threads
from realrun.bench.config import BenchConfig
from realrun.bench.worker import worker
from topologies.errors import RunError

WORKER = "realrun.bench"   # its __main__: one rank


def run_collectives(config: BenchConfig) -> list[dict]:
    """Start ``config.world`` local ranks and return their records (rank 0's view)."""
    if importlib.util.find_spec("torch") is None:
        raise RunError("backend", config.backend, "torch is not installed in this environment, and realrun's "
                       "collectives run on torch.distributed: pip install 'commpress[real]' (or your own CUDA "
                       "build of torch >= 2.4 first)")
    if config.backend == "nccl":
        require_nccl(config.world)
    with procs.temporary_directory() as tmp:
        cfg = os.path.join(tmp, "config.json")
        with open(cfg, "w") as handle:
            handle.write(config.to_json())
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "records.jsonl")
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **threads.launch_env(config.threads, config.world)}
        ranks = []
        try:
            for r in range(config.world):
                ranks.append(procs.start(procs.python_argv(WORKER, str(r), str(config.world), store, cfg, out),
                                         quiet=r > 0, env=env))
            procs.wait_all(ranks, config.timeout_s)
        finally:
            procs.stop_all(ranks)
        with open(out) as handle:
            return [json.loads(line) for line in handle]


def require_nccl(ranks: int) -> None:
    """NCCL needs a torch built with it and a CUDA GPU per local rank: refused before any rank starts."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not dist.is_nccl_available() or gpus < ranks:
        have = "a torch without NCCL" if not dist.is_nccl_available() else f"{gpus} CUDA GPU(s)"
        raise RunError("backend", "nccl", f"backend nccl needs a CUDA GPU per rank ({ranks}) and a torch built "
                       f"with NCCL; this machine has {have}: use --backend gloo")


def under_torchrun() -> bool:
    """True inside a torchrun (or any env:// launcher) process."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


@functools.cache
def _end_group_at_exit() -> None:
    """Once per process: the process group ends when the process does."""
    import atexit

    import torch.distributed as dist

    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())


def run_here(config: BenchConfig) -> list[dict]:
    """Run the benchmark in this process as one rank of an env:// launch (torchrun); every
    rank returns rank 0's records. The process group stays for the next benchmark of the
    process (validate runs one per op) and ends with it: a second env:// start in one torchrun
    attempt reads the first group's addresses from torchrun's store and fails to connect."""
    _end_group_at_exit()
    import torch.distributed as dist

    with procs.temporary_directory() as tmp:
        out = os.path.join(tmp, "records.jsonl")
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, config, out, keep_group=True)
        lines = [""]
        if dist.get_rank() == 0:
            with open(out) as handle:
                lines = [handle.read()]
        dist.broadcast_object_list(lines, src=0)
    return [json.loads(line) for line in lines[0].splitlines()]
