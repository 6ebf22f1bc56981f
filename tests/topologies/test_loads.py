"""The fabric view from host symmetry (topologies.loads) against routing every flow
(routing.Router), on every catalog cluster, and the array form of the flow patterns."""
import numpy as np
import pytest

from topologies import build_cluster
from topologies.catalog import catalog_names
from topologies.fabricview import (_pattern, _regular_flows, inter_flows, intra_flows, pattern_by_flow,
                                   ring_flows)

PATTERNS = (ring_flows, intra_flows, inter_flows)


def _layouts(gpus: int):
    """All GPUs as one group; TP-like blocks; DP-like strides."""
    yield [tuple(range(gpus))]
    for tp in (2, 4, 8):
        if gpus % tp == 0 and gpus > tp:
            yield [tuple(range(k * tp, (k + 1) * tp)) for k in range(gpus // tp)]
            yield [tuple(range(j, gpus, tp)) for j in range(tp)]
    yield [tuple(range(0, gpus, 2))[:4] + tuple(range(1, gpus, 2))[:4]]      # irregular: hosts interleaved


def _same(a, b) -> None:
    assert a.bottleneck_tier == b.bottleneck_tier
    assert a.bandwidth_Bps == pytest.approx(b.bandwidth_Bps, rel=1e-9)
    assert a.latency_s == pytest.approx(b.latency_s, rel=1e-9)
    assert [(t.tier, t.max_flows) for t in a.tiers] == [(t.tier, t.max_flows) for t in b.tiers]
    assert [t.bandwidth_Bps for t in a.tiers] == pytest.approx([t.bandwidth_Bps for t in b.tiers], rel=1e-9)
    assert [t.latency_s for t in a.tiers] == pytest.approx([t.latency_s for t in b.tiers], rel=1e-9)
    assert dict(a.traversals) == pytest.approx(dict(b.traversals), rel=1e-9)


@pytest.mark.parametrize("name", catalog_names())
@pytest.mark.parametrize("nodes", [1, 2, 4, 16])
def test_symmetric_loads_equal_flow_by_flow_routing(name, nodes):
    cluster = build_cluster(name, nodes=nodes)
    for groups in _layouts(cluster.gpus):
        groups = [g for g in groups if len(g) == len(groups[0])]
        for make in PATTERNS:
            _same(_pattern(cluster, groups, make), pattern_by_flow(cluster, groups, make))


@pytest.mark.parametrize("name", ["dgx-a100", "lassen", "frontier", "commodity-25g"])
def test_array_flows_are_the_per_group_flows_in_order(name):
    cluster = build_cluster(name, nodes=4)
    checked = 0
    for groups in _layouts(cluster.gpus):
        for make in PATTERNS:
            arrays = _regular_flows(cluster, groups, make)
            flows = [f for g in groups for f in make(cluster, g)]
            if arrays is None:      # not alike: the per-group form is used
                assert groups == [tuple(range(0, cluster.gpus, 2))[:4] + tuple(range(1, cluster.gpus, 2))[:4]] \
                    or len(groups) == 1
                continue
            checked += 1
            assert list(zip(*(a.tolist() for a in arrays))) == flows
    assert checked >= 9


def test_a_shared_link_is_seen_whatever_the_host():
    """Loads are kept per host: a pattern loading host 3 only still finds that host's busiest link."""
    cluster = build_cluster("commodity-25g", nodes=4)
    gph = cluster.gpus_per_host
    groups = [tuple(3 * gph + k for k in range(gph)), tuple(k for k in range(gph))]
    _same(_pattern(cluster, groups, ring_flows), pattern_by_flow(cluster, groups, ring_flows))
    lone = _pattern(cluster, groups[:1], ring_flows)
    assert lone.bandwidth_Bps == pytest.approx(_pattern(cluster, groups, ring_flows).bandwidth_Bps)
    assert np.isfinite(lone.bandwidth_Bps)


@pytest.mark.parametrize("name,nodes", [("dgx-a100", 128), ("lassen", 256), ("frontier", 128)])
def test_symmetric_loads_at_1024_gpus(name, nodes):
    """The largest size where routing every flow is still quick: TP=8 layouts' DP and TP groups."""
    cluster = build_cluster(name, nodes=nodes)
    gpus = cluster.gpus
    for groups in ([tuple(range(k * 8, k * 8 + 8)) for k in range(gpus // 8)],
                   [tuple(range(j, gpus, 8)) for j in range(8)]):
        for make in PATTERNS:
            _same(_pattern(cluster, groups, make), pattern_by_flow(cluster, groups, make))


def test_every_catalog_tier_has_its_own_fixed_colour(tmp_path):
    from topologies.draw import TIER_COLOURS, draw

    tiers = set()
    for name in catalog_names():
        cluster = build_cluster(name, nodes=2)
        tiers |= set(cluster.tiers)
    assert tiers <= set(TIER_COLOURS) and len(set(TIER_COLOURS.values())) == len(TIER_COLOURS)
    path = draw(build_cluster("dgx-a100", nodes=2), str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.endswith("c.png")
