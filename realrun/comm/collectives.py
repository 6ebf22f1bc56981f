"""Compressed collectives on torch.distributed: CPU tensors on gloo (numpy compressors), CUDA
tensors on NCCL (realrun.gpu's CuPy kernels; specs without a GPU path are refused).

A ``Comm`` holds everything a run of collectives keeps between calls, as PyTorch's comm hooks
keep theirs in ``state``: one ``Wire`` per (spec, device) with the compressor's residuals and
warm starts, the node subgroups of the hierarchical algorithm, and running ``stats``. Its codec
threads default to the host's cores over the ranks on it (``realrun.threads``: ``threads=`` or
``COMMPRESS_CODEC_THREADS`` override, a user's ``NUMBA_NUM_THREADS`` is kept). Every floating
dtype torch hands over is served (``realrun.compressors.dtypes``: fp32, fp64, fp16, bf16, fp8).

    comm = Comm()                                   # the default process group
    y = comm.allreduce(t, "int8", algorithm="two_phase", key="layer3.grad")
    stats = CommStats(); comm.allgather(t, "fp16", stats=stats)   # what this call did

The module-level functions (``allreduce(t, "int8")`` ...) use one ``Comm`` per process group
(``default_comm``), for scripts; libraries and hooks hold their own. The algorithms are in
``algorithms.py`` (every rank ends with the same bits). ``algorithm="auto"`` is
``perfmodel.collectives.runtime.runtime_algorithm`` (one place decides, so the model predicts what runs):
none, fp16 and bf16 run the ordinary all-reduce on the (cast) tensor; sparse specs (top-k,
rand-k) use ``allgather`` (one compression per value), others ``two_phase`` (two). The
all-to-all (``alltoall``, expert parallelism's dispatch and combine) runs ``direct``: each chunk
compressed once at its source, decoded once at its destination. ``shift`` is one step of a
ring (to the next rank, from the previous: context parallelism's K/V passes), compressed once.
"""
from __future__ import annotations

import math
import numbers
import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from perfmodel.compression import Codec
from perfmodel.collectives.record import busbw_factor
from perfmodel.collectives.runtime import runtime_algorithm
from perfmodel.collectives.registry import runtime_algorithms
from realrun.comm.algorithms import (ALLTOALL_IMPLEMENTATIONS, IMPLEMENTATIONS, _reduce_scatter, _xp,
                                     hierarchical_reduce_scatter, split)
from realrun.comm.exchange import all_gather_bytes, as_u8, exchange_bytes, on_gpu, to_array, world
from realrun.comm.names import RUNTIME_ALGORITHMS, OP_TIMEOUT_S
from realrun.comm.wire import BoundWire, CommStats, Wire
from realrun.compressors import dtypes
from realrun.threads import apply as apply_threads
from realrun.threads import codec_threads
from topologies.errors import InputError

__all__ = ["RUNTIME_ALGORITHMS", "Comm", "CommStats", "allgather", "allreduce", "alltoall", "broadcast", "default_comm",
           "recv", "reduce_scatter", "send", "shift"]


class Comm:
    """Compressed collectives on one process group, with their state (module doc)."""

    def __init__(self, group=None, timeout_s: float = OP_TIMEOUT_S, threads: int | None = None):
        self.group, self.timeout_s = group, timeout_s   # timeout_s: point-to-point waits (exchange), node groups
        # codec threads of this rank: None is the host's cores over its local ranks (realrun.threads),
        # applied in the thread that runs each call (numba keeps its count per thread)
        self.threads = None if threads is None else codec_threads(threads)
        self.stats = CommStats()
        self._wires: dict = {}
        self._subgroups: dict = {}
        self._contraction = False   # tally error feedback's contraction (``track_contraction``)

    def wire(self, spec: str | Codec, device: str = "cpu") -> Wire:
        key = (spec.text if isinstance(spec, Codec) else spec, device)
        if key not in self._wires:
            self._wires[key] = wire = Wire(spec, device)
            if self._contraction and not wire.gpu:
                wire.c.ctx.track_contraction(True)
        return self._wires[key]

    def track_contraction(self) -> None:
        """Tally error feedback's contraction on this Comm's (host) wires, those made later too,
        until ``take_contraction``."""
        self._contraction = True
        for wire in self._wires.values():
            if not wire.gpu:
                wire.c.ctx.track_contraction(True)

    def take_contraction(self) -> float | None:
        """The relative error ``||C(y) - y|| / ||y||`` of this Comm's error-feedback compressions
        since ``track_contraction`` (``y`` the tensor plus its old residual: the contraction of
        the error-feedback theory, ``perfmodel.explore.convergence``), and tracking stops; None where
        none ran."""
        self._contraction, res2, y2 = False, 0.0, 0.0
        for wire in self._wires.values():
            if not wire.gpu:
                r, y = wire.c.ctx.take_contraction()
                res2, y2 = res2 + r, y2 + y
        return math.sqrt(res2 / y2) if y2 > 0 else None

    def state_dict(self) -> dict:
        """Every wire's compressor state ({device: {spec: state}}), for checkpoints."""
        out: dict = {}
        for (spec, device), wire in self._wires.items():
            state = wire.state_dict()
            if state:
                out.setdefault(device, {})[spec] = state
        return out

    def load_state_dict(self, saved: dict) -> None:
        """Restore what ``state_dict`` gave (wires are created as needed)."""
        for device, specs in saved.items():
            for spec, state in specs.items():
                self.wire(spec, device).load_state_dict(state)

    def _bound(self, spec, tensor, key: str) -> BoundWire:
        """The wire for one call on ``tensor``, with fresh statistics (and this thread's codec
        threads set, ``realrun.threads.apply``)."""
        apply_threads(self.threads)
        return self.wire(spec, _device(tensor, self.group)).bound(key, CommStats())

    def _settle(self, c: BoundWire, stats: CommStats | None) -> None:
        """Add a call's statistics to the running totals and to the caller's ``stats``."""
        self.stats.add(c.stats)
        if stats is not None:
            stats.add(c.stats)

    def node_groups(self, local_size: int):
        """(intra-node group, inter-node group) of this rank; created collectively once."""
        rank, p = world(self.group)
        if p % local_size:
            raise InputError("local_size", local_size, f"a divisor of the world size {p}")
        if local_size not in self._subgroups:
            ranks = list(range(p)) if self.group is None else dist.get_process_group_ranks(self.group)
            wait = timedelta(seconds=self.timeout_s)   # a dead peer fails their collectives, never hangs them
            intra = [dist.new_group([ranks[i] for i in range(n, n + local_size)], timeout=wait)
                     for n in range(0, p, local_size)]
            inter = [dist.new_group([ranks[i] for i in range(j, p, local_size)], timeout=wait)
                     for j in range(local_size)]
            self._subgroups[local_size] = (intra, inter)
        intra, inter = self._subgroups[local_size]
        return intra[rank // local_size], inter[rank % local_size]

    def allreduce(self, tensor: torch.Tensor, spec: str | Codec = "none", algorithm: str = "auto",
                  local_size: int | None = None, key: str = "", chunks: int = 1, inplace: bool = False,
                  stats: CommStats | None = None) -> torch.Tensor:
        """Sum ``tensor`` over the group with ``spec`` compression: a new tensor, or ``tensor``
        itself with ``inplace`` (no copy where the plain all-reduce runs). ``key`` names the
        tensor for stateful compressors (error-feedback residuals). ``chunks > 1`` pipelines
        compression with communication (the all-gather algorithm, fixed-size specs). ``stats``
        receives this call's bytes and kernel seconds."""
        if algorithm != "auto" and algorithm not in IMPLEMENTATIONS:
            raise InputError("algorithm", algorithm, "auto or one of " + ", ".join(RUNTIME_ALGORITHMS))
        group = self.group
        c = self._bound(spec, tensor, key)
        # the choice perfmodel.collectives.runtime predicts
        alg = runtime_algorithm("allreduce", c.wire.codec, algorithm)
        if chunks != 1:
            if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
                raise InputError("chunks", chunks, "an integer >= 1")
            if alg != "allgather" or not (c.none or c.wire.codec.exact):
                raise InputError("chunks", chunks, "1, or more with the allgather algorithm and a fixed-size spec")
            alg = "pipelined"
        try:
            if world(group)[1] == 1:
                return tensor if inplace else tensor.clone()
            if alg == "torch":   # none, or a reducible cast: the ordinary all-reduce on the (cast) tensor
                # a cast never widens: a 2-byte tensor (bf16, fp16) passes through fp16 and bf16
                cast = c.wire.cast if tensor.element_size() > 2 else None
                width = 2 if cast else tensor.element_size()   # what a ring rank sends (nccl-tests)
                c.stats.bytes_in += tensor.numel() * tensor.element_size()
                c.stats.bytes_out += int(tensor.numel() * width * busbw_factor("allreduce", world(group)[1]))
                return _torch_allreduce(tensor, cast, group, inplace)
            kwargs = self._algorithm_kwargs(alg, c, tensor, local_size, chunks)
            result = _tensor(IMPLEMENTATIONS[alg](to_array(tensor), c, group, **kwargs), tensor)
            return tensor.copy_(result) if inplace else result
        finally:
            self._settle(c, stats)

    def _algorithm_kwargs(self, alg: str, c: BoundWire, tensor, local_size, chunks) -> dict:
        """What the hierarchical and pipelined algorithms take beyond (x, wire, group)."""
        if alg == "pipelined":
            return {"chunks": min(chunks, max(1, tensor.numel()))}
        if alg != "hierarchical":
            return {}
        local = local_size or int(os.environ.get("LOCAL_WORLD_SIZE", world(self.group)[1]))
        intra, inter = self.node_groups(local)
        raw = self.wire("none", "cuda" if c.gpu else "cpu").bound(c.key, c.stats)
        return dict(local=local, intra=intra, inter=inter, raw=raw)

    def allgather(self, tensor: torch.Tensor, spec: str | Codec = "none", key: str = "",
                  stats: CommStats | None = None) -> torch.Tensor:
        """Every rank's tensor, concatenated in rank order (compressed once at each source)."""
        c, x = self._bound(spec, tensor, key), to_array(tensor)
        try:
            parts = [c.unpack(d, x.dtype) for d in all_gather_bytes(c.pack(x, "ag"), self.group)]
        finally:
            self._settle(c, stats)
        out = _xp(x).concatenate(parts)
        return _tensor(out, out, tensor.dtype)

    def reduce_scatter(self, tensor: torch.Tensor, spec: str | Codec = "none", key: str = "",
                       stats: CommStats | None = None, local_size: int | None = None) -> torch.Tensor:
        """This rank's part (split as evenly as possible, earlier ranks one longer) of the sum:
        the first phase of two-phase, one compression per value. ``local_size`` (ranks per node,
        a divisor of the group, between 2 and the group size - 1): ZeRO++'s hierarchical qgZ,
        an in-node compressed all-to-all, then one across nodes on 1/local_size of the data."""
        c, x = self._bound(spec, tensor, key), to_array(tensor)
        _, p = world(self.group)
        try:
            if local_size is not None and 1 < local_size < p:
                intra, inter = self.node_groups(local_size)
                part = hierarchical_reduce_scatter(x, c, self.group, local=local_size, intra=intra,
                                                   inter=inter).astype(x.dtype)
            else:
                part = _reduce_scatter(x, c, self.group).astype(x.dtype)
        finally:
            self._settle(c, stats)
        return _tensor(part, part, tensor.dtype)

    def alltoall(self, tensor: torch.Tensor, spec: str | Codec = "none", splits: list[int] | None = None,
                 out_splits: list[int] | None = None, algorithm: str = "auto", key: str = "",
                 stats: CommStats | None = None) -> torch.Tensor:
        """Rows of ``tensor`` (its dim 0) to every rank, as ``torch.distributed.all_to_all_single``:
        ``splits[j]`` rows go to rank j (default: split as evenly as possible, earlier ranks one
        longer, every rank's tensor the same length); returns the rows every rank sent here, in
        rank order. Each chunk is compressed once at its source and decoded once at its
        destination (dispatched tokens are forwarded, never summed: error enters once); the own
        chunk stays exact. ``out_splits`` (rows from each rank), where known, skips the size round
        for fixed-size specs. ``algorithm``: auto or direct (pairwise). ``none`` runs torch's own
        ``all_to_all_single`` on the rows (no payload copies)."""
        if algorithm not in ("auto",) + runtime_algorithms("alltoall"):
            raise InputError("algorithm", algorithm, "auto or one of " + ", ".join(runtime_algorithms("alltoall")))
        if tensor.dim() < 1:
            raise InputError("tensor", tuple(tensor.shape), "a tensor of at least one dim (its rows are sent)")
        rank, p = world(self.group)
        rows, width = tensor.shape[0], int(np.prod(tensor.shape[1:]))
        if splits is None:
            splits = [s.stop - s.start for s in split(rows, p)]
            out_splits = [splits[rank]] * p if out_splits is None else out_splits
        splits = _check_splits("splits", splits, p, rows)
        if out_splits is not None:
            out_splits = _check_splits("out_splits", out_splits, p, None)
        c = self._bound(spec, tensor, key)
        try:
            if p == 1:
                return tensor.clone()
            if c.none:
                sent = (rows - splits[rank]) * width * tensor.element_size()
                c.stats.bytes_in, c.stats.bytes_out = c.stats.bytes_in + sent, c.stats.bytes_out + sent
                return _torch_alltoall(tensor, splits, out_splits, self.group)
            alg = runtime_algorithm("alltoall", c.wire.codec, algorithm)
            values = None if out_splits is None else [s * width for s in out_splits]
            out = ALLTOALL_IMPLEMENTATIONS[alg](to_array(tensor), c, self.group, splits=[s * width for s in splits],
                                                out_splits=values)
        finally:
            self._settle(c, stats)
        return _tensor(out, out, tensor.dtype).reshape(len(out) // max(width, 1), *tensor.shape[1:])

    def broadcast(self, tensor: torch.Tensor, spec: str | Codec = "none", src: int = 0, key: str = "",
                  stats: CommStats | None = None) -> torch.Tensor:
        """``src``'s tensor on every rank; the source keeps the decoded version too (same bits)."""
        c, x = self._bound(spec, tensor, key), to_array(tensor)
        rank, _ = world(self.group)
        try:
            data = all_gather_bytes(c.pack(x, "bcast") if rank == src else x[:0].view("uint8"), self.group)[src]
            return _tensor(c.unpack(data, x.dtype).copy(), tensor)
        finally:
            self._settle(c, stats)

    def send(self, tensor: torch.Tensor, spec: str | Codec, dst: int, key: str = "",
             stats: CommStats | None = None) -> None:
        """Compress and send to ``dst`` (global rank; pair with ``recv`` there)."""
        self.exchange(tensor, dst, None, None, spec, key, stats)

    def recv(self, like: torch.Tensor, spec: str | Codec, src: int, key: str = "",
             stats: CommStats | None = None) -> torch.Tensor:
        """Receive from ``src`` (global rank) and decompress into a tensor shaped like ``like``."""
        return self.exchange(None, None, like, src, spec, key, stats)

    def shift(self, tensor: torch.Tensor, spec: str | Codec = "none", key: str = "",
              stats: CommStats | None = None) -> torch.Tensor:
        """One ring step: every rank of the group sends ``tensor`` to the next rank (group order,
        the last to the first) and returns what the previous one sent, shaped as ``tensor``
        (every rank's the same shape). Both go out at once (``exchange``), so the ring cannot
        deadlock; context parallelism passes its K/V blocks this way. A group of one returns a
        copy."""
        rank, p = world(self.group)
        if p == 1:
            return tensor.clone()
        ranks = list(range(p)) if self.group is None else dist.get_process_group_ranks(self.group)
        return self.exchange(tensor, ranks[(rank + 1) % p], tensor, ranks[(rank - 1) % p], spec, key, stats)

    def exchange(self, tensor: torch.Tensor | None, dst: int | None, like: torch.Tensor | None,
                 src: int | None, spec: str | Codec = "none", key: str = "",
                 stats: CommStats | None = None) -> torch.Tensor | None:
        """Send ``tensor`` to ``dst`` and receive one shaped like ``like`` from ``src`` at once
        (either side may be None; a pipeline stage's send to one neighbour with its receive
        from the other, see ``exchange_bytes``). Returns the received tensor or None."""
        data = None
        if tensor is not None:
            c = self._bound(spec, tensor, key)
            try:
                data = as_u8(c.pack(to_array(tensor), f"p2p{dst}"))
            finally:
                self._settle(c, stats)
        raw = exchange_bytes(data, dst, src, self.group, like.device if like is not None else None, self.timeout_s)
        if like is None:
            return None
        c = self._bound(spec, like, key)
        try:
            out = c.unpack(raw, to_array(like).dtype)
        finally:
            self._settle(c, stats)
        return _tensor(out.copy(), like)


def _torch_allreduce(tensor: torch.Tensor, cast: str | None, group, inplace: bool) -> torch.Tensor:
    """torch.distributed's own all-reduce, on the tensor itself (``inplace``), a copy, or a cast."""
    if cast:
        out = tensor.detach().to(getattr(torch, cast))
        dist.all_reduce(out, group=group)
        return tensor.copy_(out) if inplace else out.to(tensor.dtype)
    out = tensor if inplace else tensor.detach().clone()
    dist.all_reduce(out, group=group)
    return out


def _torch_alltoall(tensor: torch.Tensor, splits: list[int], out_splits: list[int] | None, group) -> torch.Tensor:
    """torch.distributed's own all-to-all of rows (``none``); the row counts arriving are
    exchanged first where the caller does not know them."""
    if out_splits is None:
        got = torch.zeros(len(splits), dtype=torch.int64, device=tensor.device)
        dist.all_to_all_single(got, torch.tensor(splits, dtype=torch.int64, device=tensor.device), group=group)
        out_splits = got.tolist()
    out = tensor.new_empty((sum(out_splits), *tensor.shape[1:]))
    dist.all_to_all_single(out, tensor.detach().contiguous(), list(out_splits), list(splits), group=group)
    return out


def _check_splits(name: str, splits, p: int, rows: int | None) -> list[int]:
    """``p`` row counts >= 0 (summing to ``rows`` where given) as Python ints; one clear error
    otherwise."""
    ok = isinstance(splits, (list, tuple)) and len(splits) == p and all(
        isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 0 for s in splits)
    if not ok or rows is not None and sum(splits) != rows:
        total = f" summing to the {rows} rows of the tensor" if rows is not None else ""
        raise InputError(name, splits, f"{p} row counts >= 0, one per rank{total}")
    return [int(s) for s in splits]


def _device(tensor: torch.Tensor, group) -> str:
    """'cpu' (gloo) or 'cuda' (NCCL moves only CUDA tensors; compression runs on the GPU)."""
    kind = tensor.device.type
    if kind == "cuda" and dist.get_backend(group) == "nccl":
        return "cuda"
    if kind == "cpu" and dist.get_backend(group) != "nccl":
        return "cpu"
    raise InputError("device", str(tensor.device), "CPU tensors on gloo, CUDA tensors on nccl "
                     f"(this group runs {dist.get_backend(group)})")


def _tensor(arr, like, dtype=None) -> torch.Tensor:
    """A torch tensor over a result array (numpy or CuPy), shaped like ``like``: on the host of the
    array's dtype (bf16 and fp8 arrays: ``dtypes.to_torch``); on the GPU, where a bf16 or fp16
    tensor's values were widened to float32 (``realrun.gpu.from_tensor``), rounded back to
    ``dtype`` (default ``like``'s)."""
    if on_gpu(arr):
        from realrun.gpu import to_tensor

        return to_tensor(_xp(arr).ascontiguousarray(arr), dtype or like.dtype).reshape(like.shape)
    return dtypes.to_torch(arr).reshape(like.shape)


_DEFAULT: dict = {}


def default_comm(group=None) -> Comm:
    """The process's ``Comm`` for ``group`` (what the module-level functions use)."""
    key = id(group)
    if key not in _DEFAULT or _DEFAULT[key].group is not group:
        _DEFAULT[key] = Comm(group)
    return _DEFAULT[key]


def allreduce(tensor, spec="none", algorithm="auto", group=None, local_size=None, key="", chunks=1,
              inplace=False, stats=None):
    """``default_comm(group).allreduce(...)``."""
    return default_comm(group).allreduce(tensor, spec, algorithm, local_size, key, chunks, inplace, stats)


def allgather(tensor, spec="none", group=None, key="", stats=None):
    return default_comm(group).allgather(tensor, spec, key, stats)


def reduce_scatter(tensor, spec="none", group=None, key="", stats=None, local_size=None):
    return default_comm(group).reduce_scatter(tensor, spec, key, stats, local_size)


def alltoall(tensor, spec="none", splits=None, out_splits=None, group=None, algorithm="auto", key="", stats=None):
    """``default_comm(group).alltoall(...)``."""
    return default_comm(group).alltoall(tensor, spec, splits, out_splits, algorithm, key, stats)


def broadcast(tensor, spec="none", src=0, group=None, key="", stats=None):
    return default_comm(group).broadcast(tensor, spec, src, key, stats)


def send(tensor, spec, dst, group=None, key="", stats=None):
    return default_comm(group).send(tensor, spec, dst, key, stats)


def recv(like, spec, src, group=None, key="", stats=None):
    return default_comm(group).recv(like, spec, src, key, stats)


def shift(tensor, spec="none", group=None, key="", stats=None):
    """``default_comm(group).shift(...)``: one ring step."""
    return default_comm(group).shift(tensor, spec, key, stats)
