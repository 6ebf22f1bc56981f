"""Uncompressed collective algorithms as phases (S = bytes of the whole array).

p ranks over N hosts with r ranks each. Sources: ring, recursive halving/doubling
(Rabenseifner) and pairwise exchange from Thakur, Rabenseifner and Gropp, "Optimization
of collective communication operations in MPICH", IJHPCA 2005; the pipelined double
binary tree from Sanders, Speck and Träff, Parallel Computing 2009 (NCCL's tree);
hierarchical all-reduce from Jia et al. 2018 / NCCL's two-level rings; NVLS from
NVIDIA's NVLink SHARP (multimem reduce-scatter + multicast all-gather).
"""
from __future__ import annotations

import math

from perfmodel.collectives import nvls
from perfmodel.collectives.fabric import Ctx
from perfmodel.collectives.transfers import AlgoCost, Transfer, concurrent
from perfmodel.devices import NvlsPipeline, nvls_pipeline


def lg(x: int) -> int:
    return math.ceil(math.log2(x)) if x > 1 else 0


def ring_allreduce(ctx: Ctx, S: float) -> AlgoCost:
    """2(p-1) steps of S/p: reduce-scatter then all-gather around one ring."""
    p = ctx.ranks
    return AlgoCost(rounds=(concurrent(Transfer(ctx.ring, 2 * (p - 1), 2 * (p - 1) / p * S)),))


def _tree_depth(ctx: Ctx) -> int:
    """NCCL's tree: a chain through the r ranks of a host, a binary tree across hosts
    (NVIDIA/nccl src/graph/tuning.cc: latency 2((r-1) intra + log2 N inter) steps)."""
    return ctx.ranks_per_host - 1 + lg(ctx.hosts)


def tree_allreduce(ctx: Ctx, S: float) -> AlgoCost:
    """Pipelined double binary tree: reduce up and broadcast down, 2S through each rank."""
    return AlgoCost(rounds=(concurrent(Transfer(ctx.ring, 2 * _tree_depth(ctx), 2 * S)),))


def _halving_phases(ctx: Ctx, S: float, factor: int) -> tuple:
    """Recursive halving (or doubling) with the in-host rounds carrying the big halves."""
    N, r = ctx.hosts, ctx.ranks_per_host
    if N == 1:
        return (concurrent(Transfer(ctx.intra, factor * lg(ctx.ranks), factor * S * (1 - 1 / ctx.ranks))),)
    return (concurrent(Transfer(ctx.intra, factor * lg(r), factor * S * (1 - 1 / r))),
            concurrent(Transfer(ctx.inter, factor * lg(N), factor * S * (1 - 1 / N) / r)))


def recursive_doubling_allreduce(ctx: Ctx, S: float) -> AlgoCost:
    """Rabenseifner: halving reduce-scatter + doubling all-gather, 2 log2 p steps, 2(p-1)/p S;
    a non-power-of-two p adds a fold-in and fold-out of S each."""
    extra = () if ctx.ranks & (ctx.ranks - 1) == 0 else (concurrent(Transfer(ctx.ring, 2, 2 * S)),)
    return AlgoCost(rounds=_halving_phases(ctx, S, 2) + extra)


def hierarchical_allreduce(ctx: Ctx, S: float) -> AlgoCost:
    """In-host reduce-scatter, ring all-reduce of S/r across hosts (r rings), in-host all-gather."""
    N, r = ctx.hosts, ctx.ranks_per_host
    inner = Transfer(ctx.intra, r - 1, (r - 1) / r * S)
    return AlgoCost(rounds=(concurrent(inner), concurrent(Transfer(ctx.inter, 2 * (N - 1), 2 * (N - 1) / N * S / r)),
                            concurrent(inner)))


def nvls_allreduce(ctx: Ctx, S: float) -> AlgoCost:
    """NVLink SHARP: the switch reduces; each GPU moves S (1 + 1/p) each way, under NVLS's own
    protocol where the architecture has one (catalog/nccl_arch.toml), in NCCL's pipeline of loops
    where the architecture has one (``nvls_pipelined``), else in one step."""
    return nvls_pipelined(ctx, S, nvls_pipeline(ctx.device.arch))


def nvls_pipelined(ctx: Ctx, S: float, pipe: NvlsPipeline | None) -> AlgoCost:
    """NVLS in ``pipe``'s loops (``perfmodel.collectives.nvls``): one step per loop a channel runs,
    plus the fill loops, which take the first loop's bytes (all of S when it is smaller) once more."""
    per_byte = 1 + 1 / ctx.ranks
    link = ctx.nvls_link or ctx.intra
    if pipe is None:
        return AlgoCost(rounds=(concurrent(Transfer(link, 1, S * per_byte)),))
    n, loop_bytes = nvls.loops(S, pipe, ctx.ranks)
    fill = pipe.fill_loops
    return AlgoCost(rounds=(concurrent(Transfer(link, n + fill, S * per_byte,
                                                fill_bytes=fill * min(S, loop_bytes) * per_byte)),))


def ring_gather(ctx: Ctx, S: float) -> AlgoCost:
    """Ring reduce-scatter or all-gather: p-1 steps of S/p."""
    p = ctx.ranks
    return AlgoCost(rounds=(concurrent(Transfer(ctx.ring, p - 1, (p - 1) / p * S)),))


def recursive_doubling_gather(ctx: Ctx, S: float) -> AlgoCost:
    """Recursive halving reduce-scatter / doubling all-gather: log2 p steps, (p-1)/p S."""
    return AlgoCost(rounds=_halving_phases(ctx, S, 1))


def hierarchical_gather(ctx: Ctx, S: float) -> AlgoCost:
    """In-host reduce-scatter of S, then across hosts on S/r (all-gather: the reverse)."""
    N, r = ctx.hosts, ctx.ranks_per_host
    return AlgoCost(rounds=(concurrent(Transfer(ctx.intra, r - 1, (r - 1) / r * S)),
                            concurrent(Transfer(ctx.inter, N - 1, (N - 1) / N * S / r))))


def ring_broadcast(ctx: Ctx, S: float) -> AlgoCost:
    """Pipelined chain: p-1 latency steps, S through each link."""
    return AlgoCost(rounds=(concurrent(Transfer(ctx.ring, ctx.ranks - 1, S)),))


def tree_broadcast(ctx: Ctx, S: float) -> AlgoCost:
    """Pipelined binary tree: depth steps, each inner rank forwards S to two children."""
    return AlgoCost(rounds=(concurrent(Transfer(ctx.ring, _tree_depth(ctx), 2 * S)),))


def direct_alltoall(ctx: Ctx, S: float) -> AlgoCost:
    """Pairwise exchange, NCCL's all-to-all: p-1 steps of S/p; in-host and cross-host peers run
    at once on their own links, those of the group's traffic matrix where the context has them
    (``perfmodel.collectives.alltoall``), else its ``intra`` and ``inter`` patterns."""
    links = ctx.alltoall
    if links is None or ctx.hosts == 1 and links.pairwise_intra is None:
        return pairwise_alltoall(ctx, S)
    p, r = ctx.ranks, ctx.ranks_per_host
    if ctx.hosts == 1:
        return AlgoCost(rounds=(concurrent(Transfer(links.pairwise_intra, p - 1, (p - 1) / p * S)),))
    intra = (Transfer(links.pairwise_intra, r - 1, (r - 1) / p * S),) if links.pairwise_intra else ()
    return AlgoCost(rounds=(concurrent(*intra, Transfer(links.pairwise_inter, p - r, (p - r) / p * S)),))


def hierarchical_alltoall(ctx: Ctx, S: float) -> AlgoCost:
    """DeepEP's all-to-all (``perfmodel.collectives.alltoall``): one RDMA message per node pair
    on the sender's rail (N-1 steps, (N-1) r S/p bytes), overlapped with NVLink forwarding to the
    final GPUs (r-1 steps, (r-1) N S/p bytes: the node's own and the arrived). Needs the traffic
    matrix's links; on a hand-built context the ``inter`` and ``intra`` patterns stand in."""
    p, N, r = ctx.ranks, ctx.hosts, ctx.ranks_per_host
    links = ctx.alltoall
    rail, forward = (links.rail, links.pairwise_intra) if links is not None else (ctx.inter, ctx.intra)
    return AlgoCost(rounds=(concurrent(Transfer(rail, N - 1, (N - 1) * r / p * S),
                                  Transfer(forward, r - 1, (r - 1) * N / p * S)),))


def pairwise_alltoall(ctx: Ctx, S: float) -> AlgoCost:
    """Pairwise exchange on the context's ``intra`` and ``inter`` patterns (the all-to-all phases
    inside compressed reductions, ``perfmodel.collectives.compressed``)."""
    p, r = ctx.ranks, ctx.ranks_per_host
    if ctx.hosts == 1:
        return AlgoCost(rounds=(concurrent(Transfer(ctx.ring, p - 1, (p - 1) / p * S)),))
    return AlgoCost(rounds=(concurrent(Transfer(ctx.intra, r - 1, (r - 1) / p * S),
                                  Transfer(ctx.inter, p - r, (p - r) / p * S)),))


def direct_sendrecv(ctx: Ctx, S: float) -> AlgoCost:
    """Every rank sends S to the next (a pipeline stage boundary): one step of S."""
    return AlgoCost(rounds=(concurrent(Transfer(ctx.ring, 1, S)),))
