"""The all-reduce and all-to-all algorithms of realrun (docs/design.md, compressed collectives), on arrays.

Each takes the local array ``x`` (numpy, or CuPy on the GPU), a ``BoundWire`` (the spec, the
tensor's key, the call's statistics) and the process group, and returns the sum. Written so
that **every rank ends with the same bits**: a rank decodes its own payload too wherever the
others see only the decoded version, and partial sums are formed in rank order.
"""
from __future__ import annotations

import numpy as np
import torch

from realrun.comm.exchange import (_array, _gather, _u8, all_gather_bytes, all_to_all_bytes, all_to_all_split_bytes,
                                   as_u8, on_gpu, sendrecv_bytes, world)
from perfmodel.collectives.registry import implementations
from realrun.comm.wire import BoundWire


def _xp(x):
    """The array module of ``x``: numpy, or CuPy for device arrays."""
    if on_gpu(x):
        from realrun.gpu import array_module

        return array_module(x)
    return np


def _roundtrip(c: BoundWire, x: np.ndarray, key: str) -> tuple[bytes, np.ndarray]:
    data = c.pack(x, key)
    return data, c.unpack(data, x.dtype)


def _acc(x: np.ndarray):
    """Sums are formed in float32 (float64 for float64 input), in rank order on every rank: p <= a
    few hundred terms lose far less than any lossy spec, and at half the memory traffic of
    float64 (decoding and summing are memory-bound on CPUs)."""
    return np.result_type(x.dtype, np.float32)


def split(n: int, p: int) -> list[slice]:
    base, extra = divmod(n, p)
    edges = np.cumsum([0] + [base + (1 if i < extra else 0) for i in range(p)])
    return [slice(int(edges[i]), int(edges[i + 1])) for i in range(p)]


def ring_allreduce(x: np.ndarray, c: BoundWire, group=None) -> np.ndarray:
    rank, p = world(group)
    parts = split(len(x), p)
    acc = [x[s].astype(_acc(x)) for s in parts]
    nxt, prv = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):   # reduce-scatter: decompress, reduce, recompress at every hop
        send_i, recv_i = (rank - step) % p, (rank - step - 1) % p
        data = c.pack(acc[send_i].astype(x.dtype), f"ring{send_i}")
        got = sendrecv_bytes(data, nxt, prv, group, c.expected(len(acc[recv_i]), x.dtype))
        acc[recv_i] += c.unpack(got, x.dtype)
    own = (rank + 1) % p
    data, mine = _roundtrip(c, acc[own].astype(x.dtype), f"ring{own}")
    acc[own] = mine.astype(_acc(x))
    for step in range(p - 1):   # all-gather: compress once, forward payloads
        recv_i = (own - step - 1) % p
        data = sendrecv_bytes(data, nxt, prv, group, c.expected(len(acc[recv_i]), x.dtype))
        acc[recv_i] = c.unpack(data, x.dtype).astype(_acc(x))
    return np.concatenate(acc).astype(x.dtype) if acc else x.copy()


def recursive_doubling_allreduce(x: np.ndarray, c: BoundWire, group=None) -> np.ndarray:
    """log2 p rounds on the whole buffer; ranks beyond the largest power of two fold in first
    and get the result back last. Both partners add the two decoded payloads in rank order."""
    rank, p = world(group)
    low = 1 << (p.bit_length() - 1)
    value = x.astype(_acc(x))
    if rank >= low:
        sendrecv_bytes(c.pack(x, "rd"), rank - low, rank - low, group)
    elif rank + low < p:
        theirs = sendrecv_bytes(b"", rank + low, rank + low, group, like=x)
        _, mine = _roundtrip(c, x, "rd")
        value = mine.astype(_acc(x)) + c.unpack(theirs, x.dtype)
    if rank < low:
        bit = 1
        while bit < low:
            partner = rank ^ bit
            data, mine = _roundtrip(c, value.astype(x.dtype), f"rd{bit}")
            got = sendrecv_bytes(data, partner, partner, group, c.expected(len(x), x.dtype))
            theirs = c.unpack(got, x.dtype).astype(_acc(x))
            a, b = (mine.astype(_acc(x)), theirs) if rank < partner else (theirs, mine.astype(_acc(x)))
            value = a + b
            bit <<= 1
    if rank >= low:
        return as_u8(sendrecv_bytes(b"", rank - low, rank - low, group, len(x) * x.itemsize, like=x)).view(
            x.dtype).copy()
    if rank + low < p:
        sendrecv_bytes(as_u8(value.astype(x.dtype)), rank + low, rank + low, group, 0)
    return value.astype(x.dtype)


def allgather_allreduce(x: np.ndarray, c: BoundWire, group=None) -> np.ndarray:
    payloads = all_gather_bytes(c.pack(x, "ag"), group, c.sizes([len(x)] * world(group)[1], x.dtype))
    total = _xp(x).zeros(len(x), _acc(x))
    for data in payloads:
        total += c.unpack(data, x.dtype)
    return total.astype(x.dtype)


def pipelined_allgather_allreduce(x: np.ndarray, c: BoundWire, group=None, chunks: int = 2) -> np.ndarray:
    """All-gather all-reduce in ``chunks`` pieces: while piece i is gathered asynchronously, piece
    i+1 is compressed. Fixed-size specs only: every rank's payload length is known from the
    count, so no size exchange serializes the pipeline."""
    rank, p = world(group)
    pending = []
    for i, s in enumerate(split(len(x), chunks)):
        data = as_u8(c.pack(x[s], f"pg{i}"))
        mine = _u8(data, len(data))
        out = torch.empty(p * len(data), dtype=torch.uint8, device=mine.device)
        work = _gather(out, mine, group=group, async_op=True)
        pending.append((work, out, len(data), s))
    total = _xp(x).zeros(len(x), _acc(x))
    for work, out, size, s in pending:
        work.wait()
        raw = _array(out)
        for r in range(p):
            total[s] += c.unpack(raw[r * size:(r + 1) * size], x.dtype)
    return total.astype(x.dtype)


def two_phase_allreduce(x: np.ndarray, c: BoundWire, group=None) -> np.ndarray:
    rank, p = world(group)
    parts = split(len(x), p)
    counts = [s.stop - s.start for s in parts]
    known = c.sizes(counts, x.dtype)
    mine = all_to_all_bytes([c.pack(x[s], f"tp{i}") for i, s in enumerate(parts)], group,
                            None if known is None else [known] * p)
    reduced = _xp(x).zeros(counts[rank], _acc(x))
    for d in mine:
        reduced += c.unpack(d, x.dtype)
    gathered = all_gather_bytes(c.pack(reduced.astype(x.dtype), "tp_out"), group, known)
    return _xp(x).concatenate([c.unpack(d, x.dtype) for d in gathered]).astype(x.dtype)


def hierarchical_allreduce(x: np.ndarray, c: BoundWire, group=None, *, local: int, intra, inter,
                           raw: BoundWire) -> np.ndarray:
    """Uncompressed in-node reduce-scatter, two-phase compressed across nodes on the shard,
    uncompressed in-node all-gather: only the slow hop is compressed. ``local`` ranks per node,
    ``intra`` / ``inter`` this rank's node and cross-node groups, ``raw`` the uncompressed wire."""
    rank, p = world(group)
    shard = _reduce_scatter(x, raw, intra) if local > 1 else x.astype(_acc(x))
    reduced = two_phase_allreduce(shard.astype(x.dtype), c, inter) if p > local else shard.astype(x.dtype)
    return _xp(x).concatenate([as_u8(d).view(x.dtype) for d in all_gather_bytes(as_u8(reduced), intra)])


def _reduce_scatter(x: np.ndarray, c: BoundWire, group, parts: list[slice] | None = None,
                    tag: str = "rs") -> np.ndarray:
    """This rank's part (accumulated as ``_acc``) of the sum, one compression per value: slice
    ``parts[j]`` of every rank goes to rank j (default: ``split``, earlier ranks one longer)."""
    rank, p = world(group)
    parts = parts or split(len(x), p)
    total = _xp(x).zeros(parts[rank].stop - parts[rank].start, _acc(x))
    known = c.sizes([s.stop - s.start for s in parts], x.dtype)
    for d in all_to_all_bytes([c.pack(x[s], f"{tag}{i}") for i, s in enumerate(parts)], group,
                              None if known is None else [known] * p):
        total += c.unpack(d, x.dtype)
    return total


def hierarchical_reduce_scatter(x: np.ndarray, c: BoundWire, group=None, *, local: int, intra,
                                inter) -> np.ndarray:
    """ZeRO++'s qgZ: this rank's ``split`` part of the sum in two compressed all-to-alls, the
    first inside the node, the second across nodes on 1/local of the data. Ranks are packed
    (rank = node x local + j). The node's slices are reordered first so that local rank j's
    slice holds the parts of every node's rank j (ZeRO++'s tensor slice reordering): after the
    in-node reduction rank j has the node's sum of exactly what its peers across nodes need."""
    rank, p = world(group)
    nodes = p // local
    parts = split(len(x), p)
    order = [parts[n * local + j] for j in range(local) for n in range(nodes)]
    y = _xp(x).concatenate([x[s] for s in order]) if len(x) else x.copy()
    sizes = [s.stop - s.start for s in order]
    edges = np.cumsum([0] + sizes)
    per_local = [slice(int(edges[j * nodes]), int(edges[(j + 1) * nodes])) for j in range(local)]
    mine = _reduce_scatter(y, c, intra, per_local, "hrs1-").astype(x.dtype)
    inner = np.cumsum([0] + sizes[(rank % local) * nodes:(rank % local + 1) * nodes])
    per_node = [slice(int(inner[n]), int(inner[n + 1])) for n in range(nodes)]
    return _reduce_scatter(mine, c, inter, per_node, "hrs2-")


def direct_alltoall(x: np.ndarray, c: BoundWire, group=None, *, splits: list[int],
                    out_splits: list[int] | None) -> np.ndarray:
    """The pairwise all-to-all: ``x[edges[j]:edges[j + 1]]`` (``splits[j]`` values) goes to rank j
    compressed once at this source and is decoded once at its destination (activations are
    forwarded, never summed: error enters once); this rank's own chunk crosses no link and stays
    exact. Returns the values every rank sent here, in rank order. ``out_splits`` (values from
    each rank), where known with a fixed-size spec, skips the size round."""
    rank, p = world(group)
    edges = np.cumsum([0, *splits])
    chunks = [x[int(edges[j]):int(edges[j + 1])] for j in range(p)]
    pieces = [x[:0].view("uint8") if j == rank else c.pack(chunks[j], f"a2a{j}") for j in range(p)]
    known = None if out_splits is None else c.sizes(list(out_splits), x.dtype)
    if known is not None:
        known[rank] = 0
    got = all_to_all_split_bytes(pieces, group, known)
    parts = [chunks[i].copy() if i == rank else c.unpack(got[i], x.dtype) for i in range(p)]
    return _xp(x).concatenate(parts)


# Registered against perfmodel's declarations (perfmodel.collectives.registry): a name the model
# does not declare for the runtime, or a declared one missing here, fails at import.
IMPLEMENTATIONS = implementations("allreduce", ring=ring_allreduce, recursive_doubling=recursive_doubling_allreduce,
                                  allgather=allgather_allreduce, two_phase=two_phase_allreduce,
                                  hierarchical=hierarchical_allreduce, pipelined=pipelined_allgather_allreduce)
ALLTOALL_IMPLEMENTATIONS = implementations("alltoall", direct=direct_alltoall)
