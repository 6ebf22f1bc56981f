"""The training loop of one rank: tensor- and data-parallel GPT training, compressed.

Each step: ``microbatches`` forward/backward passes on this replica's data (gradients
accumulate; with tensor parallelism the layers' reductions run inside them, see
``tensor_parallel``), then the gradients are reduced bucket by bucket (``BUCKET_BYTES``, in reverse
parameter order as DDP builds them) through ``realrun.comm`` with the spec the policy's
``dp`` axis gives the bucket's size (``ef(...)`` keeps one residual per bucket), averaged,
and AdamW steps (with ZeRO-1: reduce-scatter, a sharded step and an all-gather, see ``zero``).
The reduction runs after the backward pass, not overlapped with it (DDP's overlap needs its
reducer; a prediction of these runs must assume the same).

Measured per step (rank 0 appends one JSON line; times are the slowest rank's): loss (the
global mean), step, forward and backward (their TP reductions apart), TP communication, exposed
dp communication (the reduction minus its compression kernels), compression kernels, optimizer
seconds, payload bytes per rank and axis (dp, tp, zero),
every ``eval_every`` steps the validation loss, every ``error_every`` steps the measured
relative error of the compressed gradient sum against the exact one.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from perfmodel.mesh import Mesh
from perfmodel.policy import parse_policy
from perfmodel.workload import load_model
from realrun.comm import Comm, CommStats
from realrun.train.config import TrainConfig
from realrun.train.data import load_corpus, train_batch, val_batches
from realrun.train.model import GPT
from realrun.train.tensor_parallel import TensorParallel
from realrun.train.zero import ShardedOptimizer
from topologies.errors import InputError

VAL_BATCHES = 4
ADAM = {"betas": (0.9, 0.95), "weight_decay": 0.0}   # GPT-3's betas; no decay on a model this small
PHASES = ("step_s", "forward_s", "backward_s", "tp_comm_s", "dp_comm_s", "compress_s", "optimizer_s")


def buckets(params: list, bucket_bytes: int) -> list[list]:
    """Parameters grouped into buckets of about ``bucket_bytes``, last parameters first (their
    gradients are ready first in backward, as DDP orders them)."""
    out, current, size = [], [], 0
    for p in reversed(params):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            out.append(current)
            current, size = [], 0
    return out + ([current] if current else [])


def sync_gradients(groups, comm: Comm, axis, world: int, stats: CommStats, measure: bool) -> float | None:
    """Sum every bucket's gradients over the ranks under the dp policy, then average. With
    ``measure``, also the exact sum (uncounted) and the relative error ||y - exact|| / ||exact||."""
    err2 = ref2 = 0.0
    for i, params in enumerate(groups):
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        exact = None
        if measure:
            exact = flat.clone()
            dist.all_reduce(exact, group=comm.group)
        codec = axis.codec_for(flat.numel() * flat.element_size())
        summed = comm.allreduce(flat, codec, key=f"bucket{i}", stats=stats, inplace=codec.is_none)
        if exact is not None:
            err2 += float((summed.double() - exact.double()).square().sum())
            ref2 += float(exact.double().square().sum())
        summed /= world
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(summed[offset:offset + n].view_as(p.grad))
            offset += n
    return math.sqrt(err2 / ref2) if measure and ref2 > 0 else (0.0 if measure else None)


def evaluate(model: GPT, vals) -> float:
    model.eval()
    with torch.no_grad():
        losses = [float(model(torch.from_numpy(x), torch.from_numpy(y))) for x, y in vals]
    model.train()
    return sum(losses) / len(losses)


class Metrics:
    """Rank 0's JSON Lines file: each record one ``write`` on an O_APPEND descriptor, so a
    reader never sees half a line and a crash loses at most the step in flight."""

    def __init__(self, path: str | None):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else None
        self.records: list[dict] = []

    def write(self, record: dict) -> None:
        self.records.append(record)
        if self.fd is not None:
            os.write(self.fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _slowest(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _mean(value: float, world: int) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / world


def _step(cfg, run, model, opt, corpus, step) -> dict:
    start = time.perf_counter()
    fwd = bwd = 0.0
    model.zero_grad(set_to_none=False)
    loss_sum = 0.0
    for m in range(cfg.microbatches):   # every rank of a TP group reads its replica's batch
        x, y = train_batch(corpus, seed=cfg.seed, step=step, index=m * cfg.dp + run.dp_rank, rows=cfg.mbs,
                           seq=cfg.seq_len)
        t = time.perf_counter()
        loss = model(torch.from_numpy(x), torch.from_numpy(y)) / cfg.microbatches
        fwd += time.perf_counter() - t
        t = time.perf_counter()
        loss.backward()
        bwd += time.perf_counter() - t
        loss_sum += float(loss.detach())
    tp_fwd, tp_bwd, tp_stats = run.tp.take()
    stats, zero_stats = CommStats(), CommStats()
    measure = cfg.error_every > 0 and step % cfg.error_every == 0 and cfg.dp > 1
    t = time.perf_counter()
    if run.zero is not None:   # reduce-scatter, sharded update, all-gather
        error, optim = run.zero.step(stats, zero_stats, measure)
        sync = time.perf_counter() - t - optim
    else:
        error = sync_gradients(run.buckets, run.dp_comm, run.dp_axis, cfg.dp, stats, measure) if cfg.dp > 1 else None
        sync = time.perf_counter() - t
        t = time.perf_counter()
        opt.step()
        optim = time.perf_counter() - t
    tp_kernels = tp_stats.compress_s + tp_stats.decompress_s
    dp_kernels = stats.compress_s + stats.decompress_s + zero_stats.compress_s + zero_stats.decompress_s
    phases = _slowest([time.perf_counter() - start, fwd - tp_fwd, bwd - tp_bwd, max(0.0, tp_fwd + tp_bwd - tp_kernels),
                       max(0.0, sync - dp_kernels), tp_kernels + dp_kernels, optim])
    return {"step": step, "loss": _mean(loss_sum, cfg.world), **dict(zip(PHASES, phases)),
            "dp_wire_bytes": stats.bytes_out, "tp_wire_bytes": tp_stats.bytes_out,
            "zero_wire_bytes": zero_stats.bytes_out, "dp_rel_error": error}


def train(cfg: TrainConfig, rank: int, world: int, store: str | None = None) -> list[dict]:
    """Run ``cfg`` as rank ``rank`` of ``world`` (``store``: a FileStore path for local ranks,
    None for env://). Returns rank 0's records (empty elsewhere)."""
    dist.init_process_group("gloo", init_method="env://" if store is None else f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=cfg.op_timeout_s))
    try:
        if world != cfg.world:
            raise InputError("dp", cfg.dp, f"tp x dp = the number of ranks ({world})")
        records = _train(cfg, rank, world)
        dist.barrier()   # every rank done before any tears its connections down
        return records
    finally:
        dist.destroy_process_group()


class Run:
    """This rank's place in the mesh and the state its collectives keep."""

    def __init__(self, cfg: TrainConfig, rank: int, model: GPT):
        mesh = Mesh(cfg.tp, 1, cfg.dp, ("tp", "pp", "dp"))   # perfmodel's layout: tp innermost
        coords = mesh.coords(rank)
        self.dp_rank = coords["dp"]
        policy = parse_policy(cfg.policy)
        tp_group, dp_group = _groups(mesh, "tp", rank), _groups(mesh, "dp", rank)
        self.tp = TensorParallel(cfg.tp, coords["tp"], Comm(tp_group) if cfg.tp > 1 else None, policy.axis("tp"))
        model.shard(self.tp)
        self.dp_comm, self.dp_axis = Comm(dp_group), policy.axis("dp")
        self.buckets = buckets(list(model.parameters()), cfg.bucket_bytes)
        self.zero = None
        if cfg.zero and cfg.dp > 1:
            self.zero = ShardedOptimizer(self.buckets, self.dp_comm, self.dp_rank, cfg.dp, self.dp_axis,
                                         policy.axis("zero"), **ADAM, lr=cfg.lr)


def _groups(mesh: Mesh, axis: str, rank: int):
    """This rank's process group on ``axis`` (None: the whole world). Every rank creates every
    group, in the same order, as torch.distributed requires."""
    mine = None
    for members in mesh.groups[axis]:
        if len(members) == dist.get_world_size():
            return None
        group = dist.new_group(list(members))
        if rank in members:
            mine = group
    return mine


def _train(cfg: TrainConfig, rank: int, world: int) -> list[dict]:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    model = GPT(load_model(cfg.model), seed=cfg.seed)
    run = Run(cfg, rank, model)
    opt = None if run.zero else torch.optim.AdamW(model.parameters(), lr=cfg.lr, **ADAM)
    corpus = load_corpus()
    vals = val_batches(corpus, rows=cfg.mbs, seq=cfg.seq_len, count=VAL_BATCHES)
    metrics = Metrics(cfg.metrics if rank == 0 else None)
    bar = _progress(cfg.steps) if rank == 0 else None
    try:
        for step in range(cfg.steps):
            record = _step(cfg, run, model, opt, corpus, step)
            last = step == cfg.steps - 1
            evaluate_now = cfg.eval_every and (step % cfg.eval_every == 0 or last)
            # every rank of rank 0's TP group evaluates (the layers' reductions need them all)
            record["val_loss"] = evaluate(model, vals) if run.dp_rank == 0 and evaluate_now else None
            run.tp.take()   # evaluation's reductions are not the next step's
            if rank == 0:
                metrics.write({**record, "policy": cfg.policy, "tokens": cfg.global_batch * cfg.seq_len})
                if bar is not None:
                    bar.set_postfix(loss=f"{record['loss']:.3f}")
                    bar.update(1)
    finally:
        metrics.close()
        if bar is not None:
            bar.close()
    return metrics.records


def _progress(total: int):
    """tqdm on stderr, only where stderr is a terminal."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="train", unit="step", file=sys.stderr, disable=not sys.stderr.isatty())
