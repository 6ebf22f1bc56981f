"""Start one rank per emulated host, torchrun-style, and wait for all of them.

Each rank runs ``ip netns exec cmp-NAME-h{i} CMD`` with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK=0``, ``LOCAL_WORLD_SIZE=1``, ``MASTER_ADDR`` (host 0), ``MASTER_PORT`` and
``GLOO_SOCKET_IFNAME=eth0``; ``OMP_NUM_THREADS``, ``NUMBA_NUM_THREADS`` and
``COMMPRESS_CODEC_THREADS`` are set to ``threads`` (default 1: an emulated host's share of one
core; ``realrun.threads.launch_env``). Each rank joins its host's cgroup (``realrun.cluster.cpu``) as it
starts (right after its exec, long before its first import), so it and every thread it starts compute on the
host's fixed CPU share. One rank failing ends the run: the others are stopped and the error
names the rank.
"""
from __future__ import annotations

import os
import sys

from realrun import procs as procs_
from realrun.cluster import cpu, emulated
from realrun.threads import launch_env
from topologies import bounds
from topologies.errors import InputError

MASTER_PORT = 29511   # torchrun's 29500 + 11; free inside our namespaces, which have their own ports


def rank_env(spec: emulated.EmulatedSpec, rank: int, threads: int, port: int, world: int | None = None) -> dict:
    env = dict(os.environ)
    env.update(RANK=str(rank), WORLD_SIZE=str(world or spec.hosts), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR=emulated.address(0), MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="eth0",
               **launch_env(threads, 1), COMMPRESS_EMULATED="1",
               TORCH_CPP_LOG_LEVEL=os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"))
    return env


def python_of_this_environment(argv: list[str]) -> list[str]:
    """``python``/``python3`` as the command means the interpreter running commpress (its
    environment has torch and realrun), not whichever is first on PATH; with ``-m MODULE`` or
    ``-c CODE`` it runs without the current directory on sys.path (``procs.python_argv``: a
    ``socket.py`` there is never imported by a rank running as root). A script keeps its own
    folder on sys.path: that is the code the user chose to run."""
    if not argv or argv[0] not in ("python", "python3"):
        return list(argv)
    rest = list(argv[1:])
    if rest[:1] == ["-m"] and len(rest) > 1:
        return procs_.python_argv(rest[1], *rest[2:])
    if rest[:1] == ["-c"] and len(rest) > 1:
        if sys.version_info >= (3, 11):
            return [sys.executable, "-P", *rest]
        return [sys.executable, "-c", "import sys; sys.path.pop(0)\n" + rest[1], *rest[2:]]
    return [sys.executable, *rest]


def run(name: str, argv: list[str], timeout_s: float = 3600, threads: int = 1, port: int = MASTER_PORT,
        quiet_ranks: bool = True, hosts: int | None = None) -> None:
    """Run ``argv`` as one rank per host of cluster ``name`` (the first ``hosts`` hosts, default
    all); raise naming the first failed rank. Rank 0's output goes to this process's; the
    others' stdout is dropped when ``quiet_ranks``."""
    bounds.check("timeout", timeout_s, "timeout_s")
    bounds.check("threads", threads)
    spec = emulated.load(name)
    if not argv:
        raise InputError("command", "", "a command to run on every host (after --)")
    world = spec.hosts if hosts is None else hosts
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= spec.hosts:
        raise InputError("hosts", hosts, f"an integer from 1 to {spec.hosts} (the cluster's hosts)")
    argv = python_of_this_environment(argv)
    procs = []
    try:
        for r in range(world):
            ns = emulated.host_ns(name, r)
            command = ["ip", "netns", "exec", ns, *argv]   # (it remounts /sys: join the cgroup before it)
            if spec.cpus_per_host is not None:
                command = cpu.joined(ns, command)
            procs.append(procs_.start(command,
                                      quiet=r > 0 and quiet_ranks, env=rank_env(spec, r, threads, port, world)))
        procs_.wait_all(procs, timeout_s)
    finally:
        procs_.stop_all(procs)
