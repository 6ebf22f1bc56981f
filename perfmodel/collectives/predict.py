"""``collective_time``: predict one collective, compressed or not, on a cluster.

The flow: cluster (topologies) -> group's fabric view -> Ctx (links with protocols)
-> candidate algorithms for (op, codec) -> AlgoCost -> protocol, chunking -> record.
``algorithm='auto'`` evaluates every applicable algorithm and keeps the fastest, as
NCCL's tuner does for its own.
"""
from __future__ import annotations

import math
from functools import lru_cache, partial

from perfmodel.collectives.compressed import Msg, movement, reducible
from perfmodel.collectives.fabric import Ctx, make_ctx
from perfmodel.collectives.transfers import evaluate, wire_bytes_by_tier, with_runtime_call
from perfmodel.collectives.registry import COMPRESSED, OPS, PLAIN
from perfmodel.dtypes import DTYPE_BYTES
from perfmodel.calibration.profile import load_profile
from perfmodel.collectives.library import library
from perfmodel.compression import Codec, compile_spec
from perfmodel.collectives.record import CollectiveRecord, busbw_factor
from topologies import InputError, cluster_for, place

DTYPES = {k: DTYPE_BYTES[k] for k in ("fp32", "bf16", "fp16")}   # the element types a collective takes
# The most pipelining chunks a user may ask for: past a few hundred, per-chunk launches dominate any message.
MAX_REQUESTED_CHUNKS = 4096
REDUCTIONS = ("allreduce", "reduce_scatter")
# What 'auto' weighs comes from the collective library (perfmodel.collectives.library, catalog/libraries.toml):
# NCCL's own algorithms (ring, tree, nvls, direct; and DeepEP's hierarchical all-to-all, which MoE
# jobs run beside it) whenever the ordinary algorithm carries the data (uncompressed, reducible
# payloads, data movement), so the uncompressed baseline is what a job runs today and fp16 is not
# credited with a better algorithm; an MPI library's ring and Rabenseifner instead. Others can be
# asked for by name.
# 'auto' accepts at most this factor on the error of the most accurate algorithm
# (error grows as sqrt(hops), so at most ERROR_BUDGET**2 times the fewest hops).
ERROR_BUDGET = 2.0


def _check(op: str, size_bytes, dtype: str) -> None:
    if op not in PLAIN:
        raise InputError("op", op, "one of " + ", ".join(OPS))
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
        raise InputError("size", size_bytes, "a whole number of bytes >= 0")
    if dtype not in DTYPES:
        raise InputError("dtype", dtype, "one of " + ", ".join(DTYPES))


def candidates(op: str, codec, ctx: Ctx, library_only: bool = True) -> dict:
    """{algorithm: builder(ctx, msg) -> AlgoCost} applicable to ``op`` with ``codec``; with
    ``library_only`` (what 'auto' weighs) those the context's collective library runs."""
    lib = ctx.library or library(None)
    compressed = op in REDUCTIONS and not codec.reducible
    if compressed:
        table = dict(COMPRESSED[op])
    elif op in REDUCTIONS:
        table = {a: partial(reducible, op, f) for a, f in PLAIN[op].items()}
    else:
        table = {a: partial(movement, op, f) for a, f in PLAIN[op].items()}
    if ctx.hosts == 1 or ctx.ranks_per_host == 1:
        table.pop("hierarchical", None)
    if not ctx.nvls:
        table.pop("nvls", None)
    allowed = (lib.compressed.get(op) if compressed else lib.auto.get(op, ())) if library_only else None
    if allowed is not None:
        table = {a: f for a, f in table.items() if a in allowed}
    return table


def _allowed_text(op: str, codec) -> str:
    kind = "non-reducible" if op in REDUCTIONS and not codec.reducible else "this"
    names = sorted(COMPRESSED[op] if kind == "non-reducible" else PLAIN[op])
    return f"auto or one of {', '.join(names)} for {op} with {kind} compressor (hierarchical needs " \
           "several nodes with several ranks each; nvls a single NVLS-capable node)"


def _best(op, size_bytes, dtype, codec, ctx, algorithm, chunks):
    """(name, AlgoCost, Timed, Msg) of the fastest candidate. 'auto' on a lossy codec only
    considers algorithms whose error growth (hops) keeps the error within ERROR_BUDGET times
    that of the most accurate candidate: it will not buy speed with a 16-hop ring of top-k."""
    table = candidates(op, codec, ctx, library_only=algorithm == "auto")
    if algorithm != "auto":
        if algorithm not in table:
            raise InputError("algorithm", algorithm, _allowed_text(op, codec))
        table = {algorithm: table[algorithm]}
    msg = Msg(size_bytes=size_bytes, dtype_bytes=DTYPES[dtype], codec=codec.on(ctx.device),
              kernel_scale=None if codec.is_none else ctx.kernel_scale(codec.text, size_bytes))
    costs = {name: build(ctx, msg) for name, build in table.items()}
    if not codec.is_none and ctx.call:
        costs = {name: with_runtime_call(c, ctx, op, name, size_bytes) for name, c in costs.items()}
    fewest = min(c.hops for c in costs.values())
    best = None
    for name, cost in costs.items():
        if cost.hops > fewest * ERROR_BUDGET ** 2:
            continue
        timed = evaluate(cost, ctx.device, chunks)
        if best is None or timed.time_s < best[2].time_s:
            best = (name, cost, timed, msg)
    return best


@lru_cache(maxsize=4096)
def _uncompressed_time(op, size_bytes, dtype, ctx) -> float:
    return _best(op, size_bytes, dtype, compile_spec("none"), ctx, "auto", 1)[2].time_s


def collective_time(op: str, size_bytes: int, *, cluster: str = "dgx-a100", nodes: int | None = None,
                    gpus: int | None = None, compressor: str = "none", algorithm: str = "auto",
                    dtype: str = "fp32", chunks="auto", placement="packed", ranks: int | None = None,
                    concurrent=(), calibration: str | None = None, library: str | None = None) -> CollectiveRecord:
    """Predict one collective on ``cluster`` sized by ``nodes`` or ``gpus``.

    ``ranks`` (default: every GPU) are placed ``packed``, ``spread`` or on an explicit
    list of GPU indices; ``concurrent`` lists other groups (GPU indices) that run the
    same collective at the same time and share links. ``chunks`` is an int >= 1 or
    'auto'. ``calibration`` is a profile path (see ``perfmodel.calibration.profile``); ``library`` the
    collective library whose algorithms and constants price it (``perfmodel.collectives.library``: nccl, the
    default, or mpi). Returns a CollectiveRecord (``.to_dict()`` for JSON).
    """
    _check(op, size_bytes, dtype)
    bad_int = isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= MAX_REQUESTED_CHUNKS
    if chunks != "auto" and bad_int:
        raise InputError("chunks", chunks, f"an integer from 1 to {MAX_REQUESTED_CHUNKS}, or auto")
    calib = load_profile(calibration, library)
    built, job = cluster_for(cluster, nodes=nodes, gpus=gpus)   # a partial last node where gpus asks
    ctx = resolve_context(built, ranks or job, placement if isinstance(placement, str) else tuple(placement),
                   tuple(tuple(g) for g in concurrent), calib)
    codec = compile_spec(compressor) if isinstance(compressor, str) else compressor
    codec = calib.codec(codec) if calib else codec
    if op == "reduce_scatter" and codec.factored:
        raise InputError("compressor", compressor, "powersgd compresses all-reduce only")
    return _record(op, size_bytes, dtype, codec, str(compressor), ctx, built, algorithm, chunks)


@lru_cache(maxsize=65536)
def collective_on(built, ctx: Ctx, op: str, size_bytes: int, codec: Codec, dtype: str = "fp32",
                  algorithm: str = "auto", label: str | None = None) -> CollectiveRecord:
    """The record of one collective on a prepared context (what the step model calls): ``codec``
    is the compiled spec with any calibrated ratios already applied, ``label`` how the user
    wrote it (default its canonical text). Cached."""
    _check(op, size_bytes, dtype)
    return _record(op, size_bytes, dtype, codec, label or codec.text, ctx, built, algorithm, "auto")


@lru_cache(maxsize=256)
def resolve_context(built, ranks, placement, concurrent, calib) -> Ctx:
    """Place the ranks and build their context (also what perfmodel.collectives.runtime and perfmodel.calibration.fit
    predict on); cached so repeated calls skip both."""
    return make_ctx(built, place(built, ranks or built.gpus, placement), concurrent, calib)


def _record(op, size_bytes, dtype, codec, label, ctx, built, algorithm, chunks) -> CollectiveRecord:
    count = size_bytes // DTYPES[dtype]
    if ctx.ranks == 1 or size_bytes == 0:
        return _trivial(op, size_bytes, count, dtype, codec, label, ctx, built)
    name, cost, timed, msg = _best(op, size_bytes, dtype, codec, ctx, algorithm, chunks)
    tiers = wire_bytes_by_tier(cost)
    base = timed.time_s if codec.is_none and algorithm == "auto" else \
        _uncompressed_time(op, size_bytes, dtype, ctx)
    algbw = size_bytes / timed.time_s / 1e9
    eps = codec.error
    return CollectiveRecord(
        op=op, size_bytes=size_bytes, count=count, dtype=dtype, cluster=built.name, nodes=built.hosts,
        gpus=ctx.ranks, algorithm=name, protocol=timed.protocol, chunks=timed.chunks, compressor=label,
        compressor_spec=codec.text, time_s=timed.time_s, algbw_GBps=algbw,
        busbw_GBps=algbw * busbw_factor(op, ctx.ranks), wire_bytes=tiers,
        sent_bytes=sum(ph.nbytes for st in cost.rounds for ph in st),
        wire_bytes_total=sum(tiers.values()), compression_ratio=size_bytes / max(msg.w(size_bytes), 1),
        exact_wire_size=codec.exact, kernel_time_s=timed.kernel_s, latency_s=timed.latency_s,
        bandwidth_s=timed.bandwidth_s, error_estimate=eps * math.sqrt(cost.hops), hops=cost.hops,
        speedup_vs_none=base / timed.time_s)


def _trivial(op, size_bytes, count, dtype, codec, label, ctx, built) -> CollectiveRecord:
    """One rank (or an empty message) moves nothing and costs nothing."""
    return CollectiveRecord(
        op=op, size_bytes=size_bytes, count=count, dtype=dtype, cluster=built.name, nodes=built.hosts,
        gpus=ctx.ranks, algorithm="none", protocol="-", chunks=1, compressor=label,
        compressor_spec=codec.text, time_s=0.0, algbw_GBps=math.inf if size_bytes else 0.0,
        busbw_GBps=math.inf if size_bytes else 0.0, sent_bytes=0.0, wire_bytes={}, wire_bytes_total=0.0,
        compression_ratio=1.0, exact_wire_size=codec.exact, kernel_time_s=0.0, latency_s=0.0,
        bandwidth_s=0.0, error_estimate=0.0, hops=0, speedup_vs_none=1.0)
