import pytest

from topologies import build_cluster, fabric_view, place
from topologies.errors import InputError

GB = 1e9


def test_dgx_a100_views():
    c = build_cluster("dgx-a100", nodes=2)
    v = fabric_view(c)
    assert (v.ranks, v.hosts, v.ranks_per_host) == (16, 2, 8)
    assert v.intra.bandwidth_Bps == pytest.approx(300 * GB)       # NVLink 3 per GPU
    assert v.inter.bandwidth_Bps == pytest.approx(25 * GB)        # one 200 Gb/s NIC per GPU
    assert v.ring.bandwidth_Bps == pytest.approx(200 * GB)        # 8 channels share the node's NICs
    assert v.ring.bottleneck_tier == "ib-leaf"
    assert set(v.tier_names) >= {"nvlink", "ib-leaf"}


def test_dp_groups_of_a_tp8_layout_share_nothing_on_rails():
    c = build_cluster("dgx-a100", nodes=2)
    groups = [(i, i + 8) for i in range(8)]
    v = fabric_view(c, groups[0], concurrent=groups)
    assert v.concurrent_groups == 8
    assert v.ring.bandwidth_Bps == pytest.approx(25 * GB)


def test_concurrent_groups_share_a_single_nic():
    c = build_cluster("commodity-25g", nodes=2)
    groups = [(i, i + 8) for i in range(8)]
    alone = fabric_view(c, groups[0])
    shared = fabric_view(c, groups[0], concurrent=groups)
    assert alone.ring.bandwidth_Bps == pytest.approx(25e9 / 8)
    assert shared.ring.bandwidth_Bps == pytest.approx(25e9 / 8 / 8)
    assert max(t.max_flows for t in shared.tiers) >= 8


def test_lassen_intra_ring_is_bound_by_the_xbus():
    v = fabric_view(build_cluster("lassen", nodes=1))
    assert v.ring.bottleneck_tier == "xbus"
    assert v.inter is None


def test_single_rank_group_has_no_links():
    v = fabric_view(build_cluster("dgx-h100", nodes=1), (3,))
    assert v.ring.bottleneck_tier is None and v.intra is None


def test_placements():
    c = build_cluster("dgx-a100", nodes=2)
    assert place(c, 4) == (0, 1, 2, 3)
    assert place(c, 4, "spread") == (0, 8, 1, 9)
    assert place(c, 2, [3, 12]) == (3, 12)
    with pytest.raises(InputError, match="placement"):
        place(c, 2, [3, 3])
    with pytest.raises(InputError, match="ranks"):
        place(c, 17)


def test_bad_group_is_refused():
    with pytest.raises(InputError, match="group"):
        fabric_view(build_cluster("dgx-a100", nodes=1), (0, 99))


def test_fabric_view_is_cached():
    c = build_cluster("dgx-h100", nodes=4)
    assert fabric_view(c) is fabric_view(c)


def test_traversals_count_link_crossings_per_byte():
    lassen = fabric_view(build_cluster("lassen", nodes=1))
    assert dict(lassen.ring.traversals) == pytest.approx({"nvlink": 1.5, "xbus": 0.5})
    dgx = fabric_view(build_cluster("dgx-a100", nodes=1))
    assert dict(dgx.ring.traversals) == pytest.approx({"nvlink": 2.0})
