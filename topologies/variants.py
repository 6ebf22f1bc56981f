"""Cluster variants: a catalog cluster (or a cluster file) with some builder arguments changed.

A variant is named ``BASE:key=value,key=value`` (``dgx-a100:gpus_per_node=4,nic_Gbps=100``), the
way ``emulated:hosts=4,bandwidth=1gbit`` names an emulated cluster, so it goes wherever a cluster
name does and is cached like one. A key is an argument of the base cluster's node or fabric builder
(``nic_Gbps``, ``oversubscription``, ``radix``, ``nvlink_GBps``, ...; case-insensitive, or written
``node.KEY`` / ``fabric.KEY``) or ``gpus_per_node`` (the node's ``gpus``). Values are checked
against the same declared bounds as a cluster file's. Two arguments follow their leader where they
were equal to it in the base cluster, so a what-if keeps the node's shape: ``nics`` follows ``gpus``
(one NIC per GPU stays one NIC per GPU) and the fabric's ``link_Gbps`` follows ``nic_Gbps`` (the
fabric is built for its NICs). A grid (``topologies.catalog.grid_names``) is the product of several values per key.
"""
from __future__ import annotations

import inspect
import math

from topologies.errors import InputError
from topologies.fabrics import FABRIC_BUILDERS
from topologies.nodes import NODE_BUILDERS

ALIASES = {"gpus_per_node": "node.gpus"}
FOLLOWERS = {"node.gpus": "node.nics", "node.nic_Gbps": "fabric.link_Gbps"}
SECTIONS = {"node": NODE_BUILDERS, "fabric": FABRIC_BUILDERS}
NOT_VARIED = {"tier_prefix", "intra_tier"}      # names, not quantities
MAX_VARIANTS = 256      # clusters one grid makes: each is a search of its own


def builder_keys(spec: dict, section: str) -> dict[str, inspect.Parameter]:
    """The keyword arguments of the builder of ``spec[section]`` that a variant may change."""
    params = inspect.signature(SECTIONS[section][spec[section]["builder"]]).parameters
    return {k: p for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k not in NOT_VARIED}


def allowed_keys(spec: dict) -> list[str]:
    keys = [a for a, target in ALIASES.items() if _exists(spec, target)]
    return keys + [k for s in SECTIONS for k in builder_keys(spec, s)]


def _exists(spec: dict, dotted: str) -> bool:
    section, _, key = dotted.partition(".")
    return key in builder_keys(spec, section)


def resolve(spec: dict, key: str, field: str = "cluster") -> str:
    """``section.key`` of a variant key on ``spec`` (module doc), or one line naming what is allowed."""
    dotted = ALIASES.get(key.lower(), key)
    if "." in dotted:
        section, _, name = dotted.partition(".")
        found = [f"{section}.{k}" for k in builder_keys(spec, section)
                 if k.lower() == name.lower()] if section in SECTIONS else []
    else:
        found = [f"{s}.{k}" for s in SECTIONS for k in builder_keys(spec, s) if k.lower() == dotted.lower()]
    if len(found) != 1:
        raise InputError(field, key, f"a builder argument of {spec['name']} "
                         f"(node {spec['node']['builder']}, fabric {spec['fabric']['builder']}): "
                         + ", ".join(allowed_keys(spec)))
    return found[0]


def _value(spec: dict, dotted: str, text: str, field: str):
    section, _, key = dotted.partition(".")
    param = builder_keys(spec, section)[key]
    current = spec[section].get(key, param.default)
    kind = type(current) if current is not inspect.Parameter.empty else None
    hint = str(param.annotation)
    if kind is bool or hint == "bool":
        if text.lower() not in ("true", "false"):
            raise InputError(field, text, "true or false")
        return text.lower() == "true"
    try:
        number = float(text)
    except ValueError:
        raise InputError(field, text, "a number") from None
    if not math.isfinite(number):
        raise InputError(field, text, "a finite number")
    if kind is int or hint == "int":
        if number != int(number):
            raise InputError(field, text, "a whole number")
        return int(number)
    return number


def apply(spec: dict, options: dict[str, str], name: str) -> dict:
    """A new spec: ``spec`` with ``options`` (variant key -> value text) applied (module doc)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in spec.items()}
    sources = dict(spec.get("sources", {}))
    for key, text in options.items():
        dotted = resolve(spec, key)
        value = _value(spec, dotted, text, f"cluster.{key}")
        section, _, arg = dotted.partition(".")
        follower = FOLLOWERS.get(dotted)
        if follower:
            f_section, _, f_arg = follower.partition(".")
            if f_arg in spec[f_section] and spec[f_section][f_arg] == spec[section].get(arg):
                out[f_section][f_arg] = value
                sources[follower] = f"variant of {spec['name']}: follows {dotted} ({key}={text})"
        out[section][arg] = value
        sources[dotted] = f"variant of {spec['name']}: {key}={text} (a what-if, not a measured system)"
    out.update(name=name, description=f"{spec['description']} [variant: {name.partition(':')[2]}]",
               sources=sources)
    return out


def parse_options(text: str, field: str = "cluster") -> dict[str, str]:
    """``key=value,key=value`` -> {key: value}; each key once."""
    out: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise InputError(field, item, "key=value items separated by commas, e.g. dgx-a100:nic_Gbps=100")
        if key in out:
            raise InputError(field, item, f"each key once ({key} repeats)")
        out[key] = value
    return out


def parse_grid(text: str) -> dict[str, list[str]]:
    """``gpus_per_node=4,8 nic_Gbps=100,200`` (items separated by spaces or ``;``) -> {key: [values]}."""
    out: dict[str, list[str]] = {}
    for item in text.replace(";", " ").split():
        key, sep, values = item.partition("=")
        names = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key or not names:
            raise InputError("cluster_grid", item, "key=value,value,... items separated by spaces, "
                             "e.g. 'gpus_per_node=4,8 nic_Gbps=100,200 oversubscription=1,2'")
        if key in out:
            raise InputError("cluster_grid", item, f"each key once ({key} repeats)")
        out[key] = list(dict.fromkeys(names))
    if not out:
        raise InputError("cluster_grid", text, "at least one key=value,value,... item")
    return out
