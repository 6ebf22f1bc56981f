"""Property tests of the collective model (hypothesis)."""
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel import collective_time
from perfmodel.collectives.compressed import Msg, movement
from perfmodel.collectives.fabric import make_ctx
from perfmodel.collectives.transfers import evaluate
from perfmodel.collectives.registry import COMPRESSED, PLAIN
from perfmodel.compression.codec import Applied
from perfmodel.compression.families import Stream
from topologies import build_cluster

CLUSTERS = st.sampled_from(["dgx-a100", "dgx-h100", "lassen", "commodity-25g", "frontier"])
OP_NAMES = st.sampled_from(["allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall", "sendrecv"])
SPECS = st.sampled_from(["none", "fp16", "int8", "topk(0.01)", "ef(topk(0.01))+int8", "sz3(abs=1e-4)",
                         "sign", "zfp(rate=8)", "lossless"])
SETTINGS = settings(max_examples=60, deadline=None)


class RatioOneCodec:
    """A compressor with ratio exactly 1 (no header) and zero kernel traffic, not reducible."""

    is_none = reducible = False
    lossless = True
    families = ()

    def apply(self, count, dtype_bytes):
        return Applied(values=Stream(count, float(count * dtype_bytes)), meta_bytes=0.0, compress_bytes=0.0,
                       decompress_bytes=0.0)

    def wire_bytes(self, count, dtype_bytes):
        return count * dtype_bytes

    def payload_bytes(self, applied, ndim=1):
        return int(applied.values.nbytes)


@SETTINGS
@given(CLUSTERS, st.integers(1, 3), OP_NAMES, SPECS, st.integers(10, 33), st.floats(1.01, 4.0))
def test_time_never_decreases_with_size(cluster, nodes, op, spec, log_size, factor):
    if op == "reduce_scatter" and spec.startswith("powersgd"):
        return
    small = collective_time(op, 2 ** log_size, cluster=cluster, nodes=nodes, compressor=spec)
    big = collective_time(op, int(2 ** log_size * factor), cluster=cluster, nodes=nodes, compressor=spec)
    assert big.time_s >= small.time_s * (1 - 1e-9)


@SETTINGS
@given(CLUSTERS, st.integers(2, 3), st.integers(12, 32), st.sampled_from(["allreduce", "reduce_scatter"]))
def test_ratio_one_zero_cost_codec_gives_the_uncompressed_time(cluster, nodes, log_size, op):
    """Ring with decompress-reduce-recompress degenerates to the plain ring; data movement
    with a ratio-1 free codec is the plain algorithm. (Compressed recursive doubling and
    hierarchical are different algorithms from their plain namesakes, so not compared.)"""
    built = build_cluster(cluster, nodes=nodes)
    ctx = make_ctx(built, tuple(range(built.gpus)))
    free = replace(ctx.device, stream_Bps=float("inf"), launch_s=0.0)
    S = 4 * ctx.ranks * 2 ** (log_size - 6)   # whole fp32 elements per rank's chunk
    msg = Msg(size_bytes=S, dtype_bytes=4, codec=RatioOneCodec())
    compressed = evaluate(COMPRESSED[op]["ring"](ctx, msg), free, 1).time_s
    plain = evaluate(PLAIN[op]["ring"](ctx, S), free, 1).time_s
    assert compressed == pytest.approx(plain, rel=1e-9)
    for move in ("allgather", "broadcast", "alltoall", "sendrecv"):
        for alg in PLAIN[move]:
            if alg == "hierarchical" and ctx.ranks_per_host == 1:
                continue
            cost = movement(move, PLAIN[move][alg], ctx, msg)
            assert evaluate(cost, free, 1).time_s == pytest.approx(
                evaluate(PLAIN[move][alg](ctx, S), free, 1).time_s, rel=1e-6)


@SETTINGS
@given(CLUSTERS, st.integers(1, 4), st.integers(10, 34))
def test_ring_busbw_never_exceeds_the_bottleneck_link(cluster, nodes, log_size):
    built = build_cluster(cluster, nodes=nodes)
    ctx = make_ctx(built, tuple(range(built.gpus)))
    r = collective_time("allreduce", 2 ** log_size, cluster=cluster, nodes=nodes, algorithm="ring")
    assert r.busbw_GBps * 1e9 <= ctx.ring.bandwidth_Bps * (1 + 1e-9)


@SETTINGS
@given(CLUSTERS, OP_NAMES, SPECS, st.integers(0, 30))
def test_one_rank_costs_zero(cluster, op, spec, log_size):
    if op == "reduce_scatter" and spec.startswith("powersgd"):
        return
    r = collective_time(op, 2 ** log_size, cluster=cluster, nodes=1, ranks=1, compressor=spec)
    assert r.time_s == 0.0 and r.wire_bytes_total == 0
