"""Mesh: rank <-> (dp, tp, pp) coordinates and the communicator groups of each axis.

Ranks are placed packed (rank r on GPU r, host-major); ``order`` lists axes innermost
first, so with the default ``tp,pp,dp`` a TP group is contiguous GPUs of one node.
Meshes are cached per layout and their group sets hash once (``Groups``), so thousands of
plans in a sweep share them cheaply.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from perfmodel.plan import MESH_AXES, ParallelPlan


class Groups(tuple):
    """A tuple of groups whose hash is computed once (they key many caches)."""

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h


class Mesh:
    def __init__(self, tp: int, pp: int, dp: int, order: tuple):
        self.sizes = {"tp": tp, "pp": pp, "dp": dp}
        self.order = tuple(order)
        ranks = np.arange(tp * pp * dp).reshape([self.sizes[a] for a in reversed(self.order)])
        self.groups = {}
        for axis in MESH_AXES:
            dim = len(self.order) - 1 - self.order.index(axis)
            rows = np.moveaxis(ranks, dim, -1).reshape(-1, self.sizes[axis])
            self.groups[axis] = Groups(tuple(int(r) for r in row) for row in rows)
        self._pairs: dict = {}

    def rank(self, **coords) -> int:
        r, stride = 0, 1
        for axis in self.order:
            r += coords[axis] * stride
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
        the node-local parts, e.g. hpZ's secondary partitions of a dp group."""
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

    def first_last_pairs(self) -> Groups:
        """(first stage, last stage) ranks: the tied-embedding all-reduce groups."""
        if "ends" not in self._pairs:
            self._pairs["ends"] = Groups((g[0], g[-1]) for g in self.groups["pp"])
        return self._pairs["ends"]


@lru_cache(maxsize=256)
def _mesh(tp: int, pp: int, dp: int, order: tuple) -> Mesh:
    return Mesh(tp, pp, dp, order)


def mesh_for(plan: ParallelPlan) -> Mesh:
    """The (cached) mesh of a plan's layout."""
    return _mesh(plan.tp, plan.pp, plan.dp, tuple(plan.order))
