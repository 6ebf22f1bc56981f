"""A policy preset as ``realrun bench`` compressors: the specs it applies on the axes whose collective an op is.

``--compressors none,loco`` on ``allreduce`` benchmarks ``none`` and LoCo's gradient spec,
``ef(int4,beta=0.8,state=int8,reset=1024)``. A preset (``perfmodel.compression.policy.PRESETS``) says a spec
per axis; each axis is carried by one collective of a training step (``OP_AXES``, the collectives
``perfmodel.axes`` prices for it):

* ``allreduce``: ``dp`` (the gradients' all-reduce under plain data parallelism) and ``tp`` (Megatron's
  activation all-reduce);
* ``reduce_scatter``: ``dp`` (ZeRO's gradient reduce-scatter);
* ``allgather``: ``zero`` (ZeRO's parameter all-gather);
* ``alltoall``: ``ep`` and ``ep_combine`` (the MoE dispatch and combine);
* ``broadcast``: none (no axis of a step broadcasts); pp and cp move their activations point to point,
  which no bench op times;
* ``kernels`` (compressors alone): every axis's spec.

What the bench runs is the spec on one flat collective, not the recipe around it: a recipe's warm-up and
optimizer (``perfmodel.compression.recipes``) are ``realrun train``'s, ``tlq`` runs its intra-node tier
(realrun's ``TwoLevelTransform``; the inter-node tier is the hierarchical reduce-scatter's), and ``qwd``
quantizes what it is given, here the bench's data, not a weight difference (its wire and kernels are
a 4-bit gather's; its error is the quantizer's on that data, not the difference's). Records keep the
spec as ``compressor`` (what ``perfmodel calibrate`` reads) and add ``preset`` and ``axis``.
"""
from __future__ import annotations

from perfmodel.compression.policy import POLICY_AXES, PRESETS, parse_policy
from topologies.errors import InputError

OP_AXES = {"allreduce": ("dp", "tp"), "reduce_scatter": ("dp",), "allgather": ("zero",),
           "alltoall": ("ep", "ep_combine"), "broadcast": (), "kernels": tuple(POLICY_AXES)}


def preset_specs(preset: str, op: str) -> list[tuple[str, str]]:
    """[(axis, spec)] that ``preset`` compresses on ``op``'s axes, each spec once (the first axis that
    applies it), in ``OP_AXES`` order."""
    policy = parse_policy(preset)
    out: dict = {}
    for axis in OP_AXES[op]:
        spec = policy.axis(axis).spec
        if spec != "none":
            out.setdefault(spec, axis)
    return [(axis, spec) for spec, axis in out.items()]


def expand(op: str, items: list[str]) -> tuple[list[str], dict]:
    """(the specs to run, {spec: (preset, axis)} for those a preset gave): each item a spec, or a
    preset name replaced by its specs on ``op`` (``preset_specs``); a preset that compresses nothing
    ``op`` carries is one line naming the presets that do."""
    specs, origin = [], {}
    for item in items:
        if item not in PRESETS:
            specs.append(item)
            continue
        found = preset_specs(item, op)
        if not found:
            some = [p for p in PRESETS if preset_specs(p, op)]
            raise InputError("compressors", item, f"a spec, or a preset that compresses what {op} carries "
                             f"({', '.join(OP_AXES[op]) or 'no axis'}): {', '.join(some) or 'none does'}")
        for axis, spec in found:
            specs.append(spec)
            origin.setdefault(spec, (item, axis))
    return list(dict.fromkeys(specs)), origin


def describe(origin: dict, op: str) -> list[str]:
    """One line per preset spec: ``loco -> dp=ef(int4,...) on allreduce``."""
    return [f"{preset} -> {axis}={spec} on {op}" for spec, (preset, axis) in origin.items()]


def annotate(records: list[dict], origin: dict) -> list[dict]:
    """The records, each of a preset's spec with its ``preset`` and ``axis``."""
    return [{**r, "preset": origin[r["compressor"]][0], "axis": origin[r["compressor"]][1]}
            if r.get("compressor") in origin else r for r in records]
