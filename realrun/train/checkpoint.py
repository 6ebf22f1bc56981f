"""Checkpoints of a training run: every rank's model shard and optimizer state, written so that
a crash at any moment leaves the last complete checkpoint readable.

Layout of ``FOLDER``: ``step-NNNNNNNN/rankRRRRR.pt`` (one file per rank, each written to a
temporary name and renamed), ``run.json`` (the configuration fields that must match to resume)
and ``latest`` (the name of the newest complete step folder). Rank 0 rewrites ``latest`` only
after every rank has written its file (a barrier), then removes older step folders; a reader
follows ``latest`` and never sees a half-written step.

Resuming (``--resume``) loads this rank's file, checks that the run is the same one (model,
plan, batch, policy, seed, learning rate), and continues at the step after the checkpoint.
Under torchrun (``--max-restarts N``), whose restarts rerun every rank with the same arguments,
``--resume`` before any checkpoint was written starts the run at step 0 (the first attempt, or
a failure before the first checkpoint); elsewhere it is refused (a folder without a checkpoint
is a mistyped path). The data of step n depends only on (seed, n), so a resumed run reads what
the uninterrupted run would have read. Each rank's compressor state (error-feedback residuals,
PowerSGD warm starts, random-draw counters of every ``Comm`` the rank holds) is saved beside
its model, so a resumed run continues the same loss curve exactly under ``ef(...)`` policies
too.
"""
from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist

from perfmodel.plan.degrees import Degrees
from topologies.clikit import atomic_write
from topologies.errors import InputError

# what must be equal for a checkpoint to continue a run (steps, metrics and evaluation may change):
# the model, every degree (stored flat; a degree newer than the checkpoint reads its default, what
# a run without it had) and how the batch, policy and optimizer ran
IDENTITY = ("model", *Degrees.names(), "schedule", "zero", "mbs", "global_batch", "seq_len", "policy", "lr",
            "seed", "bucket_bytes")


def written(folder: str) -> bool:
    """True once a run has completed a checkpoint in ``folder`` (its ``latest`` exists)."""
    return os.path.isfile(os.path.join(folder, "latest"))


def under_elastic_launcher() -> bool:
    """A rank of torchrun (torch elastic), which restarts every rank after a failure with the same
    arguments (``--max-restarts``): there ``--resume`` also means the first attempt."""
    return "TORCHELASTIC_RESTART_COUNT" in os.environ


def _step_name(step: int) -> str:
    return f"step-{step:08d}"


def save(folder: str, cfg, rank: int, steps_done: int, model, optimizer, comms: dict | None = None) -> None:
    """Every rank calls this after the same step (collective: a barrier inside). ``comms``:
    {name: Comm} whose compressor state is saved."""
    name = _step_name(steps_done)
    os.makedirs(os.path.join(folder, name), exist_ok=True)
    path = os.path.join(folder, name, f"rank{rank:05d}.pt")
    state = {"steps_done": steps_done, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "comms": {name: comm.state_dict() for name, comm in (comms or {}).items()}}
    atomic_write(path, lambda h: torch.save(state, h))
    dist.barrier()
    if rank == 0:
        identity = {k: getattr(cfg, k) for k in IDENTITY}
        atomic_write(os.path.join(folder, "run.json"), lambda h: h.write(json.dumps(identity, indent=1).encode()))
        atomic_write(os.path.join(folder, "latest"), lambda h: h.write(f"{name}\n".encode()))
        for old in os.listdir(folder):
            if old.startswith("step-") and old != name:
                shutil.rmtree(os.path.join(folder, old), ignore_errors=True)
    dist.barrier()   # no rank starts the next save before the old folders are gone


def check(folder: str, cfg) -> str:
    """The newest complete step folder of ``folder``, after checking it continues ``cfg``'s run;
    one clear error otherwise (called before any rank starts, and by each rank again)."""
    latest, run = os.path.join(folder, "latest"), os.path.join(folder, "run.json")
    if not (os.path.isfile(latest) and os.path.isfile(run)):
        raise InputError("checkpoint", folder, "a folder that a run with --checkpoint wrote (no 'latest' in it)")
    try:
        with open(run) as handle:
            saved = json.load(handle)
        with open(latest) as handle:
            name = handle.read().strip()
    except (OSError, ValueError) as exc:
        raise InputError("checkpoint", folder, f"a readable checkpoint ({exc})") from None
    if not isinstance(saved, dict) or not os.path.isdir(os.path.join(folder, name)):
        raise InputError("checkpoint", folder, "a complete checkpoint ('latest' names no step folder)")
    saved = {**saved, **Degrees.of(saved).as_dict()}   # degrees it lacks: their defaults
    for key in IDENTITY:
        if saved.get(key) != getattr(cfg, key):
            raise InputError(key, getattr(cfg, key), f"{saved.get(key)!r}, as in the checkpoint's run (resume "
                             "continues the same run)")
    return os.path.join(folder, name)


def load(folder: str, cfg, rank: int, model, optimizer, device=None, comms: dict | None = None) -> int:
    """Restore this rank's state from ``folder`` onto ``device`` (and the compressor state of
    ``comms``, {name: Comm}); returns the number of steps done."""
    state = torch.load(os.path.join(check(folder, cfg), f"rank{rank:05d}.pt"), map_location=device,
                       weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for name, comm in (comms or {}).items():
        comm.load_state_dict(state.get("comms", {}).get(name, {}))
    return int(state["steps_done"])
