"""The training loop of one rank: tensor-, context-, expert-, pipeline- and data-parallel GPT
training, compressed.

Each step: ``microbatches`` forward/backward passes on this replica's data through its
pipeline under the schedule (``pipeline``; gradients accumulate; with tensor parallelism the
layers' reductions run inside them, see ``tensor_parallel``, as do the MoE all-to-alls and cp's
ring), then the gradient reductions and the optimizer step (``data_parallel``; with ZeRO-1 a
reduce-scatter, a sharded step and an all-gather, see ``zero``; a recipe policy's warm-up and, for
1-bit and 0/1 Adam, its own optimizer: ``onebit``). Every parallel runtime answers
one interface (``runtime.AxisRuntime``): the step opens each, runs the passes and the reduction,
and takes each one's timing.

Measured per step (rank 0 appends one JSON line; the step time is the slowest rank's, every
other time the busiest rank's, see ``_busiest``): loss (the global mean), ``step_s``, and the
step's phases under perfmodel's names (``realrun.train.phases``): ``compute_s`` (forward and
backward, the collectives inside them out; also apart as ``forward_s`` and ``backward_s``), the
exposed communication of each reported axis's phase (``tp_comm_s``; ``pp_comm_s``: send/recv,
including the wait for a neighbour, the bubble; ``dp_comm_exposed_s``: the reductions and ZeRO's
gather; ``ep_comm_s`` and ``cp_comm_s`` where the plan runs them), each without its compression
kernels, ``compression_s`` (the kernels in all, and per axis as ``<axis>_kernel_s``) and
``optimizer_s``; payload bytes per rank and axis (``<axis>_wire_bytes``), every ``eval_every``
steps the validation loss, every ``error_every`` steps the measured relative error of each
compressed axis on rank 0 (``realrun.train.accuracy``): dp, the gradient sums against exact sums;
tp, the layers' sums; pp, what the stage received against what was sent; ep and ep_combine, the
all-to-alls; cp, the ring's blocks (exact copies travel uncounted on those steps, outside the timed
phases).

A mixture-of-experts model (``realrun.train.moe``) adds ``moe_dropped``, the fraction of
token-to-expert assignments its capacity dropped, and with ``routing_out`` writes the measured
routing histogram at the end (``routing_histogram``); with expert parallelism (``ep`` ranks carved
from dp) the routed experts' gradients reduce over the expert-data-parallel group (dp / ep
ranks) instead of dp.

Context parallelism (``realrun.train.context_parallel``, ``cp`` ranks per replica): every rank
of a cp group reads its replica's batch and keeps its two chunks of each sequence; the loss is the
mean over the cp group (the whole sequence's) and the dense gradients reduce over dp x cp.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from perfmodel.compression.policy import parse_policy
from perfmodel.plan.mesh import Mesh
from perfmodel.workload import load_model
from realrun.comm import Comm
from realrun.comm.exchange import gather_tensor
from realrun import threads
from realrun.train import checkpoint, profiling, rendezvous
from realrun.train.clock import now
from realrun.train.config import TrainConfig
from realrun.train.context_parallel import ContextParallel
from realrun.train.data import load_corpus, train_batch, val_batches
from realrun.train.data_parallel import DataParallel, buckets
from realrun.train.model import GPT
from realrun.train.moe import ExpertParallel
from realrun.train.onebit import CompressedAdam
from realrun.train.phases import AXIS_PHASES, reported_axes, step_phases, upgraded
from realrun.train.pipeline import Pipeline
from realrun.train.runtime import exposed as runtime_exposed
from realrun.train.tensor_parallel import TensorParallel
from realrun.train.zero import ShardedOptimizer
from topologies.clikit import atomic_write
from topologies.errors import InputError

VAL_BATCHES = 4
ADAM = {"betas": (0.9, 0.95), "weight_decay": 0.0}   # GPT-3's betas; no decay on a model this small


def evaluate(run: Run, model: GPT, vals) -> float:
    """Validation loss of the replica with dp rank 0 (its whole pipeline and TP group run the
    forward passes, with its cp ranks; the other replicas wait, or with expert parallelism run
    the same batches beside it); every rank gets the value."""
    value = 0.0
    if run.dp_rank == 0 or run.ep.size > 1:   # an ep group's ranks hold one replica's experts together
        model.eval()
        with torch.no_grad():
            loss = run.pipe.run(model, vals, run.hidden_shape, backward=False).loss_sum
        model.train()
        value = loss if run.dp_rank == 0 else 0.0
        for runtime in run.runtimes:   # evaluation's reductions, routing, ring and transfers are no step's
            runtime.take()
    return _last_stage_mean(value, run, replicas=1)


def _last_stage_mean(value: float, run: Run, replicas: int) -> float:
    """The mean over ``replicas`` of a value only the last pipeline stage holds (each of its TP
    ranks holds the same; each of its cp ranks its tokens' mean, as many tokens each), known to
    every rank."""
    t = torch.tensor([value if run.pipe.last else 0.0], dtype=torch.float64, device=run.device)
    dist.all_reduce(t)
    return float(t) / (replicas * run.tp.size * run.cp.size)


class Metrics:
    """Rank 0's JSON Lines file: each record one ``write`` on an O_APPEND descriptor, so a
    reader never sees half a line and a crash loses at most the step in flight. Opening keeps
    the records of steps before ``keep_before`` (a resumed run) and drops the rest."""

    def __init__(self, path: str | None, keep_before: int = 0):
        self.records: list[dict] = []
        self.fd = None
        if not path:
            return
        if keep_before and os.path.exists(path):   # older records kept under today's phase names
            with open(path) as handle:
                self.records = [upgraded(r) for r in map(json.loads, filter(str.strip, handle))
                                if r["step"] < keep_before]
        atomic_write(path, lambda h: h.write("".join(json.dumps(r) + "\n" for r in self.records).encode()))
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)

    def write(self, record: dict) -> None:
        self.records.append(record)
        if self.fd is not None:
            os.write(self.fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _busiest(times: dict, device) -> dict:
    """The phases of the busiest rank (the most forward and backward seconds: the pipeline's
    and the replicas' bottleneck, whose phases add up to its step as perfmodel's breakdown
    does) and the slowest rank's step time (one all-gather). Each phase the slowest rank's
    instead would count one rank's wait for another as communication."""
    mine = torch.tensor(list(times.values()), dtype=torch.float64, device=device)
    every = torch.zeros(dist.get_world_size() * len(times), dtype=torch.float64, device=device)
    gather_tensor(every, mine)
    rows = every.view(-1, len(times)).tolist()
    names = list(times)
    busy = [names.index("forward_s"), names.index("backward_s")]
    out = dict(zip(names, max(rows, key=lambda r: sum(r[i] for i in busy))))
    out["step_s"] = max(r[names.index("step_s")] for r in rows)
    return out


def _step(cfg: TrainConfig, run: Run, model: GPT, opt, corpus, step: int) -> dict:
    with profiling.span(profiling.STEP_SPAN, cfg.profile is not None):
        return _timed_step(cfg, run, model, opt, corpus, step)


def _timed_step(cfg: TrainConfig, run: Run, model: GPT, opt, corpus, step: int) -> dict:
    start = now(run.device)
    model.zero_grad(set_to_none=False)
    # microbatch m of this replica: every rank of its TP group, cp group and pipeline reads the
    # same; a cp rank keeps its chunks of each sequence
    batches = [run.cp.local(train_batch(corpus, seed=cfg.seed, step=step, index=m * cfg.dp + run.dp_rank,
                                        rows=cfg.mbs, seq=cfg.seq_len)) for m in range(cfg.microbatches)]
    measure = cfg.error_every > 0 and step % cfg.error_every == 0
    for runtime in run.runtimes:
        runtime.start_step(measure)
    passes = run.pipe.run(model, batches, run.hidden_shape)
    optimizer_s = run.dp.step(model, opt)
    step_s = now(run.device) - start
    timings = {runtime: runtime.take() for runtime in run.runtimes}
    times = step_times(step_s, passes, list(timings.values()), optimizer_s, run.axes)
    stats = {axis: st for t in timings.values() for axis, st in t.stats.items() if axis in run.axes}
    errors = {axis: e for t in timings.values() for axis, e in t.errors.items() if axis in run.axes}
    routing = timings[run.ep]
    moe = {"moe_dropped": _dropped_fraction(routing.routed, routing.dropped, run.device)} if model.spec.is_moe else {}
    return {"step": step, "loss": _last_stage_mean(passes.loss_sum, run, cfg.dp), "error_step": measure,
            **_busiest(times, run.device),
            **{f"{axis}_wire_bytes": stats[axis].bytes_out for axis in run.axes},
            **{f"{axis}_rel_error": errors[axis] for axis in run.axes}, **moe,
            # error feedback's ||C(y) - y|| / ||y||, on the steps that measure (None: none ran)
            "dp_contraction": timings[run.dp].contraction}


def step_times(step_s: float, passes, timings: list, optimizer_s: float, axes) -> dict:
    """This rank's times of a step: ``step_s``, forward and backward compute (the pipeline's
    ``passes`` minus the runtimes' collectives inside them), the phases of the reported ``axes``
    (``realrun.train.phases``: each runtime's seconds minus its kernels) and each axis's kernels."""
    forward_s, backward_s = passes.forward_s, passes.backward_s
    for t in timings:   # the collectives inside the passes are their axes' phases
        forward_s -= t.forward_s
        backward_s -= t.backward_s
    exposed, kernels = runtime_exposed(timings, axes)
    return {"step_s": step_s, "forward_s": forward_s, "backward_s": backward_s,
            **step_phases(forward_s, backward_s, optimizer_s, exposed, kernels),
            **{f"{axis}_kernel_s": v for axis, v in kernels.items()}}


def _dropped_fraction(routed: int, dropped: int, device) -> float:
    """The step's dropped token assignments over all it routed, every MoE layer, micro-batch and
    rank (a TP group's ranks route alike: counted on each, the fraction is the same)."""
    t = torch.tensor([routed, dropped], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t[1] / t[0]) if t[0] else 0.0


def device_of(cfg: TrainConfig, rank: int) -> torch.device:
    """This rank's device: a GPU (LOCAL_RANK's, or the rank's modulo the GPUs here) for cuda,
    or auto where CUDA is available; else the CPU."""
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InputError("device", cfg.device, "cpu or auto on a machine without a CUDA device")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())


def train(cfg: TrainConfig, rank: int, world: int, store: str | None = None) -> list[dict]:
    """Run ``cfg`` as rank ``rank`` of ``world`` (``store``: a FileStore path for local ranks,
    None for a launcher's ranks, see ``rendezvous``) on gloo (CPU) or NCCL (GPU). Returns rank
    0's records (empty elsewhere)."""
    device = device_of(cfg, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rendezvous.init_process_group("nccl" if device.type == "cuda" else "gloo", rank, world, cfg.op_timeout_s, store)
    try:
        if world != cfg.world:
            raise InputError("dp", cfg.dp, f"tp x cp x pp x dp = the number of ranks ({world})")
        records = _train(cfg, rank, device)
        dist.barrier()   # every rank done before any tears its connections down
        return records
    finally:
        dist.destroy_process_group()


class Run:
    """This rank's place in the mesh (perfmodel's layout: tp innermost, then cp, ep, pp, dp), its
    stage of the model, and its parallel runtimes (``realrun.train.runtime``), with the state their
    collectives keep."""

    def __init__(self, cfg: TrainConfig, rank: int, model: GPT, device: torch.device):
        self.device = device
        mesh = cfg.degrees.mesh()
        coords = mesh.coords(rank)
        # the replica whose data it reads (its dp group also holds its cp ranks, innermost)
        self.dp_rank, stage = mesh.group_of("dp", rank).index(rank) // cfg.cp, coords["pp"]
        policy = parse_policy(cfg.policy)
        wait_s = cfg.op_timeout_s   # every group's, every Comm's: a dead peer ends the run, never hangs it
        tp_group, pp_group, dp_group = (_my_group(mesh.groups[axis], rank, wait_s)[0] for axis in ("tp", "pp", "dp"))
        self.tp = TensorParallel(cfg.tp, coords["tp"], Comm(tp_group, wait_s, cfg.threads) if cfg.tp > 1 else None,
                                 policy.axis("tp"))
        self.ep, edp_comm = _expert_parallel(cfg, mesh, rank, policy)
        self.ep.aux_scale = 1.0 / cfg.microbatches   # as the pipeline scales each micro-batch's loss
        self.cp = _context_parallel(cfg, mesh, rank, policy)
        layers = cfg.plan().stage_layers(model.spec.num_layers)
        model.keep_stage(sum(layers[:stage]), sum(layers[:stage + 1]), stage == 0, stage == cfg.pp - 1)
        model.shard(self.tp).shard_experts(self.ep).shard_context(self.cp).to(device)
        line = mesh.group_of("pp", rank)
        self.pipe = Pipeline(cfg.schedule, stage, cfg.pp, Comm(pp_group, wait_s, cfg.threads), policy.axis("pp"),
                             line[stage - 1] if stage > 0 else None, line[stage + 1] if stage < cfg.pp - 1 else None,
                             device)
        self.hidden_shape = (cfg.mbs, cfg.seq_len // cfg.cp, model.spec.hidden_size)
        embed_comm = _embedding_comm(mesh, rank, wait_s, cfg.threads) if cfg.pp > 1 and model.spec.tied_embeddings \
            else None
        dp_comm, dp_axis = Comm(dp_group, wait_s, cfg.threads), policy.axis("dp")
        experts = model.expert_parameters() if cfg.ep > 1 else []   # sharded: reduced over edp, not dp
        sharded = {id(e) for e in experts}
        dense = buckets([p for p in model.parameters() if id(p) not in sharded], cfg.bucket_bytes)
        self.zero = None
        if cfg.zero and cfg.dp > 1:
            self.zero = ShardedOptimizer(dense, dp_comm, self.dp_rank, cfg.dp, dp_axis, policy.axis("zero"),
                                         whole=experts, **ADAM, lr=cfg.lr)
        recipe = policy.recipe
        self.dp = DataParallel(dp_comm, dp_axis, cfg.dp * cfg.cp, cfg.dp, dense, buckets(experts, cfg.bucket_bytes),
                               embed_comm, edp_comm, self.zero, device, recipe,
                               recipe.warmup_steps(cfg.steps) if recipe is not None else 0)
        self.recipe_opt = CompressedAdam(dense, dp_comm, dp_axis, recipe, cfg.dp * cfg.cp, cfg.steps, cfg.lr,
                                         ADAM["betas"], device) \
            if recipe is not None and recipe.compresses == "momentum" else None
        self.runtimes = (self.tp, self.cp, self.ep, self.pipe, self.dp)   # every axis's, each step in this order
        self.axes = reported_axes(cfg, model.spec)   # the axes a step record reports (realrun.train.phases)

    def comms(self) -> dict:
        """{name: Comm} of every collective this rank runs (their compressor state is checkpointed)."""
        named = {"tp": self.tp.comm, "pp": self.pipe.comm, "embedding": self.dp.embed_comm, "dp": self.dp.comm,
                 "ep": self.ep.comm, "edp": self.dp.expert_comm, "cp": self.cp.comm}
        return {name: comm for name, comm in named.items() if comm is not None}


def _expert_parallel(cfg: TrainConfig, mesh: Mesh, rank: int, policy) -> tuple[ExpertParallel, Comm | None]:
    """This rank's ep group (the dispatch and combine under the ep and ep_combine specs) and its
    expert-data-parallel Comm (None where ep = 1 or the group is this rank alone)."""
    if cfg.ep == 1:
        return ExpertParallel(1, 0, None), None
    wait_s = cfg.op_timeout_s
    ep_group = _my_group(mesh.groups["ep"], rank, wait_s)[0]
    edp_group = _my_group(mesh.groups["edp"], rank, wait_s)[0]
    comm = Comm(ep_group, wait_s, cfg.threads)
    ep = ExpertParallel(cfg.ep, mesh.coords(rank)["ep"], comm, policy.axis("ep"), policy.axis("ep_combine"))
    return ep, Comm(edp_group, wait_s, cfg.threads) if cfg.dp // cfg.ep > 1 else None


def _context_parallel(cfg: TrainConfig, mesh: Mesh, rank: int, policy) -> ContextParallel:
    """This rank's cp group: its ring (a Comm over the group) under the policy's cp spec."""
    if cfg.cp == 1:
        return ContextParallel(1, 0, None)
    group = _my_group(mesh.groups["cp"], rank, cfg.op_timeout_s)[0]
    return ContextParallel(cfg.cp, mesh.coords(rank)["cp"], Comm(group, cfg.op_timeout_s, cfg.threads),
                           policy.axis("cp"))


def _embedding_comm(mesh: Mesh, rank: int, timeout_s: float, threads: int | None = None) -> Comm | None:
    """Collectives between the first and last stage of this rank's pipeline (tied embeddings);
    None on the stages between."""
    group, member = _my_group([(line[0], line[-1]) for line in mesh.groups["pp"]], rank, timeout_s)
    return Comm(group, timeout_s, threads) if member else None


def _my_group(groups, rank: int, timeout_s: float) -> tuple[object, bool]:
    """(this rank's process group among ``groups`` (lists of global ranks; None: the whole
    world), whether the rank is in one). Every rank creates every group, in the same order, as
    torch.distributed requires."""
    mine, member = None, False
    for members in groups:
        if len(members) == dist.get_world_size():
            return None, True
        group = dist.new_group(list(members), timeout=timedelta(seconds=timeout_s))   # torch's default: 30 min
        if rank in members:
            mine, member = group, True
    return mine, member


def _train(cfg: TrainConfig, rank: int, device: torch.device) -> list[dict]:
    torch.manual_seed(cfg.seed)
    # torch's and the codecs' threads: cfg.threads, else the host's cores over its local ranks (run_local's
    # COMMPRESS_CODEC_THREADS, or torchrun's LOCAL_WORLD_SIZE): realrun runs this process, so torch's too, and
    # explicitly, as run_local's ranks are: a NUMBA_NUM_THREADS in the environment does not change the run
    threads.apply(threads.codec_threads(cfg.threads), torch_too=True)
    model = GPT(load_model(cfg.model), seed=cfg.seed)   # built whole on the CPU: every layout starts alike
    run = Run(cfg, rank, model, device)
    opt = run.zero or run.recipe_opt or torch.optim.AdamW(model.parameters(), lr=cfg.lr, **ADAM)
    first = checkpoint.load(cfg.checkpoint, cfg, rank, model, opt, device, run.comms()) if cfg.resume else 0
    run.dp.steps_done = first   # a recipe's warm-up counts the run's steps, a resumed run's too
    corpus = load_corpus()
    vals = [run.cp.local(b) for b in val_batches(corpus, rows=cfg.mbs, seq=cfg.seq_len, count=VAL_BATCHES)]
    metrics = Metrics(cfg.metrics if rank == 0 else None, keep_before=first)
    bar = _progress(cfg.steps, first) if rank == 0 else None
    with profiling.profiler(cfg, rank, cfg.world) as prof:
        steps = _loop(cfg, rank, run, model, opt, corpus, vals, metrics, bar, first, prof)
    if prof is not None:
        profiling.add_run_times(cfg, rank, steps)
    if cfg.routing_out:
        histogram = routing_histogram(model, run)
        if rank == 0:
            write_histogram(cfg, histogram, histogram_from(cfg, first))
    return metrics.records


def _loop(cfg: TrainConfig, rank: int, run: Run, model: GPT, opt, corpus, vals, metrics, bar, first: int,
          prof) -> list[dict]:
    """The steps from ``first`` on: each trained, evaluated every ``eval_every`` steps, written by
    rank 0 and checkpointed as asked; ``prof`` (a profiler or None) told of each step's end.
    Returns every step's number, time and exposed communication with its kernels (``step``,
    ``step_s``, ``comm_s``) as this rank has them."""
    steps = []
    try:
        for step in range(first, cfg.steps):
            if step == histogram_from(cfg, first):   # the histogram counts the last routing_steps steps only
                for block in model.blocks:
                    if block.moe is not None:
                        block.moe.load = None
            record = _step(cfg, run, model, opt, corpus, step)
            steps.append({"step": step, "step_s": record["step_s"],   # what a profile's trace is told
                          "comm_s": sum(record.get(p, 0.0) for p in AXIS_PHASES) + record.get("compression_s", 0.0)})
            last = step == cfg.steps - 1
            evaluate_now = cfg.eval_every and (step % cfg.eval_every == 0 or last)
            record["val_loss"] = evaluate(run, model, vals) if evaluate_now else None
            if rank == 0:
                metrics.write({**record, "policy": cfg.policy, "tokens": cfg.global_batch * cfg.seq_len})
                if bar is not None:
                    bar.set_postfix(loss=f"{record['loss']:.3f}")
                    bar.update(1)
            if cfg.checkpoint and (last or (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0)):
                checkpoint.save(cfg.checkpoint, cfg, rank, step + 1, model, opt, run.comms())
            if prof is not None:
                prof.step()
    finally:
        metrics.close()
        if bar is not None:
            bar.close()
    return steps


def histogram_from(cfg: TrainConfig, first: int) -> int:
    """The first step the routing histogram counts: the run's first (``first``, a resumed run's), or
    the first of its last ``routing_steps`` steps where that is later."""
    return max(first, cfg.steps - cfg.routing_steps) if cfg.routing_steps else first


def routing_histogram(model: GPT, run: Run) -> list[list[int]]:
    """The router's assignments per expert of every MoE layer of the model (its rows in layer
    order), summed over this run's training passes and every rank's tokens: each stage adds its
    layers' counts, a TP group's first rank alone (its ranks route the same tokens alike). Every
    rank calls it (one all-reduce); every rank gets the sum."""
    spec = model.spec
    layers = [i for i in range(spec.num_layers) if spec.is_moe_layer(i)]
    counts = torch.zeros(len(layers), spec.num_experts, dtype=torch.float64, device=run.device)
    if run.tp.rank == 0:
        for block in model.blocks:
            if block.moe is not None and block.moe.load is not None:
                counts[layers.index(block.moe.index)] += block.moe.load.to(counts.device)
    dist.all_reduce(counts)
    return [[int(round(c)) for c in row] for row in counts.tolist()]


def write_histogram(cfg: TrainConfig, counts: list[list[int]], first: int) -> None:
    """``counts`` as the JSON histogram ``perfmodel predict --routing FILE`` reads
    (``perfmodel.plan.routing.read_histogram``), atomically, at ``cfg.routing_out``."""
    note = (f"realrun train: router assignments per expert (top-k copies, before capacity), summed over steps "
            f"{first}-{cfg.steps - 1} and all {cfg.global_batch * cfg.seq_len} tokens of each, one row per MoE layer")
    body = {"tokens_per_expert": counts, "model": cfg.model, "note": note}
    atomic_write(cfg.routing_out, lambda h: h.write((json.dumps(body) + "\n").encode()))


def _progress(total: int, done: int):
    """tqdm on stderr, only where stderr is a terminal."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=done, desc="train", unit="step", file=sys.stderr, disable=not sys.stderr.isatty())
