"""Compressed collectives (docs/design.md, Compressed collectives: two cost structures): the two cost structures.

*Data movement* (all-gather, broadcast, all-to-all, send/recv) compresses once at the
source, moves payloads with the ordinary algorithm and decompresses at each receiver.
*Reduction* with a reducible codec (fp16, bf16, PowerSGD factors) runs the ordinary
algorithm on the payload. Reduction with a non-reducible codec needs one of:

* ``ring``: reduce-scatter half decompress-reduce-recompress at every hop (error grows
  with p hops), all-gather half compresses once and forwards (gZCCL, Huang et al. 2023);
* ``recursive_doubling``: log2 p rounds on the whole buffer (gZCCL for small n/p);
* ``allgather``: compress once, gather all payloads, decode p-1 and sum (sparse top-k);
* ``two_phase``: all-to-all of compressed slices, reduce in full precision, compress,
  all-gather (ZeRO++ qgZ, CGX);
* ``hierarchical``: all-reduce: uncompressed in-host reduce-scatter, two-phase across hosts
  on the shard, uncompressed in-host all-gather: only the slow hop is compressed;
  reduce-scatter (ZeRO++ qgZ): compressed all-to-all in the host, reduce, compressed
  all-to-all across hosts. A two-level codec (SDP4Bit's ``tlq``: ``TwoLevel.tiers``) uses its
  intra-node spec inside the host and its inter-node spec across hosts (``tiers``); SDP4Bit's
  chunked pipelining of the two all-to-alls (``--gradient-alltoall-pipeline``, 8 in its scripts)
  is not priced: the chunks of ``transfers.evaluate`` overlap the kernels with the wire, and the
  in-node phase and the one across nodes still run back to back. The hierarchical all-reduce
  (``dp=tlq`` under ZeRO-0) compresses only its hops across hosts, with the inter tier; its error
  is still reported from ``tlq``'s own (both tiers' in quadrature), under the two 4-bit hops'.

``Msg`` gives a piece's payload size and kernel traffic; builders return an AlgoCost.
Where the sum must be the same bits on every rank, a rank decodes its own payload too (it
sums what the others sum): the ring's own chunk, all p payloads of ``allgather``, all p
slices in both phases of ``two_phase`` (realrun does exactly this).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from perfmodel.collectives.fabric import Ctx
from perfmodel.collectives.transfers import AlgoCost, Transfer, concurrent, tagged
from perfmodel.collectives.plain import lg, pairwise_alltoall, ring_gather
from perfmodel.compression import Codec, compile_spec


@dataclass(frozen=True, kw_only=True)
class Msg:
    """A message of ``size_bytes`` of a ``dtype_bytes`` type under ``codec``."""

    size_bytes: int
    dtype_bytes: int
    codec: Codec
    kernel_scale: tuple | None = None   # calibrated (compress, decompress) traffic per input byte
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    def _applied(self, nbytes: float):
        count = max(1, round(nbytes / self.dtype_bytes)) if nbytes > 0 else 0
        if count not in self._memo:
            if self.codec.is_none:
                self._memo[count] = (count * self.dtype_bytes, 0.0, 0.0)
            else:
                out = self.codec.apply(count, self.dtype_bytes)
                wire = self.codec.payload_bytes(out)
                comp, decomp = out.compress_bytes, out.decompress_bytes
                if self.kernel_scale:
                    raw = count * self.dtype_bytes
                    comp, decomp = raw * self.kernel_scale[0], raw * self.kernel_scale[1]
                self._memo[count] = (wire, comp, decomp)
        return self._memo[count]

    def w(self, nbytes: float) -> float:
        """Payload bytes of a piece of ``nbytes``."""
        return self._applied(nbytes)[0]

    def c(self, nbytes: float) -> float:
        """Device traffic to compress a piece of ``nbytes``."""
        return self._applied(nbytes)[1]

    def d(self, nbytes: float) -> float:
        """Device traffic to decompress a piece of ``nbytes``."""
        return self._applied(nbytes)[2]


def tiers(m: Msg) -> tuple[Msg, Msg]:
    """(inside the host, across hosts): a two-level codec's two messages (a single family with
    ``tiers``: SDP4Bit's ``tlq``), else ``m`` for both."""
    fams = m.codec.families
    split = getattr(fams[0], "tiers", None) if len(fams) == 1 else None
    if split is None:
        return m, m
    intra, inter = (Msg(size_bytes=m.size_bytes, dtype_bytes=m.dtype_bytes, codec=compile_spec(spec),
                        kernel_scale=m.kernel_scale) for spec in split())
    return intra, inter


def ring_allreduce(ctx: Ctx, m: Msg) -> AlgoCost:
    p, S = ctx.ranks, m.size_bytes
    n = S / p
    return AlgoCost(rounds=(concurrent(Transfer(ctx.ring, 2 * (p - 1), 2 * (p - 1) * m.w(n), "p2p")),),
                    kernel_bytes=(p - 1) * (m.c(n) + m.d(n)) + m.c(n) + p * m.d(n),
                    launches=2 * (p - 1) + 2, hops=p)


def recursive_doubling_allreduce(ctx: Ctx, m: Msg) -> AlgoCost:
    S, N, r = m.size_bytes, ctx.hosts, ctx.ranks_per_host
    intra, inter = (lg(ctx.ranks), 0) if N == 1 else (lg(r), lg(N))
    extra = 0 if ctx.ranks & (ctx.ranks - 1) == 0 else 2
    rounds = intra + inter + extra
    return AlgoCost(rounds=(concurrent(Transfer(ctx.intra, intra, intra * m.w(S), "p2p")),
                            concurrent(Transfer(ctx.inter, inter, inter * m.w(S), "p2p")),
                            concurrent(Transfer(ctx.ring, extra, extra * m.w(S), "p2p"))),
                    kernel_bytes=rounds * (m.c(S) + m.d(S)), launches=2 * rounds, hops=rounds)


def allgather_allreduce(ctx: Ctx, m: Msg) -> AlgoCost:
    p, S = ctx.ranks, m.size_bytes
    gather = ring_gather(ctx, p * m.w(S))
    return AlgoCost(rounds=tagged(gather.rounds, "allgather"), kernel_bytes=m.c(S) + p * m.d(S),
                    launches=2, hops=1)


def _alltoall(ctx: Ctx, slice_payload: float) -> tuple:
    return tagged(pairwise_alltoall(ctx, ctx.ranks * slice_payload).rounds, "alltoall")


def two_phase_allreduce(ctx: Ctx, m: Msg) -> AlgoCost:
    p, S = ctx.ranks, m.size_bytes
    n = S / p
    gather = ring_gather(ctx, p * m.w(n))
    return AlgoCost(rounds=_alltoall(ctx, m.w(n)) + tagged(gather.rounds, "allgather"),
                    kernel_bytes=m.c(S) + p * m.d(n) + m.c(n) + p * m.d(n),
                    launches=4, hops=2)


def hierarchical_allreduce(ctx: Ctx, m: Msg) -> AlgoCost:
    S, N, r = m.size_bytes, ctx.hosts, ctx.ranks_per_host
    shard, n = S / r, S / (r * N)
    m = tiers(m)[1]   # only the hop across hosts is compressed
    across = (concurrent(Transfer(ctx.inter, N - 1, (N - 1) * m.w(n), "alltoall")),
              concurrent(Transfer(ctx.inter, N - 1, (N - 1) * m.w(n), "allgather")))
    return AlgoCost(rounds=(concurrent(Transfer(ctx.intra, r - 1, (r - 1) / r * S, "alltoall")),) + across
                    + (concurrent(Transfer(ctx.intra, r - 1, (r - 1) / r * S, "allgather")),),
                    kernel_bytes=m.c(shard) + (N - 1) * m.d(n) + m.c(n) + (N - 1) * m.d(n),
                    launches=4, hops=2)


def ring_reduce_scatter(ctx: Ctx, m: Msg) -> AlgoCost:
    p, S = ctx.ranks, m.size_bytes
    n = S / p
    return AlgoCost(rounds=(concurrent(Transfer(ctx.ring, p - 1, (p - 1) * m.w(n), "p2p")),),
                    kernel_bytes=(p - 1) * (m.c(n) + m.d(n)), launches=2 * (p - 1), hops=p - 1)


def two_phase_reduce_scatter(ctx: Ctx, m: Msg) -> AlgoCost:
    p, S = ctx.ranks, m.size_bytes
    n = S / p
    return AlgoCost(rounds=_alltoall(ctx, m.w(n)), kernel_bytes=m.c(S) + (p - 1) * m.d(n),
                    launches=2, hops=1)


def hierarchical_reduce_scatter(ctx: Ctx, m: Msg) -> AlgoCost:
    """ZeRO++'s qgZ (Wang et al. 2023): an all-to-all of compressed slices inside the host, each
    rank reduces its host's slice in full precision, compresses it again and an all-to-all
    across hosts leaves it its shard. Across hosts each rank sends 1/r of what a flat two-phase
    reduce-scatter sends; two compressions (hops 2). A two-level codec (``tiers``) compresses
    each all-to-all with its own tier (SDP4Bit: 8 bits inside, 4 across)."""
    S, N, r = m.size_bytes, ctx.hosts, ctx.ranks_per_host
    local, n = S / r, S / (r * N)
    a, b = tiers(m)
    return AlgoCost(rounds=(concurrent(Transfer(ctx.intra, r - 1, (r - 1) * a.w(local), "alltoall")),
                            concurrent(Transfer(ctx.inter, N - 1, (N - 1) * b.w(n), "alltoall"))),
                    kernel_bytes=a.c(S) + r * a.d(local) + b.c(local) + N * b.d(n), launches=4, hops=2)


def recursive_doubling_reduce_scatter(ctx: Ctx, m: Msg) -> AlgoCost:
    S, rounds = m.size_bytes, lg(ctx.ranks)
    pieces = [S / 2 ** (j + 1) for j in range(rounds)]
    in_host = lg(ctx.ranks_per_host) if ctx.hosts > 1 else rounds
    inside = Transfer(ctx.intra, in_host, sum(m.w(x) for x in pieces[:in_host]), "p2p")
    across = Transfer(ctx.inter, rounds - in_host, sum(m.w(x) for x in pieces[in_host:]), "p2p")
    return AlgoCost(rounds=(concurrent(inside), concurrent(across)),
                    kernel_bytes=sum(m.c(x) + m.d(x) for x in pieces), launches=2 * rounds, hops=rounds)


def reducible(op: str, plain, ctx: Ctx, m: Msg) -> AlgoCost:
    """Reducible codec: compress S, the ordinary algorithm (``plain``: its uncompressed cost
    function, ``registry.PLAIN[op][alg]``) on each payload part, decompress."""
    S, p = m.size_bytes, ctx.ranks
    count = max(1, round(S / m.dtype_bytes)) if S else 0
    parts = m.codec.reduce_parts(count, m.dtype_bytes) if op == "allreduce" else [m.w(S)]
    rounds = tuple(st for part in parts for st in tagged(plain(ctx, part).rounds, op))
    out = S if op == "allreduce" else S / p
    kernels = 0 if m.codec.is_none else 2 * len(parts)
    return AlgoCost(rounds=rounds, kernel_bytes=m.c(S) + m.d(out), launches=kernels,
                    hops=0 if m.codec.lossless else 1)


def movement(op: str, plain, ctx: Ctx, m: Msg) -> AlgoCost:
    """Data movement: compress at the source, move payloads with the ordinary algorithm
    (``plain``: its uncompressed cost function), decompress at each receiver."""
    S, p = m.size_bytes, ctx.ranks
    if op == "allgather":
        n = S / p
        payload, comp, decomp = p * m.w(n), m.c(n), (p - 1) * m.d(n)
    elif op == "alltoall":
        n = S / p
        payload, comp, decomp = p * m.w(n), m.c(S), (p - 1) * m.d(n)
    else:  # broadcast, sendrecv
        payload, comp, decomp = m.w(S), m.c(S), m.d(S)
    moved = plain(ctx, payload)
    return AlgoCost(rounds=tagged(moved.rounds, op), kernel_bytes=comp + decomp,
                    launches=0 if m.codec.is_none else 2, hops=0 if m.codec.lossless else 1)
