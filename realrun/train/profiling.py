"""``realrun train --profile DIR``: PyTorch profiler traces of a training run, as users' own jobs
write them, for ``perfmodel calibrate --from-file torch-trace:DIR``.

Every rank writes ``DIR/trace-rank<R>.json`` (Chrome trace JSON, ``torch.profiler``'s
``export_chrome_trace``): CPU operators with their input shapes (``record_shapes``) over the
steps after the first ``WARMUP_STEPS`` (first-call allocations and numba compiles are no part of
the steady step; ``torch.profiler.schedule``: the warm-up steps waited, one more step warming the
profiler up, then up to ``ACTIVE_STEPS`` recorded, at most half the steps left: the rest run
unprofiled). Recording costs every operator the profiler's callbacks (on this machine's CPU a
small GPT's step took 1.27 times as long recorded in docs/examples/gpt-tiny-cpu-trace.json.gz, about
twice under other load), so the steps after the recorded ones run
unprofiled and their median step (``unprofiled_step_s``, seconds) joins the metadata at the end
of the run (``perfmodel.calibration.traces`` takes the difference out, per operator), as does each
recorded step's exposed communication with its compression kernels (``recorded_comm_s``): realrun's
collectives run on its own transport's threads and record no operator. Each step's training work is one
``commpress.step`` span (the step's passes, reductions and optimizer step; evaluation falls
outside it); the optimizer step is torch's own ``Optimizer.step#<class>.step`` span, as in any
PyTorch job's trace. The trace's ``commpress`` metadata is the run's configuration and
perfmodel's plan of it (``perfmodel.calibration.traces`` reads it to know the model and plan the
trace ran, where a user's trace needs ``--model`` and the plan given).
"""
from __future__ import annotations

import contextlib
import json
import os

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from realrun.train.config import TrainConfig
from realrun.train.report import WARMUP_STEPS
from topologies.clikit import atomic_write
from topologies.errors import InputError

STEP_SPAN = "commpress.step"            # one step's training work (perfmodel.calibration.traces reads it)
METADATA_KEY = "commpress"              # the trace's metadata: the run's configuration and plan
ACTIVE_STEPS = 5                        # steps recorded at most: a gpt-tiny step (mbs 8) is ~0.9 MB of trace


def trace_path(folder: str, rank: int) -> str:
    """Where rank ``rank`` writes its trace."""
    return os.path.join(folder, f"trace-rank{rank}.json")


def check(cfg: TrainConfig) -> None:
    """A run that cannot be profiled is one line before any rank starts: the steps must outlast
    the warm-up and the profiler's own warm-up step and leave one recorded and one unprofiled
    step, and the folder must take files."""
    if cfg.profile is None:
        return
    if cfg.steps < WARMUP_STEPS + 3:
        raise InputError("steps", cfg.steps, f"at least {WARMUP_STEPS + 3} with --profile (the first {WARMUP_STEPS} "
                         "are warm-up, one warms the profiler up, then steps recorded and as many unprofiled)")
    os.makedirs(cfg.profile, exist_ok=True)
    if not os.access(cfg.profile, os.W_OK):
        raise InputError("profile", cfg.profile, "a folder this process can write")


def active_steps(cfg: TrainConfig) -> int:
    """How many steps the trace records: at most ``ACTIVE_STEPS``, and at most half the steps after
    the warm-ups (the rest run unprofiled)."""
    return max(1, min(ACTIVE_STEPS, (cfg.steps - WARMUP_STEPS - 1) // 2))


def unprofiled(cfg: TrainConfig) -> range:
    """The steps after the recorded ones (unprofiled)."""
    return range(WARMUP_STEPS + 1 + active_steps(cfg), cfg.steps)


def recorded(cfg: TrainConfig) -> range:
    """The steps the trace records."""
    first = WARMUP_STEPS + 1
    return range(first, first + active_steps(cfg))


def add_run_times(cfg: TrainConfig, rank: int, steps: list[dict]) -> None:
    """Write what the run measured beside the trace into the rank's trace: the median step of the
    unprofiled steps after the recorded ones (``unprofiled_step_s``) and each recorded step's
    exposed communication with its compression kernels (``recorded_comm_s``: realrun's collectives
    run on its own transport's threads, which record no operator). ``steps``: each step's
    ``step``, ``step_s`` and ``comm_s`` as this rank has them (the step the slowest rank's)."""
    import statistics

    path = trace_path(cfg.profile, rank)
    plain = [r["step_s"] for r in steps if r["step"] in unprofiled(cfg)]
    if not plain or not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data[METADATA_KEY] |= {"unprofiled_step_s": statistics.median(plain), "unprofiled_steps": len(plain),
                           "recorded_comm_s": [r["comm_s"] for r in steps if r["step"] in recorded(cfg)]}
    atomic_write(path, lambda h: h.write(json.dumps(data).encode()))


def metadata(cfg: TrainConfig, rank: int, world: int) -> dict:
    """What the trace says about its run: the configuration, perfmodel's plan keywords (what
    ``perfmodel predict`` takes for it) and the rank."""
    plan = cfg.plan()
    return {"schema": "commpress.trace/1", "rank": rank, "world": world, "model": cfg.model,
            "config": cfg.as_dict(),
            "plan": {**plan.degrees.as_dict(), "zero": plan.zero, "mbs": plan.mbs, "gbs": plan.gbs, "seq": plan.seq,
                     "schedule": plan.schedule, "compute_dtype": plan.compute_dtype, "grad_dtype": plan.grad_dtype,
                     "bucket_bytes": plan.bucket_bytes, "dp_overlap": plan.dp_overlap, "kernels": plan.kernels},
            "threads": torch.get_num_threads(), "torch": torch.__version__}


@contextlib.contextmanager
def profiler(cfg: TrainConfig, rank: int, world: int):
    """The run's profiler (None without ``cfg.profile``): call ``.step()`` after every training
    step; its trace is written when the recording ends."""
    if cfg.profile is None:
        yield None
        return
    path = trace_path(cfg.profile, rank)
    about = metadata(cfg, rank, world)

    def write(prof) -> None:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:   # the metadata beside torch's own keys (a trace's top level)
            data = json.load(f)
        data[METADATA_KEY] = about
        atomic_write(path, lambda h: h.write(json.dumps(data).encode()))

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available()
                                           and cfg.device != "cpu" else [])
    plan = schedule(wait=WARMUP_STEPS, warmup=1, active=active_steps(cfg), repeat=1)
    with profile(activities=activities, schedule=plan, record_shapes=True, on_trace_ready=write) as prof:
        yield prof


def span(name: str, on: bool):
    """A named span in the trace (nothing when not profiling)."""
    return record_function(name) if on else contextlib.nullcontext()
