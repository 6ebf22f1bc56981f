"""``perfmodel search``: the best plan and compression under an error budget, and the Pareto front."""
from __future__ import annotations

import os
import sys

from perfmodel.cli.common import FROM_HELP, LIBRARY_HELP, RAW, FromAction, batch_size, bounded, track_given
from perfmodel.explore.executors import EXECUTORS
from perfmodel.report.text import plan_text
from topologies import bounds
from topologies.clikit import Progress, atomic_write, check_writable, dump_json, positive_int
from topologies.errors import InputError

SEARCH_EPILOG = """examples:
  perfmodel search --model gpt3-175b --cluster dgx-a100 --gpus 1024 --gbs 1536
  perfmodel search --model gpt3-1.3b --cluster commodity-25g --gpus 32 --gbs 256 \
      --candidates "dp=none|int8|ef(topk(0.01))+int8;tp=none|fp16" --max-error tp=0.001 \
      --csv all.csv --plot pareto.png
  perfmodel search --model llama2-70b --cluster dgx-a100,dgx-h100 --gpus 512 --gbs 1024 --recompute any \
      --tokens 1e12 --gpu-hour-price dgx-a100=1.8,dgx-h100=3.0 --pareto --plot cost.png
  perfmodel search --model gpt3-13b --cluster dgx-h100 --nodes 16 --gbs 512 \
      --cluster-grid "gpus_per_node=4,8 nic_Gbps=100,200,400 oversubscription=1,2" --tokens 300e9
  perfmodel search --from hf:config.json --from megatron:train.sh --cluster dgx-h100 --gpus 256
      (the model, the batch, the sequence, the precision and dtypes, ZeRO, recompute and the schedule from
      the files; the degrees and the microbatch are what the search varies)
  perfmodel search --model gpt3-1.3b --cluster dgx-a100 --gpus 32 --gbs 256 --executor dask --workers 2 \
      --stream rows.csv            (killed? the same command with --resume rows.csv continues it)
  perfmodel search ... --executor dask --scheduler tcp://host:8786 --resume rows.csv

error budget defaults: dp=0.05 tp=0.01 pp=0.01 zero=0.01 (relative RMS error as the collectives
apply the spec; on dp, a spec with error feedback needs only error < 1: what it drops returns the
next step). Activations and gathered parameters have nothing to correct their error: 1% admits
int8 (0.8%) and 16-bit floats, not fp8 (3.6%) or int4 (14.6%).

accuracy cost: every row's steps inflation (perfmodel.explore.convergence), the steps its policy needs to
reach the uncompressed run's loss over the uncompressed steps: error feedback divides the steps
the gradient's curvature sets by its contraction 1 - e^2 (Stich & Karimireddy 2020), a compressor
without it adds e^2 to the steps the gradient noise sets (Alistarh et al. 2017); the split is the
batch over the critical batch (McCandlish et al. 2018), Kaplan et al. 2020's at 2 nats per token
unless --convergence gives one measured by realrun convergence. Rows rank by the time per step of
progress (step time x inflation, 'to target' column); the Pareto front weighs it against the
uncompensated error (axes without error feedback in quadrature).

cost (with --tokens): steps = ceil(tokens / (gbs x seq) x inflation); GPU-hours = GPUs x time to
train; cost = GPU-hours x --gpu-hour-price; energy = GPUs x board power (the GPU's TDP, perfmodel
catalog gpus) x time, an upper bound. The Pareto front is then over (cost, time to train,
uncompensated error).
"""


def add_search(sub) -> None:
    from perfmodel.explore.search import DEFAULT_CANDIDATES

    se = sub.add_parser("search", help="best plan x compression under an error budget, Pareto front",
                        description="Search parallel plans (tp, pp, dp, mbs, ZeRO, recompute, sequence parallelism, "
                        "schedule, hpZ) and compression policies built from per-axis candidates; keep those within "
                        "the per-axis error budget; rank by step time with the speedup over the best uncompressed "
                        "plan; print the Pareto front of step time against error.", epilog=SEARCH_EPILOG,
                        formatter_class=RAW)
    se.takes_model = True     # perfmodel.cli names --model among the missing arguments (it may come from --from)
    se.add_argument("--model", help="catalog model (perfmodel catalog models) or a model TOML path (or from --from)")
    se.add_argument("--from", dest="sources", action=FromAction, metavar="FORMAT:PATH", default=[],
                    help=FROM_HELP + ". In a search the files' degrees and microbatch are not used (the search "
                    "varies them); their ZeRO stage, schedule, recompute and sequence parallelism narrow what it "
                    "tries, and their batch, sequence, precision and dtypes hold for every plan")
    se.add_argument("--cluster", required=True, help="one or more clusters, comma-separated: catalog names, cluster "
                    "TOML paths or variants BASE:key=value,... (e.g. 'dgx-a100,dgx-h100:nic_Gbps=200')")
    se.add_argument("--cluster-grid", metavar="KEY=V,V ...", help="vary each --cluster over the product of "
                    "builder arguments, e.g. 'gpus_per_node=4,8 nic_Gbps=100,200,400 oversubscription=1,2' "
                    "(keys: gpus_per_node or any argument of the cluster's node or fabric builder)")
    se.add_argument("--gpus", type=int, help="GPUs in the job (every cluster); not a whole number of nodes: as few "
                    "nodes as hold them")
    se.add_argument("--nodes", type=int, help="nodes (instead of --gpus)")
    se.add_argument("--gbs", type=batch_size, help=f"global batch size ({bounds.describe('gbs')}; required, "
                    "unless --from gives it)")
    se.add_argument("--seq", type=int, help="sequence length (default the model's)")
    se.add_argument("--candidates", default=DEFAULT_CANDIDATES,
                    help="per-axis candidate specs: 'dp=none|int8|...;tp=none|fp16;...' (default: %(default)s)")
    se.add_argument("--max-error", default="", help="per-axis budgets over the defaults, e.g. 'dp=0.1,tp=0.001'")
    se.add_argument("--recompute", default="none", help="none, selective, full or any (default: %(default)s)")
    se.add_argument("--schedules", default="1f1b,interleaved:2",
                    help="pipeline schedules to try, comma-separated (default: %(default)s)")
    se.add_argument("--max-mbs", type=positive_int, default=8, help="largest microbatch size (default: %(default)s)")
    se.add_argument("--top", type=positive_int, default=10, help="rows in the table (default: %(default)s)")
    se.add_argument("--workers", type=bounded("workers"), help="processes (default: every core; "
                    f"{bounds.describe('workers')}, and no more than the families of plans); with --executor dask "
                    "the local cluster's worker processes")
    _run_args(se)
    _output_args(se)
    track_given(se)


def _run_args(se) -> None:
    se.add_argument("--executor", choices=EXECUTORS, default="local", help="where the families of plans "
                    "run: local (a process pool) or dask (a Dask cluster of --workers processes on this machine, "
                    "closed to other users: TLS with keys made for it, no HTTP server, workers that import nothing "
                    "from the current folder; or the cluster at --scheduler; needs the scale extra: pip install "
                    "'commpress[scale]')")
    se.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask cluster's scheduler, PROTOCOL://HOST:PORT "
                    "(tcp, tls, ws or wss, e.g. tcp://host:8786; with --executor dask): its workers need commpress "
                    "and the files the search names. That cluster is trusted: tasks and results travel pickled, so "
                    "whoever runs its scheduler or workers can run code in this process; tcp:// is unauthenticated, "
                    "tls:// takes the client certificate from Dask's configuration")
    se.add_argument("--stream", metavar="FILE.csv", help="append every family's rows to this new CSV as it finishes "
                    "(one synced write each), so a killed search can be resumed")
    se.add_argument("--resume", metavar="FILE.csv", help="continue the stream FILE (a missing one is started): skip "
                    "the families whose rows are all there, append the rest (the result is an uninterrupted search's); "
                    "a row with a value the search cannot have written (NaN, a time <= 0, ...) is refused naming its "
                    "line, and a last line cut short is run again")


def _output_args(se) -> None:
    se.add_argument("--csv", help="write every evaluated (plan, policy), within the budget or not, to this CSV")
    se.add_argument("--plot", metavar="FILE.png", help="draw step time against error with the Pareto front")
    se.add_argument("--calibration", help="calibration profile JSON")
    se.add_argument("--convergence", metavar="FILE.json|NAME", help="the training regime of the steps inflation: "
                    "a realrun convergence file or a catalog regime (gpt-tiny: measured on the small GPT) (its "
                    "fitted critical batch and the errors it measured on real "
                    "gradients; default: Kaplan et al. 2020's critical batch at 2 nats per token, unit-Gaussian "
                    "errors)")
    se.add_argument("--tokens", help="a token budget (e.g. 300e9; 1 to 1e16): add steps = tokens / (gbs x seq), "
                    "time to train, GPU-hours and energy (GPUs x board power at TDP x time, an upper bound) to every "
                    "row")
    se.add_argument("--gpu-hour-price", metavar="USD", help="USD per GPU-hour (with --tokens; 0 to 10000): one number "
                    "for all clusters or one per cluster, each named once, e.g. 'dgx-a100=1.8,dgx-h100=3.0'; adds cost")
    se.add_argument("--pareto", action="store_true", help="print only the Pareto front (with --tokens: over cost, "
                    "time to train and error)")
    se.add_argument("--library", default="nccl", help=LIBRARY_HELP)
    se.add_argument("--json", action="store_true", help="print the ranked rows and the front as JSON")


def run_search(args) -> None:
    from perfmodel.report.plots import plot_cost_front, plot_pareto
    from perfmodel.report.text import rows_csv, search_table

    _check_files(args)
    hints = from_hints(args)
    args.from_hints = hints
    result = _search(args, hints)
    if args.csv:
        atomic_write(args.csv, lambda h: h.write(rows_csv(result.rows)))
    if args.plot:
        title = f"{args.model} on {', '.join(result.clusters) if len(result.clusters) < 4 else args.cluster}, " \
            f"gbs {args.gbs}"
        (plot_cost_front if result.tokens else plot_pareto)(result, args.plot, title)
    if args.json:
        print(dump_json({"ranked": [] if args.pareto else result.ranked[:args.top], "pareto": result.pareto,
                         "best_uncompressed": result.best_uncompressed, "evaluated": result.evaluated,
                         "plans": result.plans, "skipped_oom": result.skipped_oom, "budget": result.budget,
                         "clusters": result.clusters, "tokens": result.tokens, "front_keys": result.front_keys}))
        return
    print(_search_summary(args, result))
    if not result.ranked:
        print("no plan fits within the budget; try --recompute any or a larger --max-error")
        return
    if not args.pareto:
        print(search_table(result.ranked, args.top, title="# fastest to target within the error budget",
                           show_cluster=len(result.clusters) > 1))
        print()
    print(search_table(result.pareto, len(result.pareto), title=_front_title(result),
                       show_cluster=len(result.clusters) > 1))


def _check_files(args) -> None:
    """The output files writable and the stream's files consistent, before any work."""
    from perfmodel.report.plots import check_picture

    if args.csv:
        check_writable(args.csv, "csv")
    check_picture(args.plot)
    if args.stream and args.resume and args.stream != args.resume:
        raise InputError("stream", args.stream, f"the file --resume continues ({args.resume}), or leave one out")
    if args.csv and os.path.abspath(args.csv) == os.path.abspath(args.resume or args.stream or ""):
        raise InputError("csv", args.csv, "another file than the stream (the stream keeps the raw rows to resume from)")


# what a search takes of an import's plan beside --gbs, --seq and --recompute: the plan space's narrowing
NARROWS = {"zero": "zero", "sequence_parallel": "sequence_parallel", "hpz": "hpz"}
# plan keywords that hold only for one layout (the search varies the degrees)
LAYOUT_ONLY = ("first_stage_layers", "last_stage_layers", "pipeline_layout", "mbs", "order")


def from_hints(args) -> dict:
    """The --from files' plan as the search takes it (``PlanSpace`` keywords: its narrowing tuples and
    ``fixed``), their lines on stderr; what it does not take, a line each. --gbs, --seq and --recompute
    are set by ``--from`` itself (a flag on the command line over them)."""
    from perfmodel.cli.common import _say_imported, explicit
    from perfmodel.explore.families import PLAN_KEYS
    from perfmodel.plan.parallel import REQUEST_FIELDS

    fields = dict(getattr(args, "from_fields", {}))
    given, hints, fixed, unused = explicit(args), {}, {}, []
    deepspeed = _deepspeed_fields(args, fields.pop("deepspeed", None))
    if "gbs" in deepspeed and "gbs" not in given and "gbs" not in fields:
        args.gbs = deepspeed["gbs"]
    fields = {**deepspeed, **fields}
    for key, value in fields.items():
        if key in ("gbs", "seq", "recompute") or key in given:
            continue
        if key == "schedule" and "schedules" not in given:      # a plan without a pipeline runs 1f1b
            hints["schedules"] = tuple(dict.fromkeys(("1f1b", value)))
        elif key in NARROWS and NARROWS[key] not in given:
            hints[NARROWS[key]] = (value,)
        elif key in REQUEST_FIELDS and key not in (*PLAN_KEYS, "gpus", "nodes", "gbs", *LAYOUT_ONLY):
            fixed[key] = value
        else:
            unused.append(f"{key} {value} not used (the search varies the layout: degrees, microbatch, stages)")
    items = [i for part in getattr(args, "from_parts", []) for i in part.policy]
    unused += [f"policy {i} not used (--candidates choose the compression)" for i in dict.fromkeys(items)]
    args.from_unused = unused
    _say_imported(args)
    if args.gbs is None:
        raise InputError("gbs", None, "a global batch size: --gbs, or a --from file that gives one")
    return {**hints, "fixed": fixed}


def _deepspeed_fields(args, path: str | None) -> dict:
    """A --from DeepSpeed config's plan on the (first) cluster's GPUs, without TP or PP (its data parallel
    degree all the GPUs, as DeepSpeed's ZeRO has it), its lines on stderr."""
    if not path:
        return {}
    from perfmodel.explore.search import parse_clusters
    from perfmodel.plan.deepspeed import map_config, read_config
    from topologies import cluster_for

    built, ranks = cluster_for(parse_clusters(args.cluster)[0], nodes=args.nodes, gpus=args.gpus)
    ds = map_config(read_config(path), built.gpus_per_host, ranks)
    for line in ds.mapped:
        print(f"perfmodel: deepspeed: {line}", file=sys.stderr)
    return ds.plan


def _search(args, hints: dict | None = None):
    """The search the arguments ask for: its PlanSpace and SearchOptions (``hints``: ``from_hints``)."""
    from perfmodel.explore.search import PlanSpace, SearchOptions, search

    hints = dict(hints or {})
    fixed = {"seq": args.seq, **hints.pop("fixed", {})}
    space = PlanSpace(model=args.model, cluster=args.cluster, cluster_grid=args.cluster_grid, gpus=args.gpus,
                      nodes=args.nodes, gbs=args.gbs, max_mbs=args.max_mbs, recompute=args.recompute,
                      schedules=hints.pop("schedules", None) or tuple(s.strip() for s in args.schedules.split(",")
                                                                     if s.strip()),
                      fixed=fixed, **hints)
    options = SearchOptions(candidates=args.candidates, max_error=args.max_error, convergence=args.convergence,
                            tokens=args.tokens, gpu_hour_price=args.gpu_hour_price, executor=args.executor,
                            workers=args.workers, scheduler=args.scheduler, stream=args.resume or args.stream,
                            resume=bool(args.resume), progress=Progress("plans"),
                            predict={"calibration": args.calibration, "library": args.library})
    return search(space, options)


def _front_title(result) -> str:
    if not result.tokens:
        return "# Pareto front: no other row is both faster to target and of less uncompensated error"
    cost = "cost" if result.front_keys[0] == "cost_usd" else "GPU-hours"
    return f"# Pareto front, cheapest first: no other row is no worse in {cost}, time to train and uncompensated " \
        "error and better in one"


def _search_summary(args, result) -> str:
    from perfmodel.report.text import search_err_axes

    shown = search_err_axes(result.rows)
    budget = ", ".join(f"{a}={v:g}" for a, v in result.budget.items() if a in shown)
    dropped = "; ".join(f"{a}: {', '.join(v)}" for a, v in result.dropped.items() if v) or "none"
    best = result.best_uncompressed
    where = args.cluster if len(result.clusters) == 1 else f"{len(result.clusters)} clusters"
    lines = [f"# {args.model} on {where}, gbs {args.gbs}: {result.plans} plans, {result.skipped_oom} do not "
             f"fit; {result.evaluated} (plan, policy) predictions in {result.seconds:.1f} s "
             f"({result.per_minute:,.0f}/min), {len(result.ranked)} within the budget"
             + (f"; all in {args.csv}" if args.csv else "")
             + (f"; {result.resumed} of the plans from {args.resume}" if args.resume else ""),
             f"# error budget: {budget} (dp with error feedback: < 1); candidates over it: {dropped}"]
    hints = getattr(args, "from_hints", {})
    held = [f"{k} {v}" for k, v in hints.get("fixed", {}).items()] + \
        [f"{k} {'|'.join(map(str, v))}" for k, v in hints.items() if k != "fixed"]
    if held:
        lines.append(f"# from {', '.join(args.sources)}: every plan {', '.join(held)}")
    if result.regime is not None:
        from perfmodel.workload import load_model

        r, batch = result.regime, args.gbs * (args.seq or load_model(args.model).seq_len)
        lines.append(f"# accuracy cost: steps inflation at a batch of {batch:,} tokens against a critical batch of "
                     f"{r.critical_batch_tokens:,.0f} ({r.source}); 'to target' = speedup in time to the "
                     "uncompressed loss")
    if best:
        lines.append(f"# best uncompressed plan: {_where(result, best)}{plan_text(best)}, {best['step_time_s']:.4g} s "
                     "per step ('vs best none' compares every row with its cluster's)")
    if result.tokens and result.pareto:
        lines.append(_cheapest_line(result))
    return "\n".join(lines)


def _where(result, row) -> str:
    return f"{row['cluster']} " if len(result.clusters) > 1 else ""


def _cheapest_line(result) -> str:
    """The cheapest row within the budget (the front's first) and what training the tokens takes on it."""
    r = result.pareto[0]
    cost = f"${r['cost_usd']:,.0f}" if "cost_usd" in r else f"{r['gpu_hours']:,.0f} GPU-hours"
    kwh = r["energy_kWh"]
    energy = "" if kwh is None else f", {kwh / 1000:,.0f} MWh" if kwh >= 1000 else f", {kwh:,.1f} kWh"
    days = r["time_to_train_s"] / 86400
    time = f"{days:,.1f} days" if days >= 2 else f"{days * 24:,.1f} hours"
    return (f"# {result.tokens:.3g} tokens ({r['steps']:,} steps): cheapest within the budget {cost}: "
            f"{r['cluster']} {plan_text(r)} policy {r['policy']}, {time} on {r['gpus']} GPUs, "
            f"{r['gpu_hours']:,.0f} GPU-hours" + (f"{energy} at most (board power at TDP)" if energy else ""))


COMMANDS = {"search": (add_search, run_search)}
