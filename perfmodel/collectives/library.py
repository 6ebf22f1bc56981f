"""Collective-library profiles (``catalog/libraries.toml``): what ``auto`` weighs and at which constants.

A ``Library`` names, per op, the algorithms ``auto`` chooses among for uncompressed and reducible
payloads (``auto``) and for payloads that cannot be summed as sent (``compressed``; empty: every
algorithm the model prices), and per tier class its protocols (per-message base and step latency,
bandwidth fraction, an optional absolute cap). ``nccl`` is the default and keeps NCCL's tables
(``catalog/protocols.toml`` with the per-architecture NVLink caps); ``mpi`` is a GPU-aware MPI
(MVAPICH2-GDR-like: ring and Rabenseifner all-reduce, eager and rendezvous protocols). Every
perfmodel command that prices collectives takes ``--library NAME``; a calibration profile's
``protocols`` override the chosen library's constants (``perfmodel.calibration.profile``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from perfmodel.devices import Protocol, protocol_table, read_catalog
from topologies.errors import InputError
from topologies.units import us_to_s

DEFAULT = "nccl"


@dataclass(frozen=True, kw_only=True, eq=False)
class Library:
    name: str
    doc: str
    auto: dict          # {op: (algorithm, ...)} weighed by 'auto' for ordinary payloads
    compressed: dict    # {op: (algorithm, ...)} weighed for non-reducible payloads; missing op: all
    protocols: dict     # {tier class: {protocol name: Protocol}}
    nccl_caps: bool     # NCCL's per-architecture NVLink terms (catalog/nccl_arch.toml) and NVLS apply

    def table(self, tier_class: str) -> dict:
        """{protocol name: Protocol} of ``tier_class`` (a class the library lacks is an error)."""
        if tier_class not in self.protocols:
            raise InputError("tier class", tier_class, f"one of {', '.join(self.protocols)} ({self.name})")
        return self.protocols[tier_class]

    def protocol_names(self) -> tuple:
        """Every protocol name some class of the library has, in catalog order."""
        return tuple(dict.fromkeys(n for table in self.protocols.values() for n in table))


def _protocols(body: dict) -> dict:
    out = {}
    for cls, protos in body.items():
        out[cls] = {name: Protocol(name=name, base_s=us_to_s(p["base_us"]), step_s=us_to_s(p["step_us"]),
                                   bw_fraction=p["bw_fraction"], max_Bps=p.get("max_GBps", math.inf) * 1e9)
                    for name, p in protos.items()}
    return out


@cache
def libraries() -> dict[str, Library]:
    out = {}
    for name, body in read_catalog("libraries").items():
        nccl = body.get("protocols") == "protocols.toml"
        out[name] = Library(name=name, doc=" ".join(body["doc"].split()),
                            auto={op: tuple(a) for op, a in body["auto"].items()},
                            compressed={op: tuple(a) for op, a in body.get("compressed", {}).items()},
                            protocols=protocol_table() if nccl else _protocols(body["protocols"]),
                            nccl_caps=nccl)
    return out


def library(name: str | None) -> Library:
    """The profile called ``name`` (None: the default); an unknown name is an InputError."""
    found = libraries()
    key = DEFAULT if name is None else name
    if key not in found:
        raise InputError("library", name, "one of " + ", ".join(found))
    return found[key]
