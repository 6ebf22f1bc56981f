"""The step's timeline as a picture: one row per stream of each pipeline stage (the first rank
of each; ranks of a stage are alike), bars coloured by kind of work, from the same events as the
Chrome trace (``perfmodel.report.trace``). For readers without ui.perfetto.dev at hand."""
from __future__ import annotations

from perfmodel.report.plots import new_figure, save_figure

KINDS = (("forward", "#4c72b0"), ("backward", "#55a868"), ("activation", "#c44e52"), ("gradient mb", "#dd8452"),
         ("gradient bucket", "#8172b3"), ("optimizer", "#937860"), ("gradient reduction", "#da8bc3"),
         ("compute slowed", "#8c8c8c"), ("gather", "#64b5cd"), ("reduce-scatter", "#ccb974"))


def _colour(name: str) -> str:
    return next((c for k, c in KINDS if name.startswith(k)), "#999999")


def _rows(events: list[dict]) -> tuple[list, dict]:
    """(row labels top to bottom, {(pid, tid): row index}) of the tracks that have slices."""
    process = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e.get("ph") == "M" and e["name"] == "thread_name"}
    used = sorted({(e["pid"], e["tid"]) for e in events if e.get("ph") == "X"})
    labels = [f"{process.get(pid, pid)} · {thread.get((pid, tid), tid)}" for pid, tid in used]
    return labels, {key: i for i, key in enumerate(used)}


def plot_timeline(events: list[dict], path: str, title: str = "") -> str:
    """Draw ``events`` (Chrome trace events) to ``path`` (PNG, or any suffix matplotlib knows),
    written atomically; returns ``path``."""
    from matplotlib.patches import Patch

    labels, row = _rows(events)
    plt, fig, ax = new_figure(12, 0.35 * len(labels) + 1.6)
    bars: dict = {}
    for e in events:
        if e.get("ph") == "X":
            key = (len(labels) - 1 - row[(e["pid"], e["tid"])], _colour(e["name"]))
            bars.setdefault(key, []).append((e["ts"] / 1e3, e["dur"] / 1e3))
    for (y, colour), spans in bars.items():
        ax.broken_barh(spans, (y - 0.4, 0.8), color=colour, linewidth=0)
    ax.set_yticks(range(len(labels)), labels=list(reversed(labels)), fontsize=8)
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(title or "predicted step", pad=28)
    seen = {colour for _, colour in bars}
    ax.legend(handles=[Patch(color=c, label=k) for k, c in KINDS if c in seen], loc="lower center",
              bbox_to_anchor=(0.5, 1.0), ncol=len(seen), fontsize=8, frameon=False)
    return save_figure(plt, fig, path)
