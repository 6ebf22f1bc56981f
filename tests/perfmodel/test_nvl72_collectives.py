"""Collectives on a multi-host NVLink domain (GB200/GB300 NVL72): NVLink inside a rack, NICs between racks."""
import pytest

from perfmodel.collectives.fabric import make_ctx
from perfmodel.collectives.predict import collective_time
from topologies import build_cluster, cluster_for

GIB = 2**30


@pytest.mark.parametrize("name", ["gb200-nvl72", "gb300-nvl72"])
def test_64_gpus_of_one_rack_all_reduce_on_nvlink_alone(name):
    rec = collective_time("allreduce", GIB, cluster=name, gpus=64)
    assert rec.nodes == 16 and rec.gpus == 64
    assert set(rec.wire_bytes) == {"nvlink"}           # no NIC, no PCIe, no fabric tier
    ring = collective_time("allreduce", GIB, cluster=name, gpus=64, algorithm="ring")
    assert set(ring.wire_bytes) == {"nvlink"}


def test_two_racks_cross_the_fabric():
    rec = collective_time("allreduce", GIB, cluster="gb200-nvl72", gpus=144)
    assert rec.nodes == 36
    assert {"ib-leaf", "nvlink"} <= set(rec.wire_bytes)
    one = collective_time("allreduce", GIB, cluster="gb200-nvl72", gpus=72)
    assert one.busbw_GBps > rec.busbw_GBps                # the rack's NVLink beats its NICs


def test_nvls_runs_in_the_domain_across_trays_not_across_racks():
    one, _ = cluster_for("gb200-nvl72", gpus=64)
    ctx = make_ctx(one, tuple(range(64)))
    assert ctx.nvls and (ctx.hosts, ctx.ranks_per_host) == (1, 64)      # the formulas' two levels: domains
    assert collective_time("allreduce", GIB, cluster="gb200-nvl72", gpus=64, algorithm="nvls").algorithm == "nvls"
    two, _ = cluster_for("gb200-nvl72", gpus=144)
    ctx = make_ctx(two, tuple(range(144)))
    assert not ctx.nvls and (ctx.hosts, ctx.ranks_per_host) == (2, 72)


def test_a_domain_of_one_host_is_as_before():
    ctx = make_ctx(build_cluster("dgx-h100", nodes=2), tuple(range(16)))
    assert (ctx.hosts, ctx.ranks_per_host) == (2, 8) and not ctx.nvls
    assert make_ctx(build_cluster("dgx-b200", nodes=1), tuple(range(8))).nvls


def test_an_expert_all_to_all_inside_a_rack_stays_on_nvlink():
    """ep = 8 over two trays of one rack: every pair is an NVLink pair (a host's NICs are not used)."""
    built, _ = cluster_for("gb200-nvl72", gpus=8)
    assert built.hosts == 2
    links = make_ctx(built, tuple(range(8))).alltoall
    assert links.pairwise_inter is None and links.rail is None
    assert links.pairwise_intra.tier == "nvlink"
    rec = collective_time("alltoall", GIB, cluster="gb200-nvl72", gpus=8)
    assert set(rec.wire_bytes) == {"nvlink"}
