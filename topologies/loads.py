"""Link loads of a whole traffic pattern at once, using that every NVLink domain (host) is the same.

``routing.Router`` routes a pattern flow by flow and keeps one load entry per link; on 131,072
GPUs that is a million flows and millions of entries. This module gives the same numbers
(tested against it wherever both run) from the symmetry of the cluster:

* **Domains alike.** Every NVLink domain (a host on most clusters, a rack of hosts on NVL72)
  has domain 0's graph, so the load a flow puts inside a domain is a row of one small route
  table (GPU or NIC to GPU or NIC, per template link). Flows are summed per (domain, source
  endpoint, destination endpoint) with ``numpy.bincount`` and the per-domain link loads are one
  matrix product: (domains x endpoint pairs) @ (pairs x links).
* **Domains on the same switches alike.** Which NIC pairs a flow between domains uses depends
  on the two GPUs' local indices and on which switches the two domains' NICs plug into (their
  *attachment*), so it is decided once per distinct (local pair, attachment pair), not per flow.
* **Switch routes shared.** The fabric part of a flow is its NIC's uplink, a switch-to-switch
  ECMP route and the receiving NIC's downlink; routes are computed once per distinct switch
  pair on the switch graph (NICs are leaves and never forward), their load added per pair.

The result is per tier what ``fabricview`` needs: the largest load / bandwidth, the largest
link latency and load among loaded links, and the summed load.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from topologies.attrs import BANDWIDTH, KIND, LATENCY, TIER
from topologies.cluster import Cluster
from topologies.routing import _Graphlet, fabric_parts, template_parts


@dataclass(frozen=True)
class TierLoad:
    """Per tier over its loaded links: max load/bandwidth, max latency, max load, summed load."""

    tier: str
    ratio: float
    latency_s: float
    max_load: float
    sum_load: float


@dataclass(frozen=True)
class PatternStats:
    tiers: tuple          # TierLoad, in first-seen order
    latency_s: float      # worst path latency of one flow


class _Links:
    """Directed links of one graphlet as arrays: bandwidth, latency, tier id."""

    def __init__(self, graphlet: _Graphlet, tier_ids: dict):
        keys = graphlet.keys               # link id = the graphlet's CSR position
        self.count = len(keys)
        self.bw = np.array([graphlet.edge[k][0] for k in keys], dtype=float)
        self.lat = np.array([graphlet.edge[k][1] for k in keys], dtype=float)
        self.tier = np.array([tier_ids.setdefault(graphlet.edge[k][2], len(tier_ids)) for k in keys],
                             dtype=np.int64)


class HostSymmetricLoads:
    """Pattern loads of one cluster from its domain template, NIC attachments and switch graph.
    ``hosts`` and ``gph`` count the units that are alike: NVLink domains and GPUs per domain
    (hosts and GPUs per host wherever a domain is one host)."""

    def __init__(self, cluster: Cluster):
        graph, self.gph, self.hosts = cluster.graph, cluster.gpus_per_domain, cluster.domains
        self.cluster = cluster
        self.tier_ids: dict = {}
        switches = [n for n in fabric_parts(cluster) if graph.nodes[n][KIND] != "nic"]
        self.host, self.switch = _Graphlet(graph, template_parts(cluster)), _Graphlet(graph, switches)
        self.hlinks = _Links(self.host, self.tier_ids)
        self.slinks = _Links(self.switch, self.tier_ids)
        self.gpu_loc = [self.host.index[cluster.gpu(g)] for g in range(self.gph)]
        self.nic_names = [n for n in self.host.names if graph.nodes[n][KIND] == "nic"]
        self.nic_loc = [self.host.index[n] for n in self.nic_names]
        self._routes_in_host()
        if self.hosts > 1 or self.nic_names:
            self._nics(graph)
        self._pairs: dict = {}
        self._hops: dict = {}
        self.to_nic = [np.array([self.host.distance(g, n) for n in self.nic_loc]) for g in self.gpu_loc]
        self.from_nic = [np.array([self.host.distance(n, g) for n in self.nic_loc]) for g in self.gpu_loc]

    @property
    def tier_names(self) -> dict:
        """Tier id -> name (ids are handed out as links are read)."""
        return {v: k for k, v in self.tier_ids.items()}

    # --- inside a domain -----------------------------------------------------------------
    def _routes_in_host(self) -> None:
        ends = self.gpu_loc + self.nic_loc
        size, links = len(ends), self.hlinks.count
        self.route = np.zeros((size, size, links))
        self.route_lat = np.zeros((size, size))
        for a, u in enumerate(ends):
            for b, v in enumerate(ends):
                if u == v:
                    continue
                ids, frac, self.route_lat[a, b] = self.host.route_ids(u, v)
                np.add.at(self.route[a, b], ids, frac)

    # --- NICs and their switches ---------------------------------------------------------
    def _nics(self, graph) -> None:
        """Each NIC's switch and its port: the graph is undirected, so one bandwidth, latency
        and tier serve the uplink and the downlink (their loads are kept apart)."""
        hosts, nics = self.hosts, len(self.nic_names)
        self.attach = np.zeros((hosts, nics), dtype=np.int64)
        bw, lat = np.zeros((hosts, nics)), np.zeros((hosts, nics))
        tiers = []
        adj, switch = graph.adj, self.switch.index
        for h in range(hosts):
            for i, s in enumerate(self.nic_names):
                ((sw, link),) = [(v, d) for v, d in adj[self.cluster.name_in(s, h)].items() if v in switch]
                self.attach[h, i], bw[h, i], lat[h, i] = switch[sw], link[BANDWIDTH], link[LATENCY]
                if h == 0:
                    tiers.append(self.tier_ids.setdefault(link[TIER], len(self.tier_ids)))
        self.port = (bw, lat, np.array(tiers))
        self.class_switches, inverse = np.unique(self.attach, axis=0, return_inverse=True)
        self.attach_class = inverse.reshape(-1)
        self.class_port_lat = np.zeros((len(self.class_switches), nics))
        np.maximum.at(self.class_port_lat, self.attach_class, lat)

    def _nic_pairs(self, ls: int, ld: int, cs: int, cd: int) -> tuple:
        """(i, j) NIC index pairs of least total hops from local GPU ls to ld between hosts of
        attachment classes cs and cd (``Router._least_hop_pairs`` on indices, same order)."""
        key = (ls, ld, cs, cd)
        if key not in self._pairs:
            hops = self._class_hops(cs, cd)
            total = self.to_nic[ls][:, None] + 2 + hops + self.from_nic[ld][None, :]
            total[(hops < 0) | (self.to_nic[ls] < 0)[:, None] | (self.from_nic[ld] < 0)[None, :]] = -1
            if (total < 0).all():
                raise ValueError("no route between hosts")
            best = total[total >= 0].min()
            self._pairs[key] = tuple((int(i), int(j)) for j, i in np.argwhere(best == total.T))
        return self._pairs[key]

    def _class_hops(self, cs: int, cd: int) -> np.ndarray:
        """Switch hops from each NIC switch of class cs to each of class cd (n x n)."""
        key = (cs, cd)
        if key not in self._hops:
            sw_s, sw_d = self.class_switches[cs], self.class_switches[cd]
            self._hops[key] = np.stack([self.switch.row(int(d))[sw_s] for d in sw_d], axis=1)
        return self._hops[key]

    # --- a pattern -----------------------------------------------------------------------
    def stats(self, src, dst, weight) -> PatternStats:
        """Loads of the flows (GPU index arrays ``src``, ``dst``; ``weight``), summed per tier."""
        src, dst, weight = (np.asarray(a) for a in (src, dst, weight))
        keep = src != dst
        src, dst, weight = src[keep], dst[keep], weight[keep].astype(float)
        hs, ls = np.divmod(src, self.gph)
        hd, ld = np.divmod(dst, self.gph)
        host_load = np.zeros((self.hosts, self.hlinks.count))
        same = hs == hd
        worst = self._same_host(hs[same], ls[same], ld[same], weight[same], host_load)
        rows = [(host_load, self.hlinks.bw, self.hlinks.lat, self.hlinks.tier)]
        if not same.all():
            far = ~same
            worst = max(worst, self._between_hosts(hs[far], ls[far], hd[far], ld[far], weight[far],
                                                   host_load, rows))
        first = self._first_path_tiers(hs[0], ls[0], hd[0], ld[0]) if len(src) else []
        return PatternStats(tiers=self._per_tier(rows, first), latency_s=worst)

    def _first_path_tiers(self, hs, ls, hd, ld) -> list:
        """Tiers in the order the pattern's first flow meets them: the order ties between
        equally busy tiers are reported in (as ``Router``, which meets links flow by flow)."""
        names = self.tier_names
        if hs == hd:
            path = self.host.route(self.gpu_loc[ls], self.gpu_loc[ld])[0]
            return [self.host.edge[(u, v)][2] for u, v, _ in path]
        i, j = self._nic_pairs(int(ls), int(ld), int(self.attach_class[hs]), int(self.attach_class[hd]))[0]
        up, down = self.class_switches[self.attach_class[hs], i], self.class_switches[self.attach_class[hd], j]
        out = [self.host.edge[(u, v)][2] for u, v, _ in self.host.route(self.gpu_loc[ls], self.nic_loc[i])[0]]
        out.append(names[int(self.port[2][i])])
        if up != down:
            out += [self.switch.edge[(u, v)][2] for u, v, _ in self.switch.route(int(up), int(down))[0]]
        out.append(names[int(self.port[2][j])])
        return out + [self.host.edge[(u, v)][2] for u, v, _ in self.host.route(self.nic_loc[j], self.gpu_loc[ld])[0]]

    def _same_host(self, h, ls, ld, w, host_load) -> float:
        if not len(h):
            return 0.0
        g = self.gph
        per = np.bincount((h * g + ls) * g + ld, weights=w, minlength=self.hosts * g * g)
        table = self.route[:g, :g].reshape(g * g, -1)
        host_load += per.reshape(self.hosts, g * g) @ table
        pairs = np.unique(ls * g + ld)
        return float(self.route_lat[pairs // g, pairs % g].max())

    def _between_hosts(self, hs, ls, hd, ld, w, host_load, rows) -> float:
        g, n, classes = self.gph, len(self.nic_loc), len(self.class_switches)
        cs, cd = self.attach_class[hs], self.attach_class[hd]
        self.switch.prefetch(self.class_switches[np.unique(cd)].ravel().tolist())
        keys, inverse = np.unique(((ls * g + ld) * classes + cs) * classes + cd, return_inverse=True)
        inverse = inverse.reshape(-1)
        table = [self._nic_pairs(int(k // classes // classes // g), int(k // classes // classes % g),
                                 int(k // classes % classes), int(k % classes)) for k in keys]
        count = np.array([len(p) for p in table])
        start = np.concatenate(([0], np.cumsum(count)[:-1]))
        pair_i = np.array([i for p in table for i, _ in p], dtype=np.int64)
        pair_j = np.array([j for p in table for _, j in p], dtype=np.int64)
        rep = count[inverse]
        flow = np.repeat(np.arange(len(w)), rep)
        row = np.repeat(start[inverse], rep) + (np.arange(rep.sum()) - np.repeat(np.cumsum(rep) - rep, rep))
        i, j, part = pair_i[row], pair_j[row], w[flow] / rep[flow]
        fs, fd = hs[flow], hd[flow]
        to_nic = np.bincount((fs * g + ls[flow]) * n + i, weights=part, minlength=self.hosts * g * n)
        from_nic = np.bincount((fd * n + j) * g + ld[flow], weights=part, minlength=self.hosts * n * g)
        host_load += to_nic.reshape(self.hosts, g * n) @ self.route[:g, g:].reshape(g * n, -1)
        host_load += from_nic.reshape(self.hosts, n * g) @ self.route[g:, :g].reshape(n * g, -1)
        up_load = to_nic.reshape(self.hosts, g, n).sum(axis=1)
        down_load = from_nic.reshape(self.hosts, n, g).sum(axis=2)
        port = (self.port[0], self.port[1], np.broadcast_to(self.port[2], up_load.shape))
        rows.append((up_load, *port))
        worst = self._through_switches(cs[flow], i, cd[flow], j, part, ls[flow], ld[flow], rows)
        rows.append((down_load, *port))
        return worst

    def _through_switches(self, cs, i, cd, j, part, ls, ld, rows) -> float:
        """Switch-to-switch loads per distinct (up switch, down switch); worst flow latency."""
        g = self.gph
        up = self.class_switches[cs, i]
        down = self.class_switches[cd, j]
        size = len(self.switch.names)
        pair_keys, inverse = np.unique(up * size + down, return_inverse=True)
        weight = np.bincount(inverse.reshape(-1), weights=part)
        self.switch.prefetch(np.unique(pair_keys % size).tolist())
        load = np.zeros(self.slinks.count)
        middle_lat = np.zeros(len(pair_keys))
        for k, (key, wt) in enumerate(zip(pair_keys.tolist(), weight.tolist())):
            u, v = divmod(key, size)
            if u != v:
                ids, frac, middle_lat[k] = self.switch.route_ids(u, v)
                load[ids] += wt * frac
        rows.append((load, self.slinks.bw, self.slinks.lat, self.slinks.tier))
        lat = (self.route_lat[ls, g + i] + self.class_port_lat[cs, i] + middle_lat[inverse.reshape(-1)]
               + self.class_port_lat[cd, j] + self.route_lat[g + j, ld])
        return float(lat.max())

    def _per_tier(self, rows, first: list) -> tuple:
        names = self.tier_names
        out: dict = {t: None for t in first}
        for load, bw, lat, tier in rows:
            load = np.asarray(load)
            bw, lat, tier = (np.broadcast_to(a, load.shape) for a in (bw, lat, tier))
            hit = load > 0
            for t in np.unique(tier[hit]).tolist():
                m = hit & (tier == t)
                entry = out[names[t]] = out.get(names[t]) or [0.0, 0.0, 0.0, 0.0]
                entry[0] = max(entry[0], float((load[m] / bw[m]).max()))
                entry[1] = max(entry[1], float(lat[m].max()))
                entry[2] = max(entry[2], float(load[m].max()))
                entry[3] += float(load[m].sum())
        return tuple(TierLoad(t, *v) for t, v in out.items() if v is not None)


@lru_cache(maxsize=32)
def loads_for(cluster: Cluster) -> HostSymmetricLoads:
    """One load model per built cluster (clusters are cached, so these are too)."""
    return HostSymmetricLoads(cluster)
