"""Moving payloads (variable-size bytes) with torch.distributed primitives.

gloo cannot all-gather tensors of unequal size, so sizes are exchanged first and every
payload is padded to the largest (DESIGN section 8). Payloads travel as uint8 tensors.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def world(group=None) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def _u8(data: bytes, size: int) -> torch.Tensor:
    buf = torch.zeros(size, dtype=torch.uint8)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buf


def all_gather_bytes(data: bytes, group=None) -> list[bytes]:
    """Every rank's ``data``, in rank order."""
    _, p = world(group)
    sizes = torch.zeros(p, dtype=torch.int64)
    _gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=group)
    top = int(sizes.max())
    out = torch.empty(p * top, dtype=torch.uint8)
    _gather(out, _u8(data, top), group=group)
    raw = out.numpy().tobytes()
    return [raw[i * top: i * top + int(sizes[i])] for i in range(p)]


def all_to_all_bytes(pieces: list[bytes], group=None) -> list[bytes]:
    """``pieces[j]`` goes to rank j; returns what each rank sent here, in rank order."""
    rank, p = world(group)
    sizes = torch.tensor([len(x) for x in pieces], dtype=torch.int64)
    all_sizes = torch.empty(p * p, dtype=torch.int64)
    _gather(all_sizes, sizes, group=group)
    top = int(all_sizes.max())
    send = torch.cat([_u8(x, top) for x in pieces])
    recv = torch.empty(p * top, dtype=torch.uint8)
    dist.all_to_all_single(recv, send, group=group)
    raw = recv.numpy().tobytes()
    mine = all_sizes.view(p, p)[:, rank]
    return [raw[i * top: i * top + int(mine[i])] for i in range(p)]


def sendrecv_bytes(data: bytes, dst: int, src: int, group=None) -> bytes:
    """Send ``data`` to ``dst`` while receiving from ``src`` (group ranks); sizes first."""
    to, frm = _global(dst, group), _global(src, group)
    size_in = torch.zeros(1, dtype=torch.int64)
    reqs = [dist.isend(torch.tensor([len(data)], dtype=torch.int64), to, group=group),
            dist.irecv(size_in, frm, group=group)]
    for r in reqs:
        r.wait()
    buf = torch.empty(int(size_in), dtype=torch.uint8)
    reqs = [dist.isend(_u8(data, len(data)), to, group=group), dist.irecv(buf, frm, group=group)]
    for r in reqs:
        r.wait()
    return buf.numpy().tobytes()


def _global(rank: int, group) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().reshape(-1).numpy()
