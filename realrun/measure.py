"""Where calibrate and validate measure: a running emulated cluster, or the ranks of a torchrun.

A runner answers four questions: which topologies cluster models a run (``topology``), how to
change the link rate (``set_bandwidth``; only the emulated cluster can), how to time
collectives (``collectives``: records from ``realrun.bench``) and how to time compressors
alone (``kernels``: one process, ``threads`` threads, as one rank of a run computes).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from realrun import bench, procs
from realrun.bench import BenchConfig
from realrun.bench.config import RUN_TIMEOUT_S
from realrun.bench.compute import run_compute
from realrun.bench.launch import WORKER
from realrun.cluster import cpu, emulated, launch
from topologies import bounds
from topologies.errors import InputError


def _read(path: str) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


@dataclass(frozen=True, kw_only=True)
class RunnerSettings:
    """Where measurements run: an emulated cluster by name, or the cluster of a torchrun launch
    (a topologies name); ``threads`` per rank (emulated), ``backend`` (torchrun)."""

    cluster: str
    threads: int = 1
    backend: str = "gloo"

    def __post_init__(self):
        object.__setattr__(self, "threads", bounds.check("threads", self.threads))
        if self.backend not in ("gloo", "nccl"):
            raise InputError("backend", self.backend, "gloo or nccl")


class EmulatedRunner:
    """Measure on the emulated cluster ``name`` (``realrun cluster up``); ranks are its hosts.
    It can change its link rate and run on a subset of its hosts."""

    emulated = True

    def __init__(self, name: str, threads: int = 1):
        self.name, self.threads = name, threads
        self.spec = emulated.load(name)
        self.original = self.spec.bandwidth

    @property
    def hosts(self) -> int:
        return self.spec.hosts

    def topology(self, hosts: int | None = None, bandwidth: int | None = None) -> str:
        spec = self.spec if bandwidth is None else replace(self.spec, bandwidth=bandwidth)
        return spec.topology(hosts)

    def set_bandwidth(self, bits_per_s: int) -> None:
        if bits_per_s and bits_per_s != self.spec.bandwidth:
            self.spec = emulated.shape(self.name, bits_per_s)

    def restore(self) -> None:
        self.set_bandwidth(self.original)

    def _place(self, i: int, pid: int) -> None:
        """A benchmark process standing in for host ``i``'s rank computes with that host's share."""
        if self.spec.cpus_per_host is not None:
            cpu.join(emulated.host_ns(self.name, i), pid)

    def _mark(self, records: list[dict], hosts: int | None = None) -> list[dict]:
        """Every record names the cluster it was measured on, the hosts' CPU share with it."""
        for r in records:
            r["cluster"], r["cpu_share"] = self.topology(hosts), self.spec.cpus_per_host
        return records

    def collectives(self, config: BenchConfig, hosts: int | None = None) -> list[dict]:
        with procs.temporary_directory() as tmp:
            cfg, out = os.path.join(tmp, "config.json"), os.path.join(tmp, "records.jsonl")
            with open(cfg, "w") as handle:
                handle.write(config.to_json())
            launch.run(self.name, procs.python_argv(WORKER, "--env", cfg, out),
                       timeout_s=config.timeout_s, threads=self.threads, hosts=hosts)
            return self._mark(_read(out), hosts)

    def train(self, cfg, timeout_s: float = RUN_TIMEOUT_S) -> list[dict]:
        """Run the training ``cfg`` on its first ``cfg.world`` hosts, one rank each; rank 0's
        per-step records."""
        from realrun.train.launch import ENTRY

        with procs.temporary_directory() as tmp:
            path, metrics = os.path.join(tmp, "config.json"), os.path.join(tmp, "metrics.jsonl")
            with open(path, "w") as handle:
                handle.write(replace(cfg, metrics=metrics).to_json())
            launch.run(self.name, procs.python_argv(ENTRY, "--env", path), timeout_s=timeout_s,
                       threads=self.threads, hosts=cfg.world)
            return self._mark(_read(metrics), cfg.world)

    def compute(self, model: str, mbs: int, cps=(1,)) -> list[dict]:
        """A training step's compute (``realrun.bench.compute.cases``) with every host's rank
        computing at once, each on its host's share."""
        return self._mark(run_compute(model, world=self.hosts, ranks=self.hosts, mbs=mbs, threads=self.threads,
                                      place=self._place, cps=cps))

    def kernels(self, sizes, specs, iters: int) -> list[dict]:
        """Alone on a whole core (the numbers the model scales by the share where it has nothing
        else), and with every host's rank computing at once, each on its host's share."""
        alone = bench.run_kernels_shared(sizes, specs, iters, ranks=1, threads=self.threads)
        for r in alone:
            r["cpu_share"] = 1.0
        return alone + self._mark(bench.run_kernels_shared(sizes, specs, iters, ranks=self.hosts,
                                                           threads=self.threads, place=self._place))


class TorchrunRunner:
    """Measure in place, as one rank of a torchrun launch on a real cluster (NCCL or gloo): its
    own links only (bandwidth 0 means them), all ranks of the launch."""

    emulated = False

    def __init__(self, cluster: str, backend: str = "gloo"):
        if not bench.under_torchrun():
            raise InputError("cluster", cluster, "an emulated cluster name, or a run under torchrun")
        self.cluster, self.backend = cluster, backend
        self.hosts, self.rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])

    def topology(self, hosts: int | None = None, bandwidth: int | None = None) -> str:
        return self.cluster

    def set_bandwidth(self, bits_per_s: int) -> None:
        if bits_per_s:   # 0: the cluster's own links, the only rate a real cluster has
            raise InputError("bandwidths", bits_per_s, "the cluster's own links under torchrun")

    def restore(self) -> None:
        pass

    def collectives(self, config: BenchConfig, hosts: int | None = None) -> list[dict]:
        records = bench.run_here(config.with_backend(self.backend))
        for r in records:
            r["cluster"] = self.cluster
        return records

    def compute(self, model: str, mbs: int, cps=(1,)) -> list[dict]:
        """CPU ranks (gloo) time the model's compute on one core each; GPU compute comes from
        the device catalog (its measured GEMM tables), not from here."""
        return [] if self.backend == "nccl" else run_compute(model, world=self.hosts, ranks=1, mbs=mbs, cps=cps)

    def kernels(self, sizes, specs, iters: int) -> list[dict]:
        return bench.run_kernels(sizes, specs, iters, accumulate=True)


def runner_for(settings: RunnerSettings | str):
    """An emulated cluster by name (``emu``), else a torchrun launch on a topologies cluster."""
    if isinstance(settings, str):
        settings = RunnerSettings(cluster=settings)
    if emulated.NAME_RE.match(settings.cluster):
        return EmulatedRunner(settings.cluster, settings.threads)
    return TorchrunRunner(settings.cluster, settings.backend)
