"""Mesh: rank <-> coordinates and the communicator groups of each axis, for the attention (dense)
layers and the expert layers of a plan.

Ranks are placed packed (rank r on GPU r, host-major); ``order`` lists the placement dimensions
innermost first, so with the default ``tp,pp,dp`` a TP group is contiguous GPUs of one node.
Context parallelism (``cp``) is placed where ``order`` names it, else right outside tp, as
Megatron-Core orders it (``tp-cp-ep-dp-pp``). The dense layers' groups: ``tp``, ``cp``, ``pp``,
and ``dp`` the ranks that hold the same dense weights (dp x cp: context-parallel ranks reduce
their gradients together, as Megatron's dp-cp group).

The expert layers (Megatron-Core's MoE parallel folding, Liu et al. 2025, arXiv 2504.14960) lay
``etp x ep x edp`` over the same tp x cp x dp ranks of each pipeline stage, independently of the
dense layout: the stage's ranks are taken in rank order and cut innermost first into etp, then
ep, then edp, as Megatron-LM's expert ``RankGenerator`` (tp=etp, ep, dp=edp, cp=1, the same order
string and pipeline groups as the decoder's; ``megatron/core/parallel_state.py``,
``initialize_model_parallel``) numbers them, so an ep group folds over cp and dp ranks (and tp
ranks where etp < tp). Where ``order`` names ep after dp, ep is cut outside edp instead (Megatron's
order string ``tp-cp-dp-ep-pp``: expert groups across nodes). Group kinds ``etp`` (the expert
GEMMs' tensor parallelism), ``ep`` (the dispatch and combine all-to-alls) and ``edp`` (the ranks
that hold the same experts: the expert gradients' reduction and their ZeRO sharding).

With pp > 1 and the project's default order (pp inside dp), a block of dp is placed inside pp
where ``order`` puts ep (right outside cp by default): the fewest dp ranks that, with tp x cp,
hold whole etp x ep groups (``Degrees.placement``), so an ep group stays inside one NVLink domain
(a node; a rack of trays on NVL72) whenever lcm(tp x cp, etp x ep) GPUs fit in it. With ep = 1 and
etp = tp the expert groups are the dense ones (edp = dp x cp) and the mesh is the three-axis one.
Meshes are cached per layout and their group sets hash once (``Groups``), so thousands of plans in
a sweep share them cheaply.
"""
from __future__ import annotations

from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:   # the plans hold the degrees this module lays out; it reads only their fields
    from perfmodel.plan.degrees import Degrees
    from perfmodel.plan.parallel import ParallelPlan

# The dense layers' group kinds beside each placement dimension's own: ``dp`` the ranks that hold
# the same dense weights (cp x the dp ranks, both of its placement parts: the block ``ep`` and the rest)
COMPOSITE_GROUPS = {"dp": ("cp", "ep", "dp")}
DENSE_GROUPS = ("tp", "cp", "pp", "dp")
EXPERT_GROUPS = ("etp", "ep", "edp")     # the expert layers' (module doc), each varying its own dimension
GROUP_KINDS = DENSE_GROUPS + EXPERT_GROUPS


def group_dims(degrees: Degrees) -> dict:
    """{dense group kind: the placement dimensions its groups vary}."""
    return {**{name: (name,) for name in DENSE_GROUPS}, **COMPOSITE_GROUPS}


def placement_order(degrees: Degrees) -> tuple:
    """Every placement dimension innermost first: ``order``, with each degree it does not name
    right outside the one the degree is placed after (``Degrees.placed_after``: cp after tp,
    the dp block ``ep`` after cp; module doc)."""
    dims = list(degrees.order)
    for name, after in degrees.placed_after().items():
        if name not in dims:
            dims.insert(dims.index(after) + 1, name)
    return tuple(dims)


def expert_order(degrees: Degrees) -> tuple:
    """The expert dimensions innermost first: etp, ep, edp; etp, edp, ep where ``order`` names ep
    after dp (module doc)."""
    order = degrees.order
    outside = "ep" in order and order.index("ep") > order.index("dp")
    return ("etp", "edp", "ep") if outside else ("etp", "ep", "edp")


class Groups(tuple):
    """A tuple of groups whose hash is computed once (they key many caches)."""

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h


class Mesh:
    """The ranks of a plan's degrees laid out in placement order, every group kind's groups."""

    def __init__(self, degrees: Degrees):
        self.sizes = degrees.placement()
        self.order = placement_order(degrees)
        ranks = np.arange(degrees.gpus).reshape([self.sizes[a] for a in reversed(self.order)])
        self.groups = {kind: self._groups(ranks, dims) for kind, dims in group_dims(degrees).items()}
        self.expert_sizes = {"etp": degrees.etp, "ep": degrees.ep, "edp": degrees.edp}
        self.expert_dims = expert_order(degrees)
        self._experts = self._expert_grid(ranks)
        self.groups.update({kind: self._expert_groups(kind) for kind in EXPERT_GROUPS})
        self._pairs: dict = {}

    def _groups(self, ranks: np.ndarray, dims: tuple) -> Groups:
        """Groups varying ``dims`` (each group's ranks ascending)."""
        axes = sorted(len(self.order) - 1 - self.order.index(d) for d in dims)
        rows = np.moveaxis(ranks, axes, range(ranks.ndim - len(axes), ranks.ndim))
        size = int(np.prod([self.sizes[d] for d in dims]))
        return Groups(tuple(row) for row in rows.reshape(-1, size).tolist())

    def _expert_grid(self, ranks: np.ndarray) -> np.ndarray:
        """The ranks as the expert layers see them: [stage, *expert dimensions outermost first],
        each stage's ranks in rank order cut into ``expert_dims`` (module doc)."""
        pp_axis = len(self.order) - 1 - self.order.index("pp")
        stages = np.moveaxis(ranks, pp_axis, 0).reshape(self.sizes["pp"], -1)
        return stages.reshape([self.sizes["pp"], *(self.expert_sizes[d] for d in reversed(self.expert_dims))])

    def _expert_groups(self, kind: str) -> Groups:
        """The groups of an expert dimension, ordered by their first rank as the dense ones are."""
        axis = len(self.expert_dims) - self.expert_dims.index(kind)   # its axis in the grid (stage first)
        rows = np.moveaxis(self._experts, axis, -1).reshape(-1, self.expert_sizes[kind]).tolist()
        return Groups(sorted((tuple(row) for row in rows), key=lambda g: g[0]))

    @cached_property
    def _expert_coords(self) -> dict:
        """{expert dimension: each rank's coordinate along it}."""
        out = {}
        for kind in self.expert_dims:
            coord = np.empty(self._experts.size, dtype=np.int64)
            axis = len(self.expert_dims) - self.expert_dims.index(kind)
            coord[self._experts.reshape(-1)] = np.indices(self._experts.shape)[axis].reshape(-1)
            out[kind] = coord
        return out

    def coords(self, rank: int) -> dict:
        """The rank's coordinates: along each dense placement dimension (tp, cp, pp, and dp: its
        place outside the dp block) and along each expert dimension (etp, ep, edp: its index in
        that group)."""
        out, rest = {}, rank
        for axis in self.order:
            out[axis] = rest % self.sizes[axis]
            rest //= self.sizes[axis]
        return out | {kind: int(c[rank]) for kind, c in self._expert_coords.items()}

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
