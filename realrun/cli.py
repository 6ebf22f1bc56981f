"""``realrun``: run compressed collectives and compressors for real, and measure them."""
from __future__ import annotations

import argparse
import textwrap
import json
import os
import sys

from perfmodel.collectives.sweep import parse_compressors, parse_sweep
from perfmodel.engines import engine_names
from perfmodel.workload import load_model
from realrun.bench import BENCH_OPS, BenchConfig, run_collectives, run_here, run_kernels, under_torchrun
from realrun.bench.presets import annotate, describe, expand as expand_presets
from realrun.comm.names import RUNTIME_ALGORITHMS, OP_TIMEOUT_S
from realrun import convergence_cli, train_cli
from realrun.compressors import Compressor
from realrun.report import MAX_REPEATS, REPEATS, check_repeats, summary_json
from topologies.clikit import Parser, atomic_write, check_writable, run, table
from topologies.errors import InputError
from topologies.units import format_size, parse_size

EPILOG = """examples:
  realrun bench allreduce --world 4 --sizes 1MiB:64MiB --compressors "none,int8,topk(0.01)" \\
      --algorithms ring,two_phase --json records.jsonl
  realrun bench alltoall --world 4 --sizes 256KiB:4MiB --compressors none,bf16,fp8,int8
  realrun bench kernels --sizes 64MiB --compressors "fp16,int8,sign,topk(0.01)"
  realrun bench reduce_scatter --world 4 --sizes 4MiB --compressors none,sdp4bit,loco,zeropp   # presets: their specs
"""


def _command(sub, name: str, summary: str, description: str, epilog: str):
    """A subcommand parser whose examples keep their layout (the description is wrapped)."""
    return sub.add_parser(name, help=summary, description=textwrap.fill(description, 100), epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _parser() -> Parser:
    p = Parser(prog="realrun", description="Compress real tensors and run compressed collectives on "
               "torch.distributed (gloo on CPU); measure them the nccl-tests way.", epilog=EPILOG,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    b = sub.add_parser("bench", help="microbenchmarks: collectives across ranks, or kernels alone",
                       description="Time compressed collectives across --world local ranks (gloo), or "
                       "compressors alone (kernels); print nccl-tests-style tables and write JSON Lines "
                       "records (perfmodel.calibration.measurements schema) with --json.", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("op", choices=BENCH_OPS + ("kernels",), help="the collective, or kernels (alltoall: SIZE is what "
                   "each rank sends, SIZE/world to every rank, each chunk compressed once at its source; busbw = "
                   "algbw x (n-1)/n)")
    b.add_argument("--world", type=int, default=2, help="ranks to start on this machine (ignored under "
                   "torchrun, which starts the ranks)")
    b.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU tensors, numpy "
                   "compressors) or nccl (CUDA tensors, one GPU per rank, CuPy compressors)")
    b.add_argument("--sizes", default="1MiB:16MiB", help="SIZE, MIN:MAX (doubling) or SIZE,SIZE,...")
    b.add_argument("--compressors", default="none,int8", help="specs separated by commas; a policy preset's "
                   "name (loco, sdp4bit, zeropp, ...) stands for the specs it applies on the axes this op carries: "
                   "allreduce dp and tp, reduce_scatter dp, allgather zero, alltoall ep and ep_combine, kernels "
                   "every axis (realrun.bench.presets; records add preset and axis)")
    b.add_argument("--algorithms", default="auto", help="for allreduce: auto or " + ",".join(RUNTIME_ALGORITHMS))
    b.add_argument("--iters", type=int, default=5)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--device", default="cpu", help="kernels: cpu")
    b.add_argument("--accumulate", action="store_true", help="kernels: decompression also adds into a float32 "
                   "sum, as realrun's reductions do")
    b.add_argument("--op-timeout", type=float, default=OP_TIMEOUT_S, metavar="S",
                   help="seconds a collective waits on a peer before the run ends with an error (a stalled or "
                   f"stopped rank; default {OP_TIMEOUT_S:g})")
    b.add_argument("--threads", type=int, default=1, help="CPU threads per local rank (default 1: ranks share "
                   "the cores the way the model of an emulated host assumes)")
    b.add_argument("--json", metavar="FILE", help="write the records as JSON Lines (atomically)")
    b.add_argument("--plot", metavar="FILE.png", help="collectives: draw measured busbw against size per "
                   "compressor and algorithm (.png, .svg or .pdf)")
    _cluster_parser(sub)
    _loop_parsers(sub)
    train_cli.add_parser(sub, _command)
    convergence_cli.add_parser(sub, _command)
    return p


LOOP_EPILOG = """examples (as root, on an emulated cluster):
  realrun cluster up --hosts 4 --bandwidth 1gbit
  realrun calibrate --cluster emu -o profile.json
  realrun validate --calibration profile.json --cluster emu --quick --out validation/
  realrun cluster down
on a real cluster (one rank per GPU, the cluster as topologies knows it):
  torchrun --nnodes 4 --nproc-per-node 8 ... -m realrun.cli calibrate --cluster dgx-h100 -o profile.json
"""


def _loop_parsers(sub) -> None:
    cal = _command(sub, "calibrate", "measure what the model needs and fit a calibration profile",
                   "Time every compressor alone and with every host's rank computing at once (one thread each), "
                   "a training step's compute (GEMMs, attention, memory-bound work of --model), "
                   "and the uncompressed runs of each algorithm and of the all-to-all at several sizes and, on an "
                   "emulated cluster, at 200 and 500 Mbit/s; fit them with perfmodel calibrate. The profile works "
                   "with --calibration in every perfmodel command.", LOOP_EPILOG)
    cal.add_argument("--cluster", default="emu", help="an emulated cluster that is up (its name), or under "
                     "torchrun the topologies cluster the ranks run on")
    cal.add_argument("-o", "--output", required=True, help="the profile (JSON, written atomically)")
    cal.add_argument("--records", help="also keep the raw records here (JSON Lines)")
    cal.add_argument("--compressors", default=None, help="specs to calibrate (default: those validate uses)")
    cal.add_argument("--model", default=None, help="the models whose training compute is "
                     "timed, comma-separated (default gpt-tiny,gpt-tiny-moe: what validate --training trains; "
                     "each at tp 1 and 2 and cp 1 and 2, the MoE one's experts also at ep 2)")
    cal.add_argument("--quick", action="store_true", help="fewer sizes (a few minutes: the compressed runs included)")
    cal.add_argument("--iters", type=int, default=3)
    val = _command(sub, "validate", "predict held-out runs, run them, report how close the model came",
                   "A grid disjoint from calibration (sizes 2/8/32 MiB, 100 Mbit/s and 1 Gbit/s, compressed "
                   "all-reduces and realrun's all-to-all): each case predicted first, then measured --repeats "
                   "times (the median counts; spread = max/min - 1 of the repeats). Writes DIR/results.csv, "
                   "DIR/report.md and DIR/predicted_vs_measured.png and prints the summary: MAPE with the "
                   "testbed's noise floor (median spread) and the cases spread over 5%, MAPE per op, worst case, "
                   "fastest-compressor agreement, int8 crossover bandwidth.", LOOP_EPILOG)
    val.add_argument("--calibration", help="profile from realrun calibrate (default: catalog numbers)")
    val.add_argument("--cluster", default="emu", help="as for calibrate")
    val.add_argument("--out", required=True, help="output folder (created)")
    val.add_argument("--quick", action="store_true", help="a smaller grid, as many repeats (under 5 minutes here "
                     "per repeat)")
    val.add_argument("--iters", type=int, default=5, help="measured iterations per case and repeat (median; "
                     "default 5)")
    val.add_argument("--repeats", type=int, default=REPEATS, metavar="R",
                     help=f"independent measurements per case, 1-{MAX_REPEATS}: collectives R timed blocks, each "
                     "after its own warm-up, round-robin over the cases of one launch; --training R runs of the "
                     "case, round-robin over the cases of a bandwidth. The case's value is their median, its spread "
                     f"max/min - 1; spreads over 5%% are starred in report.md (default {REPEATS})")
    val.add_argument("--training", action="store_true", help="validate training steps instead: realrun train "
                     "of gpt-tiny on the emulated hosts, plans (dp, tp 2, pp 2, tp 2 x pp 2, ZeRO-1) x policies x "
                     "100 Mbit/s and 1 Gbit/s; writes results_training.csv, report.md, "
                     "step_predicted_vs_measured.png, loss_curves.png")
    val.add_argument("--steps", type=int, help="--training: steps per run (default 12, --quick 7)")
    val.add_argument("--plans", metavar="LIST", help="--training: only these plans of the grid, "
                     "comma-separated as dp8, tp2xdp2, pp2xdp2, tp2xpp2xdp2, dp4xzero1 (default: all the cluster's); "
                     "also, on N hosts, ep2xdpN (expert parallelism, gpt-tiny-moe, ep carved from dp as realrun "
                     "train --ep), ep2xdpNxdropless (the same, dropless: predicted balanced and with the routing "
                     "histogram its first run measures) and cp2xdpN/2 (context parallelism: K/V ring attention)")
    val.add_argument("--policies", metavar="LIST", help="--training: these policies instead of the "
                     "grid's (none is always run: the speedups' baseline); perfmodel's policy grammar, separated by ;. "
                     "presets: every policy preset (hybrid, zeropp, ..., powersgd, loco, onebit-adam, zero-one-adam "
                     "as zero-one-adam,var_update_scaler=1, sdp4bit), each beside none on the plan that carries the "
                     "most of what it compresses among those realrun train runs it on (sdp4bit: dpNxzero1 on N "
                     "hosts; the four DDP recipes: dpN; deepseek: ep2xdpN), or with --plans on every named plan; a "
                     "plan "
                     "realrun train refuses is skipped, its reason in the report. report.md's Presets table: "
                     "predicted and measured speedup over none, the sign right or not, each preset's step MAPE")
    val.add_argument("--engine", choices=engine_names(), default="analytical",
                     help="--training: perfmodel's engine for the predictions (des: the discrete-event engine)")
    val.add_argument("--measured", metavar="CSV", help="predict the cases of a stored results.csv (with "
                     "--training: results_training.csv) again, after a model change or with another --calibration, "
                     "against its measurements; nothing runs and no cluster is needed")
    val.add_argument("--json", action="store_true", help="print the summary as JSON")


CLUSTER_EPILOG = """examples (as root):
  realrun cluster up --hosts 4 --bandwidth 1gbit
  realrun cluster up --name two --hosts 4 --groups 2 --bandwidth 1gbit --trunk 200mbit
  realrun cluster run -- python -m realrun.cli bench allreduce --sizes 16MiB --compressors none,int8
  realrun cluster shape --bandwidth 100mbit
  realrun cluster status --json
  realrun cluster down
"""


def _cluster_parser(sub) -> None:
    c = _command(sub, "cluster", "an emulated multi-host cluster: namespaces with rate-limited links",
                 "Hosts are Linux network namespaces on one bridge (or groups of bridges joined by rate-limited "
                 "trunks), each link limited with tc tbf in both directions. Needs root and iproute2. Names start "
                 "with cmp-NAME-, so clusters coexist. run: realrun cluster run [options] -- CMD ARGS... starts "
                 "CMD once per host.", CLUSTER_EPILOG)
    c.add_argument("action", choices=("up", "down", "status", "run", "shape"))
    c.add_argument("--name", default=None, help="cluster name: 1-8 lowercase letters or digits (default emu; "
                   "status without it lists every cluster of ours)")
    c.add_argument("--hosts", type=int, default=4, help="up: hosts, 2-8 (default 4)")
    c.add_argument("--bandwidth", default=None, help="up/shape: every host link, e.g. 100mbit, 1gbit (default 1gbit)")
    c.add_argument("--slow-host", type=int, default=None, help="up: index of one slower host")
    c.add_argument("--slow-bandwidth", default=None, help="up: that host's link rate")
    c.add_argument("--groups", type=int, default=1, help="up: groups of hosts behind trunks (two-tier)")
    c.add_argument("--trunk", default=None, help="up/shape: trunk rate between a group and the core")
    c.add_argument("--burst", default=None, help="up: token bucket of every link (default: one GSO segment of "
                   "0.5 ms at the link's rate plus 2 KiB, the segments cut to fit: the line rate holds from the first "
                   "byte; see docs)")
    c.add_argument("--cpus-per-host", default="auto", metavar="SHARE",
                   help="up: each host's fixed share of one core, a cgroup per host pinned to one core (auto: "
                        "the most every core can give its hosts, 0.45 for 4 hosts on 2 cores; none: hosts "
                        "time-share the cores). Recorded in the topology (cpu_share=) and every measurement")
    c.add_argument("--threads", type=int, default=1, help="run: OMP/numba threads per rank, 1-256 (default 1)")
    c.add_argument("--timeout", type=float, default=3600.0, help="run: seconds before every rank is stopped, "
                   "1 to 604800 (a week)")
    c.add_argument("--json", action="store_true", help="status/up: print JSON")


MAX_SIZE_BYTES = 1 << 31   # per message: a benchmark keeps several buffers of it per rank on a 24 GiB machine
MAX_SIZES = 64


def _sizes(text: str) -> list[int]:
    """SIZE, MIN:MAX (doubling) or a comma-separated list of sizes, each at most 2 GiB."""
    if "," in text:
        sizes = [parse_size(t.strip(), "sizes") for t in text.split(",") if t.strip()]
    else:
        sizes = parse_sweep(text if ":" in text else f"{text}:{text}")
    if not sizes or len(sizes) > MAX_SIZES or max(sizes) > MAX_SIZE_BYTES or min(sizes) < 4:
        raise InputError("sizes", text, f"1 to {MAX_SIZES} sizes from 4 B to 2 GiB")
    return sizes


def _training_filters(args) -> None:
    """--plans and --policies as lists (policies parsed now: a bad one is refused before anything
    runs); only with --training."""
    from perfmodel.compression.policy import parse_policy

    for name, sep in (("plans", ","), ("policies", ";")):
        text = getattr(args, name)
        if text is None:
            continue
        if not args.training:
            raise InputError(name, text, "only with --training")
        items = [t.strip() for t in text.split(sep) if t.strip()]
        if not items:
            raise InputError(name, text, f"a {sep}-separated list")
        setattr(args, name, items)
    from realrun.validate_training import PRESETS_WORD

    for policy in args.policies or ():
        if policy != PRESETS_WORD:
            parse_policy(policy)


def _positive(field: str, value: int, low: int = 1) -> int:
    if value < low:
        raise InputError(field, value, f"an integer >= {low}")
    return value


HEAD = ("size", "count", "type", "compressor", "algorithm", "time_us", "min_us", "max_us", "algbw", "busbw",
        "#wrong", "wire_bytes", "ratio", "compress_us", "decompress_us", "max_rel_err")


def _row(r: dict) -> tuple:
    algbw = r["size_bytes"] / r["time_s"] / 1e9 if r["time_s"] else 0.0
    return (r["size_bytes"], r["size_bytes"] // 4, "float", r["compressor"], r["algorithm"],
            r["time_s"] * 1e6, r["time_min_s"] * 1e6, r["time_max_s"] * 1e6, algbw, algbw * r["busbw_factor"],
            r.get("wrong", "-"), int(r["wire_bytes"]), r["size_bytes"] / max(r["wire_bytes"], 1), r["compress_s"] * 1e6,
            r["decompress_s"] * 1e6, r["max_rel_error"])


def _gbps(size: int, seconds: float) -> float:
    return size / seconds / 1e9 if seconds else float("inf")


def _kernel_row(r: dict) -> tuple:
    def gbps(s):
        return _gbps(r["size_bytes"], s)

    return (format_size(r["size_bytes"]), r["compressor"], r["device"], gbps(r["compress_s"]),
            gbps(r["decompress_s"]), r["size_bytes"] / max(r["wire_bytes"], 1), r["max_rel_error"])


def _bench(args) -> None:
    from perfmodel.report.plots import check_picture

    if args.json:
        check_writable(args.json, "json")   # before measuring: results are never lost to a bad path
    check_picture(args.plot)
    sizes = _sizes(args.sizes)
    specs, origin = expand_presets(args.op, parse_compressors(args.compressors))
    _positive("iters", args.iters)
    _positive("warmup", args.warmup, 0)
    for spec in specs:
        Compressor(spec)   # one clear error for a bad spec, before any rank starts
    if args.op == "kernels":
        records = annotate(run_kernels(sizes, specs, args.iters, args.device, args.accumulate), origin)
        for line in describe(origin, args.op):
            print(f"# {line}")
        print(table(("size", "compressor", "device", "compress_GBps", "decompress_GBps", "ratio", "max_rel_err"),
                    [_kernel_row(r) for r in records]))
    else:
        algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
        config = BenchConfig.grid(op=args.op, sizes=sizes, compressors=specs, algorithms=algorithms,
                                  world=args.world, backend=args.backend, iters=args.iters, warmup=args.warmup,
                                  op_timeout_s=args.op_timeout, threads=args.threads)
        torchrun = under_torchrun()
        records = run_here(config) if torchrun else run_collectives(config)
        if torchrun and os.environ["RANK"] != "0":
            return
        records = annotate(records, origin)
        world = os.environ["WORLD_SIZE"] if torchrun else args.world
        print(f"# realrun bench {args.op}: world={world} backend={args.backend} iters={args.iters} "
              f"(time = median over iterations of the slowest rank)" + (" under torchrun" if torchrun else ""))
        for line in describe(origin, args.op):
            print(f"# {line}")
        print(table(HEAD, [_row(r) for r in records]))
        if args.plot:
            from perfmodel.report.plots import plot_measured_collectives

            plot_measured_collectives(records, args.plot, f"realrun bench {args.op}: {world} ranks, {args.backend}")
    if args.json:
        atomic_write(args.json, lambda h: h.write("".join(json.dumps(r) + "\n" for r in records).encode()))


def _cluster(args) -> None:
    from realrun import cluster
    from realrun.cluster.emulated import check_name as emulated_check_name

    if args.name is not None:
        emulated_check_name(args.name)
    if args.action != "status":
        args.name = args.name or "emu"
    if args.action == "down":
        removed = cluster.down(args.name)
        print(f"cluster {args.name}: removed {len(removed)} namespaces" if removed else f"cluster {args.name}: not up")
        return
    if args.action == "run":
        argv = args.cmd
        cluster.run(args.name, argv, timeout_s=args.timeout, threads=args.threads)
        return
    if args.action == "up":
        spec = cluster.EmulatedSpec(hosts=args.hosts, bandwidth=args.bandwidth or "1gbit", slow_host=args.slow_host,
                                    slow_bandwidth=args.slow_bandwidth, groups=args.groups,
                                    trunk_bandwidth=args.trunk,
                                    burst_bytes=parse_size(args.burst, "burst") if args.burst else None,
                                    cpus_per_host=args.cpus_per_host)
        state = cluster.up(spec, args.name)
    elif args.action == "shape":
        cluster.shape(args.name, args.bandwidth, args.trunk)
        state = cluster.status(args.name)
    else:
        state = cluster.status(args.name)
        if not state:
            print("no emulated cluster is up")
            return
    if args.json:
        print(json.dumps(state, indent=2))
        return
    for name, info in state.items():
        if info["state"] == "half-built":
            print(f"cluster {name}: half-built ({len(info['namespaces'])} namespaces; "
                  f"realrun cluster down --name {name} removes them)")
            continue
        if not info["up"]:
            print(f"cluster {name}: not up")
            continue
        print(f"cluster {name}: up  topology {info['topology']}")
        share, cores = info["spec"]["cpus_per_host"], info["cores"]
        for ns, links in info["qdiscs"].items():
            host = int(ns.rsplit("-h", 1)[1]) if "-h" in ns else None
            where = f"  cpu {share:g} of core {cores[host]}" if share is not None and host is not None else ""
            print(f"  {ns:16s} " + "  ".join(f"{dev} {rate}" for dev, rate in sorted(links.items())) + where)
        if share is None:
            print("  cpu: hosts time-share this machine's cores (no fixed share)")


def _calibrate(args) -> None:
    from perfmodel.calibration.fit import summary
    from realrun.calibrate import COMPRESSORS, COMPUTE_MODELS, calibrate
    from realrun.measure import runner_for

    check_writable(args.output, "output")
    if args.records:
        check_writable(args.records, "records")
    specs = parse_compressors(args.compressors) if args.compressors else list(COMPRESSORS)
    for spec in specs:
        Compressor(spec)
    model = args.model or COMPUTE_MODELS
    for name in model.split(","):   # each a catalog name or a file, checked before any run
        load_model(name.strip())
    runner = runner_for(args.cluster)
    profile, records = calibrate(runner, specs, args.quick, _positive("iters", args.iters),
                                 sources=[f"realrun calibrate --cluster {args.cluster}"], model=model)
    if under_torchrun() and os.environ["RANK"] != "0":
        return
    atomic_write(args.output, lambda h: h.write(json.dumps(profile, indent=1).encode()))
    if args.records:
        atomic_write(args.records, lambda h: h.write("".join(json.dumps(r) + "\n" for r in records).encode()))
    print(f"# realrun calibrate: {len(records)} records on {runner.topology()} -> {args.output}")
    print(table(("fitted", "value", "fit"), summary(profile)))


def _validate(args) -> None:
    from perfmodel.calibration.profile import load_calibration
    from realrun.measure import runner_for
    from realrun.validate import summary_lines, validate

    check_repeats(args.repeats)
    _training_filters(args)
    load_calibration(args.calibration)   # a bad profile is refused before anything runs
    if args.measured is not None:
        _repredict(args)
        return
    iters = _positive("iters", args.iters)
    runner = runner_for(args.cluster)    # a bad cluster too; only then is --out created
    check_writable(os.path.join(args.out, "results.csv") if os.path.isdir(args.out) else args.out, "out")
    if args.training:
        _validate_training(args, runner)
        return
    os.makedirs(args.out, exist_ok=True)
    result = validate(runner, args.calibration, args.out, args.quick, iters, repeats=args.repeats)
    if under_torchrun() and os.environ["RANK"] != "0":
        return
    _print_summary(args, result, summary_lines, f"# realrun validate on {runner.topology()}: {args.out}/results.csv, "
                   "report.md, predicted_vs_measured.png")


def _repredict(args) -> None:
    check_writable(os.path.join(args.out, "report.md") if os.path.isdir(args.out) else args.out, "out")
    if args.training:
        from realrun.validate_training import repredict, summary_lines

        result = repredict(args.measured, args.calibration, args.out, engine=args.engine)
        _print_summary(args, result, summary_lines, f"# realrun validate --training ({args.engine}), re-predicted from "
                       f"{args.measured}: {args.out}/results_training.csv, report.md, step_predicted_vs_measured.png")
        return
    from realrun.validate import repredict, summary_lines

    result = repredict(args.measured, args.calibration, args.out)
    _print_summary(args, result, summary_lines, f"# realrun validate, re-predicted from {args.measured}: "
                   f"{args.out}/results.csv, report.md, predicted_vs_measured.png")


def _validate_training(args, runner) -> None:
    from realrun.validate_training import summary_lines, validate_training

    if not runner.emulated:
        raise InputError("cluster", args.cluster, "an emulated cluster that is up (--training trains on its hosts)")
    steps = None if args.steps is None else _positive("steps", args.steps)
    result = validate_training(runner, args.calibration, args.out, args.quick, steps=steps, engine=args.engine,
                               repeats=args.repeats, plans=args.plans, policies=args.policies)
    _print_summary(args, result, summary_lines, f"# realrun validate --training on {runner.topology()}: "
                   f"{args.out}/results_training.csv, report.md, step_predicted_vs_measured.png, loss_curves.png")


def _print_summary(args, result: dict, lines, header: str) -> None:
    """A validation's summary: JSON with --json, else the header and its summary lines."""
    if args.json:
        print(summary_json(result))
        return
    print(header)
    for line in lines(result):
        print(line)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []   # cluster run -- CMD ARGS...
    args = _parser().parse_args(argv[: len(argv) - len(cmd) - (1 if "--" in argv else 0)])
    args.cmd = cmd
    {"bench": _bench, "cluster": _cluster, "calibrate": _calibrate, "validate": _validate,
     "train": train_cli.run_train, "convergence": convergence_cli.run}[args.command](args)
    return 0


def entry() -> None:
    sys.exit(run(main))



if __name__ == "__main__":   # torchrun --nproc_per_node N -m realrun.cli bench allreduce ...
    entry()
