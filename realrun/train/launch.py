"""Where a training run's ranks come from: started here (``run_local``: tp x cp x pp x dp local ranks in
their own process groups, a FileStore rendezvous, gloo on loopback, ``threads`` threads each: by
default the host's cores over the ranks, ``realrun.threads``; a failure is one line, the ranks'
error output in ``error_log``), or a launcher's (``run_here``: torchrun, ``realrun cluster run``)."""
from __future__ import annotations

import json
import os
from dataclasses import replace

from realrun import procs, threads
from realrun.train.config import TrainConfig

ENTRY = "realrun.train"   # its __main__: one rank


def run_local(cfg: TrainConfig, timeout_s: float = 7 * 86400) -> list[dict]:
    """Start ``cfg.world`` (tp x cp x pp x dp) local ranks; return rank 0's records (from ``cfg.metrics`` or a
    temp file)."""
    with procs.temporary_directory() as tmp:
        metrics = cfg.metrics or os.path.join(tmp, "metrics.jsonl")
        run = replace(cfg, metrics=metrics)
        path, store = os.path.join(tmp, "config.json"), os.path.join(tmp, "store")
        with open(path, "w") as handle:
            handle.write(run.to_json())
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **threads.launch_env(cfg.threads, cfg.world)}
        ranks = []
        try:
            for r in range(cfg.world):
                ranks.append(procs.start(procs.python_argv(ENTRY, str(r), str(cfg.world), store, path),
                                         quiet=r > 0, env=env))
            procs.wait_all(ranks, timeout_s, log=error_log(cfg))
        finally:
            procs.stop_all(ranks)
        with open(metrics) as handle:
            return [json.loads(line) for line in handle if line.strip()]


def error_log(cfg: TrainConfig) -> str | None:
    """Where the ranks' error output goes when the run fails: the run's output folder (its
    checkpoint folder where it exists, else beside its metrics file); None (a temporary file) where
    it has none."""
    if cfg.checkpoint and os.path.isdir(cfg.checkpoint):
        return os.path.join(cfg.checkpoint, "errors.log")
    return f"{cfg.metrics}.errors.log" if cfg.metrics else None


def under_launcher() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_here(cfg: TrainConfig) -> list[dict]:
    """This process as one rank of an env:// launch; rank 0 returns the records."""
    from realrun.train.trainer import train

    return train(cfg, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


def run_training(cfg: TrainConfig) -> list[dict]:
    """The run of ``cfg``: as a rank of the launcher this process belongs to (torchrun,
    ``realrun cluster run``), or on ``cfg.world`` local ranks started here. Returns rank 0's
    per-step records (empty on other ranks of a launch)."""
    return run_here(cfg) if under_launcher() else run_local(cfg)
