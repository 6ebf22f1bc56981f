"""A picture of a cluster: hosts side by side, their GPUs and switches, the fabric above.

The switch of an NVLink domain that spans hosts (an NVL72 rack's NVLink Switch trays, drawn as
one) sits below the GPUs of its hosts, so a rack reads as its trays side by side over one switch.

Links are coloured by tier, with one colour per tier name on every cluster (``TIER_COLOURS``),
and the legend gives each tier's bandwidth per direction; a second legend names the node kinds.
Levels of fabric switches come from their hop distance to the nearest NIC, so any builder draws
without special cases; within a level switches sit over the mean position of what they connect
below (a rail's leaf over its rail's NICs), which keeps a rail-optimized fabric readable.
"""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from topologies.attrs import DOMAIN, HOST, KIND, LOCAL, TIER  # noqa: E402
from topologies.clikit import atomic_write  # noqa: E402
from topologies.cluster import Cluster  # noqa: E402
from topologies.errors import InputError  # noqa: E402

_ROW = {"gpu": 0.0, "nvswitch": 1.0, "pcie_switch": 1.0, "cpu": 1.6, "nic": 2.4}
_COLOR = {"gpu": "#76b900", "nvswitch": "#1f77b4", "pcie_switch": "#9467bd", "cpu": "#8c564b",
          "nic": "#ff7f0e", "switch": "#7f7f7f", "router": "#7f7f7f"}
MAX_DRAWN_NODES = 32
# Fixed per tier name across clusters (inside a node warm, fabric tiers cool); others get grey.
TIER_COLOURS = {"nvlink": "#2ca02c", "xgmi": "#17becf", "xbus": "#bcbd22", "pcie": "#9467bd", "c2c": "#393b79",
                "ib-leaf": "#1f77b4", "ib-spine": "#d62728", "ib-core": "#8c564b", "eth-leaf": "#ff7f0e",
                "eth-spine": "#e377c2", "ss-edge": "#7f7f7f"}


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
    per_domain = cluster.hosts_per_domain
    for n, d in graph.nodes(data=True):   # a domain's switch under the middle of its hosts
        if DOMAIN in d and HOST not in d:
            first = d[DOMAIN] * per_domain
            pos[n] = ((first + per_domain / 2.0) * width - width / 2.0 + (cluster.gpus_per_host - 1) / 2.0, -1.0)
    nics = [n for n, d in graph.nodes(data=True) if d[KIND] == "nic"]
    level = nx.multi_source_dijkstra_path_length(graph, nics) if nics else {}
    fabric = [n for n, d in graph.nodes(data=True) if HOST not in d and DOMAIN not in d]
    span = cluster.hosts * width
    for lvl in sorted({level.get(n, 1) for n in fabric}):
        row = [n for n in fabric if level.get(n, 1) == lvl]
        row.sort(key=lambda n: _below(graph, pos, n))
        for i, n in enumerate(row):
            pos[n] = ((i + 0.5) * span / len(row) - 0.5, 2.4 + 1.6 * lvl)
    return pos


def _below(graph, pos: dict, node) -> float:
    """Mean x of the already placed neighbours (the level below): where a switch belongs."""
    xs = [pos[v][0] for v in graph.adj[node] if v in pos]
    return sum(xs) / len(xs) if xs else 0.0


def draw(cluster: Cluster, path: str) -> str:
    """Write a PNG (or any format matplotlib knows by suffix) of ``cluster`` to ``path``."""
    if cluster.hosts > MAX_DRAWN_NODES:
        raise InputError("nodes", cluster.hosts, f"at most {MAX_DRAWN_NODES} to draw readably")
    graph, pos = cluster.graph, _positions(cluster)
    fig, ax = plt.subplots(figsize=(max(8, cluster.hosts * 3.2), 7))
    for tier, facts in sorted(cluster.tiers.items()):
        edges = [(u, v) for u, v, d in graph.edges(data=True) if d[TIER] == tier]
        low, high = facts["min_bandwidth_Bps"] / 1e9, facts["max_bandwidth_Bps"] / 1e9
        rate = f"{low:g} GB/s" if low == high else f"{low:g}-{high:g} GB/s"
        nx.draw_networkx_edges(graph, pos, edgelist=edges, edge_color=[TIER_COLOURS.get(tier, "#aaaaaa")], ax=ax,
                               width=1.6, label=f"{tier} ({rate} per direction)")
    colors = [_COLOR[d[KIND]] for _, d in graph.nodes(data=True)]
    nx.draw_networkx_nodes(graph, pos, node_color=colors, node_size=140, ax=ax)
    tiers = ax.legend(title="link tier", loc="upper left", bbox_to_anchor=(0.0, 0.0), fontsize=8, ncol=2)
    ax.add_artist(tiers)
    kinds = sorted({d[KIND] for _, d in graph.nodes(data=True)}, key=list(_COLOR).index)
    ax.legend(handles=[Line2D([], [], marker="o", linestyle="", color=_COLOR[k], label=k.replace("_", " "))
                       for k in kinds], title="node", loc="upper right", bbox_to_anchor=(1.0, 0.0), fontsize=8,
              ncol=len(kinds))
    domains = (f", NVLink domains of {cluster.hosts_per_domain} nodes ({cluster.gpus_per_domain} GPUs)"
               if cluster.hosts_per_domain > 1 else "")
    ax.set_title(f"{cluster.name}: {cluster.hosts} nodes x {cluster.gpus_per_host} GPUs "
                 f"({cluster.node_builder} nodes, {cluster.fabric_builder} fabric{domains})")
    ax.axis("off")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.rsplit(".", 1)[-1].lower() if "." in path else "png", dpi=110)
    plt.close(fig)
    return atomic_write(path, lambda h: h.write(buffer.getvalue()))
