"""Mesh: rank <-> (tp, cp, ep, pp, dp) coordinates and the communicator groups of each axis.

Ranks are placed packed (rank r on GPU r, host-major); ``order`` lists axes innermost
first, so with the default ``tp,pp,dp`` a TP group is contiguous GPUs of one node.
Context parallelism (``cp``) and expert parallelism (``ep``) are placed where ``order`` names
them, else as Megatron-Core orders them (``tp-cp-ep-dp-pp``): cp right outside tp, ep right
outside cp, so an expert-parallel group is inside one NVLink domain (a node; a rack of trays on
NVL72) whenever tp x cp x ep GPUs fit in it (its all-to-all then runs on NVLink). ``ep`` is
carved from dp: the dp coordinate is split into ep (inner) and dp / ep expert-data-parallel
replicas. Group kinds: ``tp``, ``cp``, ``pp``,
``ep``; ``dp`` the ranks that hold the same dense weights (dp x cp: context-parallel ranks
reduce their gradients together, as Megatron's dp-cp group), ``edp`` the ranks that hold the
same experts (dp / ep x cp: the expert gradients' reduction). With ep = cp = 1 the mesh is the
three-axis one. Meshes are cached per layout and their group sets hash once (``Groups``), so
thousands of plans in a sweep share them cheaply.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:   # the plans hold the degrees this module lays out; it reads only their fields
    from perfmodel.plan.degrees import Degrees
    from perfmodel.plan.parallel import ParallelPlan

# Group kinds beside each degree's own (which varies that placement dimension alone): ``dp`` the
# ranks that hold the same dense weights (cp x ep x the dp / ep replicas in placement), ``edp``
# those that hold the same experts (cp x the dp / ep replicas)
COMPOSITE_GROUPS = {"dp": ("cp", "ep", "dp"), "edp": ("cp", "dp")}


def group_dims(degrees: Degrees) -> dict:
    """{group kind: the placement dimensions its groups vary}."""
    return {**{name: (name,) for name in degrees.names()}, **COMPOSITE_GROUPS}


def placement_order(degrees: Degrees) -> tuple:
    """Every placement dimension innermost first: ``order``, with each degree it does not name
    right outside the one the degree is placed after (``Degrees.placed_after``: cp after tp,
    ep after cp; module doc)."""
    dims = list(degrees.order)
    for name, after in degrees.placed_after().items():
        if name not in dims:
            dims.insert(dims.index(after) + 1, name)
    return tuple(dims)


class Groups(tuple):
    """A tuple of groups whose hash is computed once (they key many caches)."""

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h


class Mesh:
    """The ranks of a plan's degrees laid out in placement order, and every group kind's groups."""

    def __init__(self, degrees: Degrees):
        self.sizes = degrees.placement()
        self.order = placement_order(degrees)
        ranks = np.arange(degrees.gpus).reshape([self.sizes[a] for a in reversed(self.order)])
        self.groups = {kind: self._groups(ranks, dims) for kind, dims in group_dims(degrees).items()}
        self._pairs: dict = {}

    def _groups(self, ranks: np.ndarray, dims: tuple) -> Groups:
        """Groups varying ``dims`` (each group's ranks ascending)."""
        axes = sorted(len(self.order) - 1 - self.order.index(d) for d in dims)
        rows = np.moveaxis(ranks, axes, range(ranks.ndim - len(axes), ranks.ndim))
        size = int(np.prod([self.sizes[d] for d in dims]))
        return Groups(tuple(row) for row in rows.reshape(-1, size).tolist())

    def rank(self, **coords) -> int:
        r, stride = 0, 1
        for axis in self.order:
            r += coords.get(axis, 0) * stride
            stride *= self.sizes[axis]
        return r

    def coords(self, rank: int) -> dict:
        out = {}
        for axis in self.order:
            out[axis] = rank % self.sizes[axis]
            rank //= self.sizes[axis]
        return out

    def group_of(self, axis: str, rank: int = 0) -> tuple[int, ...]:
        return next(g for g in self.groups[axis] if rank in g)

    def stage_pairs(self, boundary: int) -> Groups:
        """(sender, receiver) ranks across pipeline boundary ``boundary`` -> ``boundary + 1``."""
        if boundary not in self._pairs:
            self._pairs[boundary] = Groups((g[boundary], g[boundary + 1]) for g in self.groups["pp"])
        return self._pairs[boundary]

    def node_groups(self, axis: str, gpus_per_host: int) -> Groups:
        """Each group of ``axis`` split by host (ranks packed: rank r on host r // gpus_per_host):
        the node-local parts, e.g. hpZ's secondary partitions of a dp group. A host, not an NVLink
        domain: DeepSpeed sizes hpZ's partition by ``zero_hpz_partition_size``, which its ZeRO++
        tutorial sets to the GPUs per node (a tray on NVL72, whose gathers still run on NVLink)."""
        key = ("node", axis, gpus_per_host)
        if key not in self._pairs:
            parts = []
            for g in self.groups[axis]:
                by_host: dict = {}
                for r in g:
                    by_host.setdefault(r // gpus_per_host, []).append(r)
                parts += [tuple(v) for v in by_host.values()]
            self._pairs[key] = Groups(parts)
        return self._pairs[key]

    def ring_pairs(self, axis: str) -> Groups:
        """(rank, next rank) of every group of ``axis`` as a ring: cp's K/V blocks pass this way."""
        key = ("ring", axis)
        if key not in self._pairs:
            self._pairs[key] = Groups((g[i], g[(i + 1) % len(g)]) for g in self.groups[axis] for i in range(len(g)))
        return self._pairs[key]

    def first_last_pairs(self) -> Groups:
        """(first stage, last stage) ranks: the tied-embedding all-reduce groups."""
        if "ends" not in self._pairs:
            self._pairs["ends"] = Groups((g[0], g[-1]) for g in self.groups["pp"])
        return self._pairs["ends"]


@lru_cache(maxsize=256)
def mesh_of(degrees: Degrees) -> Mesh:
    """The (cached) mesh of a layout (``Degrees.mesh``)."""
    return Mesh(degrees)


def mesh_for(plan: ParallelPlan) -> Mesh:
    """The (cached) mesh of a plan's layout."""
    return mesh_of(plan.degrees)
