"""All-to-all from its traffic matrix on the fabric (the MoE dispatch and combine).

An all-to-all loads links unlike a ring: every rank sends S / p bytes to every other rank at
once, so the busiest link is where the matrix piles up, not where a ring's neighbours meet.
The links here come from routing the whole matrix of the group, and of every group that runs
beside it, on the cluster (``topologies.loads``: the same host-symmetric link loads the fabric
view uses for its rings): a phase's bandwidth is what its ranks send divided by the busiest
link's load over that link's bandwidth, so cross-node bytes are bounded by the NICs (and any
oversubscribed tier the matrix crosses), in-node bytes by NVLink.

Two algorithms (``perfmodel.collectives.plain``, registered in ``registry``):

* ``direct`` (pairwise, NCCL's): every pair at once; in-node pairs over NVLink and cross-node
  pairs over the network run side by side, p - r network steps.
* ``hierarchical`` (DeepEP's, DeepSeek-AI 2024 section 3.2.2): each rank sends what it has for a
  node in one RDMA message to the rank of the same local index there (the same rail), which
  forwards it over NVLink to its final GPU while further RDMA arrives (the two overlapped):
  N - 1 network steps, r N / p of S forwarded to each in-node peer. Same cross-node bytes as
  pairwise, far fewer messages, rails kept (no cross-rail traffic through the spine).

Token deduplication (a token bound for several experts of one node crosses the network once)
is not modelled: each routed copy is counted, so the hierarchical algorithm's advantage is
the conservative one.

Uneven splits (dropless routing with imbalance, ``perfmodel.plan.routing``): where rank j takes a
share F_j of every rank's data, the all-to-all is as long as its busiest sender's or receiver's
links take, not the mean's (``uneven_factor``): the busiest receiver takes p max F times a
balanced rank's bytes from its peers, and a rank whose own share is smallest sends the most. The
factor prices the whole exchange at the busiest rank's bytes, so for the hierarchical algorithm,
whose RDMA phase a node's summed share sets (at most the busiest rank's), it is the conservative one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topologies.fabricview import by_host
from topologies.loads import loads_for


@dataclass(frozen=True, eq=False)
class AllToAllLinks:
    """The links of the two algorithms' phases (``fabric.Link``; None where a phase is empty),
    each with the bandwidth one rank gets for the bytes that phase sends."""

    pairwise_intra: object
    pairwise_inter: object
    rail: object


def pair_flows(groups, gpus_per_host: int, same_host: bool):
    """(src, dst, weight 1) of every ordered pair of each group, on one host or across hosts."""
    src, dst = [], []
    for g in groups:
        ranks = np.asarray(g, dtype=np.int64)
        s, d = np.meshgrid(ranks, ranks, indexing="ij")
        keep = (s // gpus_per_host == d // gpus_per_host) if same_host else (s // gpus_per_host != d // gpus_per_host)
        keep &= s != d
        src.append(s[keep])
        dst.append(d[keep])
    return np.concatenate(src), np.concatenate(dst)


def rail_flows(groups, gpus_per_host: int):
    """(src, dst) of DeepEP's RDMA phase: local index j of each node to local index j of every other."""
    src, dst = [], []
    for g in groups:
        hosts = by_host(g, gpus_per_host)
        width = min(len(h) for h in hosts)
        cols = np.array([h[:width] for h in hosts], dtype=np.int64)     # (nodes, width)
        for a in range(len(hosts)):
            for b in range(len(hosts)):
                if a != b:
                    src.append(cols[a])
                    dst.append(cols[b])
    if not src:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(src), np.concatenate(dst)


def phase_link(cluster, src, dst, units: float, make_link):
    """The Link of a phase whose flows (weight 1 each) carry ``units`` per sending rank: its
    bandwidth so that ``units`` take the busiest link's load over its bandwidth; None if empty."""
    if not len(src):
        return None
    stats = loads_for(cluster).stats(src, dst, np.ones(len(src)))
    busiest = max(stats.tiers, key=lambda t: t.ratio)
    sent = float(len(src))
    traversals = tuple((t.tier, t.sum_load / sent) for t in sorted(stats.tiers, key=lambda t: t.tier))
    return make_link(busiest.tier, units / busiest.ratio, stats.latency_s, traversals)


def alltoall_links(cluster, group: tuple, concurrent: tuple, make_link) -> AllToAllLinks:
    """The links of ``group``'s all-to-all while ``concurrent`` groups run theirs (module doc);
    ``make_link(tier, bandwidth_Bps, latency_s, traversals)`` gives a tier its protocols. A "node"
    here is an NVLink domain (``Cluster.gpus_per_domain``): on NVL72 a rack's pairs are NVLink pairs."""
    gph = cluster.gpus_per_domain
    groups = (group,) + tuple(g for g in concurrent if tuple(g) != tuple(group))
    hosts = by_host(group, gph)
    nodes, width = len(hosts), max(len(h) for h in hosts)
    p = len(group)
    intra = phase_link(cluster, *pair_flows(groups, gph, True), width - 1, make_link)
    inter = phase_link(cluster, *pair_flows(groups, gph, False), p - width, make_link) if nodes > 1 else None
    rail = phase_link(cluster, *rail_flows(groups, gph), (nodes - 1), make_link) if nodes > 1 else None
    return AllToAllLinks(pairwise_intra=intra, pairwise_inter=inter, rail=rail)


def uneven_factor(shares) -> float:
    """The bytes per rank that price an all-to-all whose rank j takes the share ``shares[j]`` (fractions
    adding up to 1) of every rank's data, over a balanced one's: the larger of what the busiest
    receiver takes from its peers, ``p max F`` times a balanced rank's, and what the rank of the
    smallest share sends to its peers, ``(1 - min F) p / (p - 1)`` times (links are full duplex: a
    rank's sends and receives do not add). 1 when the shares are equal; the combine, the same
    exchange reversed, takes the same factor."""
    p = len(shares)
    if p <= 1:
        return 1.0
    return max(1.0, p * max(shares), (1.0 - min(shares)) * p / (p - 1))
