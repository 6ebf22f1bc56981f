"""Write a cluster graph as GraphML or node-link JSON, atomically."""
from __future__ import annotations

import json

import networkx as nx

from topologies.clikit import atomic_write
from topologies.cluster import Cluster
from topologies.errors import InputError

FORMATS = ("graphml", "json")


def export(cluster: Cluster, path: str, fmt: str) -> str:
    """Write ``cluster.graph`` to ``path`` as ``graphml`` or ``json`` (node-link)."""
    if fmt not in FORMATS:
        raise InputError("format", fmt, "one of " + ", ".join(FORMATS))
    graph = cluster.graph.copy()
    graph.graph.update(name=cluster.name, gpu=cluster.gpu_model, nodes=cluster.hosts,
                       nodes_per_nvlink_domain=cluster.hosts_per_domain)
    if fmt == "graphml":
        atomic_write(path, lambda h: nx.write_graphml(graph, h))
    else:
        data = nx.node_link_data(graph, edges="links")
        atomic_write(path, lambda h: h.write(json.dumps(data, indent=1).encode()))
    return path
