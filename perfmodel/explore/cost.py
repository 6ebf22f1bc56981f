"""What training a token budget takes on each (cluster, plan, policy): time, GPU-hours, cost, energy.

For a budget of ``tokens`` at global batch ``gbs`` and sequence length ``seq``:

* ``steps = ceil(tokens / (gbs x seq) x steps_inflation)``: the steps that reach the loss the
  uncompressed run reaches on the budget (``perfmodel.explore.convergence``; 1 for an uncompressed row;
  whole steps: the last one may train a little past it);
* ``time_to_train_s = steps x step_time_s`` (the time to target);
* ``gpu_hours = gpus x time_to_train_s / 3600``;
* ``cost_usd = gpu_hours x price`` with ``price`` the cluster's USD per GPU-hour (given by the
  user: no price is assumed);
* ``energy_kWh = gpus x board_power_W x time_to_train_s / 3.6e6``: the GPU board's maximum power (TDP)
  from the GPU catalog (``perfmodel/catalog/gpus.toml``, ``board_power_W`` with its datasheet in
  ``power_source``), so an upper bound on the GPUs' energy (training rarely holds TDP; host CPUs,
  switches and cooling are not counted); ``None`` for a device without a known board power.

The token budget and the prices are bounded (``topologies.bounds``: ``tokens``, ``gpu_hour_price``) so that
every column is a finite number. Without a token budget none of these columns exists (absent, not zero).
A price given by cluster name (``dgx-a100=1.8``) applies to that cluster's variants
(``dgx-a100:nic_Gbps=100``) too; each cluster is priced once.
"""
from __future__ import annotations

import math

from perfmodel.devices import device
from topologies import InputError, bounds, load_spec

COST_KEYS = ("steps", "time_to_train_s", "gpu_hours", "cost_usd", "energy_kWh")


def parse_tokens(value) -> float:
    """A number of tokens to train (``300e9``), within its declared bound (``topologies.bounds``)."""
    return bounds.check("tokens", _number(value))


def _price(text, name: str) -> float:
    """USD per GPU-hour (of the cluster ``name``, or of all where empty), within its declared bound."""
    try:
        return bounds.check("gpu_hour_price", _number(text))
    except InputError as err:
        if not name:
            raise
        raise InputError(err.field, f"{name}={text}", err.allowed) from None


def _number(text):
    """``text`` as a float where it reads as one, else as given (for the bound check to refuse)."""
    if isinstance(text, bool):
        return text
    try:
        return float(text)
    except (TypeError, ValueError):
        return text


def parse_prices(value, clusters: list[str]) -> dict[str, float]:
    """{cluster: USD per GPU-hour} from one number for all, ``name=price,...`` (a name is a cluster of
    ``clusters`` or the catalog base of its variants) or a dict of the same; every cluster priced."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) or \
            isinstance(value, str) and "=" not in value:
        price = _price(value, "")
        return {c: price for c in clusters}
    items = value.items() if isinstance(value, dict) else \
        (i.partition("=")[::2] for i in str(value).split(",") if i.strip())
    named = {}
    for name, text in items:
        name = name.strip()
        if name in named:
            raise InputError("gpu_hour_price", value, f"each cluster priced once ({name} repeats)")
        if name not in clusters and name not in {base_name(c) for c in clusters}:
            raise InputError("gpu_hour_price", f"{name}={text}", "name=price with name one of the searched "
                             "clusters: " + ", ".join(dict.fromkeys(base_name(c) for c in clusters)))
        named[name] = _price(text, name)
    missing = [c for c in clusters if c not in named and base_name(c) not in named]
    if missing:
        raise InputError("gpu_hour_price", value, "a price for every cluster (missing: " + ", ".join(missing)
                         + "), or one number for all")
    return {c: named.get(c, named.get(base_name(c))) for c in clusters}


def base_name(cluster: str) -> str:
    """The catalog cluster (or file) a variant ``BASE:key=value`` varies; the name itself otherwise."""
    return cluster.partition(":")[0] if ":" in cluster and not cluster.startswith("emulated:") else cluster


def board_power_W(cluster: str) -> float | None:
    """The board power (TDP) of one GPU of ``cluster`` (GPU catalog), or None where unknown."""
    return device(load_spec(cluster)[0]["gpu"]).board_power_W


def training_cost(row: dict, tokens: float, tokens_per_step: int, price: float | None,
                  power_W: float | None) -> dict:
    """The cost columns (module doc) of one search row (``step_time_s``, ``gpus``)."""
    steps = math.ceil(tokens / tokens_per_step * row.get("steps_inflation", 1.0))
    time_s = steps * row["step_time_s"]
    gpu_hours = row["gpus"] * time_s / 3600.0
    out = {"steps": steps, "time_to_train_s": time_s, "gpu_hours": gpu_hours}
    if price is not None:
        out["cost_usd"] = gpu_hours * price
    out["energy_kWh"] = row["gpus"] * power_W * time_s / 3.6e6 if power_W is not None else None
    return out


def pareto_front(rows: list, keys: tuple) -> list:
    """Rows no other row beats: a row is off the front when another is no worse on every key of
    ``keys`` (smaller is better) and better on one, or equal on all and earlier (a tie shows once).
    In the order of ``keys`` (by the first, then the next)."""
    front: list = []
    for r in sorted(rows, key=lambda r: tuple(r[k] for k in keys)):
        if not any(all(f[k] <= r[k] for k in keys) for f in front):
            front.append(r)
    return front


def dominated(row: dict, by: dict, keys: tuple) -> bool:
    """Whether ``by`` is no worse than ``row`` on every key and better on one."""
    return all(by[k] <= row[k] for k in keys) and any(by[k] < row[k] for k in keys)
