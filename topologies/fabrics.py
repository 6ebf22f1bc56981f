"""Fabric builders: wire the hosts' NICs together, in the style of networkx generators.

Each takes the graph and ``nics`` (per host, its NIC names in rail order) and adds
switches and links. Shared parameter names: ``link_Gbps`` (switch-to-switch rate),
``latency_us`` (one hop: cable plus switch traversal), ``radix``, ``oversubscription``
(down:up port ratio at the leaf), ``tier_prefix`` (``ib``, ``eth``, ``ss``). A NIC's
own link runs at the NIC rate (node attribute ``rate_Bps``).
"""
from __future__ import annotations

import itertools
import math

import networkx as nx

from topologies.attrs import KIND, add_link
from topologies.errors import InputError
from topologies.units import Gbps_to_Bps, us_to_s


def _switch(graph: nx.Graph, name: str, kind: str = "switch") -> str:
    graph.add_node(name, **{KIND: kind})
    return name


def _attach(graph, nic, switch, tier, latency_s):
    add_link(graph, nic, switch, tier=tier, bandwidth_Bps=graph.nodes[nic]["rate_Bps"],
             latency_s=latency_s)


def _leaf_ports(radix: int, oversubscription: float) -> tuple[int, int]:
    """(down, up) ports of a leaf with ``radix`` ports at ``oversubscription`` down:up."""
    if radix < 2:
        raise InputError("fabric.radix", radix, "an integer >= 2")
    if oversubscription < 1:
        raise InputError("fabric.oversubscription", oversubscription, "a ratio >= 1 (1 = full bisection)")
    down = max(1, round(radix * oversubscription / (1 + oversubscription)))
    return down, max(1, radix - down)


def single_switch(graph, nics, *, latency_us: float, tier_prefix: str = "eth"):
    """Every NIC on one non-blocking switch (small clusters, a top-of-rack Ethernet switch)."""
    switch = _switch(graph, f"{tier_prefix}.sw0")
    for nic in itertools.chain.from_iterable(nics):
        _attach(graph, nic, switch, f"{tier_prefix}-leaf", us_to_s(latency_us))


def fat_tree(graph, nics, *, radix: int, link_Gbps: float, latency_us: float,
             levels: int = 2, oversubscription: float = 1.0, tier_prefix: str = "ib"):
    """Folded Clos (fat tree) of ``levels`` (1-3) switch levels over all NICs, host-major.

    Leaves take ``down`` NICs and have ``up`` uplinks (``down:up = oversubscription``);
    with 2 levels there are ``up`` spines and every leaf has one link to each; with 3,
    leaves form pods of ``radix // 2`` with ``up`` aggregation switches each, and
    aggregation switch j of every pod links to the j-th group of ``radix // 2`` cores
    (Al-Fares et al., SIGCOMM 2008, k-ary fat tree). Spine radix is not enforced.
    """
    if levels not in (1, 2, 3):
        raise InputError("fabric.levels", levels, "1, 2 or 3")
    down, up = _leaf_ports(radix, oversubscription)
    ends = list(itertools.chain.from_iterable(nics))
    lat, rate = us_to_s(latency_us), Gbps_to_Bps(link_Gbps)
    leaves = []
    for i in range(0, len(ends), down):
        leaf = _switch(graph, f"{tier_prefix}.leaf{len(leaves)}")
        leaves.append(leaf)
        for nic in ends[i:i + down]:
            _attach(graph, nic, leaf, f"{tier_prefix}-leaf", lat)
    if levels == 1 or len(leaves) == 1:
        return
    if levels == 2:
        _full_bipartite(graph, leaves, [_switch(graph, f"{tier_prefix}.spine{j}") for j in range(up)],
                        f"{tier_prefix}-spine", rate, lat)
        return
    pod_size, half = max(1, radix // 2), max(1, radix // 2)
    for p in range(math.ceil(len(leaves) / pod_size)):
        aggs = [_switch(graph, f"{tier_prefix}.agg{p}.{j}") for j in range(up)]
        _full_bipartite(graph, leaves[p * pod_size:(p + 1) * pod_size], aggs,
                        f"{tier_prefix}-spine", rate, lat)
        for j, agg in enumerate(aggs):
            cores = [_switch(graph, f"{tier_prefix}.core{j}.{c}") for c in range(half)]
            _full_bipartite(graph, [agg], cores, f"{tier_prefix}-core", rate, lat)


def _full_bipartite(graph, lower, upper, tier, rate, lat):
    for a in lower:
        for b in upper:
            add_link(graph, a, b, tier=tier, bandwidth_Bps=rate, latency_s=lat)


def rail_optimized(graph, nics, *, radix: int, link_Gbps: float, latency_us: float,
                   oversubscription: float = 1.0, tier_prefix: str = "ib"):
    """Rail-optimized fabric (NVIDIA DGX SuperPOD): NIC r of every host in a scalable unit
    of ``down`` hosts sits on that unit's rail-r leaf; every leaf links to each of ``up``
    spines. Same-rail traffic stays one switch hop apart inside a unit."""
    down, up = _leaf_ports(radix, oversubscription)
    lat, rate = us_to_s(latency_us), Gbps_to_Bps(link_Gbps)
    rails = max(len(h) for h in nics)
    leaves = []
    for su in range(math.ceil(len(nics) / down)):
        for r in range(rails):
            leaf = _switch(graph, f"{tier_prefix}.su{su}.rail{r}")
            leaves.append(leaf)
            for host_nics in nics[su * down:(su + 1) * down]:
                if r < len(host_nics):
                    _attach(graph, host_nics[r], leaf, f"{tier_prefix}-leaf", lat)
    if len(leaves) > 1:
        spines = [_switch(graph, f"{tier_prefix}.spine{j}") for j in range(up)]
        _full_bipartite(graph, leaves, spines, f"{tier_prefix}-spine", rate, lat)


def dragonfly(graph, nics, *, routers_per_group: int, hosts_per_router: int, link_Gbps: float,
              global_Gbps: float, latency_us: float, global_latency_us: float,
              tier_prefix: str = "ss"):
    """Dragonfly (Kim et al., ISCA 2008): hosts on routers, routers of a group all-to-all
    (local tier), every pair of groups joined by one global link; minimal routing.
    A host's NICs all sit on its router (HPE Slingshot on Frontier)."""
    if routers_per_group < 1 or hosts_per_router < 1:
        raise InputError("fabric.routers_per_group", routers_per_group, "integers >= 1")
    routers = []
    for h, host_nics in enumerate(nics):
        r = h // hosts_per_router
        if r == len(routers):
            routers.append(_switch(graph, f"{tier_prefix}.g{r // routers_per_group}.r{r % routers_per_group}",
                                   kind="router"))
        for nic in host_nics:
            _attach(graph, nic, routers[r], f"{tier_prefix}-edge", us_to_s(latency_us))
    groups = [routers[i:i + routers_per_group] for i in range(0, len(routers), routers_per_group)]
    for group in groups:
        _full_mesh(graph, group, f"{tier_prefix}-local", Gbps_to_Bps(link_Gbps), us_to_s(latency_us))
    for a, b in itertools.combinations(range(len(groups)), 2):
        ra, rb = groups[a][b % len(groups[a])], groups[b][a % len(groups[b])]
        add_link(graph, ra, rb, tier=f"{tier_prefix}-global", bandwidth_Bps=Gbps_to_Bps(global_Gbps),
                 latency_s=us_to_s(global_latency_us))


def _full_mesh(graph, nodes, tier, rate, lat):
    for a, b in itertools.combinations(nodes, 2):
        add_link(graph, a, b, tier=tier, bandwidth_Bps=rate, latency_s=lat)


def torus(graph, nics, *, dims: list, link_Gbps: float, latency_us: float, tier_prefix: str = "torus"):
    """2-D or 3-D torus: one router per host at a grid coordinate (host-major), links to the
    two neighbours along each dim with wrap-around (a dim of 2 gets two parallel links)."""
    dims = tuple(int(d) for d in dims)
    if len(dims) not in (2, 3) or min(dims) < 1 or math.prod(dims) < len(nics):
        raise InputError("fabric.dims", list(dims),
                         f"2 or 3 positive sizes whose product is >= the {len(nics)} hosts")
    coords = list(itertools.product(*(range(d) for d in dims)))
    name = {c: _switch(graph, f"{tier_prefix}.r" + "x".join(map(str, c)), kind="router") for c in coords}
    rate, lat = Gbps_to_Bps(link_Gbps), us_to_s(latency_us)
    for c in coords:
        for axis, size in enumerate(dims):
            if size == 1:
                continue
            nxt = list(c)
            nxt[axis] = (c[axis] + 1) % size
            add_link(graph, name[c], name[tuple(nxt)], tier=f"{tier_prefix}",
                     bandwidth_Bps=rate, latency_s=lat)
    for h, host_nics in enumerate(nics):
        for nic in host_nics:
            _attach(graph, nic, name[coords[h]], f"{tier_prefix}-edge", lat)




def two_tier(graph, nics, *, hosts_per_group: int, trunk_Gbps: float, latency_us: float, tier_prefix: str = "tcp"):
    """Groups of ``hosts_per_group`` hosts on their own switch; each group switch reaches one
    core switch over a trunk of ``trunk_Gbps`` (tier ``{prefix}-trunk``): an inter-node tier
    with oversubscription = group NIC rate / trunk rate (realrun's emulated groups)."""
    if hosts_per_group < 1 or len(nics) % hosts_per_group:
        raise InputError("fabric.hosts_per_group", hosts_per_group, f"a divisor of the hosts ({len(nics)})")
    core = _switch(graph, f"{tier_prefix}.core")
    for g in range(len(nics) // hosts_per_group):
        sw = _switch(graph, f"{tier_prefix}.sw{g}")
        add_link(graph, sw, core, tier=f"{tier_prefix}-trunk", bandwidth_Bps=Gbps_to_Bps(trunk_Gbps),
                 latency_s=us_to_s(latency_us))
        for host_nics in nics[g * hosts_per_group:(g + 1) * hosts_per_group]:
            for nic in host_nics:
                _attach(graph, nic, sw, f"{tier_prefix}-leaf", us_to_s(latency_us))


FABRIC_BUILDERS = {
    "two_tier": two_tier,
    "single_switch": single_switch,
    "fat_tree": fat_tree,
    "rail_optimized": rail_optimized,
    "dragonfly": dragonfly,
    "torus": torus,
}
