"""Collective algorithms, each declared once, for the model and the runtime alike.

An ``Algorithm`` names the ops it serves and how each is priced: ``plain`` costs move
uncompressed (or reducible, summed-as-sent) payloads (``perfmodel.collectives.plain``:
``cost(ctx, size_bytes)``); ``compressed`` costs carry a payload that cannot be summed without
decoding (``perfmodel.collectives.compressed``: ``cost(ctx, msg)``, their kernels included).
``runtime`` lists the ops realrun implements it for, ``runtime_args`` what that implementation
takes beyond ``(x, wire, group)``, and ``selectable`` whether a user names it (``pipelined`` is
chosen by ``chunks``, not by name). realrun's implementations register against these entries
(``implementations``), and ``tests/test_algorithm_registry.py`` fails when a runtime algorithm
has no model entry or the reverse. An op missing from ``runtime`` is model-only (the
hierarchical all-to-all, tree, NVLS): the model prices it, realrun has no implementation of it
under that name; ``direct`` runs in realrun as the all-to-all (``Comm.alltoall``).
``PLAIN`` and ``COMPRESSED`` are views by op.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from perfmodel.collectives import compressed as c
from perfmodel.collectives import plain as p

OPS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall", "sendrecv")


@dataclass(frozen=True, kw_only=True)
class Algorithm:
    name: str
    plain: dict = field(default_factory=dict)        # {op: cost(ctx, size_bytes)}
    compressed: dict = field(default_factory=dict)   # {op: cost(ctx, msg)} for non-reducible payloads
    runtime: tuple = ()                              # ops realrun implements
    runtime_args: tuple = ()                         # its implementation's arguments beyond (x, wire, group)
    selectable: bool = True                          # a user may name it (realrun --algorithms)
    doc: str = ""

    @property
    def needs_reducible(self) -> bool:
        """Only runs on payloads that sum as sent (no compressed form of its own)."""
        return bool(self.plain) and not self.compressed


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm(name="ring", plain={"allreduce": p.ring_allreduce, "reduce_scatter": p.ring_gather,
                                  "allgather": p.ring_gather, "broadcast": p.ring_broadcast},
              compressed={"allreduce": c.ring_allreduce, "reduce_scatter": c.ring_reduce_scatter},
              runtime=("allreduce",), doc="2(p-1) steps on n/p chunks; compressed: decode-sum-encode per hop"),
    Algorithm(name="tree", plain={"allreduce": p.tree_allreduce, "broadcast": p.tree_broadcast},
              doc="NCCL's double binary tree"),
    Algorithm(name="recursive_doubling",
              plain={"allreduce": p.recursive_doubling_allreduce, "reduce_scatter": p.recursive_doubling_gather,
                     "allgather": p.recursive_doubling_gather},
              compressed={"allreduce": c.recursive_doubling_allreduce,
                          "reduce_scatter": c.recursive_doubling_reduce_scatter},
              runtime=("allreduce",), doc="log2 p rounds on the whole buffer (halving-doubling)"),
    Algorithm(name="allgather", compressed={"allreduce": c.allgather_allreduce}, runtime=("allreduce",),
              doc="gather every rank's payload, decode p-1 and sum (sparse top-k's path)"),
    Algorithm(name="two_phase", compressed={"allreduce": c.two_phase_allreduce,
                                            "reduce_scatter": c.two_phase_reduce_scatter},
              runtime=("allreduce",), doc="all-to-all of compressed slices, sum, compress, all-gather (qgZ, CGX)"),
    Algorithm(name="hierarchical", plain={"allreduce": p.hierarchical_allreduce,
                                          "reduce_scatter": p.hierarchical_gather,
                                          "allgather": p.hierarchical_gather, "alltoall": p.hierarchical_alltoall},
              compressed={"allreduce": c.hierarchical_allreduce, "reduce_scatter": c.hierarchical_reduce_scatter},
              runtime=("allreduce",), runtime_args=("local", "intra", "inter", "raw"),
              doc="inside the node, across nodes, inside the node again; all-to-all: DeepEP's RDMA per node "
                  "pair on its rail, NVLink forwarding beside it (model-only: no runtime op for it)"),
    Algorithm(name="nvls", plain={"allreduce": p.nvls_allreduce}, doc="NVLink SHARP: the switch reduces"),
    Algorithm(name="direct", plain={"alltoall": p.direct_alltoall, "sendrecv": p.direct_sendrecv},
              runtime=("alltoall",), runtime_args=("splits", "out_splits"),
              doc="every pair at once (all-to-all: pairwise, from the traffic matrix) or one hop (a pipeline "
                  "boundary); realrun's all-to-all (each chunk compressed once at its source)"),
    Algorithm(name="pipelined", runtime=("allreduce",), runtime_args=("chunks",), selectable=False,
              doc="realrun's all-gather all-reduce in chunks (the model prices it as allgather with chunks)"),
)}


def _view(kind: str) -> dict:
    return {op: {a.name: getattr(a, kind)[op] for a in ALGORITHMS.values() if op in getattr(a, kind)}
            for op in OPS if any(op in getattr(a, kind) for a in ALGORITHMS.values())}


PLAIN = _view("plain")
COMPRESSED = _view("compressed")


def runtime_algorithms(op: str = "allreduce") -> tuple:
    """The algorithms a user names for realrun's ``op`` (declaration order)."""
    return tuple(a.name for a in ALGORITHMS.values() if op in a.runtime and a.selectable)


RUNTIME_ALGORITHMS = runtime_algorithms("allreduce")   # realrun --algorithms (the all-reduce's)
RUNTIME_OPS = tuple(op for op in OPS if any(op in a.runtime for a in ALGORITHMS.values()))


def implementations(op: str, **functions) -> dict:
    """realrun's implementations of ``op`` by algorithm name, checked against the declarations:
    every name declared for that op in the runtime, and every such declaration implemented."""
    declared = {a.name for a in ALGORITHMS.values() if op in a.runtime}
    if set(functions) != declared:
        raise ValueError(f"runtime {op} algorithms {sorted(functions)} differ from the declared {sorted(declared)}")
    return dict(functions)
