"""Pictures of perfmodel results (matplotlib, loaded only when drawing; written atomically)."""
from __future__ import annotations

import io

from topologies.clikit import atomic_write


def _figure(width: float = 8.0, height: float = 5.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=(width, height))


def _save(plt, fig, path: str) -> str:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format=path.rsplit(".", 1)[-1].lower() if "." in path else "png", dpi=110)
    plt.close(fig)
    return atomic_write(path, lambda h: h.write(buffer.getvalue()))


def plot_pareto(result, path: str, title: str = "") -> str:
    """Every (plan, policy) within the budget as step time against total error, the Pareto front
    joined and numbered as its table, the best uncompressed plan marked."""
    plt, fig, ax = _figure()
    rows = result.ranked
    ax.scatter([r["total_error"] for r in rows], [r["step_time_s"] for r in rows], s=6, color="#bbbbbb",
               label=f"(plan, policy) within budget ({len(rows)})")
    front = result.pareto
    ax.plot([r["total_error"] for r in front], [r["step_time_s"] for r in front], "o-", color="#c44e52",
            label="Pareto front")
    for i, r in enumerate(front, 1):      # numbered as in the Pareto table
        ax.annotate(str(i), (r["total_error"], r["step_time_s"]), fontsize=8, xytext=(3, 5),
                    textcoords="offset points", color="#c44e52")
    best = result.best_uncompressed
    if best:
        ax.axhline(best["step_time_s"], color="#4c72b0", linestyle="--", linewidth=1,
                   label="best uncompressed plan")
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_xlim(left=0)
    ax.set_yscale("log")
    ax.set_xlabel("total error (per-axis relative RMS errors in quadrature)")
    ax.set_ylabel("step time (s)")
    ax.set_title(title or "search: step time against error")
    ax.legend(fontsize=8)
    return _save(plt, fig, path)
