"""The validation report: a markdown table and summary, and the predicted-vs-measured picture.

Also the repeats both validations share: a case is measured ``repeats`` times, its measured
value is the median of the repeats and its spread ``max / min - 1`` (unknown, NaN, with one
repeat); the testbed's noise floor is the median spread over the cases, and a case whose
spread exceeds ``SPREAD_FLAG`` is flagged (starred in the table, counted), never dropped.
"""
from __future__ import annotations

import json
import math
import statistics

from perfmodel.calibration import tables
from topologies.errors import InputError
from topologies.units import format_rate, format_size

TARGET_MAPE = 0.10      # the loop's targets (docs/design.md, validation)
TARGET_FASTEST = 0.90
OWN_LINKS = 0   # a bandwidth of 0: the cluster's own links (a real cluster under torchrun)
REPEATS = 3             # measurements per case (the median counts)
MAX_REPEATS = 20
SPREAD_FLAG = 0.05      # a case whose repeats spread more than this is flagged


def rate_label(bw: int) -> str:
    return "own links" if bw == OWN_LINKS else format_rate(bw)


def check_repeats(value) -> int:
    """``value`` as the number of repeats per case, or one InputError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEATS:
        raise InputError("repeats", value, f"an integer from 1 to {MAX_REPEATS}")
    return value


def spread(values) -> float:
    """max / min - 1 of a case's repeats; NaN (unknown, not zero) with fewer than two."""
    values = list(values)
    if len(values) < 2 or min(values) <= 0:
        return math.nan
    return max(values) / min(values) - 1


def _all_key(key: str) -> str:
    return key.removesuffix("_s") + "_all_s"     # measured_s -> measured_all_s


def repeated(values, key: str = "measured_s") -> dict:
    """A case's measurement from its repeats: the median under ``key``, every repeat under
    ``key``'s ``_all_s`` form, ``repeats`` and ``spread``."""
    values = [float(v) for v in values]
    return {key: statistics.median(values), _all_key(key): values, "repeats": len(values), "spread": spread(values)}


def restored(stored: dict, key: str = "measured_s", where: str = "row") -> dict:
    """``repeated`` of a stored results row: its median as stored; a row written before repeats
    were recorded has one repeat, its own value, and an unknown spread. Each time is checked
    (``perfmodel.calibration.tables``: seconds within ``topologies.bounds`` measured_s), else one
    line naming ``where`` (the row's FILE:LINE), the column and the value."""
    all_key = _all_key(key)
    median = tables.number(where, stored, key, "measured_s")
    cells = filter(None, tables.text(where, stored, all_key, required=False).split(";"))
    values = [tables.number(where, {all_key: cell}, all_key, "measured_s") for cell in cells]
    return dict(repeated(values or [median], key), **{key: median})


def csv_cells(row: dict, key: str = "measured_s") -> dict:
    """``row`` with its repeats as CSV cells: the values joined by ';', an unknown spread empty."""
    values, s = row[_all_key(key)], row["spread"]
    return {**row, _all_key(key): ";".join(repr(float(v)) for v in values), "spread": "" if math.isnan(s) else s}


def noise(rows: list[dict]) -> dict:
    """The testbed's noise over ``rows``: ``noise_floor`` (median spread of the cases whose
    spread is known, NaN if none is), ``noise_cases`` (those cases), ``flagged`` (spread above
    ``SPREAD_FLAG``) and ``repeats`` (the fewest any case had)."""
    known = [r["spread"] for r in rows if not math.isnan(r["spread"])]
    return {"noise_floor": statistics.median(known) if known else math.nan, "noise_cases": len(known),
            "flagged": sum(s > SPREAD_FLAG for s in known), "repeats": min((r["repeats"] for r in rows), default=0)}


def noise_text(summary: dict) -> str:
    """The noise floor as the summaries print it beside the MAPE."""
    if math.isnan(summary["noise_floor"]):
        return ("noise floor unknown (one measurement per case: --repeats 1, or results stored before "
                "repeats were recorded)")
    return (f"noise floor {100 * summary['noise_floor']:.1f}% (median over {summary['noise_cases']} cases of the "
            f"spread, max/min - 1, of {summary['repeats']} repeats); {summary['flagged']}/{summary['noise_cases']} "
            f"spread over {100 * SPREAD_FLAG:.0f}% (* in the table)")


def spread_cell(r: dict) -> str:
    """A case's spread for a table: a percentage, starred above ``SPREAD_FLAG``; '-' if unknown."""
    s = r["spread"]
    return "-" if math.isnan(s) else f"{100 * s:.1f}%" + (" *" if s > SPREAD_FLAG else "")


def error_bars(rows: list[dict], key: str = "measured_s") -> tuple[list[float], list[float]]:
    """Each row's repeats as (below, above) its median: matplotlib's ``xerr``."""
    return ([r[key] - min(r[_all_key(key)]) for r in rows], [max(r[_all_key(key)]) - r[key] for r in rows])


SPREAD_NOTE = (f"spread = max/min - 1 of the case's repeats; * above {100 * SPREAD_FLAG:.0f}% (kept and counted, "
               "not dropped); - one repeat, unknown.")


def summary_lines(summary: dict) -> list[str]:
    worst = summary["worst"]
    cross = summary["crossover"]
    if math.isnan(summary["mape"]):   # summarize averaged nothing: no case of 1 MiB or more
        lines = ["cases (>= 1 MiB): none (the summary covers cases of 1 MiB or more; each smaller case's error is "
                 "in report.md and results.csv)", f"MAPE: no case of 1 MiB or more; {noise_text(summary)}"]
    else:
        lines = [f"cases (>= 1 MiB): {summary['cases']}; compressors: {', '.join(summary['compressors'])}; "
                 f"algorithms: {', '.join(summary['algorithms'])}",
                 f"MAPE: {100 * summary['mape']:.1f}% (target <= {100 * TARGET_MAPE:.0f}%); {noise_text(summary)}"]
    by_op = summary.get("by_op") or {}
    if len(by_op) > 1:
        lines.append("MAPE by op: " + "; ".join(f"{op} {100 * v['mape']:.1f}% ({v['cases']} cases)"
                                                 for op, v in by_op.items()))
    if worst:
        lines.append(f"worst: {100 * worst['error']:+.1f}% ({_op_label(worst)}{worst['compressor']} "
                     f"{worst['algorithm']} "
                     f"{format_size(worst['size_bytes'])} {worst['hosts']} hosts {rate_label(worst['bandwidth'])})")
    if summary["fastest_total"]:
        share = summary["fastest_agree"] / summary["fastest_total"]
        lines.append(f"predicted fastest compressor = measured fastest: {summary['fastest_agree']}/"
                     f"{summary['fastest_total']} ({100 * share:.0f}%, target >= {100 * TARGET_FASTEST:.0f}%)")
    if cross:
        def fmt(v):
            return format_rate(v) if v else "no crossing in range"
        lines.append(f"int8 stops paying off at: predicted {fmt(cross['predicted'])}, measured "
                     f"{fmt(cross['measured'])}" + (f" (factor {summary['crossover_ratio']:.2f}, target <= 2)"
                                                    if summary["crossover_ratio"] else ""))
    return lines


def summary_json(summary: dict) -> str:
    """A validation's summary as strict JSON (``--json``): a number that is none (NaN: the MAPE
    where no case was averaged, a noise floor or spread unknown; an infinity) is null, never the
    ``NaN`` that no JSON reader takes."""
    return json.dumps(_finite(summary), indent=1, default=str, allow_nan=False)


def _finite(value):
    """``value`` with every float that is not finite, at any depth, as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _op_label(row: dict) -> str:
    """'' for an all-reduce (the grid's default), else the op and a space."""
    op = row.get("op", "allreduce")
    return "" if op == "allreduce" else f"{op} "


def report_md(rows: list[dict], summary: dict) -> str:
    out = ["# realrun validate: predicted vs measured", "",
           "Each case was predicted (perfmodel, the calibration profile, the algorithm realrun ran) before it "
           "was measured: each repeat the median of its iterations (slowest rank), the case the median of "
           f"its {summary['repeats']} repeats. error = (predicted - measured) / measured; {SPREAD_NOTE}", "",
           "## Summary", ""]
    out += [f"- {line}" for line in summary_lines(summary)]
    for key, p, m in summary.get("fastest_wrong", []):
        hosts, bw, size, *op = key
        where = f" ({op[0]})" if op and op[0] != "allreduce" else ""
        out.append(f"- fastest differs at {hosts} hosts, {rate_label(bw)}, {format_size(size)}{where}: predicted {p}, "
                   f"measured {m}")
    cross = summary.get("crossover") or {}
    if cross.get("bandwidths"):
        pts = ", ".join(f"{format_rate(b)}: {s:.2f}x" for b, s in zip(cross["bandwidths"], cross["speedups"]))
        out.append(f"- measured int8 speedup over none at {format_size(8 * 2**20)}: {pts}")
    out += ["", "## Cases", "",
            "| op | hosts | bandwidth | size | compressor | algorithm | predicted s | measured s | error | spread |",
            "|---|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r.get('op', 'allreduce')} | {r['hosts']} | {rate_label(r['bandwidth'])} | "
                   f"{format_size(r['size_bytes'])} | "
                   f"`{r['compressor']}` | {r['algorithm']} | {r['predicted_s']:.4f} | {r['measured_s']:.4f} | "
                   f"{100 * r['error']:+.1f}% | {spread_cell(r)} |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: str) -> None:
    """Log-log predicted vs measured, y = x and a +-10% band, one marker per compressor; the
    measured side's error bars span the case's repeats (min..max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from topologies.clikit import atomic_write

    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    values = [v for r in rows for v in (r["predicted_s"], *r["measured_all_s"]) if v > 0]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    xs = [lo * (hi / lo) ** (k / 50) for k in range(51)]
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="0.88", label="±10%")
    ax.plot(xs, xs, color="0.3", lw=1, label="y = x")
    markers = "osD^vP*X"
    for i, (op, comp) in enumerate(sorted({(r.get("op", "allreduce"), r["compressor"]) for r in rows})):
        pts = [r for r in rows if (r.get("op", "allreduce"), r["compressor"]) == (op, comp)]
        ax.errorbar([r["measured_s"] for r in pts], [r["predicted_s"] for r in pts], xerr=error_bars(pts),
                    fmt=markers[i % len(markers)], ms=5, elinewidth=0.8, capsize=2,
                    label=comp + (f" ({op})" if op != "allreduce" else ""), mfc="none" if op != "allreduce" else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured time (s)")
    ax.set_ylabel("predicted time (s)")
    mape = [abs(r["error"]) for r in rows if r["size_bytes"] >= 2**20 and not r.get("crossover")]
    floor = noise(rows)["noise_floor"]
    ax.set_title("realrun validate" + (f": MAPE {100 * sum(mape) / len(mape):.1f}%" if mape else "")
                 + ("" if math.isnan(floor) else f", noise floor {100 * floor:.1f}%"))
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()

    def write(handle):
        fig.savefig(handle, format="png", dpi=120)

    atomic_write(path, write)
    plt.close(fig)
