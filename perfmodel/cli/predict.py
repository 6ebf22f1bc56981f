"""``perfmodel predict`` (one step) and ``perfmodel compare`` (one plan under several policies)."""
from __future__ import annotations

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

    check_picture(args.plot)
    r = predict(args.model, args.cluster, *request(args, args.policy))
    if args.plot:
        plot_breakdown([r], args.plot)
    say_idle([r])
    print(dump_json(r.to_dict()) if args.json else step_report(r))


def run_compare(args) -> None:
    from perfmodel.report.plots import check_picture, plot_breakdown

    check_picture(args.plot)
    records = compare(args.model, args.cluster, args.policies, *request(args))
    if args.plot:
        plot_breakdown(records, args.plot)
    say_idle(records)
    print(dump_json([r.to_dict() for r in records]) if args.json else compare_report(records))


COMMANDS = {"predict": (add_predict, run_predict), "compare": (add_compare, run_compare)}
