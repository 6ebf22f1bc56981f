"""``perfmodel predict`` (one step) and ``perfmodel compare`` (one plan under several policies)."""
from __future__ import annotations

import sys

from perfmodel.cli.common import EPILOG, POLICY_HELP, RAW, cluster_args, plan_args, request, say_idle
from perfmodel.prediction import compare, predict
from perfmodel.report.text import compare_report, step_report
from topologies.clikit import dump_json


def add_predict(sub) -> None:
    pr = sub.add_parser("predict", help="one training step: time, breakdown, TFLOPS, speedup",
                        description="Predict one training step of a model on a cluster under a parallel "
                        "plan and a compression policy.", epilog=EPILOG, formatter_class=RAW)
    cluster_args(pr)
    plan_args(pr)
    pr.add_argument("--policy", default="none", help=POLICY_HELP)
    pr.add_argument("--export-chakra", metavar="DIR",
                    help="also write the step as Chakra execution traces for ASTRA-sim (DIR/commpress.<rank>.et, "
                    "one per rank, and DIR/comm_group.json): compute from the model, every collective at its "
                    "compressed size, the compressor in an attribute (needs the protobuf package: the "
                    "'export' extra; docs/export.md)")
    pr.add_argument("--export-simai", metavar="FILE",
                    help="also write the step as a SimAI (AICB) workload file: stage 0's layer pieces with "
                    "compute in ns and compressed comm sizes, the compressor in each row's name (docs/export.md)")


def add_compare(sub) -> None:
    cp = sub.add_parser("compare", help="several policies side by side on one plan",
                        description="The same plan under several compression policies, side by side.",
                        epilog=EPILOG, formatter_class=RAW)
    cluster_args(cp)
    plan_args(cp)
    cp.add_argument("--policies", default="none,naive:int8,hybrid",
                    help="policies separated by commas (AXIS=SPEC items attach to the policy before "
                    "them) or by semicolons: 'none;dp=int8;hybrid'")


def run_predict(args) -> None:
    from perfmodel.report.plots import check_picture, plot_breakdown

    from perfmodel.report.export import check_exports

    check_picture(args.plot)
    check_exports(args.export_chakra, args.export_simai)
    plan, options = request(args, args.policy)
    r = predict(args.model, args.cluster, plan, options)
    if args.plot:
        plot_breakdown([r], args.plot)
    say_idle([r])
    _export(args, plan, options)
    print(dump_json(r.to_dict()) if args.json else step_report(r))


def _export(args, plan, options) -> None:
    """``--export-chakra`` and ``--export-simai``: the files, and one line each on stderr."""
    from perfmodel.report.export import describe, export_chakra, export_simai

    if args.export_chakra:
        for line in describe(export_chakra(args.export_chakra, args.model, args.cluster, plan, options), "chakra"):
            print(f"perfmodel: {line}", file=sys.stderr)
    if args.export_simai:
        for line in describe(export_simai(args.export_simai, args.model, args.cluster, plan, options), "simai"):
            print(f"perfmodel: {line}", file=sys.stderr)


def run_compare(args) -> None:
    from perfmodel.report.plots import check_picture, plot_breakdown

    check_picture(args.plot)
    records = compare(args.model, args.cluster, args.policies, *request(args))
    if args.plot:
        plot_breakdown(records, args.plot)
    say_idle(records)
    print(dump_json([r.to_dict() for r in records]) if args.json else compare_report(records))


COMMANDS = {"predict": (add_predict, run_predict), "compare": (add_compare, run_compare)}
