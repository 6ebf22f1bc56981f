"""``perfmodel catalog``: the GPUs, models, clusters, compressors, libraries, policy presets and
precisions the model knows."""
from __future__ import annotations

from perfmodel.report.text import catalog_report

KINDS = ("gpus", "models", "clusters", "compressors", "libraries", "policies", "precisions", "all")


def add_catalog(sub) -> None:
    ca = sub.add_parser("catalog", help="what the model knows: GPUs, models, clusters, compressors, libraries, "
                        "policy presets, precisions")
    ca.add_argument("kind", nargs="?", default="all", choices=KINDS)


def run_catalog(args) -> None:
    print(catalog_report(args.kind))


COMMANDS = {"catalog": (add_catalog, run_catalog)}
