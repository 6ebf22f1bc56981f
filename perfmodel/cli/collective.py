"""``perfmodel collective``: one collective's time, compressed or not, as nccl-tests reports it."""
from __future__ import annotations

import argparse

from perfmodel.cli.common import EPILOG, LIBRARY_HELP, RAW
from perfmodel.collectives.predict import DTYPES
from perfmodel.collectives.registry import OPS
from perfmodel.collectives.sweep import parse_compressors, parse_sweep, sweep_collectives
from topologies.clikit import dump_json, table
from topologies.units import format_size, parse_size


def _chunks(text):
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        return text  # collective_time names the field and what is allowed


HEAD = ("size", "count", "type", "compressor", "algorithm", "proto", "chunks", "time_us",
        "algbw", "busbw", "sent_bytes", "ratio", "speedup", "error")


NCCL_TYPES = {"float": "fp32", "half": "fp16", "bfloat16": "bf16"}   # nccl-tests' -d names
NCCL_NAME = {v: k for k, v in NCCL_TYPES.items()}


def _dtype(text: str) -> str:
    dtype = NCCL_TYPES.get(text, text)
    if dtype not in DTYPES:
        raise argparse.ArgumentTypeError(f"{text!r}: float, half or bfloat16 (or fp32, fp16, bf16)")
    return dtype


def _row(r) -> tuple:
    return (r.size_bytes, r.count, NCCL_NAME.get(r.dtype, r.dtype), r.compressor, r.algorithm, r.protocol,
            r.chunks, r.time_s * 1e6, r.algbw_GBps, r.busbw_GBps, int(r.sent_bytes),
            r.compression_ratio, r.speedup_vs_none, r.error_estimate)


def _speedup_matrix(records, compressors) -> str:
    by = {(r.size_bytes, r.compressor): r for r in records}
    sizes = sorted({r.size_bytes for r in records})
    rows = [(format_size(s),) + tuple(by[(s, c)].speedup_vs_none for c in compressors) for s in sizes]
    title = "# speedup over uncompressed (the library's best algorithm)"
    return table(("size",) + tuple(compressors), rows, title=title)


def add_collective(sub) -> None:
    c = sub.add_parser("collective", help="time one collective, compressed or not (nccl-tests style)",
                       description="Predict a collective's time, algbw and busbw (nccl-tests definitions), "
                       "the algorithm that wins, wire bytes per tier, kernel time and error estimate, "
                       "for one or several compressors.", epilog=EPILOG, formatter_class=RAW)
    c.add_argument("op", choices=OPS, help="the collective")
    c.add_argument("--cluster", default="dgx-a100", help="catalog name or cluster TOML path")
    c.add_argument("--nodes", type=int, help="nodes of the cluster (default: the catalog's)")
    c.add_argument("--gpus", type=int, help="GPUs in the job (a partial last node where not a multiple of GPUs "
                   "per node)")
    size = c.add_mutually_exclusive_group()
    size.add_argument("--size", default="1GiB", help="message size: 4096, 64KiB, 256MiB, 1GB")
    size.add_argument("--sweep", metavar="MIN:MAX", help="doubling sizes from MIN to MAX")
    c.add_argument("--dtype", type=_dtype, default="fp32", metavar="TYPE",
                   help="element type, nccl-tests' names (float, half, bfloat16) or fp32, fp16, bf16 (default float)")
    c.add_argument("--compressor", default="none",
                   help="spec or comma-separated specs, e.g. 'none,int8,ef(topk(0.01))+int8'")
    c.add_argument("--algorithm", default="auto", help="ring, tree, recursive_doubling, "
                   "hierarchical, nvls, allgather, two_phase, direct, or auto (default)")
    c.add_argument("--chunks", default="auto", help="pipelining chunks: an integer or auto")
    c.add_argument("--placement", default="packed", choices=("packed", "spread"))
    c.add_argument("--calibration", help="calibration profile JSON (see docs/design.md, 'Calibration')")
    c.add_argument("--library", default="nccl", help=LIBRARY_HELP)
    c.add_argument("--json", action="store_true", help="print a JSON list of records")
    c.add_argument("--plot", metavar="FILE.png", help="draw busbw and speedup against size per compressor "
                   "(with --sweep; .png, .svg or .pdf)")


def run_collective(args) -> None:
    from perfmodel.report.plots import check_picture

    check_picture(args.plot)
    sizes = parse_sweep(args.sweep) if args.sweep else [parse_size(args.size)]
    compressors = parse_compressors(args.compressor)
    records = sweep_collectives(args.op, sizes, compressors, cluster=args.cluster, nodes=args.nodes, gpus=args.gpus,
                    algorithm=args.algorithm, dtype=args.dtype, chunks=_chunks(args.chunks),
                    placement=args.placement, calibration=args.calibration, library=args.library)
    if args.plot:
        from perfmodel.report.plots import plot_collectives

        plot_collectives(records, args.plot, f"{args.op} on {records[0].cluster} ({records[0].gpus} GPUs)")
    if args.json:
        print(dump_json([r.to_dict() for r in records]))
        return
    first = records[0]
    print(f"# perfmodel collective {args.op}: cluster={first.cluster} nodes={first.nodes} "
          f"gpus={first.gpus} dtype={NCCL_NAME.get(args.dtype, args.dtype)} algorithm={args.algorithm} "
          f"library={args.library}")
    print("# size in bytes, time_us, algbw and busbw (GB/s) as nccl-tests; sent_bytes = payload bytes one rank sends; "
          "error = relative RMS error (unit-Gaussian data)")
    print(table(HEAD, [_row(r) for r in records]))
    if len(compressors) > 1:
        print()
        print(_speedup_matrix(records, compressors))


COMMANDS = {"collective": (add_collective, run_collective)}
