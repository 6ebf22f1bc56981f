"""What a training run shows: a summary table and the loss curve."""
from __future__ import annotations

import statistics

from perfmodel.axes import AXES
from realrun.train.phases import MEASURED, TIMES, upgraded
from topologies.clikit import atomic_write, table

WARMUP_STEPS = 2   # steps left out of the median step time (first-call allocations, numba compiles)


def _axes(record: dict, suffix: str) -> list[str]:
    """The axes (``perfmodel.axes``) a step record measures ``{axis}{suffix}`` for, in its order."""
    return [k.removesuffix(suffix) for k in record if k.endswith(suffix) and k.removesuffix(suffix) in AXES]


def steady(records: list[dict]) -> list[dict]:
    """The steps a run's times are its medians over: after ``WARMUP_STEPS``, without the steps
    that measure errors (``error_step``: their times include the exact collectives each compressed
    one is checked against, which at 100 Mbit/s double a step) while any others are left."""
    warm = records[WARMUP_STEPS:] or records
    return [r for r in warm if not r.get("error_step")] or warm


def summary(records: list[dict]) -> dict:
    """The run's losses, the median over ``steady`` steps of its times and phases (those of the
    plan's axes), payload bytes, measured errors and MoE drops; older records read under today's
    phase names (``realrun.train.phases.upgraded``)."""
    records = [upgraded(r) for r in records]
    steady_ = steady(records)
    vals = [r for r in records if r.get("val_loss") is not None]
    out = {"steps": len(records), "first_loss": records[0]["loss"], "final_loss": records[-1]["loss"],
           "final_val_loss": vals[-1]["val_loss"] if vals else None}
    for key in TIMES + MEASURED:   # the phases of the axes a record reports
        if key in records[0]:
            out[f"median_{key}"] = statistics.median(r[key] for r in steady_)
    for axis in _axes(records[0], "_wire_bytes"):
        out[f"{axis}_wire_bytes_per_step"] = statistics.median(r[f"{axis}_wire_bytes"] for r in steady_)
    for axis in _axes(records[0], "_rel_error"):
        errors = [r[f"{axis}_rel_error"] for r in records if r.get(f"{axis}_rel_error") is not None]
        out[f"{axis}_rel_error"] = statistics.median(errors) if errors else None
    if "moe_dropped" in records[0]:   # a mixture-of-experts model: assignments its capacity dropped
        out["moe_dropped"] = statistics.fmean(r["moe_dropped"] for r in records)
    return out


def summary_table(s: dict) -> str:
    rows = [("loss first -> final", f"{s['first_loss']:.4f} -> {s['final_loss']:.4f}"),
            ("validation loss (last)", "-" if s["final_val_loss"] is None else f"{s['final_val_loss']:.4f}")]
    rows += [(k.removeprefix("median_").removesuffix("_s") + " s (median)", f"{s[k]:.4f}")
             for k in s if k.startswith("median_")]
    rows += [(f"{axis} payload bytes/step/rank", f"{s[f'{axis}_wire_bytes_per_step']:,.0f}")
             for axis in _axes(s, "_wire_bytes_per_step")]
    rows += [(f"{axis} relative error (measured, median)", f"{s[f'{axis}_rel_error']:.3g}")
             for axis in _axes(s, "_rel_error") if s[f"{axis}_rel_error"] is not None]
    if "moe_dropped" in s:
        rows.append(("MoE tokens dropped (mean fraction)", f"{s['moe_dropped']:.4f}"))
    return table(("", "value"), rows)


def plot_losses(runs: dict[str, list[dict]], path: str) -> str:
    """Training loss (and validation points) per step, one curve per run label; PNG written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, records in runs.items():
        line, = ax.plot([r["step"] for r in records], [r["loss"] for r in records], label=label, lw=1.2)
        vals = [r for r in records if r.get("val_loss") is not None]
        ax.plot([r["step"] for r in vals], [r["val_loss"] for r in vals], "o", color=line.get_color(), ms=4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte); dots: validation")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda h: fig.savefig(h, format="png", dpi=120))
    plt.close(fig)
    return path
