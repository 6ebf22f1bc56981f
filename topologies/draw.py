"""A picture of a cluster: hosts side by side, their GPUs and switches, the fabric above.

Links are coloured by tier. Levels of fabric switches come from their hop distance to
the nearest NIC, so any builder draws without special cases.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402

from topologies.attrs import HOST, KIND, LOCAL, TIER  # noqa: E402
from topologies.cluster import Cluster  # noqa: E402
from topologies.errors import InputError  # noqa: E402

_ROW = {"gpu": 0.0, "nvswitch": 1.0, "pcie_switch": 1.0, "cpu": 1.6, "nic": 2.4}
_COLOR = {"gpu": "#76b900", "nvswitch": "#1f77b4", "pcie_switch": "#9467bd", "cpu": "#8c564b",
          "nic": "#ff7f0e", "switch": "#7f7f7f", "router": "#7f7f7f"}
MAX_DRAWN_NODES = 32


def _positions(cluster: Cluster) -> dict:
    graph, pos, width = cluster.graph, {}, max(cluster.gpus_per_host, 2) + 1.0
    slots: dict = {}
    for n, d in graph.nodes(data=True):
        if HOST in d:
            k = (d[HOST], d[KIND])
            i = d.get(LOCAL, slots.get(k, 0))
            slots[k] = slots.get(k, 0) + 1
            pos[n] = (d[HOST] * width + i, _ROW[d[KIND]])
    for (host, kind), count in slots.items():  # centre parts that are fewer than GPUs
        if kind != "gpu":
            shift = (cluster.gpus_per_host - count) / 2.0
            for n, d in graph.nodes(data=True):
                if d.get(HOST) == host and d[KIND] == kind:
                    pos[n] = (pos[n][0] + shift, pos[n][1])
    nics = [n for n, d in graph.nodes(data=True) if d[KIND] == "nic"]
    level = nx.multi_source_dijkstra_path_length(graph, nics) if nics else {}
    fabric = [n for n, d in graph.nodes(data=True) if HOST not in d]
    span = cluster.hosts * width
    for lvl in sorted({level.get(n, 1) for n in fabric}):
        row = [n for n in fabric if level.get(n, 1) == lvl]
        for i, n in enumerate(row):
            pos[n] = ((i + 0.5) * span / len(row) - 0.5, 2.4 + 1.6 * lvl)
    return pos


def draw(cluster: Cluster, path: str) -> str:
    """Write a PNG (or any format matplotlib knows by suffix) of ``cluster`` to ``path``."""
    if cluster.hosts > MAX_DRAWN_NODES:
        raise InputError("nodes", cluster.hosts, f"at most {MAX_DRAWN_NODES} to draw readably")
    graph, pos = cluster.graph, _positions(cluster)
    tiers = sorted({d[TIER] for _, _, d in graph.edges(data=True)})
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(max(8, cluster.hosts * 3.2), 6))
    for i, tier in enumerate(tiers):
        edges = [(u, v) for u, v, d in graph.edges(data=True) if d[TIER] == tier]
        nx.draw_networkx_edges(graph, pos, edgelist=edges, edge_color=[cmap(i % 10)], ax=ax,
                               width=1.6, label=tier)
    colors = [_COLOR[d[KIND]] for _, d in graph.nodes(data=True)]
    nx.draw_networkx_nodes(graph, pos, node_color=colors, node_size=140, ax=ax)
    ax.legend(title="tier", loc="upper left", fontsize=8)
    ax.set_title(f"{cluster.name}: {cluster.hosts} nodes x {cluster.gpus_per_host} GPUs "
                 f"({cluster.node_builder} nodes, {cluster.fabric_builder} fabric)")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
