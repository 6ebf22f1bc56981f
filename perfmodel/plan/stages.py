"""Pipeline stages: how many transformer layers each pipeline stage, and each of its model chunks
(virtual stages), holds.

By default layers are split evenly and earlier stages take the remainder (``ParallelPlan.
stage_layers``). A plan may instead fix the split as Megatron-Core does (Megatron-LM
``megatron/core/transformer/transformer_block.py``, ``get_num_layers_to_build``, and
``megatron/core/transformer/pipeline_parallel_layer_layout.py``), three ways, one at a time:

* ``first_stage_layers`` / ``last_stage_layers`` (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``): the first (last) stage holds that many layers, the
  stages between split the rest evenly (it must divide by their number); interleaved, every stage's
  layers split evenly over its V chunks (each stage's count divisible by V). Not with the
  account-for flags (Megatron asserts "Does not support standalone embedding stage and standalone
  loss stage with uneven pp").
* ``account_for_embedding`` / ``account_for_loss`` (``--account-for-embedding-in-pipeline-split``,
  ``--account-for-loss-in-pipeline-split``): the embedding (loss) counts as one layer, num_layers
  plus those divide by pp (and each stage's share by V), and the first chunk of the first stage
  (the last chunk of the last) holds one layer fewer.
* ``pipeline_layout`` (``--pipeline-model-parallel-layout``): Megatron's layout string, each
  virtual stage's layers between ``|`` in model order (chunk k on stage k mod pp), ``E`` the
  embedding, ``t`` a transformer layer, ``m`` a multi-token-prediction layer, ``L`` the loss,
  ``x*n`` and ``(...)*n`` repeats, commas ignored (``parse_str_to_list``): DeepSeek-V3's 61 layers
  on pp 4 x V 4 as Megatron-Bridge runs them are ``Et*4|(t*4|)*14tmL``. It has pp x V virtual
  stages, E first and L last once each, num_layers t, and as many m as the model's MTP layers,
  after every t and in the last chunk of a stage (``validate_layer_layout``).

The result is a tuple of layers per virtual stage in model order (``ParallelPlan.layout``); empty
where the default split holds. Stages keep their own compute, memory and events; with
interleaving a stage's chunks are timed as V equal parts of its layers, and which of its layers
are MoE is counted as if the stage's layers were contiguous (``ParallelPlan.stage_first_layer``).
"""
from __future__ import annotations

import re

from topologies import bounds
from topologies.errors import InputError

LAYOUT_CHARS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}   # Megatron's layer characters
_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))    # Megatron's two unrolling passes


def resolve(request, num_layers: int, mtp_layers: int, pp: int, virtual: int) -> tuple[int, ...]:
    """Layers per virtual stage in model order from a request's split fields (module doc); ()
    where none is set (the default split)."""
    ends = request.first_stage_layers is not None or request.last_stage_layers is not None
    accounted = bool(request.account_for_embedding or request.account_for_loss)
    if request.pipeline_layout is not None:
        for field, on in (("first_stage_layers", ends), ("account_for_embedding", accounted)):
            if on:
                raise InputError(field, getattr(request, field) if field != "first_stage_layers" else
                                 (request.first_stage_layers, request.last_stage_layers),
                                 "unset with pipeline_layout (Megatron takes one way of splitting the layers)")
        return parse_layout(request.pipeline_layout, num_layers, mtp_layers, pp, virtual)
    if ends:
        if accounted:
            raise InputError("account_for_embedding", (request.account_for_embedding, request.account_for_loss),
                             "false with first_stage_layers or last_stage_layers (Megatron-Core does not "
                             "support both)")
        return fixed_ends(num_layers, pp, virtual, request.first_stage_layers, request.last_stage_layers)
    if accounted:
        return accounted_split(num_layers, pp, virtual, bool(request.account_for_embedding),
                               bool(request.account_for_loss))
    return ()


def fixed_ends(num_layers: int, pp: int, virtual: int, first: int | None, last: int | None) -> tuple[int, ...]:
    """``--decoder-first/last-pipeline-num-layers`` (module doc)."""
    if pp == 1:
        raise InputError("first_stage_layers", first if first is not None else last,
                         "unset with pp 1 (one stage holds every layer)")
    for field, value in (("first_stage_layers", first), ("last_stage_layers", last)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= num_layers):
            raise InputError(field, value, f"an integer from 0 to num_layers {num_layers}")
    given = {s: n for s, n in ((0, first), (pp - 1, last)) if n is not None}
    rest, middle = num_layers - sum(given.values()), pp - len(given)
    if rest < 0 or (middle == 0 and rest) or (middle and rest % middle):
        raise InputError("first_stage_layers", (first, last), f"first and last stage layers leaving num_layers "
                         f"{num_layers} minus them ({rest}) divisible by the {middle} other stages "
                         "(Megatron-Core's uneven pipeline)")
    per_stage = [given.get(s, rest // middle if middle else 0) for s in range(pp)]
    return _chunks(per_stage, virtual, "first_stage_layers")


def accounted_split(num_layers: int, pp: int, virtual: int, embedding: bool, loss: bool) -> tuple[int, ...]:
    """``--account-for-embedding/loss-in-pipeline-split`` (module doc)."""
    total = num_layers + embedding + loss
    if total % pp:
        raise InputError("account_for_embedding", (embedding, loss), f"num_layers {num_layers} plus the embedding "
                         f"and loss counted ({total}) divisible by pp {pp}")
    chunks = list(_chunks([total // pp] * pp, virtual, "account_for_embedding"))
    chunks[0] -= embedding
    chunks[-1] -= loss
    if min(chunks) < 0:
        raise InputError("account_for_embedding", (embedding, loss), "a first and last chunk of at least one "
                         "layer each (the embedding and loss take one)")
    return tuple(chunks)


def _chunks(per_stage: list, virtual: int, field: str) -> tuple[int, ...]:
    """Each stage's layers split over its ``virtual`` chunks, in model order (chunk v of stage s
    at v x pp + s); every stage's count divisible by V."""
    if any(n % virtual for n in per_stage):
        raise InputError(field, "/".join(map(str, per_stage)), f"stage layer counts divisible by the {virtual} "
                         "virtual stages of interleaving")
    return tuple(n // virtual for _ in range(virtual) for n in per_stage)


def unroll(text: str) -> str:
    """Megatron's layout string with its repeats unrolled (``parse_str_to_list``), refused once
    it would pass the declared bound on its length."""
    out = str(text).replace(",", "")
    _, low, high = bounds.bound("pipeline_layout_chars")

    def refuse(chars: int):
        raise InputError("pipeline_layout", text, f"{bounds.describe('pipeline_layout_chars')} layer characters "
                         f"once unrolled (it has {chars})")

    for pattern in _REPEATS:
        def expand(match):
            body, times = match.group(1), int(match.group(2))
            if len(body) * times > high:
                refuse(len(body) * times)
            return body * times
        out = pattern.sub(expand, out)
    if not low <= len(out) <= high:
        refuse(len(out))
    return out


def parse_layout(text: str, num_layers: int, mtp_layers: int, pp: int, virtual: int) -> tuple[int, ...]:
    """Transformer layers per virtual stage of Megatron's layout string (module doc), checked as
    Megatron-Core checks it."""
    stages = unroll(text).split("|")
    bad = sorted({c for stage in stages for c in stage if c not in LAYOUT_CHARS})
    if bad:
        raise InputError("pipeline_layout", text, "virtual stages of E, t, m and L between '|', with x*n and (...)*n "
                         f"repeats (not {''.join(bad)!r})")
    if len(stages) != pp * virtual:
        raise InputError("pipeline_layout", text, f"pp x V = {pp} x {virtual} virtual stages (it has {len(stages)})")
    flat = "".join(stages)
    counts = {c: flat.count(c) for c in LAYOUT_CHARS}
    if not flat.startswith("E") or not flat.endswith("L") or counts["E"] != 1 or counts["L"] != 1:
        raise InputError("pipeline_layout", text, "the embedding E first and the loss L last, once each")
    if counts["t"] != num_layers:
        raise InputError("pipeline_layout", text,
                         f"num_layers {num_layers} transformer layers t (it has {counts['t']})")
    if counts["m"] != mtp_layers:
        raise InputError("pipeline_layout", text, f"as many m as the model's multi-token-prediction layers "
                         f"({mtp_layers}; it has {counts['m']})")
    if counts["m"]:
        holder = [k for k, stage in enumerate(stages) if "m" in stage]
        if "t" in flat[flat.index("m"):] or len(holder) != 1 or holder[0] // pp != virtual - 1:
            raise InputError("pipeline_layout", text, "the MTP layers m after every t, together in the last virtual "
                             "stage of a pipeline stage")
    return tuple(stage.count("t") for stage in stages)


def stage_sums(layout: tuple, pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage of a layout (its chunks k with k mod pp = s)."""
    return tuple(sum(layout[s::pp]) for s in range(pp))

