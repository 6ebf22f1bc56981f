"""Moving payloads (variable-size bytes) with torch.distributed primitives.

gloo cannot all-gather tensors of unequal size, so sizes are exchanged first and every
payload is padded to the largest (docs/design.md, Facts measured). Where every size is known in advance
(fixed-size specs: the payload length is perfmodel's wire size, a contract test checks it)
callers pass ``sizes`` and the size round is skipped.

Payloads are numpy arrays on the CPU (gloo) or CuPy arrays on the GPU (NCCL, which moves only
CUDA tensors); they become uint8 tensors without a copy (``torch.from_numpy``, DLPack) and
what comes back are uint8 views of the receive buffer in the caller's array module.
"""
from __future__ import annotations

from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from realrun.comm.names import OP_TIMEOUT_S
from realrun.compressors import dtypes

# every rank's tensor into one: torch's current name where it has one, else the older one
gather_tensor = _gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def world(group=None) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def on_gpu(arr) -> bool:
    return type(arr).__module__.split(".")[0] == "cupy"


def as_u8(data):
    """A flat uint8 view of a payload: numpy for ndarray, bytearray, memoryview or bytes; CuPy
    stays CuPy."""
    if on_gpu(data):
        return data.reshape(-1).view("uint8")
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def _device(arr) -> torch.device:
    return torch.device("cuda", arr.device.id) if on_gpu(arr) else torch.device("cpu")


def _tensor(arr) -> torch.Tensor:
    """A uint8 tensor over ``arr`` (no copy where the buffer is writable)."""
    if on_gpu(arr):
        return torch.from_dlpack(arr)
    return torch.from_numpy(arr if arr.flags.writeable else arr.copy())


def _array(t: torch.Tensor):
    """The caller's array view of a tensor: numpy on the CPU (bf16 and fp8 as ml_dtypes arrays
    over its bytes, ``realrun.compressors.dtypes``), CuPy on the GPU (``realrun.gpu.from_tensor``:
    bf16 and fp16 as a new array of their float32 values)."""
    if t.device.type == "cpu":
        return dtypes.to_numpy(t)
    from realrun.gpu import from_tensor

    return from_tensor(t)


def _u8(data, size: int, device=None) -> torch.Tensor:
    """A uint8 tensor of ``size`` bytes holding ``data`` (zero padding where shorter)."""
    arr = as_u8(data)
    if len(arr) == size and size:
        return _tensor(arr)
    buf = torch.zeros(size, dtype=torch.uint8, device=device or _device(arr))
    if len(arr):
        buf[: len(arr)] = _tensor(arr)
    return buf


def _ints(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def all_gather_bytes(data, group=None, sizes: list[int] | None = None) -> list:
    """Every rank's ``data``, in rank order; ``sizes`` (every rank's length) skips the size round."""
    _, p = world(group)
    arr = as_u8(data)
    dev = _device(arr)
    if sizes is None:
        gathered = torch.zeros(p, dtype=torch.int64, device=dev)
        _gather(gathered, _ints([len(arr)], dev), group=group)
        sizes = gathered.tolist()
    top = max(sizes)
    out = torch.empty(p * top, dtype=torch.uint8, device=dev)
    _gather(out, _u8(arr, top, dev), group=group)
    raw = _array(out)
    return [raw[i * top: i * top + sizes[i]] for i in range(p)]


def all_to_all_bytes(pieces: list, group=None, sizes: list[list[int]] | None = None) -> list:
    """``pieces[j]`` goes to rank j; returns what each rank sent here, in rank order.
    ``sizes[i][j]`` (rank i's piece for rank j), where known, skips the size round."""
    rank, p = world(group)
    arrays = [as_u8(x) for x in pieces]
    dev = _device(arrays[0])
    if sizes is None:
        all_sizes = torch.zeros(p * p, dtype=torch.int64, device=dev)
        _gather(all_sizes, _ints([len(a) for a in arrays], dev), group=group)
        sizes = all_sizes.view(p, p).tolist()
    top = max(max(row) for row in sizes)
    send = torch.cat([_u8(a, top, dev) for a in arrays])
    recv = torch.empty(p * top, dtype=torch.uint8, device=dev)
    dist.all_to_all_single(recv, send, group=group)
    raw = _array(recv)
    return [raw[i * top: i * top + sizes[i][rank]] for i in range(p)]


def all_to_all_split_bytes(pieces: list, group=None, recv_sizes: list[int] | None = None) -> list:
    """``pieces[j]`` goes to rank j at its own length (``all_to_all_single`` with split sizes: no
    padding; gloo and NCCL post every pair at once); returns what each rank sent here, in rank
    order. ``recv_sizes`` (bytes from each rank), where known, skips the size round (an
    all-to-all of one int64 per pair). Bounded by the process group's timeout."""
    _, p = world(group)
    arrays = [as_u8(x) for x in pieces]
    dev = _device(arrays[0])
    send_sizes = [len(a) for a in arrays]
    if recv_sizes is None:
        got = torch.zeros(p, dtype=torch.int64, device=dev)
        dist.all_to_all_single(got, _ints(send_sizes, dev), group=group)
        recv_sizes = got.tolist()
    send = torch.cat([_u8(a, len(a), dev) for a in arrays])
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=dev)
    dist.all_to_all_single(recv, send, output_split_sizes=list(recv_sizes), input_split_sizes=send_sizes,
                           group=group)
    raw = _array(recv)
    edges = np.cumsum([0, *recv_sizes])
    return [raw[int(edges[i]):int(edges[i + 1])] for i in range(p)]


def sendrecv_bytes(data, dst: int, src: int, group=None, size: int | None = None, like=None):
    """Send ``data`` to ``dst`` while receiving from ``src`` (group ranks); ``size`` (what ``src``
    sends), where known, skips the size round. ``like``: an array on the device to receive on
    when ``data`` is empty bytes."""
    to, frm = _global(dst, group), _global(src, group)
    arr = as_u8(data)
    dev = _device(like if like is not None and len(arr) == 0 else arr)
    if size is None:
        size_in = torch.zeros(1, dtype=torch.int64, device=dev)
        reqs = [dist.isend(_ints([len(arr)], dev), to, group=group), dist.irecv(size_in, frm, group=group)]
        for r in reqs:
            r.wait()
        size = int(size_in.item())
    buf = torch.empty(size, dtype=torch.uint8, device=dev)
    reqs = [dist.isend(_u8(arr, len(arr), dev), to, group=group), dist.irecv(buf, frm, group=group)]
    for r in reqs:
        r.wait()
    return _array(buf)


def _global(rank: int, group) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def to_array(t: torch.Tensor):
    """A flat array of a tensor in its array module (``_array``: a view, but for a bf16 or fp16 CUDA tensor)."""
    return _array(t.detach().reshape(-1))


SIZE_TAG, DATA_TAG = 1, 2   # the two messages of one payload, matched by tag (in order within a tag)


def exchange_bytes(data, dst: int | None, src: int | None, group=None, device=None,
                   timeout_s: float = OP_TIMEOUT_S):
    """Send ``data`` to ``dst`` and receive a payload from ``src`` at once (either None). Both
    messages of the send (size, then bytes) are posted before anything is waited on, so two
    ranks that send to each other in the same call, or a chain of them, cannot deadlock
    (Megatron's batched send/recv); the receive waits for its size, then its bytes. ``dst`` and
    ``src`` are global ranks. A peer silent for ``timeout_s`` raises (gloo's point-to-point
    waits have no timeout of their own). Returns the received bytes or None."""
    out = as_u8(data) if dst is not None else None
    dev = _device(out) if out is not None else (device or torch.device("cpu"))
    sends = []
    if out is not None:
        sends.append(_ints([len(out)], dev))
        if len(out):
            sends.append(_u8(out, len(out), dev))
    works = [dist.isend(t, dst, group=group, tag=tag) for t, tag in zip(sends, (SIZE_TAG, DATA_TAG))]
    buf = None
    if src is not None:
        size = torch.zeros(1, dtype=torch.int64, device=dev)
        _wait(dist.irecv(size, src, group=group, tag=SIZE_TAG), timeout_s, src)
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=dev)
        if len(buf):
            _wait(dist.irecv(buf, src, group=group, tag=DATA_TAG), timeout_s, src)
    for work in works:
        _wait(work, timeout_s, dst)
    return None if buf is None else _array(buf)


def _wait(work, timeout_s: float, peer: int) -> None:
    try:
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise TimeoutError(f"rank {peer}: a point-to-point transfer failed or waited over {timeout_s:g} s "
                           f"({exc})") from None
