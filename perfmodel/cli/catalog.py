"""``perfmodel catalog``: the GPUs, models, clusters, compressors, libraries, policy presets, precisions
and codec kernel costs the model knows.

  perfmodel catalog codecs                   # published kernel measurements, and every kernel on A100 and H100
  perfmodel catalog codecs --gpu b200 --json
"""
from __future__ import annotations

from perfmodel.report.text import catalog_report
from topologies.clikit import dump_json, table
from topologies.errors import InputError

KINDS = ("gpus", "models", "clusters", "compressors", "libraries", "policies", "precisions", "codecs", "all")
DEFAULT_GPUS = ("a100-sxm-80gb", "h100-sxm")


def add_catalog(sub) -> None:
    ca = sub.add_parser("catalog", help="what the model knows: GPUs, models, clusters, compressors, libraries, "
                        "policy presets, precisions, codec kernel costs")
    ca.add_argument("kind", nargs="?", default="all", choices=KINDS)
    ca.add_argument("--gpu", default=None, help="codecs: the GPU (gpus.toml key) whose kernel costs to list "
                    f"(default: {', '.join(DEFAULT_GPUS)})")
    ca.add_argument("--json", action="store_true", help="codecs: print the measurements and the kernel costs as JSON")


def codec_catalog(gpus: tuple) -> dict:
    """The published codec kernel measurements (catalog/codec_kernels.toml) and every kernel's cost on each
    of ``gpus``: {"measurements": [...], "costs": {gpu: [...]}}."""
    from perfmodel.compression.kernel_costs import kernel_costs
    from perfmodel.compression.kernels import codec_kernels

    return {"measurements": [c.to_dict() for c in codec_kernels()],
            "costs": {g: [k.to_dict() for k in kernel_costs(g)] for g in gpus}}


def _num(value) -> object:
    return "-" if value is None else round(value)


def codec_report(data: dict) -> str:
    """``codec_catalog``'s answer as text: the measurements with their sources, then one table per GPU."""
    from perfmodel.compression.grammar import _fmt

    def name(m: dict) -> str:
        shown = ",".join(f"{k}={_fmt(v)}" for k, v in m["match"].items())
        return m["family"] + (f"({shown})" if shown else "")

    rows = [(name(m), m["gpu"], _num(m["compress_GBps"]), _num(m["decompress_GBps"]), m["implementation"][:60])
            for m in data["measurements"]]
    parts = [table(("kernel", "measured on", "compress GB/s", "decompress GB/s", "implementation"), rows,
                   title="# published codec kernel measurements (sources: --json, docs/codec-costs.md)")]
    for gpu, costs in data["costs"].items():
        rows = [(c["kernel"], _num(c["compress_GBps"]), _num(c["decompress_GBps"]), c["compress"], c["decompress"])
                for c in costs]
        parts.append(table(("kernel", "compress GB/s", "decompress GB/s", "compress basis", "decompress basis"),
                           rows, title=f"# {gpu}: kernel throughput of fp32 input as the model prices it"))
    return "\n\n".join(parts)


def run_catalog(args) -> None:
    if args.kind not in ("codecs", "all") and (args.json or args.gpu):
        raise InputError("--json/--gpu", args.kind, "the codecs catalog (perfmodel catalog codecs --gpu KEY --json)")
    if args.kind == "codecs":
        data = codec_catalog((args.gpu,) if args.gpu else DEFAULT_GPUS)
        print(dump_json(data) if args.json else codec_report(data))
        return
    if args.json:
        raise InputError("--json", args.kind, "the codecs catalog (perfmodel catalog codecs --json)")
    text = catalog_report(args.kind)
    if args.kind == "all":
        text += "\n\n" + codec_report(codec_catalog((args.gpu,) if args.gpu else DEFAULT_GPUS))
    print(text)


COMMANDS = {"catalog": (add_catalog, run_catalog)}
