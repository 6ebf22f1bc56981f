"""The record of one collective prediction, reported the nccl-tests way.

``algbw = S / t``; ``busbw = algbw x 2(n-1)/n`` for all-reduce, ``x (n-1)/n`` for
all-gather, reduce-scatter and all-to-all (S = the whole array), ``x 1`` for
broadcast and send/recv (nccl-tests doc/PERFORMANCE.md).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


def busbw_factor(op: str, ranks: int) -> float:
    if ranks <= 1:
        return 1.0
    if op == "allreduce":
        return 2.0 * (ranks - 1) / ranks
    if op in ("allgather", "reduce_scatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


@dataclass(frozen=True, kw_only=True)
class CollectiveRecord:
    op: str
    size_bytes: int
    count: int
    dtype: str
    cluster: str
    nodes: int
    gpus: int
    algorithm: str
    protocol: str
    chunks: int
    compressor: str
    compressor_spec: str
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    sent_bytes: float          # payload bytes one rank sends
    wire_bytes: dict           # bytes crossing links of each tier, for what one rank sends
    wire_bytes_total: float
    compression_ratio: float   # message bytes / payload bytes
    exact_wire_size: bool
    kernel_time_s: float
    latency_s: float
    bandwidth_s: float
    error_estimate: float      # relative RMS error of the result (unit-Gaussian data)
    hops: int                  # lossy compressions in sequence
    speedup_vs_none: float     # best uncompressed time / this time

    def to_dict(self) -> dict:
        return asdict(self)
