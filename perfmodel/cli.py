"""``perfmodel``: predict collectives and training steps with compressed communication."""
from __future__ import annotations

import argparse
import os
import sys

from perfmodel.collective import DTYPES, OPS
from perfmodel.library import library
from perfmodel.prediction import PredictOptions, compare, predict, request_and_options
from perfmodel.plan import DEFAULT_BUCKET_BYTES, KERNELS, PlanRequest
from perfmodel.report import plan_text, catalog_report, compare_report, step_report, sweep_csv, sweep_table
from perfmodel.plan_sweep import sweep_plans
from perfmodel.step import DEFAULT_OVERLAP_SLOWDOWN
from perfmodel.collective_sweep import parse_compressors, parse_sweep, sweep_collectives
from topologies.clikit import Parser, Progress, atomic_write, check_writable, dump_json, positive_int, run, table
from topologies.errors import InputError
from topologies.units import format_size, parse_size

RAW = argparse.RawDescriptionHelpFormatter
EPILOG = """examples:
  perfmodel predict --model gpt-neox-20b --cluster lassen --gpus 192 --tp 4 --pp 4 --mbs 4 --gbs 1056 \\
      --zero 1 --recompute full --policy hybrid
  perfmodel compare --model gpt-neox-20b --cluster lassen --gpus 192 --tp 4 --pp 4 --mbs 4 --gbs 1056 \\
      --zero 1 --recompute full --policies none,naive:int8,hybrid
  perfmodel sweep --model gpt3-175b --cluster dgx-a100 --gpus 1024 --gbs 1536 --policies none,hybrid
  perfmodel search --model gpt3-175b --cluster dgx-a100 --gpus 1024 --gbs 1536 --plot pareto.png
  perfmodel collective allreduce --cluster dgx-h100 --nodes 4 --size 1GiB --compressor int8
  perfmodel predict --model deepseek-v3 --cluster dgx-h100 --gpus 2048 --pp 16 --ep 64 --policy deepseek
  perfmodel breakeven --model gpt-neox-20b --cluster lassen --gpus 192 --tp 4 --pp 4 --mbs 4 --gbs 1056 \\
      --zero 1 --recompute full --policy hybrid --target +12.7% --library mpi
  perfmodel catalog models
  perfmodel validate --published megatron-lm-a100-2021
"""
POLICY_HELP = ("compression policy: a preset (none, hybrid, mzhybrid, zhybrid, zeropp, deepseek), naive:SPEC, "
               "AXIS=SPEC or AXIS.min=SIZE items (AXIS: dp gradients, zero parameter gathers, tp, pp activations, "
               "ep MoE dispatch, ep_combine MoE combine (default: as ep), cp K/V ring), e.g. "
               "'hybrid,dp=ef(topk(0.01))+int8' or 'ep=fp8,ep_combine=none'")

LIBRARY_HELP = ("collective library whose algorithms and per-message constants price the collectives: nccl "
                "(default) or mpi (a GPU-aware MPI, MVAPICH2-GDR-like: ring / Rabenseifner all-reduce, eager and "
                "rendezvous protocols; catalog/libraries.toml gives each number's source)")


def _size(text):
    return parse_size(text, "bucket")


def _cluster_args(p) -> None:
    p.add_argument("--model", required=True, help="catalog model (perfmodel catalog models) or a model TOML path")
    p.add_argument("--cluster", required=True, help="catalog cluster (perfmodel catalog clusters) or a cluster "
                   "TOML path")
    p.add_argument("--gpus", type=int, help="GPUs in the job; not a whole number of nodes: as few nodes as hold "
                   "them, the last one partly used")
    p.add_argument("--nodes", type=int, help="nodes (instead of --gpus)")


def _plan_args(p, sweep: bool = False) -> None:
    if not sweep:
        p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (divides heads)")
        p.add_argument("--pp", type=int, default=1, help="pipeline stages")
        p.add_argument("--dp", default="auto", help="data-parallel size or auto = gpus / (tp pp)")
        p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage")
        p.add_argument("--mbs", type=int, default=1, help="microbatch size")
        p.add_argument("--ep", type=int, default=1, help="expert parallel (MoE models): experts sharded over ep "
                       "ranks carved from dp (ep divides dp and the experts)")
        p.add_argument("--cp", type=int, default=1, help="context parallel: each sequence split over cp GPUs "
                       "(ring attention; gpus = tp x cp x pp x dp)")
    p.add_argument("--gbs", type=int, required=sweep, help="global batch size (default mbs x dp)")
    p.add_argument("--seq", type=int, help="sequence length (default the model's)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    p.add_argument("--recompute", default="none",
                   help="activation recompute: none, selective, full" + (", any" if sweep else ""))
    p.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b or interleaved:V")
    p.add_argument("--compute-dtype", choices=("bf16", "fp16", "fp32"), help="default bf16 (fp16 if none)")
    p.add_argument("--grad-dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--bucket", type=_size, default=DEFAULT_BUCKET_BYTES, help="DDP bucket size (25MiB)")
    p.add_argument("--order", default="tp,pp,dp", help="placement order, innermost first (may name cp and ep, e.g. "
                   "tp,pp,dp,ep: ep across nodes)")
    p.add_argument("--engine", choices=("analytical", "des"), default="analytical",
                   help="analytical (closed forms, the fast path) or des (the pipeline and every stage's gradient "
                   "buckets as events, links shared between concurrent traffic; the difference is 'contention')")
    p.add_argument("--no-dp-overlap", dest="dp_overlap", action="store_false",
                   help="reduce gradients after backward, not during it (as realrun train does)")
    if not sweep:
        p.add_argument("--trace", metavar="FILE.json", help="write the step's timeline as Chrome trace-event JSON "
                       "(open in ui.perfetto.dev): per pipeline stage its forward/backward operations, transfers "
                       "with flow arrows, then the exposed reduction and optimizer (gpipe, 1f1b)")
        p.add_argument("--timeline", metavar="FILE.png",
                       help="draw the same timeline as a picture (.png, .svg or .pdf): a row per stream of each "
                       "stage; with --engine des also the gradient buckets as they share the NIC")
        p.add_argument("--plot", metavar="FILE.png", help="draw the step's breakdown as stacked bars (one per policy "
                       "with compare; .png, .svg or .pdf)")
        p.add_argument("--deepspeed", metavar="ds_config.json",
                       help="take ZeRO stage, qwZ/qgZ/hpZ, fp16/bf16, micro batch, accumulation and batch size from a "
                       "DeepSpeed config (printed as mapped; keys it cannot honour are refused)")
        p.add_argument("--tp-overlap", action="store_true",
                       help="overlap TP all-gathers and reduce-scatters with their GEMMs (Megatron --tp-comm-overlap; "
                       "needs --sequence-parallel): all but 1/tp of them hide behind the GEMMs, which they slow by "
                       "the overlap slowdown")
        p.add_argument("--kernels", choices=KERNELS, default="fused",
                       help="whose kernels compute the layers: fused (default: Megatron-Core with Transformer "
                       "Engine, flash attention and fused MoE permutation) or eager (PyTorch eager as realrun's "
                       "layers: ring-attention score blocks in memory, MoE permutation through capacity queues)")
        p.add_argument("--hpz", action="store_true",
                       help="ZeRO++ hpZ (with --zero 3): a secondary parameter partition inside each node, so "
                       "backward gathers stay on the node's links (costs weights / local dp ranks of memory)")
    p.add_argument("--overlap-slowdown", type=float,
                   help=f"fraction by which overlapped communication slows compute "
                   f"(default: the profile's, else {DEFAULT_OVERLAP_SLOWDOWN})")
    p.add_argument("--calibration", help="calibration profile JSON (see docs/design.md, 'Calibration')")
    p.add_argument("--library", default="nccl", help=LIBRARY_HELP)
    p.add_argument("--allow-oom", action="store_true", help="report plans that do not fit memory")
    p.add_argument("--json", action="store_true", help="JSON instead of tables")


def _parser() -> Parser:
    p = Parser(prog="perfmodel", description="Predict the step time of LLM training with compressed "
               "communication, and the collectives it is made of.", epilog=EPILOG, formatter_class=RAW)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    pr = sub.add_parser("predict", help="one training step: time, breakdown, TFLOPS, speedup",
                        description="Predict one training step of a model on a cluster under a parallel "
                        "plan and a compression policy.", epilog=EPILOG, formatter_class=RAW)
    _cluster_args(pr)
    _plan_args(pr)
    pr.add_argument("--policy", default="none", help=POLICY_HELP)
    cp = sub.add_parser("compare", help="several policies side by side on one plan",
                        description="The same plan under several compression policies, side by side.",
                        epilog=EPILOG, formatter_class=RAW)
    _cluster_args(cp)
    _plan_args(cp)
    cp.add_argument("--policies", default="none,naive:int8,hybrid",
                    help="policies separated by commas (AXIS=SPEC items attach to the policy before "
                    "them) or by semicolons: 'none;dp=int8;hybrid'")
    sw = sub.add_parser("sweep", help="every valid plan x policies, ranked",
                        description="Every valid (tp, pp, dp, mbs, zero) plan under each policy; prints the "
                        "top plans and writes all to --csv.", epilog=EPILOG, formatter_class=RAW)
    _cluster_args(sw)
    _plan_args(sw, sweep=True)
    sw.add_argument("--policies", default="none,hybrid", help="policies separated by commas or semicolons "
                    "(as in compare)")
    sw.add_argument("--max-mbs", type=positive_int, default=8, help="largest microbatch size tried (>= 1)")
    sw.add_argument("--top", type=positive_int, default=10, help="rows in the table (>= 1)")
    sw.add_argument("--csv", help="write every evaluated (plan, policy) to this CSV")
    _search_parser(sub)
    _breakeven_parser(sub)
    ca = sub.add_parser("catalog", help="GPUs, models and clusters the model knows")
    ca.add_argument("kind", nargs="?", default="all", choices=("gpus", "models", "clusters", "compressors", "libraries",
                                                                   "all"))
    _collective_parser(sub)
    _validate_parser(sub)
    cal = sub.add_parser("calibrate", help="fit a calibration profile from measured records",
                         description="Fit alpha, beta and base latency per tier class (uncompressed collective "
                         "records), kernel throughput per compressor and direction and the launch cost "
                         "(kernel records), and measured ratios of data-dependent specs; scipy least squares "
                         "with a robust loss. Prints residuals and R^2; writes a versioned profile that every "
                         "perfmodel command takes with --calibration.", epilog=CALIBRATE_EPILOG,
                         formatter_class=RAW)
    cal.add_argument("records", nargs="+", help="JSON Lines files written by realrun bench --json")
    cal.add_argument("-o", "--output", required=True, help="the profile to write (JSON, atomically)")
    cal.add_argument("--cluster", help="cluster the collective records ran on, where a record does not name it "
                     "(e.g. emulated:hosts=4,bandwidth=1gbit)")
    cal.add_argument("--json", action="store_true", help="print the profile instead of the summary table")
    return p


SEARCH_EPILOG = """examples:
  perfmodel search --model gpt3-175b --cluster dgx-a100 --gpus 1024 --gbs 1536
  perfmodel search --model gpt3-1.3b --cluster commodity-25g --gpus 32 --gbs 256 \
      --candidates "dp=none|int8|ef(topk(0.01))+int8;tp=none|fp16" --max-error tp=0.001 \
      --csv all.csv --plot pareto.png
  perfmodel search --model llama2-70b --cluster dgx-a100,dgx-h100 --gpus 512 --gbs 1024 --recompute any \
      --tokens 1e12 --gpu-hour-price dgx-a100=1.8,dgx-h100=3.0 --pareto --plot cost.png
  perfmodel search --model gpt3-13b --cluster dgx-h100 --nodes 16 --gbs 512 \
      --cluster-grid "gpus_per_node=4,8 nic_Gbps=100,200,400 oversubscription=1,2" --tokens 300e9
  perfmodel search --model gpt3-1.3b --cluster dgx-a100 --gpus 32 --gbs 256 --executor dask --workers 2 \
      --stream rows.csv            (killed? the same command with --resume rows.csv continues it)
  perfmodel search ... --executor dask --scheduler tcp://host:8786 --resume rows.csv

error budget defaults: dp=0.05 tp=0.01 pp=0.01 zero=0.01 (relative RMS error as the collectives
apply the spec; on dp, a spec with error feedback needs only error < 1: what it drops returns the
next step). Activations and gathered parameters have nothing to correct their error: 1% admits
int8 (0.8%) and 16-bit floats, not fp8 (3.6%) or int4 (14.6%).

accuracy cost: every row's steps inflation (perfmodel.convergence), the steps its policy needs to
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


def _search_parser(sub) -> None:
    from perfmodel.search import DEFAULT_CANDIDATES

    se = sub.add_parser("search", help="best plan x compression under an error budget, Pareto front",
                        description="Search parallel plans (tp, pp, dp, mbs, ZeRO, recompute, sequence parallelism, "
                        "schedule, hpZ) and compression policies built from per-axis candidates; keep those within "
                        "the per-axis error budget; rank by step time with the speedup over the best uncompressed "
                        "plan; print the Pareto front of step time against error.", epilog=SEARCH_EPILOG,
                        formatter_class=RAW)
    se.add_argument("--model", required=True, help="catalog model (perfmodel catalog models) or a model TOML path")
    se.add_argument("--cluster", required=True, help="one or more clusters, comma-separated: catalog names, cluster "
                    "TOML paths or variants BASE:key=value,... (e.g. 'dgx-a100,dgx-h100:nic_Gbps=200')")
    se.add_argument("--cluster-grid", metavar="KEY=V,V ...", help="vary each --cluster over the product of "
                    "builder arguments, e.g. 'gpus_per_node=4,8 nic_Gbps=100,200,400 oversubscription=1,2' "
                    "(keys: gpus_per_node or any argument of the cluster's node or fabric builder)")
    se.add_argument("--gpus", type=int, help="GPUs in the job (every cluster); not a whole number of nodes: as few "
                    "nodes as hold them")
    se.add_argument("--nodes", type=int, help="nodes (instead of --gpus)")
    se.add_argument("--gbs", type=int, required=True, help="global batch size")
    se.add_argument("--seq", type=int, help="sequence length (default the model's)")
    se.add_argument("--candidates", default=DEFAULT_CANDIDATES,
                    help="per-axis candidate specs: 'dp=none|int8|...;tp=none|fp16;...' (default: %(default)s)")
    se.add_argument("--max-error", default="", help="per-axis budgets over the defaults, e.g. 'dp=0.1,tp=0.001'")
    se.add_argument("--recompute", default="none", help="none, selective, full or any (default: %(default)s)")
    se.add_argument("--schedules", default="1f1b,interleaved:2",
                    help="pipeline schedules to try, comma-separated (default: %(default)s)")
    se.add_argument("--max-mbs", type=positive_int, default=8, help="largest microbatch size (default: %(default)s)")
    se.add_argument("--top", type=positive_int, default=10, help="rows in the table (default: %(default)s)")
    se.add_argument("--workers", type=positive_int, help="processes (default: every core); with --executor dask "
                    "the local cluster's worker processes")
    se.add_argument("--executor", choices=("local", "dask"), default="local", help="where the families of plans "
                    "run: local (a process pool) or dask (a Dask LocalCluster of --workers processes, or the cluster "
                    "at --scheduler; needs the scale extra: pip install 'commpress[scale]')")
    se.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask cluster's scheduler (tcp://host:8786; "
                    "with --executor dask): its workers need commpress and the files the search names")
    se.add_argument("--stream", metavar="FILE.csv", help="append every family's rows to this new CSV as it finishes "
                    "(one synced write each), so a killed search can be resumed")
    se.add_argument("--resume", metavar="FILE.csv", help="continue the stream FILE (a missing one is started): skip "
                    "the families whose rows are all there, append the rest (the result is an uninterrupted search's)")
    se.add_argument("--csv", help="write every evaluated (plan, policy), within the budget or not, to this CSV")
    se.add_argument("--plot", metavar="FILE.png", help="draw step time against error with the Pareto front")
    se.add_argument("--calibration", help="calibration profile JSON")
    se.add_argument("--convergence", metavar="FILE.json|NAME", help="the training regime of the steps inflation: "
                    "a realrun convergence file or a catalog regime (gpt-tiny: measured on the small GPT) (its "
                    "fitted critical batch and the errors it measured on real "
                    "gradients; default: Kaplan et al. 2020's critical batch at 2 nats per token, unit-Gaussian "
                    "errors)")
    se.add_argument("--tokens", help="a token budget (e.g. 300e9): add steps = tokens / (gbs x seq), time to train, "
                    "GPU-hours and energy (GPUs x board power at TDP x time, an upper bound) to every row")
    se.add_argument("--gpu-hour-price", metavar="USD", help="USD per GPU-hour (with --tokens): one number for all "
                    "clusters or per cluster, e.g. 'dgx-a100=1.8,dgx-h100=3.0'; adds cost")
    se.add_argument("--pareto", action="store_true", help="print only the Pareto front (with --tokens: over cost, "
                    "time to train and error)")
    se.add_argument("--library", default="nccl", help=LIBRARY_HELP)
    se.add_argument("--json", action="store_true", help="print the ranked rows and the front as JSON")


BREAKEVEN_EPILOG = """examples:
  perfmodel breakeven --model gpt-neox-20b --cluster lassen --gpus 192 --tp 4 --pp 4 --mbs 4 --gbs 1056 \\
      --zero 1 --recompute full --policy hybrid --target +12.7% --library mpi
  perfmodel breakeven ... --policy 'naive:zfp(rate=8)' --target 1.05 --families zfp --json

The throughput is what a calibration profile's kernels section gives a spec: GB/s of uncompressed
bytes per direction; decompression scales with compression at the spec's own ratio of the two.
"""


def _breakeven_parser(sub) -> None:
    b = sub.add_parser("breakeven", help="kernel throughput at which a policy reaches a target speedup",
                       description="Solve for the codec kernel throughput (GB/s, compress and decompress scaled "
                       "together) at which the policy's predicted speedup over the same plan uncompressed reaches "
                       "--target (Brent's method over throughput), or say it cannot be reached at any throughput "
                       "and give the limit as the throughput grows without bound.", epilog=BREAKEVEN_EPILOG,
                       formatter_class=RAW)
    _cluster_args(b)
    _plan_args(b)
    b.add_argument("--policy", default="hybrid", help=POLICY_HELP + " (default: hybrid)")
    b.add_argument("--target", required=True, help="target speedup: a gain in percent (+12.7%%) or a ratio (1.127)")
    b.add_argument("--families", default="zfp", help="compressor families whose kernels are scaled, comma-separated, "
                   "or all (default: zfp)")


def _breakeven(args) -> None:
    from perfmodel.breakeven import breakeven, parse_target

    parse_target(args.target)
    for name in ("trace", "timeline", "plot"):
        if getattr(args, name):
            raise InputError(name, getattr(args, name), "not with breakeven (it draws no step)")
    request, options = _request(args, args.policy)
    r = breakeven(args.model, args.cluster, args.target, request, options, families=args.families)
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


CALIBRATE_EPILOG = """examples:
  realrun bench kernels --sizes 1MiB:64MiB --compressors int8,sz3 --json kernels.jsonl
  perfmodel calibrate kernels.jsonl collectives.jsonl --cluster emulated:hosts=4,bandwidth=1gbit -o profile.json
  perfmodel collective allreduce --cluster emulated:hosts=4,bandwidth=1gbit --size 64MiB \
      --compressor none,int8 --calibration profile.json
"""


def _collective_parser(sub) -> None:
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


def _validate_parser(sub) -> None:
    v = sub.add_parser("validate", help="predict published measurements (validation/published): MAPE per source",
                       description="Predict every row of the published tables in validation/published (sources.toml "
                       "names them; README.md there gives each row's source and conditions) and print, per source, "
                       "MAPE, bias, the worst row and the table of measured against predicted.")
    v.add_argument("--published", nargs="?", const="all", default="all", metavar="SOURCE",
                   help="one source key of sources.toml, or all (default)")
    v.add_argument("--dir", help="folder of the tables (default: the repository's validation/published)")
    v.add_argument("--json", action="store_true", help="JSON: per source its summary and rows")
    v.add_argument("--csv", metavar="FILE", help="write every row (source, measured, predicted, error) as CSV")
    v.add_argument("--plot", metavar="FILE.png", help="draw predicted against measured (.png, .svg or .pdf)")
    v.add_argument("--check-bounds", action="store_true",
                   help="exit 1 if a source's MAPE is above its bound in bounds.json, or a measured run's "
                        "plan is predicted not to fit its GPUs' memory")


def _validate(args) -> None:
    import csv
    import io
    from pathlib import Path

    from perfmodel import published as pub
    from perfmodel.plots import check_picture

    folder = Path(args.dir) if args.dir else pub.PUBLISHED_DIR
    if args.csv:
        check_writable(args.csv, "csv")
    check_picture(args.plot)
    reports = pub.validate_published(args.published, folder)
    bounds = pub.load_bounds(folder) if (folder / pub.BOUNDS_FILE).exists() else {}
    if args.csv:
        buffer = io.StringIO()
        csv.writer(buffer).writerows(pub.results_csv_rows(reports))
        atomic_write(args.csv, lambda h: h.write(buffer.getvalue().encode()))
    if args.plot:
        pub.plot_published(reports, args.plot)
    if args.json:
        print(dump_json([dict(r, bound=bounds.get(r["source"])) for r in reports]))
    else:
        _validate_report(reports, bounds)
    bad = pub.check_bounds(reports, bounds) if args.check_bounds else []
    if bad:
        print("\n".join(bad), file=sys.stderr)
        raise SystemExit(1)


def _validate_report(reports, bounds) -> None:
    from perfmodel.published import summary_markdown

    print(summary_markdown(reports, bounds))
    for rep in reports:
        rows = [(r.label, r.measured, "-" if r.predicted is None else round(r.predicted, 1),
                 "-" if r.error is None else f"{r.error:+.1%}", _memory_cell(r), r.skipped) for r in rep["results"]]
        unit = rep["results"][0].unit if rep["results"] else ""
        print()
        print(table(("row", f"measured {unit}", "predicted", "error", "memory/GPU", "skipped"), rows,
                    title=f"# {rep['source']}: {rep['title']}"))


def _memory_cell(row) -> str:
    """A training row's predicted memory per GPU, flagged where it would not fit (it ran)."""
    if row.memory_GiB is None:
        return "-"
    return f"{row.memory_GiB:.1f} GiB" + ("" if row.fits else " DOES NOT FIT")


def _plan_kwargs(args, sweep: bool = False) -> dict:
    """The plan and option fields the arguments give, by their names in PlanRequest and
    PredictOptions (a sweep varies the layout itself: without tp, pp, dp, zero, ...)."""
    library(args.library)   # an unknown name is refused before any work
    kw = dict(calibration=args.calibration, library=args.library, gpus=args.gpus, nodes=args.nodes, gbs=args.gbs,
              seq=args.seq,
              sequence_parallel=args.sequence_parallel, schedule=args.schedule, compute_dtype=args.compute_dtype,
              grad_dtype=args.grad_dtype, bucket_bytes=args.bucket, order=args.order, dp_overlap=args.dp_overlap,
              overlap_slowdown=args.overlap_slowdown, allow_oom=args.allow_oom, engine=args.engine)
    if not sweep:
        dp = args.dp if args.dp == "auto" else _int("dp", args.dp)
        kw.update(tp=args.tp, pp=args.pp, dp=dp, zero=args.zero, mbs=args.mbs, recompute=args.recompute,
                  hpz=args.hpz, tp_overlap=args.tp_overlap, ep=args.ep, cp=args.cp, kernels=args.kernels)
    return kw


def _request(args, policy: str = "none") -> tuple[PlanRequest, PredictOptions]:
    """The PlanRequest and PredictOptions of predict and compare (a DeepSpeed config applied)."""
    kw, policy = _deepspeed(args, _plan_kwargs(args), policy)
    return request_and_options(policy=policy, trace=args.trace, timeline=args.timeline, **kw)


def _int(field, text):
    try:
        return int(text)
    except ValueError:
        raise InputError(field, text, "an integer or auto") from None


def _say_idle(records) -> None:
    """One line on stderr per policy axis that compresses nothing in the plan."""
    for r in records:
        for axis in r.idle_policy_axes:
            p = r.plan
            print(f"perfmodel: policy {r.policy!r}: axis {axis} has no traffic in this plan (tp={p['tp']} pp={p['pp']} "
                  f"dp={p['dp']} zero={p['zero']}); its spec {r.policy_axes[axis]['spec']} is not used",
                  file=sys.stderr)


def _deepspeed(args, kw: dict, policy: str) -> tuple[dict, str]:
    """``kw`` and ``policy`` with a DeepSpeed config's plan and ZeRO++ items applied (stderr says how)."""
    if not args.deepspeed:
        return kw, policy
    from perfmodel.deepspeed import map_config, read_config
    from topologies import cluster_for

    built, ranks = cluster_for(args.cluster, nodes=args.nodes, gpus=args.gpus)
    try:
        ds = map_config(read_config(args.deepspeed), built.gpus_per_host, ranks, args.tp, args.pp)
    except InputError as err:
        for line in getattr(err, "refused", ()):
            print(f"perfmodel: deepspeed: cannot honour {line}", file=sys.stderr)
        raise
    for line in ds.mapped:
        print(f"perfmodel: deepspeed: {line}", file=sys.stderr)
    if ds.ignored:
        print(f"perfmodel: deepspeed: ignored (no effect on a step's time here): {', '.join(ds.ignored)}",
              file=sys.stderr)
    if ds.policy_items:
        policy = ",".join(([policy] if policy != "none" else []) + ds.policy_items)
    return {**kw, **ds.plan}, policy


def _predict(args) -> None:
    from perfmodel.plots import check_picture, plot_breakdown

    check_picture(args.plot)
    r = predict(args.model, args.cluster, *_request(args, args.policy))
    if args.plot:
        plot_breakdown([r], args.plot)
    _say_idle([r])
    print(dump_json(r.to_dict()) if args.json else step_report(r))


def _compare(args) -> None:
    from perfmodel.plots import check_picture, plot_breakdown

    check_picture(args.plot)
    records = compare(args.model, args.cluster, args.policies, *_request(args))
    if args.plot:
        plot_breakdown(records, args.plot)
    _say_idle(records)
    print(dump_json([r.to_dict() for r in records]) if args.json else compare_report(records))


def _sweep(args) -> None:
    if args.csv:
        check_writable(args.csv, "csv")
    kw = _plan_kwargs(args, sweep=True)
    gbs = kw.pop("gbs")
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


def _search(args) -> None:
    from perfmodel.plots import check_picture, plot_cost_front, plot_pareto
    from perfmodel.report import rows_csv, search_table
    from perfmodel.search import search

    if args.csv:
        check_writable(args.csv, "csv")
    check_picture(args.plot)
    if args.stream and args.resume and args.stream != args.resume:
        raise InputError("stream", args.stream, f"the file --resume continues ({args.resume}), or leave one out")
    if args.csv and os.path.abspath(args.csv) == os.path.abspath(args.resume or args.stream or ""):
        raise InputError("csv", args.csv, "another file than the stream (the stream keeps the raw rows to resume from)")
    schedules = tuple(s.strip() for s in args.schedules.split(",") if s.strip())
    result = search(args.model, args.cluster, gpus=args.gpus, nodes=args.nodes, gbs=args.gbs, seq=args.seq,
                    candidates=args.candidates, max_error=args.max_error, recompute=args.recompute,
                    schedules=schedules, max_mbs=args.max_mbs, workers=args.workers, calibration=args.calibration,
                    cluster_grid=args.cluster_grid, tokens=args.tokens, gpu_hour_price=args.gpu_hour_price,
                    executor=args.executor, scheduler=args.scheduler, stream=args.resume or args.stream,
                    resume=bool(args.resume), library=args.library, convergence=args.convergence,
                    progress=Progress("plans"))
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


def _front_title(result) -> str:
    if not result.tokens:
        return "# Pareto front: no other row is both faster to target and of less uncompensated error"
    cost = "cost" if result.front_keys[0] == "cost_usd" else "GPU-hours"
    return f"# Pareto front, cheapest first: no other row is no worse in {cost}, time to train and uncompensated " \
        "error and better in one"


def _search_summary(args, result) -> str:
    from perfmodel.report import search_err_axes

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


def _collective(args) -> None:
    from perfmodel.plots import check_picture

    check_picture(args.plot)
    sizes = parse_sweep(args.sweep) if args.sweep else [parse_size(args.size)]
    compressors = parse_compressors(args.compressor)
    records = sweep_collectives(args.op, sizes, compressors, cluster=args.cluster, nodes=args.nodes, gpus=args.gpus,
                    algorithm=args.algorithm, dtype=args.dtype, chunks=_chunks(args.chunks),
                    placement=args.placement, calibration=args.calibration, library=args.library)
    if args.plot:
        from perfmodel.plots import plot_collectives

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


def _calibrate(args) -> None:
    import json

    from perfmodel.fit import fit_profile, summary, worst_residuals
    from perfmodel.measurements import read_records

    check_writable(args.output, "output")
    records = [r for path in args.records for r in read_records(path)]
    cluster = args.cluster or next((r["cluster"] for r in records if "cluster" in r), None)
    if cluster is None:
        raise InputError("cluster", None, "--cluster NAME (the records do not name the cluster they ran on)")
    profile = fit_profile(records, cluster, sources=args.records)
    atomic_write(args.output, lambda h: h.write(json.dumps(profile, indent=1).encode()))
    if args.json:
        print(dump_json(profile))
        return
    print(f"# perfmodel calibrate: {len(records)} records -> {args.output} (cluster {cluster})")
    print(table(("fitted", "value", "fit"), summary(profile)))
    print()
    print(table(("cluster", "algorithm", "size", "measured_s", "fitted_s", "residual"), worst_residuals(profile),
                title="# largest residuals of the tier fit (all are in the profile under fits)"))


COMMANDS = {"breakeven": _breakeven,
            "calibrate": _calibrate, "predict": _predict, "compare": _compare, "sweep": _sweep, "search": _search,
            "collective": _collective, "validate": _validate, "catalog": lambda args: print(catalog_report(args.kind))}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    COMMANDS[args.command](args)
    return 0


def entry() -> None:
    sys.exit(run(main))
