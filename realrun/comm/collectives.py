"""Compressed collectives on torch.distributed: CPU tensors on gloo (numpy compressors), CUDA
tensors on NCCL (realrun.gpu's CuPy kernels; specs without a GPU path are refused).

Every algorithm of DESIGN section 6, written so that **every rank ends with the same bits**:
a rank decodes its own payload too wherever the others see only the decoded version, and
partial sums are formed in rank order. ``none`` runs the plain torch collective.

    allreduce(t, "int8", algorithm="two_phase")   -> new tensor, same shape and dtype
    allgather(t, "fp16") -> tensor of p * t.numel();  reduce_scatter(t, "int8") -> this rank's part
    broadcast(t, "topk(0.1)", src=0);  send(t, "int8", dst) / recv(like, "int8", src)

``algorithm="auto"`` is ``perfmodel.runtime.runtime_algorithm`` (one place decides, so the
model predicts what runs): none, fp16 and bf16 run the ordinary all-reduce on the (cast)
tensor; sparse specs (top-k, rand-k) use ``allgather`` (one compression per value), others
``two_phase`` (two), as perfmodel's error budget would.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.distributed as dist

from realrun.comm.exchange import (_array, _gather, _u8, all_gather_bytes, all_to_all_bytes, as_u8, on_gpu,
                                   sendrecv_bytes, to_array, world)
from perfmodel.runtime import runtime_algorithm
from realrun.compressors import Compressor
from topologies.errors import InputError

from realrun.comm.names import ALGORITHMS  # re-exported
_wires: dict = {}


class Wire:
    """Bytes for an array under one spec (raw bytes for ``none``), and back. One per spec and
    device per process: the compressor holds error-feedback and warm-start state. On
    ``device='cuda'`` the compressor is realrun.gpu's (CuPy kernels; a spec without a GPU path
    is refused, never run on the host)."""

    def __init__(self, spec: str, device: str = "cpu"):
        self.gpu = device == "cuda"
        if self.gpu:
            from realrun.gpu import GpuCompressor

            self.c = GpuCompressor(spec)
        else:
            self.c = Compressor(spec, seed=0)
        self.none = self.c.codec.is_none
        self.cast = self.c.codec.cast_to
        self.prefix = ""
        self.stats = {"bytes_in": 0, "bytes_out": 0, "compress_s": 0.0, "decompress_s": 0.0}

    def expected(self, n: int, dtype) -> int | None:
        """Payload bytes of ``n`` values where known in advance (none, fixed-size specs)."""
        itemsize = np.dtype(dtype).itemsize
        if self.none:
            return n * itemsize
        return self.c.codec.wire_bytes(n, itemsize) if self.c.codec.exact else None

    def sizes(self, counts: list[int], dtype) -> list[int] | None:
        known = [self.expected(n, dtype) for n in counts]
        return None if None in known else known

    def pack(self, x: np.ndarray, key: str = ""):
        """Payload bytes (a uint8 view of ``x`` for none: no copy)."""
        start = time.perf_counter()
        if self.none:
            data = as_u8(x)
        else:
            data = self.c.compress(x) if self.gpu else self.c.compress(x, key=self.prefix + key).data
        self._sync()
        self.stats["compress_s"] += time.perf_counter() - start
        self.stats["bytes_in"] += x.nbytes
        self.stats["bytes_out"] += len(data)
        return data

    def unpack(self, data, dtype) -> np.ndarray:
        """Values back (a view of the received bytes for none: read, don't keep)."""
        start = time.perf_counter()
        out = as_u8(data).view(dtype) if self.none else self.c.decompress(data).reshape(-1)
        self._sync()
        self.stats["decompress_s"] += time.perf_counter() - start
        return out

    def _sync(self) -> None:
        """GPU kernels run asynchronously: wait, so the statistics time them."""
        if self.gpu:
            from realrun.gpu import synchronize

            synchronize()


def wire(spec: str, device: str = "cpu") -> Wire:
    if (spec, device) not in _wires:
        _wires[(spec, device)] = Wire(spec, device)
    return _wires[(spec, device)]


def _xp(x):
    """The array module of ``x``: numpy, or CuPy for device arrays."""
    if on_gpu(x):
        from realrun.gpu import array_module

        return array_module(x)
    return np


def _roundtrip(c: Wire, x: np.ndarray, key: str) -> tuple[bytes, np.ndarray]:
    data = c.pack(x, key)
    return data, c.unpack(data, x.dtype)


def _acc(x: np.ndarray):
    """Sums are formed in float32 (float64 for float64 input), in rank order on every rank: p <= a
    few hundred terms lose far less than any lossy spec, and at half the memory traffic of
    float64 (decoding and summing are memory-bound on CPUs)."""
    return np.result_type(x.dtype, np.float32)


def _split(n: int, p: int) -> list[slice]:
    base, extra = divmod(n, p)
    edges = np.cumsum([0] + [base + (1 if i < extra else 0) for i in range(p)])
    return [slice(int(edges[i]), int(edges[i + 1])) for i in range(p)]


def ring_allreduce(x: np.ndarray, c: Wire, group=None) -> np.ndarray:
    rank, p = world(group)
    parts = _split(len(x), p)
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


def recursive_doubling_allreduce(x: np.ndarray, c: Wire, group=None) -> np.ndarray:
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


def allgather_allreduce(x: np.ndarray, c: Wire, group=None) -> np.ndarray:
    payloads = all_gather_bytes(c.pack(x, "ag"), group, c.sizes([len(x)] * world(group)[1], x.dtype))
    total = _xp(x).zeros(len(x), _acc(x))
    for data in payloads:
        total += c.unpack(data, x.dtype)
    return total.astype(x.dtype)


def pipelined_allgather_allreduce(x: np.ndarray, c: Wire, group=None, chunks: int = 2) -> np.ndarray:
    """All-gather all-reduce in ``chunks`` pieces: while piece i is gathered asynchronously, piece
    i+1 is compressed. Fixed-size specs only: every rank's payload length is known from the
    count, so no size exchange serializes the pipeline."""
    rank, p = world(group)
    pending = []
    for i, s in enumerate(_split(len(x), chunks)):
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


def two_phase_allreduce(x: np.ndarray, c: Wire, group=None) -> np.ndarray:
    rank, p = world(group)
    parts = _split(len(x), p)
    counts = [s.stop - s.start for s in parts]
    known = c.sizes(counts, x.dtype)
    mine = all_to_all_bytes([c.pack(x[s], f"tp{i}") for i, s in enumerate(parts)], group,
                            None if known is None else [known] * p)
    reduced = _xp(x).zeros(counts[rank], _acc(x))
    for d in mine:
        reduced += c.unpack(d, x.dtype)
    gathered = all_gather_bytes(c.pack(reduced.astype(x.dtype), "tp_out"), group, known)
    return _xp(x).concatenate([c.unpack(d, x.dtype) for d in gathered]).astype(x.dtype)


_subgroups: dict = {}


def _node_groups(local_size: int, group=None):
    """(intra-node group, inter-node group) of this rank; created collectively once."""
    rank, p = world(group)
    if p % local_size:
        raise InputError("local_size", local_size, f"a divisor of the world size {p}")
    key = (id(group), local_size)
    if key not in _subgroups:
        ranks = list(range(p)) if group is None else dist.get_process_group_ranks(group)
        intra = [dist.new_group([ranks[i] for i in range(n, n + local_size)]) for n in range(0, p, local_size)]
        inter = [dist.new_group([ranks[i] for i in range(j, p, local_size)]) for j in range(local_size)]
        _subgroups[key] = (intra, inter)
    intra, inter = _subgroups[key]
    return intra[rank // local_size], inter[rank % local_size]


def hierarchical_allreduce(x: np.ndarray, c: Wire, group=None, local_size: int | None = None) -> np.ndarray:
    """Uncompressed in-node reduce-scatter, two-phase compressed across nodes on the shard,
    uncompressed in-node all-gather: only the slow hop is compressed. ``local_size`` is the
    ranks per node (default: $LOCAL_WORLD_SIZE as torchrun sets it, else the whole group)."""
    rank, p = world(group)
    local = local_size or int(os.environ.get("LOCAL_WORLD_SIZE", p))
    intra, inter = _node_groups(local, group)
    raw = wire("none", "cuda" if c.gpu else "cpu")
    shard = _reduce_scatter(x, raw, intra) if local > 1 else x.astype(_acc(x))
    reduced = two_phase_allreduce(shard.astype(x.dtype), c, inter) if p > local else shard.astype(x.dtype)
    return _xp(x).concatenate([as_u8(d).view(x.dtype) for d in all_gather_bytes(as_u8(reduced), intra)])


IMPLEMENTATIONS = {"ring": ring_allreduce, "recursive_doubling": recursive_doubling_allreduce,
                   "allgather": allgather_allreduce, "two_phase": two_phase_allreduce,
                   "hierarchical": hierarchical_allreduce, "pipelined": pipelined_allgather_allreduce}


def _reduce_scatter(x: np.ndarray, c: Wire, group) -> np.ndarray:
    """This rank's part of the sum (accumulated as ``_acc``), one compression per value."""
    rank, p = world(group)
    parts = _split(len(x), p)
    total = _xp(x).zeros(parts[rank].stop - parts[rank].start, _acc(x))
    known = c.sizes([s.stop - s.start for s in parts], x.dtype)
    for d in all_to_all_bytes([c.pack(x[s], f"rs{i}") for i, s in enumerate(parts)], group,
                              None if known is None else [known] * p):
        total += c.unpack(d, x.dtype)
    return total


def allreduce(tensor: torch.Tensor, spec: str = "none", algorithm: str = "auto", group=None,
              local_size: int | None = None, key: str = "", chunks: int = 1) -> torch.Tensor:
    """Sum ``tensor`` over the group with ``spec`` compression; returns a new tensor.
    ``key`` names the tensor for stateful compressors (error-feedback residuals). ``chunks > 1``
    pipelines compression with communication (the all-gather algorithm, fixed-size specs)."""
    if algorithm != "auto" and algorithm not in IMPLEMENTATIONS:
        raise InputError("algorithm", algorithm, "auto or one of " + ", ".join(ALGORITHMS))
    c = wire(spec, _device(tensor, group))
    alg = runtime_algorithm("allreduce", c.c.codec.text, algorithm)   # the choice perfmodel.runtime predicts
    kwargs = {"local_size": local_size} if alg == "hierarchical" else {}
    if chunks != 1:
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise InputError("chunks", chunks, "an integer >= 1")
        if alg != "allgather" or not (c.none or c.c.codec.exact):
            raise InputError("chunks", chunks, "1, or more with the allgather algorithm and a fixed-size spec")
        alg, kwargs = "pipelined", {"chunks": min(chunks, max(1, tensor.numel()))}
    if world(group)[1] == 1:
        return tensor.clone()
    if alg == "torch":   # none, or a reducible cast: the ordinary all-reduce on the (cast) tensor
        cast = getattr(torch, c.cast) if c.cast else None
        out = tensor.detach().to(cast) if cast else tensor.detach().clone()
        dist.all_reduce(out, group=group)
        return out.to(tensor.dtype)
    x = to_array(tensor)
    c.prefix = f"{key}/"
    try:
        result = IMPLEMENTATIONS[alg](x, c, group, **kwargs)
    finally:
        c.prefix = ""
    return _tensor(result, tensor)


def _device(tensor: torch.Tensor, group) -> str:
    """'cpu' (gloo) or 'cuda' (NCCL moves only CUDA tensors; compression runs on the GPU)."""
    kind = tensor.device.type
    if kind == "cuda" and dist.get_backend(group) == "nccl":
        return "cuda"
    if kind == "cpu" and dist.get_backend(group) != "nccl":
        return "cpu"
    raise InputError("device", str(tensor.device), "CPU tensors on gloo, CUDA tensors on nccl "
                     f"(this group runs {dist.get_backend(group)})")


def _tensor(arr, like: torch.Tensor) -> torch.Tensor:
    """A torch tensor over a result array (numpy or CuPy), shaped like ``like``."""
    if on_gpu(arr):
        return torch.from_dlpack(_xp(arr).ascontiguousarray(arr)).reshape(like.shape)
    return torch.from_numpy(np.ascontiguousarray(arr)).reshape(like.shape)


def allgather(tensor: torch.Tensor, spec: str = "none", group=None) -> torch.Tensor:
    """Every rank's tensor, concatenated in rank order (compressed once at each source)."""
    c, x = wire(spec, _device(tensor, group)), to_array(tensor)
    parts = [c.unpack(d, x.dtype) for d in all_gather_bytes(c.pack(x, "ag"), group)]
    out = _xp(x).concatenate(parts)
    return _tensor(out, out)


def reduce_scatter(tensor: torch.Tensor, spec: str = "none", group=None) -> torch.Tensor:
    """This rank's part (split as evenly as possible, earlier ranks one longer) of the sum:
    the first phase of two-phase, one compression per value."""
    x = to_array(tensor)
    part = _reduce_scatter(x, wire(spec, _device(tensor, group)), group).astype(x.dtype)
    return _tensor(part, part)


def broadcast(tensor: torch.Tensor, spec: str = "none", src: int = 0, group=None) -> torch.Tensor:
    """``src``'s tensor on every rank; the source keeps the decoded version too (same bits)."""
    c, x = wire(spec, _device(tensor, group)), to_array(tensor)
    rank, _ = world(group)
    data = all_gather_bytes(c.pack(x, "bcast") if rank == src else x[:0].view("uint8"), group)[src]
    return _tensor(c.unpack(data, x.dtype).copy(), tensor)


def send(tensor: torch.Tensor, spec: str, dst: int, group=None) -> None:
    """Compress and send to ``dst`` (global rank; pair with ``recv`` there)."""
    data = as_u8(wire(spec, _device(tensor, group)).pack(to_array(tensor), f"p2p{dst}"))
    dist.send(torch.tensor([len(data)], dtype=torch.int64, device=tensor.device), dst, group=group)
    dist.send(_u8(data, len(data)), dst, group=group)


def recv(like: torch.Tensor, spec: str, src: int, group=None) -> torch.Tensor:
    """Receive from ``src`` (global rank) and decompress into a tensor shaped like ``like``."""
    size = torch.zeros(1, dtype=torch.int64, device=like.device)
    dist.recv(size, src, group=group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=like.device)
    dist.recv(buf, src, group=group)
    out = wire(spec, _device(like, group)).unpack(_array(buf), to_array(like).dtype)
    return _tensor(out.copy(), like)
