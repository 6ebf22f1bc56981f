"""``perfmodel breakeven``: the kernel throughput at which a policy reaches a target speedup."""
from __future__ import annotations

from perfmodel.cli.common import POLICY_HELP, RAW, cluster_args, plan_args, request
from topologies.clikit import dump_json
from topologies.errors import InputError

BREAKEVEN_EPILOG = """examples:
  perfmodel breakeven --model gpt-neox-20b --cluster lassen --gpus 192 --tp 4 --pp 4 --mbs 4 --gbs 1056 \\
      --zero 1 --recompute full --policy hybrid --target +12.7% --library mpi
  perfmodel breakeven ... --policy 'naive:zfp(rate=8)' --target 1.05 --families zfp --json

The throughput is what a calibration profile's kernels section gives a spec: GB/s of uncompressed
bytes per direction; decompression scales with compression at the spec's own ratio of the two.
"""


def add_breakeven(sub) -> None:
    b = sub.add_parser("breakeven", help="kernel throughput at which a policy reaches a target speedup",
                       description="Solve for the codec kernel throughput (GB/s, compress and decompress scaled "
                       "together) at which the policy's predicted speedup over the same plan uncompressed reaches "
                       "--target (Brent's method over throughput), or say it cannot be reached at any throughput "
                       "and give the limit as the throughput grows without bound.", epilog=BREAKEVEN_EPILOG,
                       formatter_class=RAW)
    cluster_args(b)
    plan_args(b)
    b.add_argument("--policy", default="hybrid", help=POLICY_HELP + " (default: hybrid)")
    b.add_argument("--target", required=True, help="target speedup: a gain in percent (+12.7%%) or a ratio (1.127)")
    b.add_argument("--families", default="zfp", help="compressor families whose kernels are scaled, comma-separated, "
                   "or all (default: zfp)")


def run_breakeven(args) -> None:
    from perfmodel.explore.breakeven import breakeven, parse_target

    parse_target(args.target)
    for name in ("trace", "timeline", "plot"):
        if getattr(args, name):
            raise InputError(name, getattr(args, name), "not with breakeven (it draws no step)")
    plan, options = request(args, args.policy)
    r = breakeven(args.model, args.cluster, args.target, plan, options, families=args.families)
    print(dump_json(r.to_dict()) if args.json else _breakeven_report(r))


def _breakeven_report(r) -> str:
    own = "; ".join(f"{s}: {c:.4g} GB/s compress, {d:.4g} decompress" for s, (c, d) in r.model_GBps.items())
    lines = [f"# break-even kernel throughput: {r.model} on {r.cluster}, policy {r.policy}, library {r.library}",
             f"# scaled ({', '.join(r.families)}): {own} (the model's own, fp32)",
             f"# speedup with the model's own kernels: {r.model_speedup:.4f}; as throughput -> infinity: "
             f"{r.limit_speedup:.4f}"]
    gain = f"{r.target_speedup:.4f} ({r.target_speedup - 1:+.1%})"
    if r.reachable:
        lines.append(f"target speedup {gain}: reached at {r.compress_GBps:.4g} GB/s compress "
                     f"({r.decompress_GBps:.4g} GB/s decompress): speedup {r.speedup_at_solution:.4f}")
    else:
        lines.append(f"target speedup {gain}: not reachable at any kernel throughput (limit {r.limit_speedup:.4f}, "
                     f"{r.limit_speedup - 1:+.1%})")
    return "\n".join(lines)


COMMANDS = {"breakeven": (add_breakeven, run_breakeven)}
