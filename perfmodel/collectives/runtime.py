"""What realrun runs, predicted: its algorithms on torch.distributed primitives.

``collective_time`` answers for NCCL (its algorithms and protocols). realrun runs its own
algorithms (docs/design.md, Compressed collectives) on torch.distributed calls, so a
prediction of a realrun measurement uses the same cost structures with realrun's choices:

* ``auto`` runs ``torch.distributed.all_reduce`` for ``none`` and the casts (fp16, bf16):
  the ring all-reduce carried by the ``allreduce`` primitive;
* ``auto`` otherwise: ``allgather`` for sparse specs, ``two_phase`` for the rest;
* a named algorithm runs realrun's implementation for any spec, ``none`` included;
* no chunking (realrun pipelines only when asked with ``chunks``);
* the all-to-all: ``direct`` (pairwise, each chunk compressed once at its source) for every spec
  (``none`` is torch's own ``all_to_all_single``, pairwise as well: the same cost structure).

Phases are tagged with the primitive that moves them, so a profile's per-primitive
measurements (``primitives``, fitted by ``perfmodel calibrate``) apply.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from perfmodel.calibration.profile import load_calibration
from perfmodel.collectives.predict import DTYPES, resolve_context
from perfmodel.collectives.compressed import Msg, movement, reducible
from perfmodel.collectives.registry import COMPRESSED, PLAIN, runtime_algorithms
from perfmodel.collectives.transfers import AlgoCost, Timed, evaluate, with_runtime_call
from perfmodel.compression import compile_spec
from topologies import build_cluster
from topologies.errors import InputError

# uncompressed collectives measured by others' tools (nccl-tests' all_gather_perf, sendrecv_perf) that the tier
# fit prices as the library runs them: NCCL's ring all-gather, one direct send/recv per peer
PLAIN_ONLY = {"allgather": "ring", "sendrecv": "direct"}
# what runtime_cost prices: realrun's compressed reductions, its all-to-all, and those plain collectives
PRICED_OPS = (*COMPRESSED, "alltoall", *PLAIN_ONLY)


def runtime_algorithm(op: str, compressor: str, algorithm: str) -> str:
    """realrun's algorithm for ``algorithm`` ('auto' resolved as realrun resolves it)."""
    if algorithm != "auto":
        return algorithm
    if op == "alltoall":
        return "direct"
    codec = compile_spec(compressor) if isinstance(compressor, str) else compressor
    if codec.is_none or codec.cast_to:
        return "torch"
    return "allgather" if codec.sparse else "two_phase"


@dataclass(frozen=True, kw_only=True)
class RuntimePrediction:
    algorithm: str       # realrun's algorithm ('torch' = torch.distributed's own call)
    cost: AlgoCost
    timed: Timed

    @property
    def time_s(self) -> float:
        return self.timed.time_s


def runtime_cost(op: str, size_bytes: int, compressor: str, algorithm: str, ctx, calib=None) -> tuple:
    """(realrun algorithm, AlgoCost) of one realrun collective on a prepared context."""
    if op not in PRICED_OPS:
        raise InputError("op", op, "one of " + ", ".join(PRICED_OPS)
                         + " (realrun's compressed reductions and all-to-all; all-gather and send/recv uncompressed)")
    codec = compile_spec(compressor) if isinstance(compressor, str) else compressor
    codec = calib.codec(codec) if calib else codec
    msg = Msg(size_bytes=size_bytes, dtype_bytes=DTYPES["fp32"], codec=codec,
              kernel_scale=None if codec.is_none else ctx.kernel_scale(codec.text, size_bytes))
    if op in PLAIN_ONLY:
        if not codec.is_none:
            raise InputError("compressor", codec.text, f"none for {op} (priced uncompressed only: nccl-tests' runs)")
        return "torch", movement(op, PLAIN[op][PLAIN_ONLY[op]], ctx, msg)
    alg = runtime_algorithm(op, compressor, algorithm)
    allowed = runtime_algorithms(op) if op == "alltoall" else tuple(COMPRESSED[op])
    if (alg != "torch" or op == "alltoall") and alg not in allowed:
        raise InputError("algorithm", algorithm, "auto or one of " + ", ".join(allowed))
    if op == "alltoall":
        cost = alltoall_cost(alg, ctx, msg)
    else:
        cost = reducible(op, PLAIN[op]["ring"], ctx, msg) if alg == "torch" else COMPRESSED[op][alg](ctx, msg)
    return alg, cost if codec.is_none else with_runtime_call(cost, ctx, op, alg, size_bytes)


def alltoall_cost(alg: str, ctx, msg: Msg) -> AlgoCost:
    """realrun's all-to-all: data movement over ``alg``'s exchange (``movement``), with the kernels
    realrun runs: each of the p - 1 outgoing chunks of S/p compressed at its source and decoded
    at its destination, one call each; the own chunk is neither."""
    cost = movement("alltoall", PLAIN["alltoall"][alg], ctx, msg)
    if msg.codec.is_none:
        return cost
    p, n = ctx.ranks, msg.size_bytes / ctx.ranks
    return replace(cost, kernel_bytes=(p - 1) * (msg.c(n) + msg.d(n)), launches=2 * (p - 1))


def runtime_time(op: str, size_bytes: int, *, cluster: str, ranks: int | None = None, compressor: str = "none",
                 algorithm: str = "auto", calibration: str | None = None) -> RuntimePrediction:
    """Predict one realrun collective (``realrun bench`` would measure it) on ``cluster``."""
    calib = load_calibration(calibration)
    built = build_cluster(cluster)
    ctx = resolve_context(built, ranks or built.gpus, "packed", (), calib)
    alg, cost = runtime_cost(op, size_bytes, compressor, algorithm, ctx, calib)
    return RuntimePrediction(algorithm=alg, cost=cost, timed=evaluate(cost, ctx.device, chunks=1))
