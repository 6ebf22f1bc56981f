"""``perfmodel calibrate``: fit a calibration profile from measured records."""
from __future__ import annotations

import argparse
import math

from perfmodel.cli.common import RAW, FromAction
from topologies.clikit import atomic_write, check_writable, dump_json, table
from topologies.errors import InputError

CALIBRATE_EPILOG = """examples:
  realrun bench kernels --sizes 1MiB:64MiB --compressors int8,sz3 --json kernels.jsonl
  perfmodel calibrate kernels.jsonl collectives.jsonl --cluster emulated:hosts=4,bandwidth=1gbit -o profile.json
  perfmodel collective allreduce --cluster emulated:hosts=4,bandwidth=1gbit --size 64MiB \
      --compressor none,int8 --calibration profile.json
  perfmodel calibrate --from-file nccl-tests:all_reduce_perf.txt --cluster dgx-h100 -o h100.json
  realrun train --model gpt-tiny --steps 10 --profile traces/
  perfmodel calibrate --from-file torch-trace:traces/ --cluster emulated:hosts=1 -o cpu.json
  perfmodel calibrate --from-file torch-trace:rank0.json.gz --from torchtitan:llama3_8b.toml --gpus 8 \
      --cluster dgx-h100 -o h100.json
"""
CHECK_EPILOG = """examples:
  perfmodel check-step --log megatron-log:train.log --model llama3-8b --cluster dgx-h100 --gpus 8 --tp 1 \
      --mbs 1 --gbs 128 --seq 8192
"""


def add_calibrate(sub) -> None:
    cal = sub.add_parser("calibrate", help="fit a calibration profile from measured records",
                         description="Fit alpha, beta and base latency per tier class (uncompressed collective "
                         "records), kernel throughput per compressor and direction and the launch cost "
                         "(kernel records), and measured ratios of data-dependent specs; scipy least squares "
                         "with a robust loss. Prints residuals, R^2 and the tier fit's standard errors; writes a "
                         "versioned profile that every perfmodel command takes with --calibration. Records come "
                         "from realrun bench, or from nccl-tests output (--from-file; docs: "
                         "calibrate-from-files.md).", epilog=CALIBRATE_EPILOG,
                         formatter_class=RAW)
    cal.add_argument("records", nargs="*", help="JSON Lines files written by realrun bench --json; every field of "
                     "every record is checked (its type and declared bound, and no record a fit cannot use: a kernel "
                     "record of 0 bytes or 0 wire bytes, times implying a rate past any device's), one line naming "
                     "the file, line and field")
    cal.add_argument("--from-file", action="append", default=[], metavar="KIND:PATH",
                     help="a file of another tool: nccl-tests:OUT.txt (all_reduce_perf ... stdout) or "
                     "nccl-tests:OUT.json (its -J JSON); nccl-tests.OP:PATH names the op where the file does not "
                     "(allreduce, reduce_scatter, alltoall, allgather, sendrecv are fitted); repeatable. What the "
                     "file did not contain is said a line each; a file with nothing usable is refused naming its "
                     "line. Training logs "
                     "(megatron-log, torchtitan-log, deepspeed-log) check a prediction: perfmodel check-step. "
                     "torch-trace:PATH: PyTorch profiler traces (Chrome trace JSON, .json.gz too; a folder: every "
                     "rank's), GEMM and attention time per shape and the memory-bound work's streaming rate")
    cal.add_argument("--model", help="torch-trace: the traced job's model, where the trace does not name it "
                     "(realrun train --profile's do): catalog name or TOML (or from --from)")
    cal.add_argument("--from", dest="sources", action=FromAction, metavar="FORMAT:PATH", default=[],
                     help="torch-trace: the traced job's model and plan from its config (as predict's --from: "
                     "hf:, megatron:, torchtitan:, nemo:, deepspeed:)")
    cal.add_argument("--gpus", type=int, help="torch-trace: GPUs of the traced job")
    cal.add_argument("--plan", type=plan_items, default={}, metavar="KEY=VALUE,...",
                     help="torch-trace: the traced job's plan as predict's Python keywords (tp=2,pp=1,mbs=1,"
                     "gbs=64,seq=4096,...), over --from's")
    cal.add_argument("-o", "--output", required=True, help="the profile to write (JSON, atomically; only once "
                     "every fitted value is within its declared bound, as perfmodel checks a profile it reads)")
    cal.add_argument("--cluster", help="cluster the collective records ran on, where a record does not name it "
                     "(e.g. emulated:hosts=4,bandwidth=1gbit)")
    cal.add_argument("--json", action="store_true", help="print the profile instead of the summary table")


def run_calibrate(args) -> None:
    import json

    from perfmodel.calibration.fit import summary, worst_residuals
    from perfmodel.calibration.measurements import read_records
    from perfmodel.calibration.userfiles import calibrate

    if not args.records and not args.from_file:
        raise InputError("records", None, "realrun bench JSON Lines files or --from-file KIND:PATH")
    check_writable(args.output, "output")
    records = [r for path in args.records for r in read_records(path)]
    model, plan = traced_job(args)
    profile, users, errors = calibrate(records, args.cluster, args.from_file, args.records, model, plan)
    cluster = profile["fits"]["cluster"]
    atomic_write(args.output, lambda h: h.write(json.dumps(profile, indent=1).encode()))
    if args.json:
        print(dump_json(profile))
        return
    print(f"# perfmodel calibrate: {len(records) + sum(len(u.records) for u in users)} records -> {args.output} "
          f"(cluster {cluster})")
    for u in users:
        say_file(u)
    print(table(("fitted", "value", "fit"), summary(profile) + error_rows(errors)))
    residuals = worst_residuals(profile)
    if residuals:
        print()
        print(table(("cluster", "algorithm", "size", "measured_s", "fitted_s", "residual"), residuals,
                    title="# largest residuals of the tier fit (all are in the profile under fits)"))
    for u in users:
        say_busbw(u, cluster, profile, errors)


def plan_items(text: str) -> dict:
    """``--plan tp=2,mbs=4,dp_overlap=false``: PlanRequest's fields (``perfmodel.plan.parallel``),
    whole numbers as numbers, true/false as booleans; another key is one line naming it."""
    from perfmodel.plan.parallel import REQUEST_FIELDS

    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in REQUEST_FIELDS:
            raise argparse.ArgumentTypeError(f"{item!r}: KEY=VALUE,... with KEY one of "
                                             + ", ".join(sorted(REQUEST_FIELDS)))
        booleans = {"true": True, "false": False}
        out[key] = int(value) if value.lstrip("-").isdigit() else booleans.get(value.lower(), value)
    return out


def traced_job(args) -> tuple[str | None, dict | None]:
    """(model, plan keywords) of a user's traced job from --model/--from, --gpus and --plan (None, None:
    none given; a realrun trace names its own)."""
    import sys

    from perfmodel.cli.common import imported_lines

    for line in imported_lines(args):
        print(f"perfmodel: {line}", file=sys.stderr)
    fields = {k: v for k, v in getattr(args, "from_fields", {}).items() if k != "deepspeed"}
    plan = {**fields, **args.plan, **({"gpus": args.gpus} if args.gpus else {})}
    if args.model is None and not plan:
        return None, None
    if args.model is None:
        raise InputError("model", None, "the traced job's model (--model or --from) with --plan/--gpus")
    return args.model, plan


def say_file(user) -> None:
    """What a user file was and, a line each, what it did not contain."""
    a = user.about
    if user.kind == "torch-trace":
        say_trace(user)
        return
    print(f"# {user.path}: {len(user.records)} {a['op']} rows on {a['world']} ranks, {a.get('hosts') or '?'} host(s), "
          f"{', '.join(a.get('devices') or ['device not named'])}")
    for line in user.missing:
        print(f"# {user.path}: {line}")


def say_trace(user) -> None:
    """A profiler trace's median step, per trace file, and what the traces did not contain."""
    rows = [(s["file"], s["steps"], "gpu" if s["gpu"] else "cpu", *(f"{s[k]:.4f}" for k in
             ("step_s", "gemm_s", "attention_s", "memory_s", "comm_s", "optimizer_s", "profiler_s", "idle_s")))
            for s in user.about["steps"]]
    print(table(("trace", "steps", "timed", "step_s", "gemm_s", "attention_s", "memory_s", "comm_s", "optimizer_s",
                 "profiler_s", "idle_s"),
                rows, title=f"# {user.path}: the median step of each trace ({len(user.records)} compute records)"))
    for line in user.missing:
        print(f"# {user.path}: {line}")


def error_rows(errors: dict) -> list[tuple]:
    """Rows (what, value, fit) of the tier fit's standard errors."""
    if not errors:
        return []
    note = f"residual sd {100 * errors['residual_sd']:.1f}%" + ("" if errors["separable"] else
                                                               "; base and alpha not separable (one world size)")
    rows = [("tier base", f"+- {_sd(errors['base_us_sd'], ' us')}", note)]
    for cls, prims in errors["primitives"].items():
        for prim, e in prims.items():
            rows.append((f"  {cls} {prim}", f"alpha +- {_sd(e['step_us_sd'], ' us')}, bw_fraction +- "
                         f"{_sd(e['bw_fraction_sd'], '', 3)}", "standard errors"))
    return rows


def _sd(value: float, unit: str, digits: int = 2) -> str:
    """A standard error, or '-' where the records do not determine it."""
    return f"{value:.{digits}f}{unit}" if math.isfinite(value) else "-"


def say_busbw(user, cluster: str, profile: dict, errors: dict) -> None:
    from perfmodel.calibration.userfiles import WITHIN, busbw_check

    if not errors:
        return
    rows = [(r["size_bytes"], f"{r['measured_busbw_GBps']:.2f}", f"{r['fitted_busbw_GBps']:.2f}",
             f"{100 * (r['measured_busbw_GBps'] / r['fitted_busbw_GBps'] - 1):+.1f}%",
             f"+-{100 * r['relative_error']:.1f}%", "yes" if r["within"] else "NO")
            for r in busbw_check(user, cluster, profile, errors)]
    print()
    print(table(("size", "busbw", "fitted", "diff", "error", f"within {WITHIN:g} sd"), rows,
                title=f"# {user.path}: measured busbw (GB/s) against the profile's"))


def add_check_step(sub) -> None:
    from perfmodel.cli.common import cluster_args, plan_args

    ck = sub.add_parser("check-step", help="a training log's measured step time against the prediction",
                        description="Read the step lines of a Megatron-LM, torchtitan or DeepSpeed log, skip the "
                        "first warm-up steps, and compare the median step (and its spread) with perfmodel's "
                        "prediction of the same plan (with --calibration, the calibrated one). A check, not a "
                        "fit: one step time cannot tell compute from communication (docs: calibrate-from-files.md).",
                        epilog=CHECK_EPILOG, formatter_class=RAW)
    ck.add_argument("--log", required=True, metavar="KIND:PATH", help="megatron-log:PATH, torchtitan-log:PATH or "
                    "deepspeed-log:PATH (torchtitan's tps and DeepSpeed's CurrSamplesPerSec become step seconds "
                    "with the plan's --gbs, --seq and GPUs)")
    cluster_args(ck)
    plan_args(ck)
    ck.add_argument("--policy", default="none", help="compression policy of the logged run")


def run_check_step(args) -> None:
    from perfmodel.calibration.userfiles import LOG_KINDS, check_step, read_step_log, split_spec
    from perfmodel.cli.common import request
    from perfmodel.prediction import predict

    kind, path, _ = split_spec(args.log)
    if kind not in LOG_KINDS:
        raise InputError("log", args.log, "KIND:PATH with KIND one of " + ", ".join(LOG_KINDS))
    log = read_step_log(path, kind)
    r = predict(args.model, args.cluster, *request(args, args.policy))
    out = check_step(log, r.step_time_s, gbs=r.plan["gbs"], seq=r.plan["seq"], gpus=r.gpus)
    if args.json:
        print(dump_json(out))
        return
    print(f"# perfmodel check-step: {path} ({kind}, {out['unit']}), first {out['warmup_steps']} steps skipped "
          f"(warm-up), {out['steps']} step lines used")
    if out["unit"] == "tokens/s/device":
        print(f"# step seconds = gbs x seq / (GPUs x tps) = {r.plan['gbs']} x {r.plan['seq']} / ({r.gpus} x tps)")
    elif out["unit"] == "samples/s":
        print(f"# step seconds = gbs / CurrSamplesPerSec = {r.plan['gbs']} / CurrSamplesPerSec")
    for line in out["missing"]:
        print(f"# {path}: {line}")
    print(table(("measured_median_s", "spread_s", "min_s", "max_s", "predicted_s", "error", "within spread"),
                [(f"{out['median_s']:.4f}", f"{out['spread_s']:.4f}", f"{out['min_s']:.4f}", f"{out['max_s']:.4f}",
                  f"{out['predicted_s']:.4f}", f"{100 * out['relative_error']:+.1f}%",
                  "yes" if out["within_spread"] else "no")]))


COMMANDS = {"calibrate": (add_calibrate, run_calibrate), "check-step": (add_check_step, run_check_step)}
