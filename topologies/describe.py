"""Facts about a built cluster for people: shape, tiers, bisection bandwidth."""
from __future__ import annotations

from functools import lru_cache

import networkx as nx

from topologies.attrs import BANDWIDTH, GPU, HOST, KIND
from topologies.cluster import Cluster


@lru_cache(maxsize=32)
def bisection_bandwidth_Bps(cluster: Cluster) -> float | None:
    """Max flow (bytes/s, one direction) from the first half of the hosts to the second.

    The host-major halves are the usual worst case of a tree-like fabric; None for one host.
    Halves are whole NVLink domains where there are two or more (the cut crosses the fabric,
    not a rack's NVLink); one multi-host domain is cut through its NVLink.
    """
    if cluster.hosts < 2:
        return None
    flow = nx.DiGraph()
    for u, v, d in cluster.graph.edges(data=True):
        flow.add_edge(u, v, capacity=d[BANDWIDTH])
        flow.add_edge(v, u, capacity=d[BANDWIDTH])
    half = _half_hosts(cluster)
    for n, d in cluster.graph.nodes(data=True):
        if d[KIND] == GPU:
            side = "_src" if d[HOST] < half else ("_dst" if d[HOST] < 2 * half else None)
            if side == "_src":
                flow.add_edge("_src", n)
            elif side == "_dst":
                flow.add_edge(n, "_dst")
    value, _ = nx.maximum_flow(flow, "_src", "_dst")
    return float(value)


def _half_hosts(cluster: Cluster) -> int:
    """Hosts on each side of the bisection: half the whole NVLink domains where there are two or
    more, else half the hosts."""
    if cluster.domains >= 2:
        return cluster.domains // 2 * cluster.hosts_per_domain
    return cluster.hosts // 2


def describe(cluster: Cluster) -> dict:
    """A JSON-ready summary: GPUs, node shape, NVLink domains, tiers, bisection and
    oversubscription (measured where the bisection cuts the fabric between domains; None
    where it cuts one domain's NVLink)."""
    bisection = bisection_bandwidth_Bps(cluster)
    injection = cluster.nic_rate_per_host_Bps * _half_hosts(cluster)
    spec = cluster.spec
    return {
        "name": cluster.name,
        "description": cluster.description,
        "origin": cluster.origin,
        "gpu": cluster.gpu_model,
        "nodes": cluster.hosts,
        "gpus_per_node": cluster.gpus_per_host,
        "gpus": cluster.gpus,
        "nodes_per_nvlink_domain": cluster.hosts_per_domain,
        "gpus_per_nvlink_domain": cluster.gpus_per_domain,
        "nvlink_domains": cluster.domains,
        "node_builder": cluster.node_builder,
        "fabric_builder": cluster.fabric_builder,
        "nic_bandwidth_per_node_Bps": cluster.nic_rate_per_host_Bps,
        "nvls": cluster.supports_nvls,
        "sharp": cluster.supports_sharp,
        "tiers": cluster.tiers,
        "bisection_bandwidth_Bps": bisection,
        "oversubscription_configured": spec["fabric"].get("oversubscription", 1.0),
        "oversubscription_measured": (injection / bisection)
        if bisection and (cluster.domains >= 2 or cluster.hosts_per_domain == 1) else None,
        "graph_nodes": cluster.graph.number_of_nodes(),
        "graph_links": cluster.graph.number_of_edges(),
        "sources": spec.get("sources", {}),
    }
