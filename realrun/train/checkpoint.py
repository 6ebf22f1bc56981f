"""Checkpoints of a training run: every rank's model shard and optimizer state, written so that
a crash at any moment leaves the last complete checkpoint readable.

Layout of ``FOLDER``: ``step-NNNNNNNN/rankRRRRR.pt`` (one file per rank, each written to a
temporary name and renamed), ``run.json`` (the configuration fields that must match to resume)
and ``latest`` (the name of the newest complete step folder). Rank 0 rewrites ``latest`` only
after every rank has written its file (a barrier), then removes older step folders; a reader
follows ``latest`` and never sees a half-written step.

Resuming (``--resume``) loads this rank's file, checks that the run is the same one (model,
plan, batch, policy, seed, learning rate), and continues at the step after the checkpoint.
``verify`` checks, in the process that starts the ranks, everything they will load (``latest``
names a step folder inside the checkpoint, every rank's file is there and reads as a checkpoint
of this run's model at that step), so a damaged or foreign checkpoint is one line naming the
file, never a failure inside the ranks.
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
import re
import shutil
import zipfile

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


STEP_NAME = re.compile(r"step-(\d{8,})")   # a step folder's name (``_step_name``): nothing else is followed


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
    if not isinstance(saved, dict):
        raise InputError(run, _short(saved), "the run's settings (a JSON object), as realrun train writes them")
    if not STEP_NAME.fullmatch(name):
        raise InputError(latest, name[:80], "the name of a step folder in the checkpoint, step-NNNNNNNN")
    if not os.path.isdir(os.path.join(folder, name)):
        raise InputError("checkpoint", folder, "a complete checkpoint ('latest' names no step folder)")
    saved = {**saved, **Degrees.of(saved).as_dict()}   # degrees it lacks: their defaults
    for key in IDENTITY:
        if saved.get(key) != getattr(cfg, key):
            raise InputError(key, getattr(cfg, key), f"{saved.get(key)!r}, as in the checkpoint's run (resume "
                             "continues the same run)")
    return os.path.join(folder, name)


def verify(folder: str, cfg) -> int:
    """The steps the checkpoint in ``folder`` has done, after checking everything ``cfg``'s ranks
    will load (called before any rank starts): ``check``, then each rank's file is there, is a
    checkpoint file (``read``) of the step its folder names, and holds a part of this run's model
    (``_check_model``). One line otherwise, naming the file, what is wrong and what is expected."""
    step_dir = check(folder, cfg)
    done = int(STEP_NAME.fullmatch(os.path.basename(step_dir)).group(1))
    shapes = _model_shapes(cfg)
    for rank in range(cfg.world):
        path = _rank_file(step_dir, rank)
        if not os.path.isfile(path):
            raise InputError("checkpoint", path, f"a file for every rank of this run's {cfg.world} (it is missing)")
        state = read(path, mmap=True)
        if state["steps_done"] != done:
            raise InputError(f"{path}: steps_done", state["steps_done"], f"{done}, the step its folder names")
        _check_model(path, state["model"], shapes, cfg)
    return done


def _rank_file(step_dir: str, rank: int) -> str:
    return os.path.join(step_dir, f"rank{rank:05d}.pt")


# what a rank's file holds (``save``): key -> (type, what it is)
STATE = {"steps_done": (int, "an integer >= 0, the steps done"), "model": (dict, "the model's tensors by name"),
         "optimizer": (dict, "the optimizer's state"), "comms": (dict, "the compressors' state by name")}


def read(path: str, device=None, mmap: bool = False) -> dict:
    """A rank's checkpoint file, as ``save`` wrote it (``STATE``): tensors and plain data only
    (``weights_only``); one line naming the file where it is not one."""
    if not zipfile.is_zipfile(path):   # torch.save's format is a zip archive
        raise InputError("checkpoint", path, f"a checkpoint file realrun train wrote (corrupt: {os.path.getsize(path)} "
                         "bytes that are no torch file: empty, truncated or other data)")
    try:
        state = torch.load(path, map_location=device or "cpu", weights_only=True, mmap=mmap)
    except Exception as exc:   # a damaged archive, objects weights_only refuses: all input
        raise InputError("checkpoint", path, f"a checkpoint file realrun train wrote (corrupt: {_reason(exc)})") \
            from None
    if not isinstance(state, dict):
        raise InputError("checkpoint", path, "a checkpoint file realrun train wrote (it holds no checkpoint state)")
    state.setdefault("comms", {})   # a file from before compressor state was saved
    for key, (kind, what) in STATE.items():
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, kind) or (kind is int and value < 0):
            raise InputError(f"{path}: {key}", _short(value), what)
    for name, value in state["comms"].items():
        if not isinstance(value, dict):
            raise InputError(f"{path}: comms.{name}", _short(value), "a compressor's state (an object)")
    return state


def _short(value) -> object:
    return value if isinstance(value, (int, float, str, type(None))) and len(str(value)) < 80 else type(value).__name__


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else type(exc).__name__


def _model_shapes(cfg) -> dict:
    """{name: shape} of the whole model of ``cfg`` (built on the meta device: no memory)."""
    from perfmodel.workload import load_model
    from realrun.train.model import GPT

    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in GPT(load_model(cfg.model), seed=cfg.seed).state_dict().items()}


def _check_model(path: str, tensors: dict, shapes: dict, cfg) -> None:
    """A rank's model state is a part of ``cfg``'s model: names of the whole model's (all of them
    without pipeline stages), each of its rank and no larger (equal where nothing is sharded)."""
    sharded = cfg.tp > 1 or cfg.ep > 1 or cfg.cp > 1
    for name, tensor in tensors.items():
        full = shapes.get(name)
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None
        fits = full is not None and shape is not None and len(shape) == len(full) and \
            all(a <= b for a, b in zip(shape, full)) and (sharded or shape == full)
        if not fits:
            raise InputError("checkpoint", path, f"a checkpoint of this run's model {cfg.model} (it holds "
                             f"{name} of shape {list(shape) if shape else type(tensor).__name__}, the model "
                             + (f"{list(full)})" if full else "has no such tensor)") + ": another model's")
    missing = sorted(set(shapes) - set(tensors))
    if cfg.pp == 1 and missing:
        raise InputError("checkpoint", path, f"a checkpoint of this run's model {cfg.model} (it lacks "
                         f"{missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "") + ")")


def load(folder: str, cfg, rank: int, model, optimizer, device=None, comms: dict | None = None) -> int:
    """Restore this rank's state from ``folder`` onto ``device`` (and the compressor state of
    ``comms``, {name: Comm}); returns the number of steps done. A state this rank's model or
    optimizer does not take is one line naming the file (``verify`` finds most before)."""
    path = _rank_file(check(folder, cfg), rank)
    state = read(path, device)
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        for name, comm in (comms or {}).items():
            comm.load_state_dict(state["comms"].get(name, {}))
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise InputError("checkpoint", path, f"a checkpoint of this rank of this run ({_reason(exc)})") from None
    return state["steps_done"]
