"""How a MoE layer's tokens spread over its experts (the plan's ``routing``), and what follows.

A routing is one of three kinds, named in a plan (``PlanRequest.routing``, ``--routing``) by its text:

* ``balanced``: every expert gets its fair share, tokens x top_k / experts. Megatron-Core's
  ``--moe-router-force-load-balancing`` (random router logits, megatron/core/transformer/moe/router.py),
  which Megatron-Bridge's performance recipes set (src/megatron/bridge/perf_recipes/*/), routes so.
* ``capacity:F``: token-drop routing padded to capacity, Megatron-Core's ``--moe-expert-capacity-factor F``
  with ``--moe-pad-expert-input-to-capacity``: each rank sends every expert ``min(tokens, ceil(F x tokens x
  top_k / experts))`` rows, real or padding, so every expert computes that many rows from each rank of its
  expert-parallel group whatever the router does, and the dispatch carries experts x that many rows.
* a histogram file: measured tokens per expert of dropless routing (``read_histogram``: the format), one
  list for every MoE layer or one per MoE layer. A rank of the expert-parallel group holds a contiguous
  block of experts, ``[r E / ep, (r + 1) E / ep)`` (Megatron-Core's expert placement; realrun's), and
  receives those experts' share of every rank's token copies (a token's experts do not depend on the rank
  it starts on); the busiest rank, the one whose experts take the most, sets the layer's time.

No routing in a plan (``None``) is the model file's: ``moe_pad_to_capacity`` with ``moe_capacity_factor``
is ``capacity:F``, else every expert at ``moe_load_imbalance`` times its fair share, capped by a capacity
factor (``balanced`` at 1). From a routing follow, per layer and micro-batch on one GPU (``expert_rows``,
``rank_load``, ``dispatch_rows``): the rows of each expert the busiest rank computes, their sum over the
balanced one's, and the rows a dispatch (and its combine) moves on its busiest rank, priced as an uneven
all-to-all (``perfmodel.collectives.alltoall.uneven_factor``). A per-layer histogram enters as the mean
over its layers (a stage's layers are taken as the model's average: which stage holds the most
imbalanced layers is not modelled). The histogram's fractions are what every micro-batch routes: the
spread of one micro-batch around them (a few tokens per expert at most under forced balance) is not.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from perfmodel.collectives.alltoall import uneven_factor
from topologies import bounds
from topologies.errors import InputError

if TYPE_CHECKING:
    from perfmodel.plan.parallel import ParallelPlan
    from perfmodel.workload import ModelSpec

KINDS = ("balanced", "capacity", "histogram")
ALLOWED = "balanced, capacity:F (F >= 1: token drop padded to capacity) or a histogram file (.json or .csv)"
HISTOGRAM_KEYS = ("tokens_per_expert", "model", "note")   # a JSON histogram's keys (the first required)


@dataclass(frozen=True)
class Routing:
    """A distribution of a MoE layer's token copies over its experts (module doc)."""

    kind: str               # balanced, capacity or histogram
    factor: float = 1.0     # balanced: every expert's rows over its fair share; capacity: the factor F
    counts: tuple = ()      # histogram: tokens per expert, a tuple per MoE layer (one: every MoE layer)
    source: str = ""        # histogram: the file it was read from
    # histogram: each layer's counts over their sum, computed once at load (every prediction reads them)
    shares: tuple = field(default=(), compare=False, repr=False)

    def describe(self) -> str:
        """``balanced``, ``balanced x1.5``, ``capacity:1.25`` or ``histogram FILE (L layers x E experts)``."""
        if self.kind == "capacity":
            return f"capacity:{self.factor:g}"
        if self.kind == "histogram":
            return f"histogram {self.source} ({len(self.counts)} layers x {len(self.counts[0])} experts)"
        return "balanced" if self.factor == 1.0 else f"balanced x{self.factor:g}"


def parse(text: str) -> Routing:
    """The routing ``text`` names: ``balanced``, ``capacity:F`` or a histogram file (``read_histogram``)."""
    if not isinstance(text, (str, os.PathLike)) or not str(text).strip():
        raise InputError("routing", text, ALLOWED)
    text = str(text)
    if text == "balanced":
        return Routing("balanced")
    if text.startswith("capacity:"):
        return Routing("capacity", factor=_capacity_factor(text))
    if not os.path.isfile(text):
        raise InputError("routing", text, ALLOWED + "; no such file")
    return _read_cached(text, os.path.abspath(text), *_stamp(text))


def _capacity_factor(text: str) -> float:
    """F of ``capacity:F``: a number of at least 1 within the model files' capacity bound."""
    try:
        factor = float(text.partition(":")[2])
    except ValueError:
        raise InputError("routing", text, ALLOWED) from None
    if not factor >= 1.0:
        raise InputError("routing", text, ALLOWED)
    return float(bounds.check("routing.capacity", factor, "moe_capacity_factor"))


def _stamp(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_mtime_ns, stat.st_size


@lru_cache(maxsize=32)
def _read_cached(path: str, absolute: str, mtime_ns: int, size: int) -> Routing:
    """``read_histogram``, once per file version (reread when the file changes; ``path`` as given names it)."""
    return read_histogram(path)


def read_histogram(path: str) -> Routing:
    """A measured routing histogram: tokens (or token copies) routed to each expert, in one of two formats.

    JSON (``.json``): an object with ``tokens_per_expert``, a list of numbers (one per expert, for every
    MoE layer) or a list of such lists (one per MoE layer, in layer order), and optionally ``model`` and
    ``note`` (text, not read). CSV (any other name): one line per MoE layer (one line: every MoE layer),
    one number per expert, comma-separated; blank lines and lines starting with ``#`` are skipped.
    Every count is a number from 0 (within ``tokens_per_expert``'s declared bound); each layer has the
    same number of experts and routes some tokens. Refusals name the file, the field and the value."""
    size = os.path.getsize(path)
    bounds.check(f"routing {path}: size", size, "routing_file_bytes")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError("routing", path, f"a readable UTF-8 histogram file ({err})") from None
    layers = _json_layers(text, path) if path.endswith(".json") else _csv_layers(text, path)
    counts = _checked(layers, path)
    return Routing("histogram", counts=counts, source=path, shares=tuple(_shares(layer) for layer in counts))


def _json_layers(text: str, path: str) -> list:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise InputError("routing", path, f"a JSON histogram ({err})") from None
    if not isinstance(data, dict) or "tokens_per_expert" not in data:
        raise InputError(f"routing {path}", type(data).__name__,
                         "a JSON object with tokens_per_expert (a list of counts, or one list per MoE layer)")
    for key in data:
        if key not in HISTOGRAM_KEYS:
            raise InputError(f"routing {path}: {key}", data[key], "not a histogram key; allowed: "
                             + ", ".join(HISTOGRAM_KEYS))
    counts = data["tokens_per_expert"]
    if not isinstance(counts, list) or not counts:
        raise InputError(f"routing {path}: tokens_per_expert", counts, "a non-empty list")
    return counts if isinstance(counts[0], list) else [counts]


def _csv_layers(text: str, path: str) -> list:
    rows = [row for row in csv.reader(io.StringIO(text)) if row and not row[0].lstrip().startswith("#")
            and any(cell.strip() for cell in row)]
    if not rows:
        raise InputError("routing", path, "a CSV histogram: a line of counts per MoE layer, one per expert")
    out = []
    for i, row in enumerate(rows):
        layer = []
        for j, cell in enumerate(row):
            try:
                layer.append(float(cell))
            except ValueError:
                raise InputError(f"routing {path}: layer {i} expert {j}", cell.strip(),
                                 "a number (tokens routed to the expert)") from None
        out.append(layer)
    return out


def _checked(layers: list, path: str) -> tuple:
    """The layers' counts as tuples of floats, each within its bound; equal widths, each routing some."""
    if len(layers) > bounds.bound("num_layers")[2]:
        raise InputError(f"routing {path}: layers", len(layers), bounds.describe("num_layers"))
    out = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, list) or not layer:
            raise InputError(f"routing {path}: layer {i}", layer, "a non-empty list of counts, one per expert")
        bounds.check(f"routing {path}: layer {i} experts", len(layer), "num_experts")
        if len(layer) != len(layers[0]):
            raise InputError(f"routing {path}: layer {i} experts", len(layer),
                             f"{len(layers[0])}, as layer 0 (every layer has the same experts)")
        row = tuple(float(bounds.check(f"routing {path}: layer {i} expert {j}", c, "tokens_per_expert"))
                    for j, c in enumerate(layer))
        if not sum(row) > 0:
            raise InputError(f"routing {path}: layer {i}", "all 0", "some tokens routed")
        out.append(row)
    return tuple(out)


def of_model(model: ModelSpec) -> Routing:
    """The routing a model file's keys describe (no routing in the plan): padded to capacity, ``capacity:F``
    (F the factor; dropless padded: every token to every expert, F = experts / top_k); else every expert at
    ``moe_load_imbalance`` times its fair share, capped by a capacity factor (``ModelSpec.expert_load``)."""
    if model.moe_pad_to_capacity:
        every = model.num_experts / model.moe_top_k
        cap = model.moe_capacity_factor
        return Routing("capacity", factor=min(cap, every) if cap > 0 else every)
    return Routing("balanced", factor=model.expert_load)


def resolve(text, model: ModelSpec) -> str | None:
    """The plan's routing text, checked against ``model`` (None: the model file's): a dense model takes only
    ``balanced``; a histogram has the model's experts and one layer or one per MoE layer."""
    if text is None:
        return None
    routing = parse(text)
    text = str(text)
    if not model.is_moe:
        if routing.kind != "balanced":
            raise InputError("routing", text, f"balanced for the dense model {model.name} (routing spreads a "
                             "MoE layer's tokens over its experts)")
        return text
    if routing.kind == "histogram":
        experts, layers = len(routing.counts[0]), len(routing.counts)
        if experts != model.num_experts:
            raise InputError(f"routing {routing.source}: experts", experts,
                             f"{model.num_experts}, num_experts of {model.name}")
        if layers not in (1, model.num_moe_layers):
            raise InputError(f"routing {routing.source}: layers", layers,
                             f"1 (every MoE layer) or {model.num_moe_layers}, the MoE layers of {model.name}")
    return text


def routing_of(model: ModelSpec, plan: ParallelPlan) -> Routing:
    """The routing a prediction uses: the plan's, else the model file's."""
    text = getattr(plan, "routing", None)
    return of_model(model) if text is None else parse(text)


def capacity_rows(factor: float, tokens: int, model: ModelSpec) -> int:
    """Rows one rank sends each expert padded to capacity: ``min(tokens, ceil(F x tokens x top_k / experts))``
    (Megatron-Core's ``get_capacity``; realrun's MoE layer)."""
    return min(tokens, math.ceil(factor * tokens * model.moe_top_k / model.num_experts))


def _fractions(routing: Routing, model: ModelSpec) -> tuple:
    """Per layer, each expert's share of the layer's token copies (a histogram's counts over their sum)."""
    if routing.kind != "histogram":
        return ((1.0 / model.num_experts,) * model.num_experts,)
    return routing.shares


def _shares(layer: tuple) -> tuple:
    """A layer's counts over their sum (the sum taken once: a sum per count is experts^2 work per layer)."""
    total = sum(layer)
    return tuple(c / total for c in layer)


def rank_shares(fractions: tuple, ep: int) -> tuple:
    """Each expert-parallel rank's share of a layer's copies: the sum over its contiguous block of experts."""
    block = len(fractions) // ep
    return tuple(math.fsum(fractions[r * block:(r + 1) * block]) for r in range(ep))


def _busiest_block(fractions: tuple, ep: int) -> tuple:
    """The fractions of the experts of the rank whose experts take the most (the first such rank)."""
    shares = rank_shares(fractions, ep)
    r = shares.index(max(shares))
    block = len(fractions) // ep
    return fractions[r * block:(r + 1) * block]


@lru_cache(maxsize=4096)
def expert_rows(model: ModelSpec, plan: ParallelPlan) -> tuple:
    """Per layer of the routing (one unless a per-layer histogram), the rows each expert of the busiest
    expert-parallel rank computes in one micro-batch: its share of the group's ``ep x T x top_k`` copies
    (T = ``ParallelPlan.expert_tokens``, what ``moe_gemms`` takes: seq / cp x mbs, gathered over etp);
    padded to capacity, ``ep`` ranks' capacity rows (each gathered over etp)."""
    routing = routing_of(model, plan)
    T, ep, k = plan.expert_tokens, plan.ep, model.moe_top_k
    local = model.num_experts // ep
    copies = ep * T * k
    if routing.kind == "capacity":
        tokens = plan.routed_tokens
        load = capacity_rows(routing.factor, tokens, model) * model.num_experts / (tokens * k)
        return ((load * copies / model.num_experts,) * local,)
    if routing.kind == "balanced":
        return ((routing.factor * copies / model.num_experts,) * local,)
    return tuple(tuple(f * copies for f in _busiest_block(layer, ep)) for layer in _fractions(routing, model))


def rank_load(model: ModelSpec, plan: ParallelPlan) -> float:
    """The busiest rank's expert rows over a balanced rank's, averaged over the routing's layers (1 balanced;
    the capacity factor padded; ``ep x`` the busiest block's share for a histogram): what the workload's
    formulas read as ``ModelSpec.expert_load``."""
    fair = plan.expert_tokens * model.moe_top_k
    layers = expert_rows(model, plan)
    return math.fsum(sum(rows) for rows in layers) / (len(layers) * fair)


def loaded(model: ModelSpec, plan: ParallelPlan) -> ModelSpec:
    """``model`` with its routing keys standing for the plan's routing (dropless, its most loaded expert at
    ``rank_load``), for the workload's formulas that read ``ModelSpec.expert_load`` (the experts' kept
    activations); ``model`` itself where that load is the model file's already."""
    load = rank_load(model, plan)
    if math.isclose(load, model.expert_load, rel_tol=1e-12):
        return model
    return replace(model, moe_load_imbalance=load, moe_capacity_factor=0.0, moe_pad_to_capacity=False)


def dispatch_rows(model: ModelSpec, plan: ParallelPlan) -> float:
    """Rows one MoE layer's dispatch (and its combine) costs a rank per micro-batch, as the busiest rank of
    an uneven all-to-all moves them: what a rank sends (``routed_tokens x top_k`` copies dropless; padded to
    capacity, ``experts x`` its capacity rows), times the all-to-all's ``uneven_factor`` of the ranks'
    shares (1 balanced or padded), averaged over the routing's layers."""
    routing, tokens = routing_of(model, plan), plan.routed_tokens
    if routing.kind == "capacity":
        return float(model.num_experts * capacity_rows(routing.factor, tokens, model))
    rows = tokens * model.moe_top_k
    if routing.kind == "balanced" or plan.ep == 1:
        return float(rows)
    return rows * _mean_uneven_factor(routing, plan.ep)


@lru_cache(maxsize=256)
def _mean_uneven_factor(routing: Routing, ep: int) -> float:
    """A histogram's ``uneven_factor`` over ``ep`` ranks, averaged over its layers (once per file version and ep)."""
    return math.fsum(uneven_factor(rank_shares(f, ep)) for f in routing.shares) / len(routing.shares)
