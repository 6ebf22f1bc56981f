"""The validation report: a markdown table and summary, and the predicted-vs-measured picture."""
from __future__ import annotations


from topologies.units import format_rate, format_size


def report_md(rows: list[dict], summary: dict) -> str:
    from realrun.validate import rate_label, summary_lines

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
