"""Transfers, algorithm costs, protocol choice and chunked pipelining.

An algorithm is a sequence of *rounds*; a round is a set of *transfers* that run at the
same time on different links (time = the slowest); a transfer is ``steps`` sequential
messages that together carry ``nbytes`` from one rank over one link. (Rounds and transfers are
a collective's own words: a step's *stages* are pipeline stages, its *phases* the parts of its
breakdown, ``perfmodel.phases``.) Under protocol P:

    transfer time = steps * max(link latency, P.step)
                    + (nbytes + fill bytes) / min(link bandwidth * P.bw_fraction, P.max)
    wire time     = max over links of P.base + sum over rounds of the slowest transfer

(Hockney's alpha-beta model per phase; NCCL's protocol latencies and bandwidth fractions, see
catalog/protocols.toml and, per GPU generation, catalog/nccl_arch.toml. A protocol whose step is
NCCL's hwLat inside an NVSwitch node takes P.step alone: it covers the path. Fill bytes are a
pipeline's first loops paid once more, NVLS's.) Kernel time is memory traffic over the
device's streaming bandwidth plus one launch overhead per kernel.

Chunked pipelining splits the message into k chunks so kernels overlap transfers:

    t(k) = L + Lk + (k - 1) * O + (K + W) / k + (k - 1) / k * max(K, W)

with L the latency part, W the bandwidth part, K kernel traffic time, Lk launch
overheads, and O = Lk + step latencies re-paid per extra chunk. k = 1 is the
unpipelined sum; large k tends to max(K, W) plus overheads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from perfmodel.devices import PROTOCOL_NAMES, Device
from perfmodel.collectives.fabric import Link

MAX_AUTO_CHUNKS = 64   # the most chunks ``auto`` tries: past it, per-chunk launches dominate any message


PRIMITIVES = ("allreduce", "allgather", "alltoall", "p2p", "broadcast", "reduce_scatter", "sendrecv")


@dataclass(frozen=True)
class Transfer:
    """``steps`` sequential messages carrying ``nbytes`` over ``link``; ``primitive`` names the
    torch.distributed call that moves them where a runtime measured it (``Link.primitives``);
    ``fill_bytes``: bytes whose time is paid once more while a pipeline fills (NVLS's first loops,
    ``perfmodel.collectives.plain.nvls_pipelined``) but which cross the link only once."""

    link: Link
    steps: int
    nbytes: float
    primitive: str = ""
    fill_bytes: float = 0.0


@dataclass(frozen=True, kw_only=True)
class AlgoCost:
    """What an algorithm does, before protocols, devices and chunking turn it into time."""

    rounds: tuple            # tuple of tuples of Transfer
    kernel_bytes: float = 0.0
    launches: int = 0
    hops: int = 0            # lossy compressions one value passes through in sequence
    host_s: float = 0.0      # a runtime's own seconds per call beyond wire and kernels (calibrated)


@dataclass(frozen=True, kw_only=True)
class Timed:
    time_s: float
    protocol: str
    chunks: int
    latency_s: float
    bandwidth_s: float
    kernel_s: float


def concurrent(*transfers: Transfer) -> tuple:
    """One round: the transfers that run at the same time (empty ones dropped)."""
    return tuple(t for t in transfers if t.steps > 0)


def _wire(cost: AlgoCost, proto: str) -> tuple[float, float, float]:
    """(base latency, step latency, bandwidth time) under one protocol."""
    base = steps = bandwidth = 0.0
    for phases in cost.rounds:
        worst_lat = worst_bw = -1.0
        for ph in phases:
            b, step, per_byte = ph.link.terms[proto]
            if ph.primitive in ph.link.primitives:   # measured for this primitive on this tier
                step, per_byte = ph.link.primitive_terms[ph.primitive]
            base = b if b > base else base
            lat, bw = ph.steps * step, (ph.nbytes + ph.fill_bytes) * per_byte
            if lat + bw > worst_lat + worst_bw:
                worst_lat, worst_bw = lat, bw
        if worst_lat >= 0:
            steps += worst_lat
            bandwidth += worst_bw
    return base, steps, bandwidth


def pipelined(latency, launches_s, overhead, kernel, wire, k: int) -> float:
    return latency + launches_s + (k - 1) * overhead + (kernel + wire) / k + (k - 1) / k * max(kernel, wire)


def chunk_options(kernel: float, wire: float, overhead: float, chunks) -> list[int]:
    """Chunk counts worth trying: the given one, or the integers around the optimum
    k* = sqrt(min(K, W) / O) of the pipelining formula (capped at MAX_AUTO_CHUNKS)."""
    if chunks != "auto":
        return [chunks]
    if kernel == 0 or wire == 0:
        return [1]
    best = math.sqrt(min(kernel, wire) / overhead) if overhead > 0 else MAX_AUTO_CHUNKS
    k = max(1, min(MAX_AUTO_CHUNKS, int(best)))
    return sorted({k, min(MAX_AUTO_CHUNKS, k + 1)})


def evaluate(cost: AlgoCost, dev: Device, chunks="auto") -> Timed:
    """Pick the fastest protocol (and chunk count when ``chunks='auto'``) for ``cost``."""
    kernel = cost.kernel_bytes / dev.stream_Bps
    launches_s = cost.launches * dev.launch_s if cost.kernel_bytes > 0 else 0.0
    best_t, best = math.inf, None
    for proto in _protocols(cost):
        base, steps, wire = _wire(cost, proto) if cost.rounds else (0.0, 0.0, 0.0)
        overhead = launches_s + steps
        for k in chunk_options(kernel, wire, overhead, chunks):
            t = pipelined(base + steps, launches_s, overhead, kernel, wire, k)
            if t < best_t:
                best_t, best = t, (proto, k, base + steps, wire)
    proto, k, latency, wire = best
    return Timed(time_s=best_t + cost.host_s, protocol=proto, chunks=k, latency_s=latency + cost.host_s,
                 bandwidth_s=wire, kernel_s=kernel + launches_s)


def with_runtime_call(cost: AlgoCost, ctx, op: str, algorithm: str, size_bytes: float) -> AlgoCost:
    """``cost`` with the runtime's own seconds per call (``Ctx.call``: Python, payload assembly,
    fitted by perfmodel calibrate) where the profile measured ``op`` by ``algorithm``."""
    extra = ctx.call(op, algorithm, size_bytes) if ctx.call else 0.0
    return replace(cost, host_s=extra) if extra else cost


def _protocols(cost: AlgoCost) -> tuple:
    """The protocols every link of ``cost`` has, in the first link's order (NCCL's LL, LL128, Simple;
    NVLS runs Simple only; an MPI library's eager and rendezvous); '-' with no rounds."""
    if not cost.rounds:
        return ("-",)
    links = list({id(ph.link): ph.link for st in cost.rounds for ph in st}.values())
    if not links:
        return PROTOCOL_NAMES
    return tuple(n for n in links[0].protocols if all(n in link.protocols for link in links)) or ("-",)


def wire_bytes_by_tier(cost: AlgoCost) -> dict:
    """Bytes that cross links of each tier for what one rank sends: a phase's bytes times
    the link crossings per byte of its pattern (topologies fabric view ``traversals``)."""
    out: dict[str, float] = {}
    for phases in cost.rounds:
        for ph in phases:
            for tier, crossings in ph.link.traversals:
                out[tier] = out.get(tier, 0.0) + ph.nbytes * crossings
    return {k: v for k, v in out.items() if v > 0}


def tagged(rounds: tuple, primitive: str) -> tuple:
    """``rounds`` with every transfer marked as moved by ``primitive``."""
    return tuple(tuple(replace(ph, primitive=primitive) for ph in st) for st in rounds)
