"""``realrun validate``: predict a grid of runs the model was not fitted on, run them, compare.

Every case is predicted first (perfmodel with the calibration profile, the algorithm realrun
runs, no chunking), then measured ``repeats`` times (each repeat the median over iterations of
the slowest rank; the case the median of its repeats, its spread max/min - 1). The grid
is disjoint from calibration: other sizes (2, 8, 32 MiB against 64 KiB-16 MiB), other
bandwidths (100 Mbit/s and 1 Gbit/s against 200 and 500 Mbit/s), compressed collectives
(calibration times compressors alone and uncompressed all-reduce only). Besides the all-reduces,
the grid has realrun's all-to-all (expert parallelism's dispatch and combine: ``direct``, each
chunk compressed once) uncompressed and compressed, so the model's pairwise all-to-all is checked
like the others (``op`` in every row; summary ``by_op``).

Repeats: one launch per (hosts, bandwidth, op) runs its cases round-robin, every case's timed block
(a warm-up iteration, then ``iters`` timed ones, on inputs of its own) once per round, ``repeats``
rounds. A repeat is thus its own warm-up and timed block, separated from the case's other repeats
by every other case of the launch: a drift over the launch (another load on the machine, the
scheduler moving ranks, socket buffers growing) falls on every case alike and shows as spread,
not as one case's bias. The blocks are what costs time; a launch of its own per repeat would
add every rank's start (torch import, process group, numba compiles) R - 1 times per
(hosts, bandwidth, op) and time nothing more that a collective's call depends on.

Outputs in ``DIR``: ``results.csv`` (a row per case, with ``repeats``, ``spread`` and every
repeat's time in ``measured_all_s``, ';'-joined), ``report.md`` (tables and summary, spread per
case, starred above 5%), ``predicted_vs_measured.png`` (log-log, y = x, +-10% band, the repeats'
range as error bars).

Summary numbers: MAPE and worst case over cases of 1 MiB and more; how often the predicted
fastest compressor (each with its best algorithm) is the measured fastest per (hosts,
bandwidth, size, op); MAPE per op; the bandwidth where ``int8`` stops paying off against ``none``, predicted
and measured (log-linear interpolation of the speedup over the bandwidths measured); the
testbed's noise floor (median spread over every case measured) and the cases flagged.
"""
from __future__ import annotations

import csv
import io
import math
import os
import sys
from dataclasses import asdict, dataclass

from perfmodel.collectives.runtime import runtime_algorithm, runtime_time
from perfmodel.calibration import tables
from realrun.bench import BenchCase, BenchConfig
from realrun.bench.config import RUN_TIMEOUT_S
from realrun.report import (OWN_LINKS, REPEATS, check_repeats, csv_cells, noise, plot, rate_label, repeated,
                            report_md, restored, summary_lines)  # noqa: F401  (summary_lines: API)
from topologies import bounds
from topologies.clikit import atomic_write
from topologies.errors import InputError

MIB = 2**20
MBIT, GBIT = 10**6, 10**9
# (compressor, algorithms realrun runs it with): 5 compressors, 4 algorithms
PAIRS = (("none", ("auto",)), ("int8", ("two_phase", "ring")), ("ef(topk(0.01))", ("allgather",)),
         ("powersgd(4)", ("allgather",)), ("zfp(rate=8)", ("two_phase", "recursive_doubling")))
QUICK_PAIRS = (("none", ("auto",)), ("int8", ("two_phase", "ring")), ("ef(topk(0.01))", ("allgather",)),
               ("powersgd(4)", ("allgather",)), ("zfp(rate=8)", ("two_phase",)))
# realrun's all-to-all (auto = direct): uncompressed and calibrated specs, fp8 the MoE dispatch's
ALLTOALL_SPECS = ("none", "fp16", "fp8", "int8")
QUICK_ALLTOALL_SPECS = ("none", "fp8", "int8")
CROSSOVER_SIZE = 8 * MIB
CROSSOVER_BANDWIDTHS = (100 * MBIT, 1 * GBIT, 3 * GBIT, 10 * GBIT)


@dataclass(frozen=True)
class Case:
    hosts: int
    bandwidth: int
    size_bytes: int
    compressor: str
    algorithm: str
    op: str = "allreduce"   # or "alltoall"


def grid(hosts: int, quick: bool, bandwidths=(100 * MBIT, GBIT), subsets: bool = True) -> list[Case]:
    """Held-out cases: 4 (or the cluster's) hosts at 100 Mbit/s and 1 Gbit/s; the full grid
    adds 2 hosts (where the runner can run a subset) and 32 MiB. All-reduces, then all-to-alls."""
    sizes = (2 * MIB, 8 * MIB) if quick else (2 * MIB, 8 * MIB, 32 * MIB)
    host_counts = (hosts,) if quick or hosts <= 2 or not subsets else (hosts, 2)
    pairs = QUICK_PAIRS if quick else PAIRS
    specs = QUICK_ALLTOALL_SPECS if quick else ALLTOALL_SPECS
    return [Case(h, bw, s, c, a) for h in host_counts for bw in bandwidths for s in sizes
            for c, algs in pairs for a in algs] + [Case(h, bw, s, c, "auto", "alltoall") for h in host_counts
                                                    for bw in bandwidths for s in sizes for c in specs]


def crossover_cases(hosts: int, quick: bool) -> list[Case]:
    bws = CROSSOVER_BANDWIDTHS[1:3] if quick else CROSSOVER_BANDWIDTHS
    return [Case(hosts, bw, CROSSOVER_SIZE, c, "auto" if c == "none" else "two_phase")
            for bw in bws for c in ("none", "int8")]


def predict(case: Case, runner, calibration: str | None) -> float:
    cluster = runner.topology(case.hosts, case.bandwidth or None)
    return runtime_time(case.op, case.size_bytes, cluster=cluster, compressor=case.compressor,
                        algorithm=case.algorithm, calibration=calibration).time_s


def measure(cases: list[Case], runner, iters: int, repeats: int = REPEATS) -> dict:
    """{case: measured seconds of each repeat}, one launch per (hosts, bandwidth, op) that runs
    its cases round-robin ``repeats`` times (module doc)."""
    out: dict = {}
    groups: dict = {}
    for c in dict.fromkeys(cases):
        groups.setdefault((c.hosts, c.bandwidth, c.op), []).append(c)
    try:
        for i, ((hosts, bw, op), members) in enumerate(sorted(groups.items())):
            runner.set_bandwidth(bw)
            if getattr(runner, "rank", 0) == 0:
                print(f"validate: {i + 1}/{len(groups)} {hosts} hosts at {rate_label(bw)}, {op}: {len(members)} "
                      f"cases x {repeats} repeats", file=sys.stderr, flush=True)
            rounds = members * repeats
            config = BenchConfig(op=op, iters=iters, warmup=1, timeout_s=RUN_TIMEOUT_S * repeats, cases=tuple(
                BenchCase(size_bytes=c.size_bytes, compressor=c.compressor, algorithm=c.algorithm) for c in rounds))
            for c, r in zip(rounds, runner.collectives(config, hosts), strict=True):
                out.setdefault(c, []).append(r["time_s"])
    finally:
        runner.restore()
    return out


def _fastest_agreement(rows) -> tuple[int, int, list]:
    """(agreeing, total, disagreements) over (hosts, bandwidth, size, op) of the fastest compressor."""
    best: dict = {}
    for r in rows:
        key = (r["hosts"], r["bandwidth"], r["size_bytes"], r.get("op", "allreduce"))
        for side in ("predicted_s", "measured_s"):
            slot = best.setdefault(key, {}).setdefault(side, {})
            slot[r["compressor"]] = min(slot.get(r["compressor"], math.inf), r[side])
    agree, wrong = 0, []
    for key, sides in best.items():
        p = min(sides["predicted_s"], key=sides["predicted_s"].get)
        m = min(sides["measured_s"], key=sides["measured_s"].get)
        agree += p == m
        if p != m:
            wrong.append((key, p, m))
    return agree, len(best), wrong


def crossover(bandwidths, speedups) -> float | None:
    """Bandwidth where speedup crosses 1 (log speedup linear in log bandwidth between the two
    points around the crossing), None if it never does."""
    pts = sorted(zip(bandwidths, speedups))
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if (s0 - 1) * (s1 - 1) <= 0 and s0 != s1:
            w = math.log(s0) / (math.log(s0) - math.log(s1))
            return math.exp(math.log(b0) + w * (math.log(b1) - math.log(b0)))
    return None


def predicted_crossover(runner, hosts: int, calibration) -> float | None:
    """Where int8 (two-phase) stops beating none on the model: 10 Mbit/s - 100 Gbit/s, 24 points per decade."""
    bws = [10 * MBIT * 10 ** (k / 24) for k in range(24 * 4 + 1)]
    speed = []
    for bw in bws:
        none = predict(Case(hosts, int(bw), CROSSOVER_SIZE, "none", "auto"), runner, calibration)
        int8 = predict(Case(hosts, int(bw), CROSSOVER_SIZE, "int8", "two_phase"), runner, calibration)
        speed.append(none / int8)
    return crossover(bws, speed)


def summarize(rows: list[dict], cross: dict) -> dict:
    big = [r for r in rows if r["size_bytes"] >= MIB and not r.get("crossover")]
    errors = [abs(r["error"]) for r in big]
    worst = max(big, key=lambda r: abs(r["error"])) if big else None
    agree, total, wrong = _fastest_agreement(big)
    compressors = sorted({r["compressor"] for r in big})
    algorithms = sorted({runtime_algorithm(r.get("op", "allreduce"), r["compressor"], r["algorithm"]) for r in big})
    ratio = None
    if cross.get("predicted") and cross.get("measured"):
        ratio = max(cross["predicted"], cross["measured"]) / min(cross["predicted"], cross["measured"])
    return {"cases": len(big), "compressors": compressors, "algorithms": algorithms,
            "mape": sum(errors) / len(errors) if errors else math.nan,
            "worst": worst, "fastest_agree": agree, "fastest_total": total, "fastest_wrong": wrong,
            "crossover": cross, "crossover_ratio": ratio, "by_op": _by_op(big), **noise(rows)}


def _by_op(rows: list[dict]) -> dict:
    """{op: {"cases", "mape"}} over the summary's cases (the all-reduces' and the all-to-alls')."""
    out: dict = {}
    for r in rows:
        out.setdefault(r.get("op", "allreduce"), []).append(abs(r["error"]))
    return {op: {"cases": len(e), "mape": sum(e) / len(e)} for op, e in sorted(out.items())}


def _crossover_times(rows: list[dict], hosts: int) -> dict:
    """{(bandwidth, compressor): measured s} of the all-reduces at the crossover size (none: auto,
    int8: two_phase)."""
    return {(r["bandwidth"], r["compressor"]): r["measured_s"] for r in rows if r["size_bytes"] == CROSSOVER_SIZE
            and r["hosts"] == hosts and r.get("op", "allreduce") == "allreduce"
            and r["algorithm"] in ("auto", "two_phase")}


def validate(runner, calibration: str | None, out_dir: str, quick: bool = False, iters: int = 5,
             cases: list[Case] | None = None, repeats: int = REPEATS) -> dict:
    """Predict, measure (each case ``repeats`` times, 1-20; ``quick`` has fewer cases, as many
    repeats), compare; write the three outputs into ``out_dir``; return the summary (with
    ``noise_floor``, ``flagged`` and ``repeats``). ``cases`` replaces the grid (and skips the
    crossover sweep)."""
    check_repeats(repeats)
    os.makedirs(out_dir, exist_ok=True)
    emulated = runner.emulated
    cross_cases = crossover_cases(runner.hosts, quick) if emulated and cases is None else []
    cases = cases or grid(runner.hosts, quick, (100 * MBIT, GBIT) if emulated else (OWN_LINKS,), subsets=emulated)
    predicted = {c: predict(c, runner, calibration) for c in cases + cross_cases}
    measured = measure(cases + cross_cases, runner, iters, repeats)
    rows = [_row(c, predicted[c], repeated(measured[c]), crossover=c in cross_cases and c not in cases)
            for c in cases + [c for c in cross_cases if c not in cases]]
    cross = {}
    if cross_cases:
        by = _crossover_times(rows, runner.hosts)
        bws = sorted({bw for bw, _ in by if (bw, "none") in by and (bw, "int8") in by})
        cross = {"measured": crossover(bws, [by[(bw, "none")] / by[(bw, "int8")] for bw in bws]),
                 "predicted": predicted_crossover(runner, runner.hosts, calibration),
                 "bandwidths": bws, "speedups": [by[(bw, "none")] / by[(bw, "int8")] for bw in bws]}
    summary = summarize(rows, cross)
    if getattr(runner, "rank", 0) == 0:
        write_outputs(out_dir, rows, summary)
    return summary


def repredict(results_csv: str, calibration: str | None, out_dir: str) -> dict:
    """Predict the cases of a stored ``results.csv`` again (a changed model, another profile)
    against its measured times; writes the three outputs into ``out_dir``. No collective runs
    and no cluster: the stored cases name their hosts and bandwidths (the crossover's measured
    bandwidth is recomputed from the stored runs, the predicted one on the model). A file
    written before repeats were recorded counts one repeat per case, its spread unknown. Every
    cell read is checked first (``stored_case``), and a prediction that is no time is refused:
    one line naming the file, line and column; nothing is written."""
    from realrun.validate_training import StoredCluster

    stored = tables.read_table(results_csv, "measured", STORED)
    tables.require(results_csv, stored, STORED_COLUMNS, "measured", STORED)
    runner = StoredCluster()
    rows = []
    for where, m in stored:
        case, measured = stored_case(where, m)
        try:
            predicted = predict(case, runner, calibration)
        except InputError as err:
            raise tables.located(where, err) from None
        rows.append(_row(case, predicted, measured, crossover=tables.flag(where, m, "crossover"), where=where))
    hosts = max(r["hosts"] for r in rows)
    by = _crossover_times(rows, hosts)
    bws = sorted({bw for bw, _ in by if (bw, "none") in by and (bw, "int8") in by})
    cross = {"measured": crossover(bws, [by[(bw, "none")] / by[(bw, "int8")] for bw in bws]),
             "predicted": predicted_crossover(runner, hosts, calibration), "bandwidths": bws,
             "speedups": [by[(bw, "none")] / by[(bw, "int8")] for bw in bws]} if bws else {}
    summary = summarize(rows, cross)
    os.makedirs(out_dir, exist_ok=True)
    write_outputs(out_dir, rows, summary)
    return summary


STORED = "a results.csv of realrun validate"
STORED_COLUMNS = ("hosts", "bandwidth", "size_bytes", "compressor", "algorithm", "crossover", "measured_s")


def stored_case(where: str, m: dict) -> tuple[Case, dict]:
    """(the case, its measurement as ``restored``) of a stored row (``where``: FILE:LINE), every cell
    checked: hosts and size within their declared bounds, the bandwidth an emulated link's rate (0,
    a real cluster's own links, names no rate to predict with), each measured time a finite number
    of seconds above 0 (``topologies.bounds`` measured_s: ``restored`` checks them)."""
    if tables.text(where, m, "bandwidth").strip() == str(OWN_LINKS):
        raise InputError(f"{where}.bandwidth", m["bandwidth"], "an emulated link rate in bits/s, "
                         f"{bounds.describe('link_bits_per_s')} (0: a real cluster's own links, which --measured "
                         "cannot predict without the cluster: run realrun validate there)")
    case = Case(tables.integer(where, m, "hosts", "nodes"), tables.integer(where, m, "bandwidth", "link_bits_per_s"),
                tables.integer(where, m, "size_bytes", "size_bytes", positive=True),
                tables.text(where, m, "compressor"), tables.text(where, m, "algorithm"),
                tables.text(where, m, "op", required=False) or "allreduce")  # older files: all-reduces
    return case, restored(m, where=where)


def _row(case: Case, predicted_s: float, measured: dict, crossover: bool, where: str = "case") -> dict:
    """A results row: the case, its prediction, its measurement (``repeated``) and the error; a
    prediction that is no time above 0 (an error of -100% or not a number) is refused naming ``where``."""
    if not (math.isfinite(predicted_s) and predicted_s > 0):
        raise InputError(f"{where}.predicted_s", predicted_s, f"a time above 0 predicted for {case} (the model gives "
                         "none: its error against the measurement would be no number)")
    return dict(asdict(case), crossover=crossover, predicted_s=predicted_s, **measured,
                error=(predicted_s - measured["measured_s"]) / measured["measured_s"])


FIELDS = ("hosts", "bandwidth", "size_bytes", "compressor", "algorithm", "crossover", "predicted_s",
          "measured_s", "error", "repeats", "spread", "measured_all_s", "op")


def write_outputs(out_dir: str, rows: list[dict], summary: dict) -> None:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=FIELDS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(csv_cells(r) for r in rows)
    atomic_write(os.path.join(out_dir, "results.csv"), lambda h: h.write(text.getvalue().encode()))
    atomic_write(os.path.join(out_dir, "report.md"), lambda h: h.write(report_md(rows, summary).encode()))
    plot(rows, os.path.join(out_dir, "predicted_vs_measured.png"))
