"""``perfmodel``: predict collectives (and, later, training steps) with compression."""
from __future__ import annotations

import sys

from perfmodel.collective import DTYPES, OPS
from perfmodel.sweep import parse_compressors, parse_sweep, sweep
from topologies.clikit import Parser, dump_json, run, table
from topologies.units import format_size, parse_size

EPILOG = """examples:
  perfmodel collective allreduce --cluster dgx-h100 --nodes 4 --size 1GiB --compressor int8
  perfmodel collective allreduce --cluster dgx-a100 --nodes 2 --sweep 1MiB:1GiB \\
      --compressor "none,fp16,int8,topk(0.01)"
  perfmodel collective allgather --cluster lassen --gpus 64 --size 256MiB --json
"""


def _parser() -> Parser:
    p = Parser(prog="perfmodel", description="Predict the cost of compressed communication "
               "in LLM training on a cluster.", epilog=EPILOG,
               formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    c = sub.add_parser("collective", help="time one collective, compressed or not (nccl-tests style)",
                       description="Predict a collective's time, algbw and busbw (nccl-tests "
                       "definitions), the algorithm that wins, wire bytes per tier, kernel time "
                       "and error estimate, for one or several compressors.",
                       epilog=EPILOG, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    c.add_argument("op", choices=OPS, help="the collective")
    c.add_argument("--cluster", default="dgx-a100", help="catalog name or cluster TOML path")
    size = c.add_mutually_exclusive_group()
    c.add_argument("--nodes", type=int, help="nodes of the cluster (default: the catalog's)")
    c.add_argument("--gpus", type=int, help="GPUs in the cluster: a multiple of GPUs per node")
    size.add_argument("--size", default="1GiB", help="message size: 4096, 64KiB, 256MiB, 1GB")
    size.add_argument("--sweep", metavar="MIN:MAX", help="doubling sizes from MIN to MAX")
    c.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="element type (default fp32)")
    c.add_argument("--compressor", default="none",
                   help="spec or comma-separated specs, e.g. 'none,int8,ef(topk(0.01))+int8'")
    c.add_argument("--algorithm", default="auto", help="ring, tree, recursive_doubling, "
                   "hierarchical, nvls, allgather, two_phase, direct, or auto (default)")
    c.add_argument("--chunks", default="auto", help="pipelining chunks: an integer or auto")
    c.add_argument("--placement", default="packed", choices=("packed", "spread"))
    c.add_argument("--json", action="store_true", help="print a JSON list of records")
    return p


def _chunks(text):
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        return text  # collective_time names the field and what is allowed


HEAD = ("size", "count", "type", "compressor", "algorithm", "proto", "chunks", "time_us",
        "algbw", "busbw", "wire_bytes", "ratio", "speedup", "error")


def _row(r) -> tuple:
    return (format_size(r.size_bytes), r.count, r.dtype, r.compressor, r.algorithm, r.protocol,
            r.chunks, r.time_s * 1e6, r.algbw_GBps, r.busbw_GBps, int(r.wire_bytes_total),
            r.compression_ratio, r.speedup_vs_none, r.error_estimate)


def _speedup_matrix(records, compressors) -> str:
    by = {(r.size_bytes, r.compressor): r for r in records}
    sizes = sorted({r.size_bytes for r in records})
    rows = [(format_size(s),) + tuple(by[(s, c)].speedup_vs_none for c in compressors) for s in sizes]
    title = "# speedup over uncompressed (best NCCL algorithm)"
    return table(("size",) + tuple(compressors), rows, title=title)


def _collective(args) -> None:
    sizes = parse_sweep(args.sweep) if args.sweep else [parse_size(args.size)]
    compressors = parse_compressors(args.compressor)
    records = sweep(args.op, sizes, compressors, cluster=args.cluster, nodes=args.nodes, gpus=args.gpus,
                    algorithm=args.algorithm, dtype=args.dtype, chunks=_chunks(args.chunks),
                    placement=args.placement)
    if args.json:
        print(dump_json([r.to_dict() for r in records]))
        return
    first = records[0]
    print(f"# perfmodel collective {args.op}: cluster={first.cluster} nodes={first.nodes} "
          f"gpus={first.gpus} dtype={args.dtype} algorithm={args.algorithm}")
    print("# time_us, algbw and busbw (GB/s) as nccl-tests; wire_bytes sent per rank; "
          "error = relative RMS error (unit-Gaussian data)")
    print(table(HEAD, [_row(r) for r in records]))
    if len(compressors) > 1:
        print()
        print(_speedup_matrix(records, compressors))


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "collective":
        _collective(args)
    return 0


def entry() -> None:
    sys.exit(run(main))
