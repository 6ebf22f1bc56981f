"""The fabric view of a group of ranks: what its collectives see of the network.

For a group (GPU indices in rank order) and the groups that communicate at the same
time (e.g. all DP groups of a TP=8 layout), three traffic patterns are routed on the
graph and their link loads summed with the concurrent groups' identical patterns:

* ``ring``  - the flat ring over the group (host-major). Across NVLink domains it runs as
  one channel per rank on a domain, each channel entering and leaving every domain at a
  different GPU, as NCCL spreads rings over NICs.
* ``intra`` - a ring among the group's ranks in each NVLink domain (hierarchical phase 1 and 3).
* ``inter`` - one ring per local rank across domains (hierarchical phase 2).

An NVLink domain is a host on most clusters and a rack of hosts on NVL72 (``topologies.cluster``):
NCCL treats the GPUs of a multi-node NVLink domain as one node (its rings and NVLS run inside
the domain over NVLink, and only traffic between domains takes the NICs), and so do these patterns.

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

import numpy as np

from topologies.cluster import Cluster
from topologies.errors import InputError
from topologies.loads import TierLoad, loads_for
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
    """What a group of ranks sees of the fabric (see module doc): its ranks, the NVLink domains
    they span and the most on one domain (what the patterns are built from), and the hosts
    (machines) they span and the most on one host (equal to the domains' on every cluster but
    multi-host NVLink racks)."""

    ranks: int
    domains: int
    ranks_per_domain: int
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


def by_host(group, gpus_per_host: int) -> list[list[int]]:
    """``group``'s GPUs by host (or by NVLink domain, given GPUs per domain), hosts and GPUs in
    the group's order."""
    hosts: dict[int, list[int]] = {}
    for g in group:
        hosts.setdefault(g // gpus_per_host, []).append(g)
    return list(hosts.values())


def by_domain(cluster: Cluster, group) -> list[list[int]]:
    """``group``'s GPUs by NVLink domain, domains and GPUs in the group's order."""
    return by_host(group, cluster.gpus_per_domain)


def ring_flows(cluster: Cluster, group) -> list:
    """Flat ring over ``group``; one channel per rank on a domain when it spans domains, channel
    c entering each domain at its c-th rank (counted round a domain that holds fewer, so a partly
    filled last domain spreads the channels over its NICs too).
    Flows are (source GPU index, destination GPU index, weight)."""
    per_domain = by_domain(cluster, group)
    if len(per_domain) == 1:
        return _domain_ring(cluster, list(group))
    channels = len(per_domain[0])
    flows = []
    for c in range(channels):
        order = [g for ranks in per_domain for g in ranks[c % len(ranks):] + ranks[:c % len(ranks)]]
        flows += _cycle(order, 1.0 / channels)
    return flows


def intra_flows(cluster: Cluster, group) -> list:
    return [f for ranks in by_domain(cluster, group) for f in _domain_ring(cluster, ranks)]


def _domain_ring(cluster: Cluster, ranks: list) -> list:
    """A ring over ranks of one domain: one cycle in their order, or on a full mesh of direct GPU
    links (``meshed``) the edge-disjoint Hamiltonian cycles of ``mesh_cycles``, each run both ways,
    sharing the data evenly: RCCL builds its rings over all of an MI300X's xGMI links."""
    if not meshed(cluster, ranks):
        return _cycle(ranks, 1.0)
    cycles = mesh_cycles(len(ranks))
    weight = 1.0 / (2 * len(cycles))
    return [f for cyc in cycles for order in (cyc, cyc[::-1]) for f in _cycle([ranks[i] for i in order], weight)]


def meshed(cluster: Cluster, ranks) -> bool:
    """Whether three or more GPUs are pairwise joined by direct links (a full mesh, no switch)."""
    if len(ranks) < 3:
        return False
    names = [cluster.gpu(g) for g in ranks]
    return all(cluster.graph.has_edge(a, b) for i, a in enumerate(names) for b in names[i + 1:])


def mesh_cycles(n: int) -> list[list[int]]:
    """(n - 1) // 2 edge-disjoint Hamiltonian cycles of the complete graph on 0 .. n-1 (n >= 3):
    Walecki's construction. Odd n = 2m + 1: vertex 2m joined to the m rotations of the zigzag path
    0, 1, 2m-1, 2, 2m-2, ..., m over the circle 0 .. 2m-1 (the rotations share no edge). Even n:
    the cycles of n - 1 vertices with the last vertex put in each in place of the path's one
    diameter (its m-th step, of length m): rotation j gives up j+a and j+a+m, so the m rotations
    give up every circle vertex once and the last vertex's edges are distinct; the n / 2 edges
    left form a matching no ring uses."""
    odd = n if n % 2 else n - 1
    m = (odd - 1) // 2
    path = [0]
    for k in range(1, 2 * m):
        path.append((path[-1] + (k if k % 2 else -k)) % (2 * m))
    cycles = [[2 * m] + [(v + j) % (2 * m) for v in path] for j in range(m)]
    if n % 2 == 0:
        for cyc in cycles:
            cyc.insert(m + 1, n - 1)     # between path[m - 1] and path[m]: cycle positions m and m + 1
    return cycles


def inter_flows(cluster: Cluster, group) -> list:
    per_domain = by_domain(cluster, group)
    width = min(len(r) for r in per_domain)
    return [f for j in range(width) for f in _cycle([r[j] for r in per_domain], 1.0)]


def _cycle(order, weight) -> list:
    if len(order) < 2:
        return []
    return list(zip(order, order[1:] + order[:1], [weight] * len(order)))


def _pattern(cluster: Cluster, groups, make_flows) -> PatternView:
    """The pattern of every group at once, its link loads from ``loads`` (hosts alike)."""
    arrays = _regular_flows(cluster, groups, make_flows)
    if arrays is None:
        flows = [f for g in groups for f in make_flows(cluster, g)]
        arrays = tuple(np.array(col) for col in zip(*flows)) if flows else None
    if arrays is None or not len(arrays[0]):
        return _IDLE
    src, dst, weight = arrays
    stats = loads_for(cluster).stats(src, dst, weight)
    sent = float(weight[src != dst].sum())
    return _view(stats.tiers, stats.latency_s, sent, 1.0 / float(weight.max()))


def _regular_flows(cluster: Cluster, groups, make_flows):
    """``make_flows`` of every group as arrays (src, dst, weight), in the same order, by numpy
    where the groups are alike: the same size, each domain's ranks adjacent, as many on every
    domain (a placement's TP, DP and PP groups are). None where they are not."""
    try:
        ranks = np.array(groups, dtype=np.int64)
    except ValueError:
        return None
    if ranks.ndim != 2 or make_flows not in _CYCLES:
        return None
    count, size = ranks.shape
    domains = ranks // cluster.gpus_per_domain
    if make_flows is not inter_flows and meshed(cluster, ranks[0, domains[0] == domains[0, 0]].tolist()):
        return None     # rings over a full mesh: the per-group form (_domain_ring)
    per = size // (1 + int((domains[0, 1:] != domains[0, :-1]).sum()))
    blocks = domains.reshape(count, size // per, per) if size % per == 0 else None
    if blocks is None or (blocks != blocks[:, :, :1]).any() \
            or (np.diff(np.sort(blocks[:, :, 0], axis=1), axis=1) == 0).any():
        return None
    return _CYCLES[make_flows](ranks.reshape(count, size // per, per))


def _cycle_arrays(orders: np.ndarray, weight: float):
    """Each row of ``orders`` (..., L) a cycle: every rank sends to the next, the last to the first."""
    if orders.shape[-1] < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    src, dst = orders.reshape(-1), np.roll(orders, -1, axis=-1).reshape(-1)
    return src, dst, np.full(len(src), weight)


def _ring_arrays(blocks: np.ndarray):
    count, hosts, per = blocks.shape
    if hosts == 1:
        return _cycle_arrays(blocks.reshape(count, per), 1.0)
    shift = (np.arange(per)[:, None] + np.arange(per)[None, :]) % per     # channel c starts at rank c
    orders = blocks[:, :, shift].transpose(0, 2, 1, 3).reshape(count, per, hosts * per)
    return _cycle_arrays(orders, 1.0 / per)


_CYCLES = {ring_flows: _ring_arrays,
           intra_flows: lambda blocks: _cycle_arrays(blocks, 1.0),
           inter_flows: lambda blocks: _cycle_arrays(blocks.transpose(0, 2, 1), 1.0)}


def pattern_by_flow(cluster: Cluster, groups, make_flows) -> PatternView:
    """The same view routed flow by flow (``routing.Router``): the reference ``_pattern`` is
    tested against; its cost grows with flows x links, so nothing else calls it."""
    flows = [(cluster.gpu(s), cluster.gpu(d), w) for g in groups for s, d, w in make_flows(cluster, g)]
    if not flows:
        return _IDLE
    router = router_for(cluster)
    loaded = router.pattern_load(flows)
    per_tier: dict[str, list] = {}
    for link, load in loaded.load.items():
        bw, lat, tier = router.link_info(link)
        entry = per_tier.setdefault(tier, [0.0, 0.0, 0.0, 0.0])
        entry[0] = max(entry[0], load / bw)
        entry[1] = max(entry[1], lat)
        entry[2] = max(entry[2], load)
        entry[3] += load
    tiers = [TierLoad(t, *v) for t, v in per_tier.items()]
    sent = sum(w for s, d, w in flows if s != d)
    return _view(tiers, loaded.latency_s, sent, 1.0 / max(w for _, _, w in flows))


_IDLE = PatternView(bandwidth_Bps=float("inf"), latency_s=0.0, bottleneck_tier=None, tiers=())


def _view(tier_loads, latency_s: float, sent: float, flows_per_unit: float) -> PatternView:
    """Loads are in units of flow weight; ``flows_per_unit`` scales them so one whole flow
    counts as 1 in ``max_flows``. Tiers busiest first (ties: the order a byte meets them)."""
    ordered = sorted(tier_loads, key=lambda t: -t.ratio)
    tiers = tuple(TierView(tier=t.tier, bandwidth_Bps=1.0 / t.ratio, latency_s=t.latency_s,
                           max_flows=round(t.max_load * flows_per_unit, 3)) for t in ordered)
    traversals = tuple((t.tier, t.sum_load / sent) for t in sorted(tier_loads, key=lambda t: t.tier))
    return PatternView(bandwidth_Bps=tiers[0].bandwidth_Bps, latency_s=latency_s,
                       bottleneck_tier=tiers[0].tier, tiers=tiers, traversals=traversals)


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
    per_domain = by_domain(cluster, group)
    spans = len(per_domain) > 1
    width = max(len(r) for r in per_domain)
    machines = by_host(group, cluster.gpus_per_host)
    return FabricView(
        ranks=len(group), domains=len(per_domain), ranks_per_domain=width,
        hosts=len(machines), ranks_per_host=max(len(r) for r in machines),
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
