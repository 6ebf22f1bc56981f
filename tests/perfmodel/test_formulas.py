"""Collective formulas against hand calculations on a synthetic fabric."""
import math

import pytest

from perfmodel.devices import Device, Protocol
from perfmodel.collectives.compressed import Msg
from perfmodel.collectives.fabric import Ctx, Link
from perfmodel.collectives.transfers import evaluate, pipelined
from perfmodel.collectives.registry import COMPRESSED, PLAIN
from perfmodel.compression import compile_spec
from perfmodel.collectives.record import busbw_factor

B, A = 10e9, 5e-6   # 10 GB/s per rank, 5 us per step


def _link(name, bw=B, lat=A):
    protos = {n: Protocol(name=n, base_s=0.0, step_s=0.0, bw_fraction=1.0) for n in ("LL", "LL128", "Simple")}
    return Link(name=name, tier=name, bandwidth_Bps=bw, latency_s=lat, protocols=protos)


def ctx(ranks=8, hosts=1, inter_bw=B):
    return Ctx(ranks=ranks, hosts=hosts, ranks_per_host=ranks // hosts, ring=_link("ring"),
               intra=_link("intra"), inter=_link("inter", bw=inter_bw), nvls=False,
               device=Device(key="x", name="x", peak_flops_per_s={}, hbm_bytes=1, hbm_Bps=1,
                             stream_Bps=1e12, launch_s=1e-6, source="test"))


def t(cost, c, chunks=1):
    return evaluate(cost, c.device, chunks).time_s


S = 64e6


def test_ring_allreduce_is_hockney():
    c = ctx(8)
    assert t(PLAIN["allreduce"]["ring"](c, S), c) == pytest.approx(14 * A + 2 * 7 / 8 * S / B)


def test_ring_allgather_and_reduce_scatter():
    c = ctx(8)
    for op in ("allgather", "reduce_scatter"):
        assert t(PLAIN[op]["ring"](c, S), c) == pytest.approx(7 * A + 7 / 8 * S / B)


def test_recursive_doubling_single_host():
    c = ctx(8)
    assert t(PLAIN["allreduce"]["recursive_doubling"](c, S), c) == pytest.approx(6 * A + 2 * 7 / 8 * S / B)


def test_hierarchical_allreduce():
    c = ctx(16, hosts=2, inter_bw=B / 4)
    expected = 2 * (7 * A + 7 / 8 * S / B) + 2 * A + 2 * (1 / 2) * (S / 8) / (B / 4)
    assert t(PLAIN["allreduce"]["hierarchical"](c, S), c) == pytest.approx(expected)


def test_pairwise_alltoall_splits_links():
    c = ctx(16, hosts=2, inter_bw=B / 4)
    cost = PLAIN["alltoall"]["direct"](c, S)
    # in-host and cross-host peers run at once: the slower of the two phases counts
    expected = max(7 * A + 7 / 16 * S / B, 8 * A + 8 / 16 * S / (B / 4))
    assert t(cost, c) == pytest.approx(expected)


def test_compressed_ring_with_identity_codec_equals_plain_ring():
    c = ctx(8)
    m = Msg(size_bytes=int(S), dtype_bytes=4, codec=compile_spec("none"))
    compressed = COMPRESSED["allreduce"]["ring"](c, m)
    assert compressed.kernel_bytes == 0
    assert t(compressed, c) == pytest.approx(t(PLAIN["allreduce"]["ring"](c, S), c))


def test_allgather_allreduce_moves_p_payloads_and_decodes_all_p():
    """Every rank decodes all p payloads, its own too, so every rank sums the same values."""
    c = ctx(8)
    m = Msg(size_bytes=int(S), dtype_bytes=4, codec=compile_spec("topk(0.01)"))
    cost = COMPRESSED["allreduce"]["allgather"](c, m)
    w = m.w(S)
    assert cost.hops == 1
    assert cost.kernel_bytes == pytest.approx(m.c(S) + 8 * m.d(S))
    assert sum(ph.nbytes for st in cost.rounds for ph in st) == pytest.approx(7 / 8 * 8 * w)


def test_hops_of_compressed_allreduces():
    c = ctx(8)
    m = Msg(size_bytes=int(S), dtype_bytes=4, codec=compile_spec("int8"))
    hops = {a: f(c, m).hops for a, f in COMPRESSED["allreduce"].items() if a != "hierarchical"}
    assert hops == {"ring": 8, "recursive_doubling": 3, "allgather": 1, "two_phase": 2}


def test_pipelining_formula():
    assert pipelined(1.0, 0.0, 0.0, 4.0, 4.0, 1) == 9.0
    assert pipelined(1.0, 0.0, 0.0, 4.0, 4.0, 4) == pytest.approx(1 + 2 + 3)
    assert pipelined(0.0, 0.0, 0.0, 2.0, 8.0, 1000) == pytest.approx(8.0, rel=0.01)


@pytest.mark.parametrize("op, n, factor", [("allreduce", 8, 1.75), ("allgather", 8, 0.875),
                                            ("reduce_scatter", 4, 0.75), ("alltoall", 2, 0.5),
                                            ("broadcast", 8, 1.0), ("sendrecv", 2, 1.0)])
def test_busbw_factors_follow_nccl_tests(op, n, factor):
    assert busbw_factor(op, n) == factor


def test_error_grows_with_sqrt_hops():
    from perfmodel import collective_time
    r = collective_time("allreduce", 1 << 26, cluster="dgx-a100", nodes=2, compressor="int8",
                        algorithm="ring")
    assert r.hops == 16
    assert r.error_estimate == pytest.approx(compile_spec("int8").error * math.sqrt(16))
