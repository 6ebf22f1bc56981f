"""``perfmodel advise``: will compression pay off on this job? (``perfmodel.explore.advise``)."""
from __future__ import annotations

from perfmodel.cli.common import EPILOG, RAW, cluster_args, plan_args, request
from topologies.clikit import atomic_write, dump_json


def add_advise(sub) -> None:
    p = sub.add_parser("advise", help="will compression pay off on this job: every preset and per-axis "
                       "candidate ranked, with an uncertainty band and why not",
                       description="Predict the job uncompressed and under every applicable compression preset "
                       "and per-axis candidate; rank them by speedup in time to the uncompressed loss, each with "
                       "an uncertainty band (the model's error on published runs of the nearest regime, or the "
                       "--calibration profile's own fit error), its memory delta, its accuracy cost (steps "
                       "inflation), a verdict (pays, negligible under 2%%, within error, no) and, where it does "
                       "not pay, why not (compute-bound, hidden by overlap, intra-node only, codec kernels "
                       "dearer than the wire time saved, the steps its error adds, memory); the best lossy option "
                       "says the codec throughput that would give 1.10x. The job's other uncompressed plans "
                       "of the same pipeline depth are timed too: a faster one is said first.",
                       epilog=EPILOG, formatter_class=RAW)
    cluster_args(p)
    plan_args(p)
    p.add_argument("--policies", help="the candidates instead of every applicable preset and per-axis spec "
                   "(policies separated by semicolons: 'zeropp;dp=int8;loco')")
    p.add_argument("--markdown", metavar="FILE.md", help="also write the advice as a Markdown report")
    p.add_argument("--waterfall", metavar="FILE.png", help="draw the step before and after the best option "
                   "(or --option) as a waterfall of the breakdown's changes (.png, .svg or .pdf)")
    p.add_argument("--option", metavar="POLICY", help="the option --waterfall draws (default: the best ranked)")
    p.add_argument("--no-plan-check", action="store_true",
                   help="do not time the job's other uncompressed plans")


def run_advise(args) -> None:
    from perfmodel.compression.policy import split_policies
    from perfmodel.explore.advise import advise
    from perfmodel.report.advise import advise_markdown, advise_report, plot_waterfall
    from perfmodel.report.plots import check_picture
    from topologies.clikit import check_writable

    check_picture(args.waterfall, "waterfall")
    if args.markdown:
        check_writable(args.markdown, "markdown")
    policies = split_policies(args.policies) if args.policies else None
    plan, options = request(args)
    result = advise(args.model, args.cluster, plan, options, policies=policies, check_plans=not args.no_plan_check)
    if args.markdown:
        text = advise_markdown(result)
        atomic_write(args.markdown, lambda h: h.write(text.encode()))
    if args.waterfall:
        plot_waterfall(result, args.waterfall, args.option)
    print(dump_json(result.to_dict()) if args.json else advise_report(result))


COMMANDS = {"advise": (add_advise, run_advise)}
