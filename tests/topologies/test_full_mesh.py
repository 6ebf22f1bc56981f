"""A node whose GPUs are fully meshed by direct links (AMD MI300X's xGMI): rings over all its links."""
import pytest

from topologies import build_cluster, catalog_names, fabric_view
from topologies.fabricview import mesh_cycles, meshed

GB = 1e9


@pytest.mark.parametrize("n", range(3, 41))
def test_mesh_cycles_are_edge_disjoint_hamiltonian_cycles(n):
    cycles = mesh_cycles(n)
    assert len(cycles) == (n - 1) // 2
    edges = set()
    for cyc in cycles:
        assert sorted(cyc) == list(range(n))
        for a, b in zip(cyc, cyc[1:] + cyc[:1]):
            assert frozenset((a, b)) not in edges
            edges.add(frozenset((a, b)))


def test_the_mi300x_node_is_a_full_mesh_of_xgmi_links():
    c = build_cluster("mi300x", nodes=1)
    assert c.tiers["xgmi"]["links"] == 28 and c.tiers["xgmi"]["max_bandwidth_Bps"] == pytest.approx(64 * GB)
    assert meshed(c, range(8)) and not meshed(c, range(2))


def test_a_ring_on_the_mesh_runs_over_six_of_each_gpu_s_seven_links():
    """Walecki's 3 edge-disjoint Hamiltonian cycles of 8 GPUs, each both ways: a rank's data is split
    over 6 links of 64 GB/s (the 7th link of each GPU is the matching no cycle uses)."""
    v = fabric_view(build_cluster("mi300x", nodes=1))
    assert v.ring.bottleneck_tier == "xgmi"
    assert v.ring.bandwidth_Bps == pytest.approx(6 * 64 * GB)
    assert dict(v.ring.traversals) == pytest.approx({"xgmi": 1.0})      # direct links: one crossing a byte


def test_two_gpus_have_one_link():
    v = fabric_view(build_cluster("mi300x", nodes=1), (0, 1))
    assert v.ring.bandwidth_Bps == pytest.approx(64 * GB)


@pytest.mark.parametrize("name", [n for n in catalog_names() if n != "mi300x"])
def test_no_other_catalog_node_is_meshed(name):
    c = build_cluster(name, nodes=1)
    assert c.gpus_per_host >= 3 and not meshed(c, range(c.gpus_per_host))
