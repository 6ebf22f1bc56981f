"""Mesh: rank <-> (dp, tp, pp) coordinates and the communicator groups of each axis.

Ranks are placed packed (rank r on GPU r, host-major); ``order`` lists axes innermost
first, so with the default ``tp,pp,dp`` a TP group is contiguous GPUs of one node.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from perfmodel.plan import ParallelPlan


@dataclass(frozen=True)
class Mesh:
    plan: ParallelPlan

    def _sizes(self) -> list[tuple[str, int]]:
        return [(a, getattr(self.plan, a)) for a in self.plan.order]

    def rank(self, **coords) -> int:
        r, stride = 0, 1
        for axis, size in self._sizes():
            r += coords[axis] * stride
            stride *= size
        return r

    def coords(self, rank: int) -> dict:
        out = {}
        for axis, size in self._sizes():
            out[axis] = rank % size
            rank //= size
        return out

    @cached_property
    def groups(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Every group of every axis, each sorted by its coordinate on that axis."""
        out = {}
        for axis in ("tp", "pp", "dp"):
            buckets: dict[tuple, list[int]] = {}
            for r in range(self.plan.gpus):
                c = self.coords(r)
                key = tuple(v for k, v in sorted(c.items()) if k != axis)
                buckets.setdefault(key, []).append(r)
            out[axis] = tuple(tuple(sorted(g, key=lambda r, a=axis: self.coords(r)[a]))
                              for g in buckets.values())
        return out

    def group_of(self, axis: str, rank: int = 0) -> tuple[int, ...]:
        return next(g for g in self.groups[axis] if rank in g)

    def stage_pairs(self, boundary: int) -> tuple[tuple[int, int], ...]:
        """(sender, receiver) ranks across pipeline boundary ``boundary`` -> ``boundary + 1``."""
        return tuple((g[boundary], g[boundary + 1]) for g in self.groups["pp"])

    def first_last_pairs(self) -> tuple[tuple[int, int], ...]:
        """(first stage, last stage) ranks: the tied-embedding all-reduce groups."""
        return tuple((g[0], g[-1]) for g in self.groups["pp"])
