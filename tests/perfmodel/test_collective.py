import math

import pytest

from perfmodel import OPS, collective_time
from topologies.errors import InputError


def test_record_fields_and_nccl_tests_definitions():
    r = collective_time("allreduce", 1 << 30, cluster="dgx-h100", nodes=4, compressor="int8")
    d = r.to_dict()
    for key in ("op", "size_bytes", "gpus", "algorithm", "compressor", "time_s", "algbw_GBps", "busbw_GBps",
                "wire_bytes", "kernel_time_s", "error_estimate"):
        assert key in d
    assert r.algbw_GBps == pytest.approx(r.size_bytes / r.time_s / 1e9)
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps * 2 * 31 / 32)
    assert set(r.wire_bytes) <= {"nvlink", "pcie", "ib-leaf", "ib-spine"} and r.kernel_time_s > 0
    assert {"nvlink", "ib-leaf"} <= set(r.wire_bytes)


def test_none_has_speedup_one_and_zero_kernel():
    r = collective_time("allreduce", 1 << 28, cluster="dgx-a100", nodes=2)
    assert r.speedup_vs_none == 1.0 and r.kernel_time_s == 0 and r.error_estimate == 0


def test_auto_reports_the_winner_and_is_fastest():
    auto = collective_time("allreduce", 1 << 28, cluster="dgx-a100", nodes=4, compressor="topk(0.01)")
    for alg in ("allgather", "two_phase", "hierarchical"):
        forced = collective_time("allreduce", 1 << 28, cluster="dgx-a100", nodes=4,
                                 compressor="topk(0.01)", algorithm=alg)
        assert auto.time_s <= forced.time_s + 1e-12
    assert auto.algorithm in ("allgather", "two_phase", "hierarchical", "recursive_doubling")


def test_auto_does_not_buy_speed_with_many_hops():
    r = collective_time("allreduce", 1 << 28, cluster="dgx-a100", nodes=4, compressor="int8")
    assert r.hops <= 4


def test_compression_pays_on_a_slow_network():
    r = collective_time("allreduce", 1 << 28, cluster="commodity-25g", nodes=4, compressor="int8")
    assert r.speedup_vs_none > 2.5


def test_nvls_only_on_hopper_single_node():
    h = collective_time("allreduce", 1 << 30, cluster="dgx-h100", nodes=1, algorithm="nvls")
    assert h.algorithm == "nvls"
    with pytest.raises(InputError, match="algorithm"):
        collective_time("allreduce", 1 << 30, cluster="dgx-a100", nodes=1, algorithm="nvls")
    with pytest.raises(InputError, match="algorithm"):
        collective_time("allreduce", 1 << 30, cluster="dgx-h100", nodes=2, algorithm="nvls")


def test_one_rank_and_empty_message_cost_nothing():
    assert collective_time("allreduce", 1 << 20, cluster="dgx-a100", nodes=1, ranks=1).time_s == 0
    assert collective_time("allgather", 0, cluster="dgx-a100", nodes=2).time_s == 0


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("compressor", ["none", "fp16", "int8", "topk(0.01)", "zfp(rate=8)"])
def test_every_op_with_every_kind_of_compressor(op, compressor):
    r = collective_time(op, 1 << 24, cluster="lassen", nodes=2, compressor=compressor)
    assert 0 < r.time_s < 1 and math.isfinite(r.busbw_GBps)


def test_powersgd_is_all_reduce_only():
    with pytest.raises(InputError, match="powersgd"):
        collective_time("reduce_scatter", 1 << 24, cluster="lassen", compressor="powersgd(4)")


@pytest.mark.parametrize("kwargs, field", [
    (dict(op="gather"), "op"), (dict(size_bytes=-1), "size"), (dict(dtype="fp64"), "dtype"),
    (dict(chunks=0), "chunks"), (dict(cluster="nope"), "cluster"), (dict(gpus=0), "gpus"),
    (dict(algorithm="allgather"), "algorithm"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    args = dict(op="allreduce", size_bytes=1 << 20, cluster="dgx-a100")
    args.update(kwargs)
    with pytest.raises(InputError) as err:
        collective_time(args.pop("op"), args.pop("size_bytes"), **args)
    assert err.value.field == field


def test_sent_and_wire_bytes_of_a_ring():
    r = collective_time("allreduce", 1 << 30, cluster="lassen", nodes=1, algorithm="ring")
    assert r.sent_bytes == pytest.approx(2 * 3 / 4 * (1 << 30))
    assert r.wire_bytes == {"nvlink": pytest.approx(1.5 * r.sent_bytes), "xbus": pytest.approx(0.5 * r.sent_bytes)}
