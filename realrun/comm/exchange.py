"""Moving payloads (variable-size bytes) with torch.distributed primitives.

gloo cannot all-gather tensors of unequal size, so sizes are exchanged first and every
payload is padded to the largest (DESIGN section 8). Where every size is known in advance
(fixed-size specs: the payload length is perfmodel's wire size, a contract test checks it)
callers pass ``sizes`` and the size round is skipped. Payloads go out as uint8 tensors made
over the caller's buffer without a copy (numpy arrays, bytearrays); what comes back are
numpy uint8 views of the receive buffer, also without a copy.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def world(group=None) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def as_u8(data) -> np.ndarray:
    """A flat uint8 numpy view of a payload (ndarray, bytearray, memoryview or bytes)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def _u8(data, size: int) -> torch.Tensor:
    """A uint8 tensor of ``size`` bytes holding ``data`` (no copy when the sizes match and the
    buffer is writable; zero padding otherwise)."""
    arr = as_u8(data)
    if len(arr) == size and size and arr.flags.writeable:
        return torch.from_numpy(arr)
    buf = torch.zeros(size, dtype=torch.uint8)
    if len(arr):
        buf[: len(arr)] = torch.from_numpy(arr.copy() if not arr.flags.writeable else arr)
    return buf


def all_gather_bytes(data, group=None, sizes: list[int] | None = None) -> list[np.ndarray]:
    """Every rank's ``data``, in rank order; ``sizes`` (every rank's length) skips the size round."""
    _, p = world(group)
    if sizes is None:
        gathered = torch.zeros(p, dtype=torch.int64)
        _gather(gathered, torch.tensor([len(as_u8(data))], dtype=torch.int64), group=group)
        sizes = gathered.tolist()
    top = max(sizes)
    out = torch.empty(p * top, dtype=torch.uint8)
    _gather(out, _u8(data, top), group=group)
    raw = out.numpy()
    return [raw[i * top: i * top + sizes[i]] for i in range(p)]


def all_to_all_bytes(pieces: list, group=None, sizes: list[list[int]] | None = None) -> list[np.ndarray]:
    """``pieces[j]`` goes to rank j; returns what each rank sent here, in rank order.
    ``sizes[i][j]`` (rank i's piece for rank j), where known, skips the size round."""
    rank, p = world(group)
    arrays = [as_u8(x) for x in pieces]
    if sizes is None:
        all_sizes = torch.zeros(p * p, dtype=torch.int64)
        _gather(all_sizes, torch.tensor([len(a) for a in arrays], dtype=torch.int64), group=group)
        sizes = all_sizes.view(p, p).tolist()
    top = max(max(row) for row in sizes)
    send = torch.from_numpy(np.concatenate([np.pad(a, (0, top - len(a))) for a in arrays]))
    recv = torch.empty(p * top, dtype=torch.uint8)
    dist.all_to_all_single(recv, send, group=group)
    raw = recv.numpy()
    return [raw[i * top: i * top + sizes[i][rank]] for i in range(p)]


def sendrecv_bytes(data, dst: int, src: int, group=None, size: int | None = None) -> np.ndarray:
    """Send ``data`` to ``dst`` while receiving from ``src`` (group ranks); ``size`` (what ``src``
    sends), where known, skips the size round."""
    to, frm = _global(dst, group), _global(src, group)
    arr = as_u8(data)
    if size is None:
        size_in = torch.zeros(1, dtype=torch.int64)
        reqs = [dist.isend(torch.tensor([len(arr)], dtype=torch.int64), to, group=group),
                dist.irecv(size_in, frm, group=group)]
        for r in reqs:
            r.wait()
        size = int(size_in)
    buf = torch.empty(size, dtype=torch.uint8)
    reqs = [dist.isend(_u8(arr, len(arr)), to, group=group), dist.irecv(buf, frm, group=group)]
    for r in reqs:
        r.wait()
    return buf.numpy()


def _global(rank: int, group) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().reshape(-1).numpy()
