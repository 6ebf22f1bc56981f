"""How far to trust a predicted speedup: the model's error on published runs like the user's job.

``perfmodel validate --published`` holds the model against published training runs; their errors
differ by regime (a dense model on DGX H100 within a few percent, a MoE on 8-GPU B200 nodes 40% off:
docs/accuracy.md "By regime"). ``regime_table`` groups the training rows' errors (predicted over
measured throughput, minus one) by cluster and model family, by GPU and family, by family and all
together; ``scripts/regime_errors.py`` writes it to ``catalog/regime_errors.json`` so an installed
perfmodel carries it without the validation tables. ``nearest`` picks the most specific group with
at least ``MIN_ROWS`` rows for a job; with a calibration profile of the user's own cluster its fits'
error is used instead (``calibration_error``).

``speedup_band`` turns that error ``e`` into a band on a speedup ``s = T0 / T1``: the longer step
splits into the seconds both steps keep, ``K`` (the shorter step), and the seconds ``D = |T0 - T1|``
the policy saves (or adds), and either may be off by ``e`` in either direction, so the band is the
smallest and largest of ``(K' + D') / K'`` (its inverse for a slowdown) over ``K' = K (1 +- e)`` and
``D' = D (1 +- e)``: a saving of a few percent of the step has a narrow band, one that dominates the
step a wide one, and the band never leaves the positive numbers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from topologies.errors import InputError

REGIME_FILE = Path(__file__).resolve().parents[1] / "catalog" / "regime_errors.json"
MIN_ROWS = 3                                      # a group's MAPE means something over three rows or more
LEVELS = ("cluster", "gpu", "family", "all")      # most specific first
FAMILIES = ("dense", "moe", "hybrid")


@dataclass(frozen=True)
class RegimeError:
    """The model's error on one group of published runs (module doc)."""

    level: str          # cluster, gpu, family, all; or calibration
    key: str            # e.g. "dgx-h100/dense"
    rows: int
    mape: float         # mean |predicted / measured - 1| of the throughput
    bias: float         # mean signed error (+: the model is optimistic)

    @property
    def text(self) -> str:
        where = "its calibration's fits" if self.level == "calibration" else f"{self.rows} published runs ({self.key})"
        return f"+-{self.mape:.0%} from {where}"


def family_of(model) -> str:
    """``dense``, ``moe`` or ``hybrid`` for a ``ModelSpec``."""
    if model.is_hybrid:
        return "hybrid"
    return "moe" if model.is_moe else "dense"


def regime_table(reports: list[dict]) -> dict:
    """{level: {key: {rows, mape, bias}}} of the training rows of ``validate_published``'s reports."""
    groups: dict[tuple, list[float]] = {}
    for rep in reports:
        for r in rep["results"]:
            if r.error is None or "precision" not in r.regime:
                continue
            family, gpu = _family(r.regime["model"]), _gpu(r.regime["cluster"])
            for level, key in (("cluster", f"{r.regime['cluster']}/{family}"), ("gpu", f"{gpu}/{family}"),
                               ("family", family), ("all", "all")):
                groups.setdefault((level, key), []).append(r.error)
    out: dict[str, dict] = {level: {} for level in LEVELS}
    for (level, key), errors in sorted(groups.items()):
        out[level][key] = {"rows": len(errors), "mape": round(sum(map(abs, errors)) / len(errors), 4),
                           "bias": round(sum(errors) / len(errors), 4)}
    out["source"] = "perfmodel validate --published (training sources), scripts/regime_errors.py"
    return out


@lru_cache(maxsize=64)
def _family(model_name: str) -> str:
    from perfmodel.workload import load_model

    try:
        return family_of(load_model(model_name))
    except InputError:       # a row given by its shape (Megatron's tables): a dense GPT
        return "dense"


@lru_cache(maxsize=64)
def _gpu(cluster: str) -> str:
    from topologies import cluster_for

    return cluster_for(cluster)[0].gpu_model


@lru_cache(maxsize=4)
def load_regime_errors(path: str | None = None) -> dict:
    """The regime table (``regime_table``'s shape) from ``path`` (default: the packaged one)."""
    file = Path(path) if path else REGIME_FILE
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise InputError("regime_errors", str(file), f"a readable JSON file from scripts/regime_errors.py ({err})") \
            from None
    if not all(isinstance(raw.get(level), dict) for level in LEVELS):
        raise InputError("regime_errors", str(file), "a JSON object with the levels " + ", ".join(LEVELS))
    return raw


def nearest(cluster: str, gpu: str, family: str, table: dict | None = None) -> RegimeError:
    """The most specific group of ``table`` (default: the packaged one) with ``MIN_ROWS`` rows or more
    for a job on ``cluster`` (its ``gpu``) of model ``family``."""
    table = table or load_regime_errors()
    for level, key in (("cluster", f"{cluster}/{family}"), ("gpu", f"{gpu}/{family}"), ("family", family),
                       ("all", "all")):
        found = table[level].get(key)
        if found and found["rows"] >= MIN_ROWS:
            return RegimeError(level, key, found["rows"], found["mape"], found["bias"])
    raise InputError("regime_errors", "no group", f"a table with an 'all' group of {MIN_ROWS} rows or more")


def calibration_error(path: str | None) -> RegimeError | None:
    """The error of a calibration profile's own fits (the largest MAPE among its tiers' and compute
    fits), or None where there is no profile or it reports none."""
    if not path:
        return None
    try:
        fits = json.loads(Path(path).read_text()).get("fits", {})
    except (OSError, ValueError, AttributeError):
        return None
    found = [(f.get("mape"), f.get("records", 0)) for f in (fits.get("tiers") or {}, fits.get("compute") or {})
             if isinstance(f, dict) and isinstance(f.get("mape"), (int, float))]
    if not found:
        return None
    mape = max(m for m, _ in found)
    return RegimeError("calibration", Path(path).name, int(sum(n for _, n in found) or 0), float(mape), 0.0)


def speedup_band(t0: float, t1: float, error: float) -> tuple[float, float]:
    """(low, high) of ``t0 / t1`` with the kept seconds (the shorter step) and the changed ones (the
    difference) each off by ``error`` in either direction (module doc)."""
    kept, changed = min(t0, t1), abs(t0 - t1)
    ratios = [(kept * (1 + a * error) + changed * (1 + b * error)) / (kept * (1 + a * error))
              for a in (-1.0, 1.0) for b in (-1.0, 1.0)]
    if t1 > t0:                          # a slowdown: the kept seconds are the uncompressed step's
        ratios = [1 / x for x in ratios]
    return min(ratios), max(ratios)
