"""The validation report: a markdown table and summary, and the predicted-vs-measured picture."""
from __future__ import annotations

from topologies.units import format_rate, format_size

TARGET_MAPE = 0.10      # the loop's targets (docs/design.md, validation)
TARGET_FASTEST = 0.90
OWN_LINKS = 0   # a bandwidth of 0: the cluster's own links (a real cluster under torchrun)


def rate_label(bw: int) -> str:
    return "own links" if bw == OWN_LINKS else format_rate(bw)



def summary_lines(summary: dict) -> list[str]:
    worst = summary["worst"]
    cross = summary["crossover"]
    lines = [f"cases (>= 1 MiB): {summary['cases']}; compressors: {', '.join(summary['compressors'])}; "
             f"algorithms: {', '.join(summary['algorithms'])}",
             f"MAPE: {100 * summary['mape']:.1f}% (target <= {100 * TARGET_MAPE:.0f}%)"]
    if worst:
        lines.append(f"worst: {100 * worst['error']:+.1f}% ({worst['compressor']} {worst['algorithm']} "
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


def report_md(rows: list[dict], summary: dict) -> str:
    out = ["# realrun validate: predicted vs measured", "",
           "Each case was predicted (perfmodel, the calibration profile, the algorithm realrun ran) before it "
           "was measured (median of the iterations, slowest rank). error = (predicted - measured) / measured.", "",
           "## Summary", ""]
    out += [f"- {line}" for line in summary_lines(summary)]
    for key, p, m in summary.get("fastest_wrong", []):
        hosts, bw, size = key
        out.append(f"- fastest differs at {hosts} hosts, {rate_label(bw)}, {format_size(size)}: predicted {p}, "
                   f"measured {m}")
    cross = summary.get("crossover") or {}
    if cross.get("bandwidths"):
        pts = ", ".join(f"{format_rate(b)}: {s:.2f}x" for b, s in zip(cross["bandwidths"], cross["speedups"]))
        out.append(f"- measured int8 speedup over none at {format_size(8 * 2**20)}: {pts}")
    out += ["", "## Cases", "",
            "| hosts | bandwidth | size | compressor | algorithm | predicted s | measured s | error |",
            "|---:|---:|---:|---|---|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['hosts']} | {rate_label(r['bandwidth'])} | {format_size(r['size_bytes'])} | "
                   f"`{r['compressor']}` | {r['algorithm']} | {r['predicted_s']:.4f} | {r['measured_s']:.4f} | "
                   f"{100 * r['error']:+.1f}% |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: str) -> None:
    """Log-log predicted vs measured, y = x and a +-10% band, one marker per compressor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from topologies.clikit import atomic_write

    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    values = [v for r in rows for v in (r["predicted_s"], r["measured_s"]) if v > 0]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    xs = [lo * (hi / lo) ** (k / 50) for k in range(51)]
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="0.88", label="±10%")
    ax.plot(xs, xs, color="0.3", lw=1, label="y = x")
    markers = "osD^vP*X"
    for i, comp in enumerate(sorted({r["compressor"] for r in rows})):
        pts = [r for r in rows if r["compressor"] == comp]
        ax.scatter([r["measured_s"] for r in pts], [r["predicted_s"] for r in pts], s=28,
                   marker=markers[i % len(markers)], label=comp)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured time (s)")
    ax.set_ylabel("predicted time (s)")
    mape = [abs(r["error"]) for r in rows if r["size_bytes"] >= 2**20 and not r.get("crossover")]
    ax.set_title(f"realrun validate: MAPE {100 * sum(mape) / len(mape):.1f}%" if mape else "realrun validate")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()

    def write(handle):
        fig.savefig(handle, format="png", dpi=120)

    atomic_write(path, write)
    plt.close(fig)
