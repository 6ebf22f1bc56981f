"""A wire: bytes for an array under one compressor spec, and back, with its statistics.

``Wire`` owns the compressor (numpy on the CPU, realrun.gpu's CuPy kernels on CUDA) and so its
persistent state: error-feedback residuals and PowerSGD warm starts, keyed by tensor. A
collective call uses it through ``Wire.bound(key, stats)``: the key names the tensor (residuals
never mix between tensors) and ``stats`` (a ``CommStats``) receives the call's bytes and kernel
seconds, so callers read exactly what their call did, never a global counter by difference.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np
import torch

from perfmodel.compression import Codec, compile_spec
from realrun.comm.exchange import as_u8
from realrun.compressors import Compressor


@dataclass
class CommStats:
    """What collective calls moved and spent: payload bytes in and out, kernel seconds (wall) and
    the CPU seconds of the calling thread in them (``*_cpu_s``: what calibration prices kernels
    from on a host with a fixed CPU share, realrun.bench.worker)."""

    bytes_in: int = 0
    bytes_out: int = 0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    compress_cpu_s: float = 0.0
    decompress_cpu_s: float = 0.0

    def add(self, other: CommStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Wire:
    """One spec on one device, with its compressor's state (one per spec and device in a
    ``Comm``). On ``device='cuda'`` the compressor is realrun.gpu's (a spec without a GPU path
    is refused, never run on the host)."""

    def __init__(self, spec: str | Codec, device: str = "cpu"):
        codec = spec if isinstance(spec, Codec) else compile_spec(spec)
        self.gpu = device == "cuda"
        if self.gpu:
            from realrun.gpu import GpuCompressor

            self.c = GpuCompressor(codec)
        else:
            self.c = Compressor(codec, seed=0)
        self.codec = codec
        self.none = codec.is_none
        self.cast = codec.cast_to

    def expected(self, n: int, dtype) -> int | None:
        """Payload bytes of ``n`` values where known in advance (none, fixed-size specs)."""
        itemsize = np.dtype(dtype).itemsize
        if self.none:
            return n * itemsize
        return self.codec.wire_bytes(n, itemsize) if self.codec.exact else None

    def sizes(self, counts: list[int], dtype) -> list[int] | None:
        known = [self.expected(n, dtype) for n in counts]
        return None if None in known else known

    def state_dict(self) -> dict:
        """The compressor's persistent state (error-feedback residuals, PowerSGD warm starts) and
        its call count, as torch tensors (``torch.load(weights_only=True)`` reads them back).
        GPU compressors keep none (no error feedback on the GPU)."""
        if self.gpu:
            return {}
        ctx = self.c.ctx
        return {"step": ctx.step, "state": {k: torch.from_numpy(np.array(v, copy=True)) for k, v in ctx.state.items()}}

    def load_state_dict(self, saved: dict) -> None:
        if self.gpu or not saved:
            return
        self.c.ctx.step = int(saved["step"])
        self.c.ctx.state = {k: v.numpy() for k, v in saved["state"].items()}

    def bound(self, key: str = "", stats: CommStats | None = None) -> BoundWire:
        return BoundWire(self, key, stats if stats is not None else CommStats())


@dataclass
class BoundWire:
    """A wire for one collective call: the tensor's key and the call's statistics."""

    wire: Wire
    key: str
    stats: CommStats

    @property
    def none(self) -> bool:
        return self.wire.none

    @property
    def gpu(self) -> bool:
        return self.wire.gpu

    def expected(self, n: int, dtype) -> int | None:
        return self.wire.expected(n, dtype)

    def sizes(self, counts: list[int], dtype) -> list[int] | None:
        return self.wire.sizes(counts, dtype)

    def pack(self, x: np.ndarray, part: str = ""):
        """Payload bytes of ``x`` (a uint8 view of ``x`` for none: no copy); ``part`` names the
        piece of the tensor (a ring chunk) for stateful compressors."""
        w = self.wire
        start, cpu = time.perf_counter(), time.thread_time()
        if w.none:
            data = as_u8(x)
        elif w.gpu:
            data = w.c.compress(x)
        else:
            data = w.c.compress(x, key=f"{self.key}/{part}").data
        self._sync()
        self.stats.compress_s += time.perf_counter() - start
        self.stats.compress_cpu_s += time.thread_time() - cpu
        self.stats.bytes_in += x.nbytes
        self.stats.bytes_out += len(data)
        return data

    def unpack(self, data, dtype) -> np.ndarray:
        """Values back (a view of the received bytes for none: read, don't keep)."""
        start, cpu = time.perf_counter(), time.thread_time()
        out = as_u8(data).view(dtype) if self.wire.none else self.wire.c.decompress(data).reshape(-1)
        self._sync()
        self.stats.decompress_s += time.perf_counter() - start
        self.stats.decompress_cpu_s += time.thread_time() - cpu
        return out

    def _sync(self) -> None:
        """GPU kernels run asynchronously: wait, so the statistics time them."""
        if self.wire.gpu:
            from realrun.gpu import synchronize

            synchronize()
