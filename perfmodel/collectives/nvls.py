"""NVLS all-reduce on one node as NCCL runs it: a pipeline of loops on each channel.

NCCL (src/device/all_reduce.h, ``RunWorkColl<AllReduce, NVLS, SIMPLE>``, the one-node branch) runs
NVLS on a fixed number of channels (CTAs), whatever the size (src/enqueue.cc ``topoGetAlgoInfo``:
``nc = comm->nvlsChannels``). Each channel takes its share of the buffer and walks it in loops of
``heads x chunk`` bytes, ``heads`` being the ranks; three warp groups work on successive loops:
scatter into the NVLS buffer, reduce and multicast through the switch, gather into the output. The
chunk shrinks for smaller messages (src/enqueue.cc ``calcCollChunking``, NVLS branch):

    chunk = 128 KiB, then 64 KiB below 64 x C x 128 KiB, 32 KiB below 8 x C x 64 KiB and
    16 KiB below 2 x C x 32 KiB, with C = channels x heads (concurrent operations)

so that on 8 H100s (16 channels) a 2 MiB message is one loop of 16 KiB chunks and a 4 GiB one 256
loops of 128 KiB. Each loop pays a synchronization across the ranks (``nvls_loop_sync_us``,
catalog/nccl_arch.toml) beside its bytes, and the pipeline fills for ``fill_loops`` loops: the
mid-size messages, with few small loops, reach well under the NVLS bandwidth NCCL's tuning model
gives them (``busBw`` from ``nvlsEfficiency``), which only large messages approach.
"""
from __future__ import annotations

import math

from perfmodel.devices import NvlsPipeline

# The chunk steps of calcCollChunking's NVLS branch: (messages below factor x C x chunk, shrink to).
CHUNK_STEPS = ((64, 65536), (8, 32768), (2, 16384))   # src/enqueue.cc lines 2272-2274 (commit 5067397c)


def chunk_bytes(size_bytes: float, pipe: NvlsPipeline, heads: int) -> int:
    """The chunk NCCL gives one NVLS operation of ``size_bytes`` on ``heads`` ranks."""
    chunk = pipe.max_chunk_bytes
    concurrent_ops = pipe.channels * heads
    for factor, smaller in CHUNK_STEPS:
        if size_bytes < factor * concurrent_ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def loops(size_bytes: float, pipe: NvlsPipeline, heads: int) -> tuple[int, float]:
    """(loops each channel runs, bytes of one loop over all channels) for ``size_bytes``."""
    loop_bytes = pipe.channels * heads * chunk_bytes(size_bytes, pipe, heads)
    return max(1, math.ceil(size_bytes / loop_bytes)), float(loop_bytes)
