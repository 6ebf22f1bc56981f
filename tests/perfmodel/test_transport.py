"""Transports: RDMA (InfiniBand, RoCE) and TCP sockets are distinct protocol classes."""
from pathlib import Path

import pytest

import topologies

from perfmodel.collectives.predict import collective_time, resolve_context
from topologies import InputError, build_cluster

COMMODITY = (Path(topologies.__file__).parent / "catalog" / "commodity-25g.toml").read_text()


def _rdma_twin(tmp_path) -> str:
    path = tmp_path / "commodity-roce.toml"
    path.write_text(COMMODITY.replace('name = "commodity-25g"', 'name = "commodity-roce"')
                    .replace('transport = "socket"', 'transport = "rdma"'))
    return str(path)


def test_a_socket_fabric_prices_cross_host_traffic_as_sockets():
    built = build_cluster("commodity-25g", nodes=2)
    assert built.transport == "socket"
    ctx = resolve_context(built, built.gpus, "packed", (), None)
    assert ctx.ring.cls == "socket" and ctx.inter.cls == "socket" and ctx.intra.cls == "pcie"
    assert build_cluster("dgx-a100", nodes=2).transport == "rdma"


def test_sockets_are_slower_than_rdma_on_the_same_wire(tmp_path):
    roce = _rdma_twin(tmp_path)
    for size in (2**16, 2**26):
        sock = collective_time("allreduce", size, cluster="commodity-25g", nodes=4)
        rdma = collective_time("allreduce", size, cluster=roce, nodes=4)
        assert sock.time_s > rdma.time_s
    big = collective_time("allreduce", 2**30, cluster="commodity-25g", nodes=4)
    big_rdma = collective_time("allreduce", 2**30, cluster=roce, nodes=4)
    assert big.time_s / big_rdma.time_s == pytest.approx(0.9697 / 0.7426, rel=0.1)   # the bandwidth fractions


def test_an_unknown_transport_is_one_clear_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(COMMODITY.replace('transport = "socket"', 'transport = "carrier-pigeon"'))
    with pytest.raises(InputError) as err:
        build_cluster(str(path), nodes=2)
    assert err.value.field == "fabric.transport"
