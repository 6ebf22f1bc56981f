"""Pictures of perfmodel results (matplotlib, loaded only when drawing; written atomically)."""
from __future__ import annotations

import io

from perfmodel.axes import PHASES
from topologies.clikit import atomic_write


def new_figure(width: float = 8.0, height: float = 5.0, cols: int = 1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(1, cols, figsize=(width, height))


def save_figure(plt, fig, path: str) -> str:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format=path.rsplit(".", 1)[-1].lower() if "." in path else "png", dpi=110)
    plt.close(fig)
    return atomic_write(path, lambda h: h.write(buffer.getvalue()))


def plot_pareto(result, path: str, title: str = "") -> str:
    """Every (plan, policy) within the budget as time per step of progress (step time x steps
    inflation) against uncompensated error, the Pareto front joined and numbered as its table,
    the best uncompressed plan marked."""
    plt, fig, ax = new_figure()
    rows = result.ranked
    x, y = "uncompensated_error", "effective_step_time_s"
    ax.scatter([r[x] for r in rows], [r[y] for r in rows], s=6, color="#bbbbbb",
               label=f"(plan, policy) within budget ({len(rows)})")
    front = result.pareto
    ax.plot([r[x] for r in front], [r[y] for r in front], "o-", color="#c44e52", label="Pareto front")
    for i, r in enumerate(front, 1):      # numbered as in the Pareto table
        ax.annotate(str(i), (r[x], r[y]), fontsize=8, xytext=(3, 5), textcoords="offset points", color="#c44e52")
    best = result.best_uncompressed
    if best:
        ax.axhline(best["step_time_s"], color="#4c72b0", linestyle="--", linewidth=1,
                   label="best uncompressed plan")
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_xlim(left=0)
    ax.set_yscale("log")
    ax.set_xlabel("uncompensated error (axes without error feedback, relative RMS in quadrature)")
    ax.set_ylabel("step time x steps inflation (s)")
    ax.set_title(title or "search: time per step of progress against error")
    ax.legend(fontsize=8)
    return save_figure(plt, fig, path)


def plot_cost_front(result, path: str, title: str = "") -> str:
    """Every (cluster, plan, policy) within the budget as time to train against cost (USD where
    priced, else GPU-hours), one colour per cluster, the Pareto front of (cost, time, error) ringed
    and numbered as its table."""
    plt, fig, ax = new_figure()
    cost = result.front_keys[0]
    rows = result.ranked
    for i, cluster in enumerate(result.clusters):
        mine = [r for r in rows if r["cluster"] == cluster]
        ax.scatter([r[cost] for r in mine], [r["time_to_train_s"] / 86400 for r in mine], s=6, alpha=0.5,
                   color=f"C{i % 10}", label=f"{cluster} ({len(mine)})")
    front = result.pareto
    ax.scatter([r[cost] for r in front], [r["time_to_train_s"] / 86400 for r in front], s=40, facecolors="none",
               edgecolors="#c44e52", linewidths=1.2, label=f"Pareto front ({len(front)}: cost, time, error)")
    for i, r in enumerate(front, 1):      # numbered as in the Pareto table
        ax.annotate(str(i), (r[cost], r["time_to_train_s"] / 86400), fontsize=7, xytext=(3, 4),
                    textcoords="offset points", color="#c44e52")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cost (USD)" if cost == "cost_usd" else "GPU-hours")
    ax.set_ylabel(f"days to train {result.tokens:.3g} tokens")
    ax.set_title(title or "search: time to train against cost")
    ax.legend(fontsize=7)
    return save_figure(plt, fig, path)


def stacked_parts(records) -> list[tuple]:
    """The bars ``plot_breakdown`` stacks: (phase, seconds per record) for every step phase
    (``perfmodel.axes.PHASES``, in their order) that some record has nonzero; per record they
    add up to its step time."""
    parts = [(phase, [r.breakdown.get(phase.name, 0.0) for r in records]) for phase in PHASES]
    return [(phase, values) for phase, values in parts if any(values)]


def plot_breakdown(records, path: str, title: str = "") -> str:
    """Stacked seconds of one step per policy (``predict``: one bar; ``compare``: one per policy)."""
    plt, fig, ax = new_figure(max(5.0, 1.3 * len(records) + 3), 4.5)
    names = [r.policy for r in records]
    bottom = [0.0] * len(records)
    for phase, values in stacked_parts(records):
        ax.bar(names, values, bottom=bottom, label=phase.label)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, (r, top) in enumerate(zip(records, bottom)):
        ax.annotate(f"{r.speedup_vs_uncompressed:.2f}x", (x, top), ha="center", xytext=(0, 3),
                    textcoords="offset points", fontsize=8)
    ax.set_ylabel("seconds per step")
    ax.tick_params(axis="x", rotation=20)
    ax.set_title(title or f"{records[0].model} on {records[0].cluster} ({records[0].gpus} GPUs)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(plt, fig, path)


def plot_collectives(records, path: str, title: str = "") -> str:
    """busbw and speedup over uncompressed against message size, one line per compressor."""
    plt, fig, (bw, speed) = new_figure(11.0, 4.2, cols=2)
    for name in dict.fromkeys(r.compressor for r in records):
        points = sorted((r.size_bytes, r.busbw_GBps, r.speedup_vs_none) for r in records if r.compressor == name)
        sizes = [p[0] for p in points]
        bw.plot(sizes, [p[1] for p in points], "o-", label=name)
        speed.plot(sizes, [p[2] for p in points], "o-", label=name)
    for ax, label in ((bw, "busbw (GB/s)"), (speed, "speedup over uncompressed")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(label)
    speed.axhline(1.0, color="grey", linewidth=0.8)
    bw.legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(plt, fig, path)


def check_picture(path: str | None, field: str = "plot") -> None:
    """Refuse, before any work, a picture path that cannot be written or is not .png/.svg/.pdf."""
    from topologies.clikit import check_writable
    from topologies.errors import InputError

    if path is None:
        return
    check_writable(path, field)
    if path.rsplit(".", 1)[-1].lower() not in ("png", "svg", "pdf"):
        raise InputError(field, path, "a picture path ending in .png, .svg or .pdf")


def plot_measured_collectives(records: list[dict], path: str, title: str = "") -> str:
    """Measured busbw against size per compressor and algorithm, from ``realrun bench`` records
    (the measurements schema: size_bytes, time_s, world)."""
    from perfmodel.collectives.record import busbw_factor

    plt, fig, ax = new_figure(7.0, 4.5)
    for key in dict.fromkeys((r["compressor"], r.get("algorithm", "auto")) for r in records):
        points = sorted((r["size_bytes"], r["size_bytes"] / r["time_s"] * busbw_factor(r["op"], r["world"]) / 1e9)
                        for r in records if (r["compressor"], r.get("algorithm", "auto")) == key)
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=f"{key[0]} ({key[1]})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("measured busbw (GB/s)")
    ax.set_title(title or "realrun bench")
    ax.legend(fontsize=8)
    return save_figure(plt, fig, path)
