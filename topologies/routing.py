"""Routes on the cluster graph and the load they put on links.

Routing is shortest path by hop count with equal-cost multipath (ECMP) split evenly
at every hop, what ECMP hashing does on average. Routes are composed in two levels,
as traffic really flows: inside an NVLink domain (GPU to GPU, or GPU to one of its NICs) on
the domain's own graph, which every domain shares (a domain is one host on most clusters, a
rack of hosts on NVL72: ``Cluster.locate``), and between NICs on the fabric graph. A flow
between domains splits evenly over the (source NIC, destination NIC) pairs of least total
hops; domains never forward other domains' traffic, and parts marked not to forward (a Grace
CPU) are left out of routes.

A traffic *pattern* is a list of flows ``(src, dst, weight)``; a flow of weight w
moves w·V bytes when the pattern moves V. Link load is the sum of weight times the
flow's fraction on the link, per direction. A pattern drains in
``V · max_link(load / bandwidth)``: the fluid bottleneck bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from topologies.attrs import BANDWIDTH, DOMAIN, FORWARDS, HOST, KIND, LATENCY, TIER
from topologies.cluster import Cluster


@dataclass(frozen=True, kw_only=True)
class PatternLoad:
    """Load per directed link key (see ``Router.link_info``) and the worst path latency."""

    load: dict
    latency_s: float


class _Graphlet:
    """A small graph with cached hop distances and per-hop ECMP routes. Directed links are
    numbered in CSR order (``keys``: (u, v) per link id, ``indptr``/``indices`` as CSR)."""

    def __init__(self, graph, names):
        self.names = list(names)
        self.index = {n: i for i, n in enumerate(self.names)}
        rows, cols, lat, self.edge = [], [], [], {}
        adj = graph.adj
        for n in self.names:
            u = self.index[n]
            for v_name, d in adj[n].items():
                v = self.index.get(v_name)
                if v is not None:
                    rows.append(u)
                    cols.append(v)
                    lat.append(d[LATENCY])
                    self.edge[(u, v)] = (d[BANDWIDTH], d[LATENCY], d[TIER])
        size = len(self.names)
        order = np.lexsort((cols, rows))
        self._rows = np.asarray(rows, dtype=np.int64)[order]
        self.indices = np.asarray(cols, dtype=np.int64)[order]
        self._lat = np.asarray(lat, dtype=float)[order]
        self.indptr = np.concatenate(([0], np.cumsum(np.bincount(self._rows, minlength=size))))
        self.keys = list(zip(self._rows.tolist(), self.indices.tolist()))
        self._keys = self._rows * size + self.indices      # sorted: CSR order is (u, v) order
        self._degree = np.diff(self.indptr)
        from scipy.sparse import csr_matrix   # scipy loads when a cluster is routed, not at import

        self._csr = csr_matrix((np.ones(len(order)), self.indices, self.indptr), shape=(size, size))
        self._dist: dict[int, np.ndarray] = {}
        self._routes: dict[tuple[int, int], tuple] = {}

    def prefetch(self, targets) -> None:
        """Hop distances of every node to each of ``targets``, kept as int16 rows (-1 where
        unreachable). Links come in both directions, so a node's row is one more than the
        least of its neighbours' rows: a node whose neighbours all have more links (a leaf
        switch under its spines) takes that from theirs, at (its links x nodes) array work
        instead of a breadth-first search over every link."""
        for t in sorted({int(t) for t in targets if t not in self._dist}):
            self._dist[t] = self._derived(t) if self._derivable(t) else _bfs_depth(self._csr, t)

    def _derivable(self, t: int) -> bool:
        nbr = self.indices[self.indptr[t]:self.indptr[t + 1]]
        return len(nbr) > 0 and len(nbr) * len(self.names) < len(self.indices) \
            and bool((self._degree[nbr] > len(nbr)).all())

    def _derived(self, t: int) -> np.ndarray:
        nbr = self.indices[self.indptr[t]:self.indptr[t + 1]]
        rows = np.stack([self.row(int(v)) for v in nbr])
        least = np.where(rows < 0, _FAR, rows).min(axis=0)
        out = np.where(least == _FAR, -1, least + 1).astype(np.int16)
        out[t] = 0
        return out

    def row(self, dst: int) -> np.ndarray:
        """Hop distance of every node to ``dst`` (-1 where unreachable)."""
        if dst not in self._dist:
            self.prefetch((dst,))
        return self._dist[dst]

    def distance(self, src: int, dst: int) -> int:
        return int(self.row(dst)[src])

    def neighbors(self, u: int) -> list:
        return self.indices[self.indptr[u]:self.indptr[u + 1]].tolist()

    def route(self, src: int, dst: int) -> tuple[tuple, float]:
        """(((u, v, fraction), ...), worst latency) from ``src`` to ``dst``."""
        ids, frac, lat = self.route_ids(src, dst)
        return tuple(zip(self._rows[ids].tolist(), self.indices[ids].tolist(), frac.tolist())), lat

    def route_ids(self, src: int, dst: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(link ids, fraction of the flow on each, worst latency) from ``src`` to ``dst``:
        equal-cost multipath split evenly at every hop, walked one hop level at a time."""
        key = (src, dst)
        if key not in self._routes:
            self._routes[key] = self._walk(src, dst)
        return self._routes[key]

    def _walk(self, src: int, dst: int):
        """Nodes on a shortest path are those with hops from ``src`` plus hops to ``dst`` equal
        to the distance; level k holds those k hops from ``src``, and the links of the walk join
        consecutive levels (found by key in the sorted link list, not by scanning neighbours:
        a spine may have thousands)."""
        to_dst, from_src = self.row(dst), self.row(src)
        hops = int(to_dst[src])
        if hops <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0), 0.0
        on = (to_dst >= 0) & (from_src >= 0) & (to_dst + from_src == hops)
        frontier, share, latency = np.array([src]), np.array([1.0]), np.array([0.0])
        ids, fracs = [], []
        for k in range(1, hops + 1):
            level = np.flatnonzero(on & (from_src == k))
            keys = (frontier[:, None] * len(self.names) + level[None, :]).ravel()
            link = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
            hit = self._keys[link] == keys
            link = link[hit]
            owner = np.repeat(np.arange(len(frontier)), len(level))[hit]
            target = np.tile(np.arange(len(level)), len(frontier))[hit]
            part = share[owner] / np.bincount(owner, minlength=len(frontier))[owner]
            ids.append(link)
            fracs.append(part)
            share = np.bincount(target, weights=part, minlength=len(level))
            reach = np.full(len(level), -np.inf)
            np.maximum.at(reach, target, latency[owner] + self._lat[link])
            frontier, latency = level, reach
        return np.concatenate(ids), np.concatenate(fracs), float(latency.max())


_FAR = np.iinfo(np.int16).max


def _bfs_depth(csr, source: int) -> np.ndarray:
    """Hops from ``source`` to every node (-1 where unreachable), from scipy's C breadth-first
    search: each node's depth follows its predecessor chain, one jump per level for all at once."""
    from scipy.sparse.csgraph import breadth_first_order

    order, pred = breadth_first_order(csr, source, directed=True, return_predecessors=True)
    depth = np.full(csr.shape[0], -1, dtype=np.int16)
    depth[source] = 0
    reached, up = order[1:], pred[order[1:]]
    hops = np.ones(len(reached), dtype=np.int16)
    while (more := up != source).any():
        up[more] = pred[up[more]]
        hops[more] += 1
    depth[reached] = hops
    return depth


def template_parts(cluster: Cluster) -> list[str]:
    """The parts of NVLink domain 0 that routes may cross: the routing template of every domain."""
    return [n for n, d in cluster.graph.nodes(data=True) if cluster.in_template(d) and d.get(FORWARDS, True)]


def fabric_parts(cluster: Cluster) -> list[str]:
    """The fabric's switches (in no host and no domain) and the NICs that plug into them."""
    return [n for n, d in cluster.graph.nodes(data=True)
            if (HOST not in d and DOMAIN not in d) or d[KIND] == "nic"]


class Router:
    """Two-level ECMP router of one cluster (domain template + fabric), caching routes."""

    def __init__(self, cluster: Cluster):
        graph = cluster.graph
        self.cluster = cluster
        self.domain = _Graphlet(graph, template_parts(cluster))
        self.nic_names = [n for n in self.domain.names if graph.nodes[n][KIND] == "nic"]
        self.fabric = _Graphlet(graph, fabric_parts(cluster))
        self.nic_local = [self.domain.index[n] for n in self.nic_names]
        self._pairs: dict = {}
        self._nic_routes: dict = {}
        self._attach_of: dict = {}
        for n in self.fabric.names:
            if graph.nodes[n][KIND] == "nic" and len(self.fabric.neighbors(self.fabric.index[n])) != 1:
                raise ValueError(f"NIC {n!r} must have exactly one fabric port")

    def _local(self, name: str) -> tuple[int, int]:
        domain, template = self.cluster.locate(name)
        return domain, self.domain.index[template]

    def link_info(self, key) -> tuple[float, float, str]:
        """(bandwidth_Bps, latency_s, tier) of a load key: (domain, u, v) or (None, u, v)."""
        domain, u, v = key
        return (self.fabric if domain is None else self.domain).edge[(u, v)]

    def flow(self, src: str, dst: str, weight: float, load: dict) -> float:
        """Add one flow's load to ``load``; return its worst path latency."""
        ds, ls = self._local(src)
        dd, ld = self._local(dst)
        if ds == dd:
            return self._add_domain(ds, ls, ld, weight, load)
        pairs = self._nic_pairs(ds, ls, dd, ld)
        worst = 0.0
        for nic_s, nic_d in pairs:
            part = weight / len(pairs)
            lat = self._add_domain(ds, ls, self.domain.index[nic_s], part, load)
            fs = self.fabric.index[self.cluster.name_in(nic_s, ds)]
            fd = self.fabric.index[self.cluster.name_in(nic_d, dd)]
            links, flat = self._fabric_route(fs, fd)
            for u, v, f in links:
                load[(None, u, v)] = load.get((None, u, v), 0.0) + part * f
            lat += flat + self._add_domain(dd, self.domain.index[nic_d], ld, part, load)
            worst = max(worst, lat)
        return worst

    def _fabric_route(self, src: int, dst: int):
        """NIC-to-NIC route; a NIC with one switch port shares its switch's routes."""
        key = (src, dst)
        if key in self._nic_routes:
            return self._nic_routes[key]
        up, down = self.fabric.neighbors(src)[0], self.fabric.neighbors(dst)[0]
        first, last = self.fabric.edge[(src, up)], self.fabric.edge[(down, dst)]
        links, lat = ((), 0.0) if up == down else self.fabric.route(up, down)
        result = (((src, up, 1.0),) + links + ((down, dst, 1.0),), lat + first[1] + last[1])
        self._nic_routes[key] = result
        return result

    def _add_domain(self, domain: int, src: int, dst: int, weight: float, load: dict) -> float:
        links, lat = self.domain.route(src, dst)
        for u, v, f in links:
            load[(domain, u, v)] = load.get((domain, u, v), 0.0) + weight * f
        return lat

    def _nic_pairs(self, ds, ls, dd, ld) -> list[tuple[str, str]]:
        """NIC pairs (template names) of least total hops; domains on the same switches share the answer."""
        key = (ls, ld, self._attachment(ds), self._attachment(dd))
        if key not in self._pairs:
            self._pairs[key] = self._least_hop_pairs(ls, ld, key[2], key[3])
        return self._pairs[key]

    def _attachment(self, domain: int) -> tuple:
        if domain not in self._attach_of:
            self._attach_of[domain] = tuple(
                self.fabric.neighbors(self.fabric.index[self.cluster.name_in(n, domain)])[0] for n in self.nic_names)
        return self._attach_of[domain]

    def _least_hop_pairs(self, ls, ld, sw_src, sw_dst) -> list[tuple[str, str]]:
        to_nic = [self.domain.distance(ls, n) for n in self.nic_local]
        from_nic = [self.domain.distance(n, ld) for n in self.nic_local]
        self.fabric.prefetch(sw_dst)
        best, pairs = None, []
        for j, b in enumerate(self.nic_names):
            row = self.fabric.row(sw_dst[j])
            for i, a in enumerate(self.nic_names):
                middle = 2 if sw_src[i] == sw_dst[j] else 2 + row[sw_src[i]]
                total = to_nic[i] + middle + from_nic[j]
                if min(to_nic[i], from_nic[j], row[sw_src[i]]) < 0:
                    continue
                if best is None or total < best:
                    best, pairs = total, [(a, b)]
                elif total == best:
                    pairs.append((a, b))
        if not pairs:
            raise ValueError("no route between domains")
        return pairs

    def pattern_load(self, flows) -> PatternLoad:
        """Sum the load of ``flows`` = [(src_gpu, dst_gpu, weight), ...] on every link."""
        load: dict = {}
        worst = 0.0
        for s, d, w in flows:
            if s != d:
                worst = max(worst, self.flow(s, d, w, load))
        return PatternLoad(load=load, latency_s=worst)


@lru_cache(maxsize=32)
def router_for(cluster: Cluster) -> Router:
    """One router per built cluster (clusters are cached, so routers are too)."""
    return Router(cluster)
