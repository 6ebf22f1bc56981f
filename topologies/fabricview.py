"""The fabric view of a group of ranks: what its collectives see of the network.

For a group (GPU indices in rank order) and the groups that communicate at the same
time (e.g. all DP groups of a TP=8 layout), three traffic patterns are routed on the
graph and their link loads summed with the concurrent groups' identical patterns:

* ``ring``  - the flat ring over the group (host-major). Across hosts it runs as one
  channel per rank on a host, each channel entering and leaving every host at a
  different GPU, as NCCL spreads rings over NICs.
* ``intra`` - a ring among the group's ranks on each host (hierarchical phase 1 and 3).
* ``inter`` - one ring per local rank across hosts (hierarchical phase 2).

Each pattern's ``bandwidth_Bps`` is what one rank can push when all ranks push at once:
``1 / max_link(load / link bandwidth)``; its ``latency_s`` the worst path latency of one
step; its ``traversals`` how many links of each tier a byte crosses on average (a byte
from GPU to GPU through an NVSwitch crosses two NVLinks), which turns bytes sent into wire
bytes per tier. Per tier the view gives the same two numbers for the links of that tier, and
``max_flows`` counts the flows sharing that tier's busiest link.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from topologies.cluster import Cluster
from topologies.errors import InputError
from topologies.routing import router_for


@dataclass(frozen=True, kw_only=True)
class TierView:
    tier: str
    bandwidth_Bps: float
    latency_s: float
    max_flows: float


@dataclass(frozen=True, kw_only=True)
class PatternView:
    bandwidth_Bps: float
    latency_s: float
    bottleneck_tier: str | None
    tiers: tuple[TierView, ...]
    traversals: tuple = ()   # ((tier, link crossings per byte a rank sends), ...)


@dataclass(frozen=True, kw_only=True)
class FabricView:
    """What a group of ranks sees of the fabric (see module doc)."""

    ranks: int
    hosts: int
    ranks_per_host: int
    concurrent_groups: int
    ring: PatternView
    intra: PatternView | None
    inter: PatternView | None

    @property
    def tiers(self) -> tuple[TierView, ...]:
        return self.ring.tiers

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(t.tier for t in self.ring.tiers)


def _by_host(cluster: Cluster, group) -> list[list[int]]:
    hosts: dict[int, list[int]] = {}
    for g in group:
        hosts.setdefault(g // cluster.gpus_per_host, []).append(g)
    return list(hosts.values())


def ring_flows(cluster: Cluster, group) -> list:
    """Flat ring over ``group``; one channel per rank on a host when it spans hosts."""
    per_host = _by_host(cluster, group)
    if len(per_host) == 1:
        return _cycle(cluster, list(group), 1.0)
    channels = len(per_host[0])
    flows = []
    for c in range(channels):
        order = [g for ranks in per_host for g in ranks[c:] + ranks[:c]]
        flows += _cycle(cluster, order, 1.0 / channels)
    return flows


def intra_flows(cluster: Cluster, group) -> list:
    return [f for ranks in _by_host(cluster, group) for f in _cycle(cluster, ranks, 1.0)]


def inter_flows(cluster: Cluster, group) -> list:
    per_host = _by_host(cluster, group)
    width = min(len(r) for r in per_host)
    return [f for j in range(width) for f in _cycle(cluster, [r[j] for r in per_host], 1.0)]


def _cycle(cluster: Cluster, order, weight) -> list:
    if len(order) < 2:
        return []
    names = [cluster.gpu(g) for g in order]
    return [(names[i], names[(i + 1) % len(names)], weight) for i in range(len(names))]


def _pattern(cluster: Cluster, groups, make_flows) -> PatternView:
    router = router_for(cluster)
    flows = [f for g in groups for f in make_flows(cluster, g)]
    if not flows:
        return PatternView(bandwidth_Bps=float("inf"), latency_s=0.0, bottleneck_tier=None, tiers=())
    loaded = router.pattern_load(flows)
    per_tier: dict[str, list] = {}
    for link, load in loaded.load.items():
        bw, lat, tier = router.link_info(link)
        entry = per_tier.setdefault(tier, [0.0, 0.0, 0.0, 0.0])
        entry[0] = max(entry[0], load / bw)
        entry[1] = max(entry[1], lat)
        entry[2] = max(entry[2], load)
        entry[3] += load
    sent = sum(w for s, d, w in flows if s != d)
    tiers = tuple(TierView(tier=t, bandwidth_Bps=1.0 / v[0], latency_s=v[1],
                           max_flows=round(v[2] * _flows_per_unit(flows), 3))
                  for t, v in sorted(per_tier.items(), key=lambda kv: -kv[1][0]))
    traversals = tuple((t, v[3] / sent) for t, v in sorted(per_tier.items()))
    return PatternView(bandwidth_Bps=tiers[0].bandwidth_Bps, latency_s=loaded.latency_s,
                       bottleneck_tier=tiers[0].tier, tiers=tiers, traversals=traversals)


def _flows_per_unit(flows) -> float:
    """Loads are in units of flow weight; scale so one whole flow counts as 1."""
    return 1.0 / max(w for _, _, w in flows)


def fabric_view(cluster: Cluster, group=None, concurrent=()) -> FabricView:
    """Fabric view of ``group`` (GPU indices; default all GPUs) while ``concurrent``
    groups (each a sequence of GPU indices, same size) run the same pattern. Cached."""
    group = tuple(range(cluster.gpus)) if group is None else tuple(group)
    others = tuple(tuple(g) for g in concurrent if tuple(g) != group)
    return _fabric_view(cluster, group, others)


@lru_cache(maxsize=256)
def _fabric_view(cluster: Cluster, group: tuple, others: tuple) -> FabricView:
    _check_group(cluster, group)
    groups = (group,) + others
    per_host = _by_host(cluster, group)
    spans = len(per_host) > 1
    width = max(len(r) for r in per_host)
    return FabricView(
        ranks=len(group), hosts=len(per_host), ranks_per_host=width,
        concurrent_groups=len(groups),
        ring=_pattern(cluster, groups, ring_flows),
        intra=_pattern(cluster, groups, intra_flows) if width > 1 else None,
        inter=_pattern(cluster, groups, inter_flows) if spans else None)


def _check_group(cluster: Cluster, group: tuple) -> None:
    if not group:
        raise InputError("group", list(group), "at least one rank")
    if len(set(group)) != len(group) or min(group) < 0 or max(group) >= cluster.gpus:
        raise InputError("group", list(group)[:8],
                         f"distinct GPU indices in [0, {cluster.gpus - 1}]")
