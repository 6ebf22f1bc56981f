"""Attribute names carried by every cluster graph, and the validator that refuses gaps.

Nodes carry KIND (one of NODE_KINDS) and, for parts of a host, HOST (host index).
GPUs also carry LOCAL (index within the host). A switch that joins the GPUs of several
hosts into one NVLink domain (GB200 NVL72's NVLink Switch trays) belongs to no host: it
carries DOMAIN (domain index) instead. A part that never forwards traffic between GPUs and
NICs (a Grace CPU beside its GPUs) carries FORWARDS = False, and routing leaves it out.
Edges carry TIER, BANDWIDTH (bytes/s per direction; links are full duplex) and LATENCY
(seconds, one traversal, switch hop included). A graph missing any of them is refused,
never defaulted.
"""
from __future__ import annotations

import math

import networkx as nx

KIND = "kind"
HOST = "host"
DOMAIN = "domain"
FORWARDS = "forwards"
LOCAL = "local"
TIER = "tier"
BANDWIDTH = "bandwidth_Bps"
LATENCY = "latency_s"

GPU = "gpu"
NODE_KINDS = ("gpu", "nvswitch", "pcie_switch", "cpu", "nic", "switch", "router")
INTRA_TIERS = ("nvlink", "pcie", "xbus", "xgmi", "c2c")


class GraphError(ValueError):
    """A cluster graph is missing or has a bad attribute."""


def validate_graph(graph: nx.Graph) -> nx.Graph:
    """Check every node and edge attribute; return the graph or raise GraphError."""
    for node, data in graph.nodes(data=True):
        kind = data.get(KIND)
        if kind not in NODE_KINDS:
            raise GraphError(f"node {node!r}: {KIND}={kind!r}, allowed {NODE_KINDS}")
        if kind == GPU and (HOST not in data or LOCAL not in data):
            raise GraphError(f"gpu {node!r} needs '{HOST}' and '{LOCAL}'")
        if kind == "nvswitch" and HOST not in data and DOMAIN not in data:
            raise GraphError(f"nvswitch {node!r} needs '{HOST}' (its host) or '{DOMAIN}' (its NVLink domain)")
    for u, v, data in graph.edges(data=True):
        for key in (TIER, BANDWIDTH, LATENCY):
            if key not in data:
                raise GraphError(f"edge {u!r}-{v!r} has no '{key}'")
        if not (data[BANDWIDTH] > 0 and math.isfinite(data[BANDWIDTH])):
            raise GraphError(f"edge {u!r}-{v!r}: {BANDWIDTH}={data[BANDWIDTH]!r} must be > 0")
        if not (data[LATENCY] >= 0 and math.isfinite(data[LATENCY])):
            raise GraphError(f"edge {u!r}-{v!r}: {LATENCY}={data[LATENCY]!r} must be >= 0")
    return graph


def add_link(graph: nx.Graph, u, v, *, tier: str, bandwidth_Bps: float, latency_s: float) -> None:
    """Add a full-duplex link; a second link between the same pair adds bandwidth (a trunk)."""
    if graph.has_edge(u, v):
        graph.edges[u, v][BANDWIDTH] += bandwidth_Bps
        return
    graph.add_edge(u, v, **{TIER: tier, BANDWIDTH: bandwidth_Bps, LATENCY: latency_s})
