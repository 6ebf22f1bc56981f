"""The training loop of one rank: tensor-, pipeline- and data-parallel GPT training, compressed.

Each step: ``microbatches`` forward/backward passes on this replica's data through its
pipeline under the schedule (``pipeline``; gradients accumulate; with tensor parallelism the
layers' reductions run inside them, see ``tensor_parallel``), the tied embedding's gradient
summed between first and last stage, then the gradients are reduced bucket by bucket
(``DEFAULT_BUCKET_BYTES``, in reverse
parameter order as DDP builds them) through ``realrun.comm`` with the spec the policy's
``dp`` axis gives the bucket's size (``ef(...)`` keeps one residual per bucket), averaged,
and AdamW steps (with ZeRO-1: reduce-scatter, a sharded step and an all-gather, see ``zero``).
The reduction runs after the backward pass, not overlapped with it (DDP's overlap needs its
reducer; a prediction of these runs must assume the same).

Measured per step (rank 0 appends one JSON line; the step time is the slowest rank's, every
other time the busiest rank's, see ``_busiest``): loss (the
global mean), step, forward and backward (their TP reductions apart), TP communication, PP
communication (send/recv, including the wait for a neighbour: the bubble), exposed dp
communication (the reduction minus its compression kernels), compression kernels (in all, and
per axis), optimizer seconds, payload bytes per rank and axis (dp, tp, pp, zero),
every ``eval_every`` steps the validation loss, every ``error_every`` steps the measured
relative error of each compressed axis on rank 0 (``realrun.train.accuracy``): dp, the
gradient sums against exact sums; tp, the layers' sums; pp, what the stage received against
what was sent (exact copies travel uncounted on those steps, outside the timed phases).

A mixture-of-experts model (``realrun.train.moe``) adds ``moe_dropped``, the fraction of
token-to-expert assignments its capacity dropped; with expert parallelism (``ep`` ranks carved
from dp) the ep and ep_combine all-to-alls' seconds (``ep_comm_s``, out of forward and
backward), kernels, payload bytes and measured errors, and the routed experts' gradients
reduce over the expert-data-parallel group (dp / ep ranks) instead of dp.

Context parallelism (``realrun.train.context_parallel``, ``cp`` ranks per replica): every rank
of a cp group reads its replica's batch and keeps its two chunks of each sequence; the K/V
ring's seconds are ``cp_comm_s`` (out of forward and backward), with its kernels, payload bytes
and measured error under the cp axis; the loss is the mean over the cp group (the whole
sequence's) and the dense gradients reduce over dp x cp.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from perfmodel.mesh import Mesh
from perfmodel.policy import parse_policy
from perfmodel.workload import load_model
from realrun.comm import Comm, CommStats
from realrun.comm.exchange import gather_tensor
from realrun.compressors import fast
from realrun.train import checkpoint, rendezvous
from realrun.train.accuracy import RelativeError
from realrun.train.clock import now
from realrun.train.config import TrainConfig
from realrun.train.context_parallel import ContextParallel
from realrun.train.data import load_corpus, train_batch, val_batches
from realrun.train.model import GPT
from realrun.train.moe import ExpertParallel
from realrun.train.pipeline import Pipeline
from realrun.train.tensor_parallel import TensorParallel
from realrun.train.zero import ShardedOptimizer
from topologies.clikit import atomic_write
from topologies.errors import InputError

VAL_BATCHES = 4
ADAM = {"betas": (0.9, 0.95), "weight_decay": 0.0}   # GPT-3's betas; no decay on a model this small
PHASES = ("step_s", "forward_s", "backward_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "compress_s", "optimizer_s")


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


def sync_gradients(groups, comm: Comm, axis, world: int, stats: CommStats, error: RelativeError | None) -> None:
    """Sum every bucket's gradients over the ranks under the dp policy, then average. With an
    ``error`` meter, also the exact sum (uncounted) to measure the compressed one against."""
    for i, params in enumerate(groups):
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        exact = None
        if error is not None:
            exact = flat.clone()
            dist.all_reduce(exact, group=comm.group)
        codec = axis.codec_for(flat.numel() * flat.element_size())
        summed = comm.allreduce(flat, codec, key=f"bucket{i}", stats=stats, inplace=codec.is_none)
        if exact is not None:
            error.add(summed, exact)
        summed /= world
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(summed[offset:offset + n].view_as(p.grad))
            offset += n


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
        run.tp.take()   # evaluation's reductions, routing and ring are not the next step's
        run.ep.take()
        run.cp.take()
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
        if keep_before and os.path.exists(path):
            with open(path) as handle:
                self.records = [r for r in map(json.loads, filter(str.strip, handle)) if r["step"] < keep_before]
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
    start = now(run.device)
    model.zero_grad(set_to_none=False)
    # microbatch m of this replica: every rank of its TP group, cp group and pipeline reads the
    # same; a cp rank keeps its chunks of each sequence
    batches = [run.cp.local(train_batch(corpus, seed=cfg.seed, step=step, index=m * cfg.dp + run.dp_rank,
                                        rows=cfg.mbs, seq=cfg.seq_len)) for m in range(cfg.microbatches)]
    measure = cfg.error_every > 0 and step % cfg.error_every == 0
    run.tp.error = RelativeError() if measure and cfg.tp > 1 else None
    run.ep.error = {"ep": RelativeError(), "ep_combine": RelativeError()} if measure and cfg.ep > 1 else None
    run.cp.error = RelativeError() if measure and cfg.cp > 1 else None
    pipe = run.pipe.run(model, batches, run.hidden_shape, measure=measure)
    tp_error, run.tp.error = run.tp.error, None
    ep_error, run.ep.error = run.ep.error or {}, None
    cp_error, run.cp.error = run.cp.error, None
    tp_fwd, tp_bwd, tp_stats = run.tp.take()
    ep_fwd, ep_bwd, ep_stats, routed, dropped = run.ep.take()
    cp_fwd, cp_bwd, cp_stats = run.cp.take()
    replicas = cfg.dp * cfg.cp   # ranks that hold the same dense weights
    stats, zero_stats = CommStats(), CommStats()
    t = now(run.device)
    run.sync_embedding(model, stats)
    dp_error = RelativeError() if measure and replicas > 1 else None
    if dp_error is not None:
        run.dp_comm.track_contraction()
    if run.zero is not None:   # reduce-scatter, sharded update, all-gather
        optim = run.zero.step(stats, zero_stats, dp_error)
        sync = now(run.device) - t - optim
    else:
        if replicas > 1:
            sync_gradients(run.buckets, run.dp_comm, run.dp_axis, replicas, stats, dp_error)
        run.sync_expert_gradients(cfg.dp, stats, dp_error)
        sync = now(run.device) - t
        t = now(run.device)
        opt.step()
        optim = now(run.device) - t
    measured = {"dp": (stats, dp_error), "tp": (tp_stats, tp_error), "pp": (pipe.stats, pipe.error),
                "zero": (zero_stats, None)}   # perfmodel.axes names; zero: its error is not measured
    if cfg.ep > 1:
        measured.update({axis: (ep_stats[axis], ep_error.get(axis)) for axis in ("ep", "ep_combine")})
    if cfg.cp > 1:
        measured["cp"] = (cp_stats, cp_error)
    kernels = {axis: st.compress_s + st.decompress_s for axis, (st, _) in measured.items()}
    times = dict(zip(PHASES, (now(run.device) - start, pipe.forward_s - tp_fwd - ep_fwd - cp_fwd,
                              pipe.backward_s - tp_bwd - ep_bwd - cp_bwd,
                              max(0.0, tp_fwd + tp_bwd - kernels["tp"]), max(0.0, pipe.pp_s - kernels["pp"]),
                              max(0.0, sync - kernels["dp"] - kernels["zero"]), sum(kernels.values()), optim)))
    if cfg.ep > 1:
        times["ep_comm_s"] = max(0.0, ep_fwd + ep_bwd - kernels["ep"] - kernels["ep_combine"])
    if cfg.cp > 1:
        times["cp_comm_s"] = max(0.0, cp_fwd + cp_bwd - kernels["cp"])
    times.update({f"{axis}_kernel_s": v for axis, v in kernels.items()})
    moe = {"moe_dropped": _dropped_fraction(routed, dropped, run.device)} if model.spec.is_moe else {}
    return {"step": step, "loss": _last_stage_mean(pipe.loss_sum, run, cfg.dp), "error_step": measure,
            **_busiest(times, run.device),
            **{f"{axis}_wire_bytes": st.bytes_out for axis, (st, _) in measured.items()},
            **{f"{axis}_rel_error": e.value() if e else None for axis, (_, e) in measured.items()}, **moe,
            # error feedback's ||C(y) - y|| / ||y||, on the steps that measure (None: none ran)
            "dp_contraction": run.dp_comm.take_contraction() if dp_error is not None else None}


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
    stage of the model, and the state its collectives keep."""

    def __init__(self, cfg: TrainConfig, rank: int, model: GPT, device: torch.device):
        self.device = device
        mesh = Mesh(cfg.tp, cfg.pp, cfg.dp, ("tp", "pp", "dp"), cp=cfg.cp, ep=cfg.ep)
        coords = mesh.coords(rank)
        # the replica whose data it reads (its dp group also holds its cp ranks, innermost)
        self.dp_rank, stage = mesh.group_of("dp", rank).index(rank) // cfg.cp, coords["pp"]
        policy = parse_policy(cfg.policy)
        wait_s = cfg.op_timeout_s   # every group's, every Comm's: a dead peer ends the run, never hangs it
        tp_group, pp_group, dp_group = (_my_group(mesh.groups[axis], rank, wait_s)[0] for axis in ("tp", "pp", "dp"))
        self.tp = TensorParallel(cfg.tp, coords["tp"], Comm(tp_group, wait_s) if cfg.tp > 1 else None,
                                 policy.axis("tp"))
        self.ep, self.edp_comm = _expert_parallel(cfg, mesh, rank, policy)
        self.ep.aux_scale = 1.0 / cfg.microbatches   # as the pipeline scales each micro-batch's loss
        self.cp = _context_parallel(cfg, mesh, rank, policy)
        layers = cfg.plan().stage_layers(model.spec.num_layers)
        model.keep_stage(sum(layers[:stage]), sum(layers[:stage + 1]), stage == 0, stage == cfg.pp - 1)
        model.shard(self.tp).shard_experts(self.ep).shard_context(self.cp).to(device)
        line = mesh.group_of("pp", rank)
        self.pipe = Pipeline(cfg.schedule, stage, cfg.pp, Comm(pp_group, wait_s), policy.axis("pp"),
                             line[stage - 1] if stage > 0 else None, line[stage + 1] if stage < cfg.pp - 1 else None,
                             device)
        self.hidden_shape = (cfg.mbs, cfg.seq_len // cfg.cp, model.spec.hidden_size)
        self.embed_comm = _embedding_comm(mesh, rank, wait_s) if cfg.pp > 1 and model.spec.tied_embeddings else None
        self.dp_comm, self.dp_axis = Comm(dp_group, wait_s), policy.axis("dp")
        experts = model.expert_parameters() if cfg.ep > 1 else []   # sharded: reduced over edp, not dp
        sharded = {id(e) for e in experts}
        self.buckets = buckets([p for p in model.parameters() if id(p) not in sharded], cfg.bucket_bytes)
        self.expert_buckets = buckets(experts, cfg.bucket_bytes)
        self.zero = None
        if cfg.zero and cfg.dp > 1:
            self.zero = ShardedOptimizer(self.buckets, self.dp_comm, self.dp_rank, cfg.dp, self.dp_axis,
                                         policy.axis("zero"), **ADAM, lr=cfg.lr)

    def comms(self) -> dict:
        """{name: Comm} of every collective this rank runs (their compressor state is checkpointed)."""
        named = {"tp": self.tp.comm, "pp": self.pipe.comm, "embedding": self.embed_comm, "dp": self.dp_comm,
                 "ep": self.ep.comm, "edp": self.edp_comm, "cp": self.cp.comm}
        return {name: comm for name, comm in named.items() if comm is not None}

    def sync_embedding(self, model: GPT, stats: CommStats) -> None:
        """Tied embeddings across a pipeline: the first stage's embedding and the last stage's
        head are one matrix, so their gradients are summed between the two (Megatron-LM's
        embedding group), a gradient reduction under the dp spec."""
        if self.embed_comm is None or model.embed is None:
            return
        grad = model.embed.weight.grad
        codec = self.dp_axis.codec_for(grad.numel() * grad.element_size())
        grad.copy_(self.embed_comm.allreduce(grad, codec, key="embedding", stats=stats))


    def sync_expert_gradients(self, dp: int, stats: CommStats, error: RelativeError | None) -> None:
        """The routed experts' gradients under expert parallelism: each already sums what its ep
        group's tokens sent it, so a sum over the expert-data-parallel group (dp / ep ranks,
        under the dp spec) makes the whole batch's, averaged over dp as the dense ones are."""
        if self.edp_comm is not None:
            sync_gradients(self.expert_buckets, self.edp_comm, self.dp_axis, dp, stats, error)
            return
        for params in self.expert_buckets:
            for p in params:
                p.grad /= dp


def _expert_parallel(cfg: TrainConfig, mesh: Mesh, rank: int, policy) -> tuple[ExpertParallel, Comm | None]:
    """This rank's ep group (the dispatch and combine under the ep and ep_combine specs) and its
    expert-data-parallel Comm (None where ep = 1 or the group is this rank alone)."""
    if cfg.ep == 1:
        return ExpertParallel(1, 0, None), None
    wait_s = cfg.op_timeout_s
    ep_group = _my_group(mesh.groups["ep"], rank, wait_s)[0]
    edp_group = _my_group(mesh.groups["edp"], rank, wait_s)[0]
    comm = Comm(ep_group, wait_s)
    ep = ExpertParallel(cfg.ep, mesh.coords(rank)["ep"], comm, policy.axis("ep"), policy.axis("ep_combine"))
    return ep, Comm(edp_group, wait_s) if cfg.dp // cfg.ep > 1 else None


def _context_parallel(cfg: TrainConfig, mesh: Mesh, rank: int, policy) -> ContextParallel:
    """This rank's cp group: its ring (a Comm over the group) under the policy's cp spec."""
    if cfg.cp == 1:
        return ContextParallel(1, 0, None)
    group = _my_group(mesh.groups["cp"], rank, cfg.op_timeout_s)[0]
    return ContextParallel(cfg.cp, mesh.coords(rank)["cp"], Comm(group, cfg.op_timeout_s), policy.axis("cp"))


def _embedding_comm(mesh: Mesh, rank: int, timeout_s: float) -> Comm | None:
    """Collectives between the first and last stage of this rank's pipeline (tied embeddings);
    None on the stages between."""
    group, member = _my_group([(line[0], line[-1]) for line in mesh.groups["pp"]], rank, timeout_s)
    return Comm(group, timeout_s) if member else None


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
    torch.set_num_threads(cfg.threads)
    fast.set_threads(cfg.threads)   # as NUMBA_NUM_THREADS in the ranks run_local starts
    model = GPT(load_model(cfg.model), seed=cfg.seed)   # built whole on the CPU: every layout starts alike
    run = Run(cfg, rank, model, device)
    opt = run.zero if run.zero is not None else torch.optim.AdamW(model.parameters(), lr=cfg.lr, **ADAM)
    first = checkpoint.load(cfg.checkpoint, cfg, rank, model, opt, device, run.comms()) if cfg.resume else 0
    corpus = load_corpus()
    vals = [run.cp.local(b) for b in val_batches(corpus, rows=cfg.mbs, seq=cfg.seq_len, count=VAL_BATCHES)]
    metrics = Metrics(cfg.metrics if rank == 0 else None, keep_before=first)
    bar = _progress(cfg.steps, first) if rank == 0 else None
    try:
        for step in range(first, cfg.steps):
            record = _step(cfg, run, model, opt, corpus, step)
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
    finally:
        metrics.close()
        if bar is not None:
            bar.close()
    return metrics.records


def _progress(total: int, done: int):
    """tqdm on stderr, only where stderr is a terminal."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=done, desc="train", unit="step", file=sys.stderr, disable=not sys.stderr.isatty())
