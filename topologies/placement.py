"""Placement of ranks on GPUs: packed (default), spread, or an explicit list."""
from __future__ import annotations

from topologies.cluster import Cluster
from topologies.errors import InputError

PLACEMENTS = ("packed", "spread")


def place(cluster: Cluster, ranks: int, placement="packed") -> tuple[int, ...]:
    """GPU index (host-major) of each rank.

    ``packed`` fills a host before the next (rank r -> GPU r); ``spread`` deals ranks
    round-robin over hosts (rank r -> host r % H, slot r // H); a list gives the GPU
    index of every rank.
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= cluster.gpus:
        raise InputError("ranks", ranks, f"an integer from 1 to {cluster.gpus} (GPUs in the cluster)")
    if not isinstance(placement, str):
        gpus = tuple(int(g) for g in placement)
        if len(gpus) != ranks or len(set(gpus)) != ranks or not all(0 <= g < cluster.gpus for g in gpus):
            raise InputError("placement", list(placement)[:8],
                             f"{ranks} distinct GPU indices in [0, {cluster.gpus - 1}]")
        return gpus
    if placement == "packed":
        return tuple(range(ranks))
    if placement == "spread":
        hosts = min(cluster.hosts, ranks)
        return tuple((r % hosts) * cluster.gpus_per_host + r // hosts for r in range(ranks))
    raise InputError("placement", placement, "packed, spread, or a list of GPU indices")
