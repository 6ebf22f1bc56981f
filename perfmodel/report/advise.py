"""``perfmodel advise`` as text, Markdown and a waterfall picture (``perfmodel.explore.advise``)."""
from __future__ import annotations

from perfmodel.axes import PHASES
from topologies.clikit import table

HEAD = ("policy", "to target", "band", "verdict", "step", "step band", "steps x", "mem GiB",
        "why not / what would change it")


def _plan_text(plan: dict) -> str:
    keys = ("tp", "pp", "dp", "cp", "ep", "etp", "zero", "mbs", "gbs")
    shown = [k for k in keys if k in plan and (plan[k] != 1 or k in ("tp", "pp", "dp"))
             and not (k == "etp" and plan[k] == plan.get("tp"))]
    return " ".join(f"{k}={plan[k]}" for k in shown)


def _rows(advice) -> list[tuple]:
    return [(o.policy, f"{o.speedup_to_target:.3f}x", f"{o.to_target_band[0]:.3f}-{o.to_target_band[1]:.3f}",
             o.verdict, f"{o.speedup:.3f}x", f"{o.speedup_band[0]:.3f}-{o.speedup_band[1]:.3f}",
             f"{o.steps_inflation:.3f}", f"{o.memory_delta_GiB:+.1f}" + ("" if o.fits else " OOM"),
             o.why_not or o.breakeven) for o in advice.options]


def _header(advice) -> list[str]:
    a = advice
    lines = [f"{a.model} on {a.cluster}: {a.gpus} GPUs, {_plan_text(a.plan)}; uncompressed step "
             f"{a.step_time_s:.3f} s, {a.memory_GiB:.1f} GiB per GPU",
             f"uncertainty: {a.regime['text']} (speedup bands: the unchanged and the saved seconds each off by "
             "that much; perfmodel.explore.uncertainty)"]
    if a.best_plan:
        b = a.best_plan
        lines.append(f"first, the plan: {_plan_text(b['plan'])} takes {b['step_time_s']:.3f} s uncompressed, "
                     f"{b['speedup']:.2f}x faster than this one")
    pays = [o for o in a.options if o.verdict == "pays"]
    lines.append(f"answer: {pays[0].policy} pays, {pays[0].speedup_to_target:.3f}x in time to target "
                 f"({pays[0].to_target_band[0]:.3f}-{pays[0].to_target_band[1]:.3f})" if pays else
                 "answer: no candidate pays off beyond the model's error on this job")
    return lines


def advise_report(advice) -> str:
    """The header lines and one row per option, ranked by speedup in time to target."""
    return "\n".join([*_header(advice), "", table(HEAD, _rows(advice))])


def advise_markdown(advice) -> str:
    """The same as a Markdown report."""
    out = [f"# Will compression pay off? {advice.model} on {advice.cluster}", ""]
    out += [f"- {line}" for line in _header(advice)]
    out += ["", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in _rows(advice)]
    return "\n".join(out) + "\n"


def waterfall_steps(advice, policy: str | None = None) -> tuple:
    """(option, [(phase label, seconds after - before)]) for ``policy`` (default: the first option),
    the phases that change, in the breakdown's order; they add up to its step minus the uncompressed."""
    if not advice.options:
        return None, []
    option = next((o for o in advice.options if o.policy == policy), None) if policy else advice.options[0]
    if option is None:
        from topologies.errors import InputError

        raise InputError("option", policy, "one of the advised policies: "
                         + ", ".join(o.policy for o in advice.options))
    deltas = [(p.label, option.breakdown.get(p.name, 0.0) - advice.breakdown.get(p.name, 0.0)) for p in PHASES]
    return option, [(label, d) for label, d in deltas if abs(d) > 1e-12]


def plot_waterfall(advice, path: str, policy: str | None = None) -> str:
    """The uncompressed step, each phase's change under the option (ms over each bar), and the
    compressed step; the axis starts at 90% of the lowest level where the changes are small."""
    from perfmodel.report.plots import new_figure, save_figure

    option, deltas = waterfall_steps(advice, policy)
    plt, fig, ax = new_figure(max(6.0, 0.9 * len(deltas) + 4), 4.5)
    level = advice.step_time_s
    levels = [level]
    ax.bar(["uncompressed"], [level], color="#4c72b0")
    for label, d in deltas:
        ax.bar([label], [abs(d)], bottom=[min(level, level + d)], color="#55a868" if d < 0 else "#c44e52")
        ax.annotate(f"{1e3 * d:+.1f} ms", (label, max(level, level + d)), ha="center", xytext=(0, 3),
                    textcoords="offset points", fontsize=7)
        level += d
        levels.append(level)
    ax.set_ylim(bottom=0.9 * min(levels) if max(levels) - min(levels) < 0.3 * min(levels) else 0.0)
    if option is not None:
        ax.bar([option.policy], [level], color="#8172b2")
        ax.annotate(f"{option.speedup:.3f}x per step", (len(deltas) + 1, level), ha="center", xytext=(0, 3),
                    textcoords="offset points", fontsize=8)
    ax.set_ylabel("seconds per step")
    ax.tick_params(axis="x", rotation=25)
    ax.set_title(f"{advice.model} on {advice.cluster} ({advice.gpus} GPUs): "
                 f"{option.policy if option else 'no option'} against uncompressed")
    return save_figure(plt, fig, path)
