import networkx as nx
import pytest

from topologies import Cluster, GraphError, build_cluster, catalog_names, validate_graph
from topologies.attrs import BANDWIDTH, GPU, KIND, LATENCY, TIER
from topologies.describe import bisection_bandwidth_Bps
from topologies.errors import InputError
from topologies.fabrics import fat_tree, torus
from topologies.nodes import nvswitch_node

EXPECTED_GPUS_PER_NODE = {"dgx-a100": 8, "dgx-a100-40gb": 8, "dgx-h100": 8, "dgx-h200": 8, "h800": 8, "lassen": 4,
                          "frontier": 8, "commodity-25g": 8, "dgx-b200": 8, "dgx-b300": 8,
                          "gb200-nvl72": 4, "gb300-nvl72": 4, "mi300x": 8}


@pytest.mark.parametrize("name", catalog_names())
@pytest.mark.parametrize("nodes", [1, 2, 5])
def test_every_catalog_cluster_builds_a_valid_graph(name, nodes):
    c = build_cluster(name, nodes=nodes)
    assert c.gpus == nodes * EXPECTED_GPUS_PER_NODE[name]
    gpus = [n for n, d in c.graph.nodes(data=True) if d[KIND] == GPU]
    assert len(gpus) == c.gpus
    assert nx.is_connected(c.graph)
    for _, _, d in c.graph.edges(data=True):
        assert d[BANDWIDTH] > 0 and d[LATENCY] >= 0 and d[TIER]


def test_catalog_has_the_six_systems():
    assert set(EXPECTED_GPUS_PER_NODE) <= set(catalog_names())


def test_gpus_sizes_the_cluster():
    assert build_cluster("lassen", gpus=192).hosts == 48


def test_gpus_not_a_multiple_of_node_is_refused():
    with pytest.raises(InputError, match="multiple of 8"):
        build_cluster("dgx-h100", gpus=12)


def test_validator_refuses_missing_bandwidth():
    g = nx.Graph()
    g.add_node("a", kind="gpu", host=0, local=0)
    g.add_node("b", kind="nvswitch", host=0)
    g.add_edge("a", "b", tier="nvlink", latency_s=1e-6)
    with pytest.raises(GraphError, match="bandwidth_Bps"):
        validate_graph(g)


def test_validator_refuses_unknown_kind():
    g = nx.Graph()
    g.add_node("a", kind="toaster")
    with pytest.raises(GraphError, match="kind"):
        validate_graph(g)


def test_second_link_between_same_pair_adds_bandwidth():
    g = nx.Graph()
    nics = [nvswitch_node(g, h, gpus=2, nvlink_GBps=100, nvlink_latency_us=0.5, nics=1, nic_Gbps=100,
                          pcie_GBps=10) for h in range(2)]
    torus(g, nics, dims=[2, 1], link_Gbps=80, latency_us=1)
    assert g.edges["torus.r0x0", "torus.r1x0"][BANDWIDTH] == pytest.approx(2 * 80e9 / 8)


def _fat_tree_graph(oversubscription):
    g = nx.Graph()
    nics = [nvswitch_node(g, h, gpus=1, nvlink_GBps=100, nvlink_latency_us=0.5, nics=1, nic_Gbps=100,
                          pcie_GBps=50) for h in range(8)]
    fat_tree(g, nics, radix=4, link_Gbps=100, latency_us=1, oversubscription=oversubscription)
    return g


def test_oversubscribed_fat_tree_has_less_bisection():
    def bisection(g):
        c = Cluster(name="fat-tree", origin="test", description="", gpu_model="a100", hosts=8, gpus_per_host=1,
                    node_builder="nvswitch", fabric_builder="fat_tree", graph=validate_graph(g), spec={})
        return bisection_bandwidth_Bps.__wrapped__(c)

    full, over = bisection(_fat_tree_graph(1.0)), bisection(_fat_tree_graph(3.0))
    assert full == pytest.approx(4 * 100e9 / 8)
    assert over < full


def test_torus_dims_must_hold_all_hosts():
    g = nx.Graph()
    nics = [nvswitch_node(g, h, gpus=1, nvlink_GBps=1, nvlink_latency_us=1, nics=1, nic_Gbps=1,
                          pcie_GBps=1) for h in range(5)]
    with pytest.raises(InputError, match="dims"):
        torus(g, nics, dims=[2, 2], link_Gbps=1, latency_us=1)


def test_show_reports_bisection_of_dgx_cluster():
    c = build_cluster("dgx-a100", nodes=4)
    # 2 hosts x 8 NICs x 200 Gb/s cross the host-major cut of a full-bisection fabric
    assert bisection_bandwidth_Bps(c) == pytest.approx(2 * 8 * 200e9 / 8)
