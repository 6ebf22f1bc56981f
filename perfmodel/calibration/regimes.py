"""The published rows' errors by regime: which model, cluster, precision, stack or scale they miss on.

Every predicted row of ``perfmodel validate --published`` carries its regime (``regime_of``): the
catalog model it predicts (its base name, ``deepseek-v3`` for ``deepseek-v3:mtp_layers=1``), the
catalog cluster, the precision recipe, the software stack and the GPU count of a training row; the
cluster, operation and GPU count of a collective row. ``by_regime`` groups a source's rows by some of
those keys with each group's MAPE, bias and worst row, which is what ``--by`` prints: the
validation's residuals where a single MAPE per source hides them (a model right on one system and
50% off on another).
"""
from __future__ import annotations

from topologies.errors import InputError

REGIME_KEYS = ("model", "cluster", "precision", "framework", "gpus", "op")


def regime_of(source, row: dict) -> dict:
    """The regime of one row of ``source`` (module doc)."""
    if source.kind == "collective":
        return dict(cluster=row.get("cluster") or source.cluster, op=row.get("op") or source.op,
                    gpus=int(row["total_gpus"]))
    model = (row.get("model") or "shape " + str(row.get("hidden_size", ""))).split(":")[0]
    return dict(model=model, cluster=row["cluster"], precision=row["precision"],
                framework=row.get("framework") or "", gpus=int(row["gpus"]))


def parse_keys(text: str) -> tuple[str, ...]:
    """``--by``'s comma-separated keys, each one of ``REGIME_KEYS``."""
    keys = tuple(k.strip() for k in text.split(","))
    for key in keys:
        if key not in REGIME_KEYS:
            raise InputError("by", key, "comma-separated keys among " + ", ".join(REGIME_KEYS))
    return keys


def by_regime(results: list, keys: tuple[str, ...]) -> list[dict]:
    """One dict per group of the predicted ``results`` (RowResults) sharing ``keys``' values: the values,
    rows, MAPE, bias and the worst row's label and error, groups in their first row's order."""
    groups: dict[tuple, list] = {}
    for r in results:
        if r.error is not None:
            groups.setdefault(tuple(r.regime.get(k, "") for k in keys), []).append(r)
    out = []
    for values, rows in groups.items():
        worst = max(rows, key=lambda r: abs(r.error))
        out.append(dict(zip(keys, values), rows=len(rows), mape=sum(abs(r.error) for r in rows) / len(rows),
                        bias=sum(r.error for r in rows) / len(rows), worst_label=worst.label,
                        worst_error=worst.error))
    return out
