"""``perfmodel sweep``: every valid plan under each policy, ranked."""
from __future__ import annotations

from perfmodel.cli.common import EPILOG, RAW, cluster_args, plan_args, plan_kwargs
from perfmodel.explore.sweep import sweep_plans
from perfmodel.report.text import sweep_csv, sweep_table
from topologies.clikit import Progress, atomic_write, check_writable, dump_json, positive_int
from topologies.errors import InputError


def add_sweep(sub) -> None:
    sw = sub.add_parser("sweep", help="every valid plan x policies, ranked",
                        description="Every valid (tp, pp, dp, mbs, zero) plan under each policy; prints the "
                        "top plans and writes all to --csv.", epilog=EPILOG, formatter_class=RAW)
    cluster_args(sw)
    plan_args(sw, sweep=True)
    sw.add_argument("--policies", default="none,hybrid", help="policies separated by commas or semicolons "
                    "(as in compare)")
    sw.add_argument("--max-mbs", type=positive_int, default=8, help="largest microbatch size tried (>= 1)")
    sw.add_argument("--top", type=positive_int, default=10, help="rows in the table (>= 1)")
    sw.add_argument("--csv", help="write every evaluated (plan, policy) to this CSV")


def run_sweep(args) -> None:
    if args.csv:
        check_writable(args.csv, "csv")
    kw = plan_kwargs(args, sweep=True)
    gbs = kw.pop("gbs")
    if gbs is None:
        raise InputError("gbs", None, "a global batch size: --gbs, or a --from file that gives one")
    for key in ("gpus", "nodes"):
        kw.pop(key)
    result = sweep_plans(args.model, args.cluster, gpus=args.gpus, nodes=args.nodes, gbs=gbs,
                         policies=args.policies, max_mbs=args.max_mbs, recompute=args.recompute,
                         progress=Progress("plans"), **kw)
    if args.csv:
        atomic_write(args.csv, lambda h: h.write(sweep_csv(result.records)))
    if args.json:
        print(dump_json([r.to_dict() for r in result.records[:args.top]]))
        return
    print(f"# {args.model} on {args.cluster}: {result.plans} candidate plans, {result.skipped_oom} do not fit, "
          f"{result.evaluated} (plan, policy) predictions" + (f"; all in {args.csv}" if args.csv else ""))
    print(sweep_table(result.records, args.top) if result.records else "no plan fits; try --recompute any")


COMMANDS = {"sweep": (add_sweep, run_sweep)}
