"""``realrun convergence``: what compression costs in steps, measured by training the small GPT,
with perfmodel's inflation model (``perfmodel.explore.convergence``) fitted and checked on it.

The uncompressed policy trains ``steps`` steps once per seed; the **target** is its validation
loss at ``target_step`` (the mean over seeds), so a compressed run has ``steps / target_step``
times the steps to reach it. Each run's steps to target is where its validation-loss curve (the
running minimum, evaluated every ``eval_every`` steps) first reaches the target, interpolated
linearly between evaluations; a run that never reaches it is reported as such (inflation above
``steps / target_step``), never extrapolated. A policy's **measured inflation** is its steps to
target over the uncompressed runs' mean; the uncompressed seeds' own spread is the noise floor.

Measured beside it, per run: the gradient's relative error after the reduction
(``dp_rel_error``) and, for error-feedback specs, the contraction ``||C(y) - y|| / ||y||`` on the
tensor plus its residual (``dp_contraction``), the ``e`` of ``delta = 1 - e^2``. perfmodel's model
is then fitted (``fit_critical_batch``: the critical batch ``B_crit``, one number for the regime)
on the measured errors and inflations, and each policy's inflation predicted twice: from the
fit on every policy, and leave one out (the fit on the others: a check, not a fit); and a priori
from perfmodel's unit-Gaussian error estimates with the fitted ``B_crit``. Outputs in ``DIR``:
``convergence.csv`` (one row per run), ``convergence.json`` (the target, per-policy summary and
the fitted regime that ``perfmodel search --convergence`` reads), ``report.md`` and
``loss_curves.png``; ``DIR`` is checked before the first run (``check_out``). ``refit`` fits
campaigns written earlier, every cell of them checked (``read_campaign``).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics

from perfmodel.axes import fed_back
from perfmodel.explore.convergence import Regime, fit_critical_batch, policy_inflation
from perfmodel.compression.policy import parse_policy
from realrun.train.config import MAX_STEPS   # a run's steps: realrun train's own limit
from topologies.clikit import atomic_write, check_writable, table
from topologies.errors import InputError

CONVERGENCE_POLICIES = ("dp=fp16", "dp=int8", "dp=ef(topk(0.01))+int8", "dp=ef(powersgd(rank=4))")
BASE = "none"
CSV_FIELDS = ("campaign", "policy", "seed", "steps", "steps_to_target", "final_val_loss", "dp_rel_error",
              "dp_contraction", "batch_tokens")
OUTPUTS = ("convergence.csv", "convergence.json", "report.md", "loss_curves.png")
MAX_BATCH_TOKENS = 2**40     # a global batch: 65,000x the largest published (16M tokens, Llama 3)
MAX_ERROR = 1e6              # a relative error or contraction: past any compressor's (unbiased rand-k at
#                              1e-6 of the values is 1e3), and e^2 stays finite in the fit


def steps_to(points: list[tuple[int, float]], target: float) -> float | None:
    """The first step at which the running minimum of the (step, validation loss) ``points``
    reaches ``target``, linear between evaluations; None if it never does."""
    prev = None                            # (step, the running minimum up to it)
    for step, loss in points:
        if loss <= target:
            if prev is None:
                return float(step)
            s0, l0 = prev
            return s0 + (step - s0) * (l0 - target) / (l0 - loss)
        prev = (step, min(loss, prev[1]) if prev else loss)
    return None


def val_curve(records: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"] + 1, r["val_loss"]) for r in records if r.get("val_loss") is not None]


def _median(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return statistics.median(values) if values else None


def run_row(policy: str, seed: int, records: list[dict], target: float, batch_tokens: int) -> dict:
    curve = val_curve(records)
    return {"policy": policy, "seed": seed, "steps": len(records), "steps_to_target": steps_to(curve, target),
            "final_val_loss": curve[-1][1] if curve else None, "dp_rel_error": _median(records, "dp_rel_error"),
            "dp_contraction": _median(records, "dp_contraction"), "batch_tokens": batch_tokens, "curve": curve}


def target_of(base_runs: list[list[dict]], target_step: int) -> float:
    """The uncompressed runs' mean validation loss at ``target_step`` (the evaluation at or just before it)."""
    losses = []
    for records in base_runs:
        at = [loss for step, loss in val_curve(records) if step <= target_step]
        if not at:
            raise InputError("target_step", target_step, "a step at or after the first validation (eval_every)")
        losses.append(at[-1])
    return statistics.fmean(losses)


def compressed_axes(policy: str) -> list[tuple[str, object]]:
    """(axis, codec) of what ``policy`` compresses: the gradients only (what a run measures)."""
    out = [(axis, p.codec) for axis, p in parse_policy(policy).axes.items() if not p.codec.is_none]
    if any(axis != "dp" for axis, _ in out):
        raise InputError("policy", policy, "dp=SPEC only (realrun convergence measures the gradient axis)")
    return out


def axis_errors(policy: str, row: dict) -> list[tuple[float, bool]]:
    """The (measured error, error feedback) of the policy's compressed axes in a run's row: the
    contraction where the spec feeds its error back, the reduced gradient's error otherwise."""
    out = []
    for axis, codec in compressed_axes(policy):
        feedback = fed_back(axis, codec)
        error = row["dp_contraction"] if feedback else row["dp_rel_error"]
        if error is None:
            raise InputError("policy", policy, "a policy whose error the run measured (dp > 1, error_every > 0)")
        out.append((error, feedback))
    return out


def gaussian_errors(policy: str) -> list[tuple[float, bool]]:
    """perfmodel's a-priori (unit-Gaussian) error of each compressed axis of ``policy``."""
    return [(codec.error, fed_back(axis, codec)) for axis, codec in compressed_axes(policy)]


def _base_key(row: dict) -> str:
    """The uncompressed runs a run is measured against: its campaign's (``campaign``, where rows
    of several are fitted together) of its batch; the label targets are keyed by."""
    batch = str(row["batch_tokens"])
    return f"{row['campaign']}: {batch}" if row.get("campaign") else batch


def add_inflation(rows: list[dict]) -> dict:
    """Each run's ``inflation``: its steps to target over the mean of the uncompressed runs of its
    campaign and batch (each sets its own target); returns {``_base_key``: that mean}."""
    bases = {}
    for key in sorted({_base_key(r) for r in rows}):
        steps = [r["steps_to_target"] for r in rows
                 if _base_key(r) == key and r["policy"] == BASE and r["steps_to_target"] is not None]
        if not steps:
            raise InputError("target_step", f"batch {key} tokens", "a step the uncompressed runs reach "
                             "(they set the target)")
        bases[key] = statistics.fmean(steps)
    for r in rows:
        base = bases[_base_key(r)]
        r["inflation"] = r["steps_to_target"] / base if r["steps_to_target"] is not None else None
    return bases


def summarize(rows: list[dict]) -> dict:
    """Per (policy, batch): measured inflation (median over seeds, spread), the fit of one
    ``B_crit`` on every compressed group and its checks (module doc)."""
    bases = add_inflation(rows)
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["policy"], r["batch_tokens"]), []).append(r)
    points = {key: [(key[1], axis_errors(key[0], r), r["inflation"]) for r in runs if r["inflation"] is not None]
              for key, runs in groups.items() if key[0] != BASE}
    fitted = [pt for pts in points.values() for pt in pts]
    critical, critical_se = fit_critical_batch(fitted) if fitted else (None, None)   # None: nothing reached
    critical_se = critical_se if critical_se is not None and math.isfinite(critical_se) else None
    several = len({batch for _, batch in groups}) > 1
    out = [_group_summary(key, runs, points, critical, several, bases) for key, runs in groups.items()]
    floors = {key: _spread([r["inflation"] for r in rows if r["policy"] == BASE and _base_key(r) == key])
              for key in bases}
    return {"base_steps_to_target": bases, "noise_floors": floors,
            "critical_batch_tokens": critical, "critical_batch_se": critical_se, "groups": out}


def _spread(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) / min(values) - 1 if len(values) > 1 else None


def _group_summary(key: tuple, runs: list[dict], points: dict, critical: float, several: bool, bases: dict) -> dict:
    policy, batch = key
    reached = [r["inflation"] for r in runs if r["inflation"] is not None]
    ceiling = min(r["steps"] / bases[_base_key(r)] for r in runs)   # the most a run could show
    out = {"label": f"{policy} @ {batch} tokens" if several else policy, "policy": policy, "batch_tokens": batch,
           "runs": len(runs), "reached": len(reached), "measured": statistics.median(reached) if reached else None,
           "spread": _spread(reached), "ceiling": ceiling}
    if policy == BASE:
        return {**out, "predicted": 1.0, "predicted_held_out": 1.0, "predicted_gaussian": 1.0}
    per_axis = zip(*(axis_errors(policy, r) for r in runs))     # each axis's (error, feedback) over the runs
    mean_errors = [(statistics.fmean(e for e, _ in runs_of), runs_of[0][1]) for runs_of in per_axis]
    others = [pt for k, pts in points.items() if k != key for pt in pts]
    held_out = fit_critical_batch(others)[0] if others else None

    def with_(errors, critical_batch):
        return policy_inflation(errors, batch, critical_batch) if critical_batch is not None else None
    return {**out, "errors": [e for e, _ in mean_errors], "predicted": with_(mean_errors, critical),
            "predicted_held_out": with_(mean_errors, held_out),
            "predicted_gaussian": with_(gaussian_errors(policy), critical)}


def regime_of(summary: dict, model: str) -> Regime | None:
    """The fitted regime, with the error-feedback specs' contractions as measured (the median over
    batches where several were run: ``perfmodel.explore.convergence``); None where nothing was fitted."""
    if summary["critical_batch_tokens"] is None:
        return None
    measured: dict = {}
    for g in summary["groups"]:
        for axis, p in parse_policy(g["policy"]).axes.items():
            if fed_back(axis, p.codec) and g.get("errors"):
                measured.setdefault(axis, {}).setdefault(p.spec, []).append(g["errors"][0])
    errors = {a: {spec: statistics.median(v) for spec, v in d.items()} for a, d in measured.items()}
    compressed = {g["policy"] for g in summary["groups"] if g["policy"] != BASE}
    batches = sorted({g["batch_tokens"] for g in summary["groups"]})
    return Regime(summary["critical_batch_tokens"], f"realrun convergence on {model}: B_crit fitted on "
                  f"{len(compressed)} compressed policies at {', '.join(map(str, batches))} tokens a batch", errors)


def check_out(out_dir: str, campaigns=()) -> None:
    """Refuse, before any run or read, an ``out_dir`` that cannot take the outputs: a file, a
    folder below a file, one this user cannot create or write in, an output name taken by a
    folder; or one of the ``campaigns`` a fit reads (the fit's files would replace theirs).
    Nothing is created: ``write_outputs`` creates the folder."""
    path = os.path.abspath(out_dir)
    if any(os.path.realpath(c) == os.path.realpath(path) for c in campaigns):
        raise InputError("out", out_dir, "a folder other than the campaigns --fit reads (the fit would replace "
                         "their files)")
    if os.path.isdir(path):
        for name in OUTPUTS:
            check_writable(os.path.join(path, name), "out")
        return
    top = path                      # the outermost folder write_outputs creates
    while not os.path.lexists(os.path.dirname(top)):
        top = os.path.dirname(top)
    for where in (top, os.path.dirname(top)):
        if os.path.lexists(where) and not os.path.isdir(where):
            raise InputError("out", out_dir, f"a folder ({where} is a file)")
    check_writable(top, "out")


def write_outputs(out_dir: str, rows: list[dict], summary: dict, regime: Regime | None, runs: dict) -> None:
    """The files of the module doc in ``out_dir`` (created), each written whole (``atomic_write``),
    after all of them are made (nothing written when one cannot be)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=(*CSV_FIELDS, "inflation"), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    fitted = {"critical_batch_tokens": regime.critical_batch_tokens, "source": regime.source,
              "errors": regime.errors} if regime else None
    doc = {"summary": summary, "regime": fitted}   # a regime of null: nothing reached the target
    texts = {"convergence.csv": buf.getvalue(), "convergence.json": json.dumps(doc, indent=1, allow_nan=False),
             "report.md": report_md(summary)}
    os.makedirs(out_dir, exist_ok=True)
    for name, text in texts.items():
        atomic_write(os.path.join(out_dir, name), lambda h, text=text: h.write(text.encode()))
    if runs:
        from realrun.train.report import plot_losses

        plot_losses(runs, os.path.join(out_dir, "loss_curves.png"))


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def summary_table(summary: dict) -> str:
    rows = []
    for g in summary["groups"]:
        measured = _fmt(g["measured"]) if g["reached"] == g["runs"] else \
            f"> {g['ceiling']:.2f} ({g['reached']}/{g['runs']} reached)" if not g["reached"] else \
            f"{_fmt(g['measured'])} ({g['reached']}/{g['runs']})"
        rows.append((g["label"], measured, _fmt(g["spread"], ".1%"), _fmt(g["predicted"]),
                     _fmt(g["predicted_held_out"]), _fmt(g["predicted_gaussian"]),
                     " ".join(_fmt(e, ".3f") for e in g.get("errors", [])) or "-"))
    return table(("policy", "measured inflation", "spread", "fitted", "held out", "gaussian a priori",
                  "measured error"), rows)


def summary_lines(summary: dict) -> list[str]:
    b, se = summary["critical_batch_tokens"], summary["critical_batch_se"]
    lines = [f"{_where(key)}: target validation loss {summary['targets'][key]:.4f} (uncompressed, step "
             f"{summary['target_steps'][key]}), reached at step {steps:.1f} on average; noise floor "
             f"{_fmt(summary['noise_floors'].get(key), '.1%')} (spread of the uncompressed seeds)"
             for key, steps in summary["base_steps_to_target"].items()]
    if b is None:
        return lines + ["no fit: no compressed run reached the target (more --steps, or an earlier --target-step)"]
    return lines + [f"fitted critical batch B_crit = {_fmt(b, ',.0f')} tokens (standard error {_fmt(se, ',.0f')})"]


def _where(key: str) -> str:
    """``_base_key`` in words: ``mbs8 (batch 2048 tokens)``, or ``batch 2048 tokens``."""
    name, _, batch = key.rpartition(": ")
    return f"{name} (batch {batch} tokens)" if name else f"batch {batch} tokens"


def report_md(summary: dict) -> str:
    return "\n".join(["# realrun convergence", "", *summary_lines(summary), "", "```", summary_table(summary), "```",
                      "", "inflation: steps to the target over the uncompressed runs' mean; fitted: perfmodel's "
                      "model with B_crit fitted on every policy and the measured errors; held out: fitted on "
                      "the other policies; gaussian a priori: perfmodel's unit-Gaussian error estimates.", ""])


def _configs(model: str, dp: int, mbs: int, steps: int, policies, seeds, eval_every: int, lr: float,
             threads: int) -> list:
    from realrun.train.config import TrainConfig

    if dp < 2:
        raise InputError("dp", dp, "an integer >= 2 (the gradient axis moves nothing on one replica)")
    for policy in policies:
        compressed_axes(policy)           # dp=SPEC only, before any run
    if all(not compressed_axes(p) for p in policies):
        raise InputError("policies", ";".join(policies) or "none", "at least one compressed gradient policy (dp=SPEC)")
    if eval_every < 1 or eval_every > steps:
        raise InputError("eval_every", eval_every, f"an integer from 1 to steps ({steps})")
    return [(policy, seed, TrainConfig.of(model=model, dp=dp, mbs=mbs, steps=steps, policy=policy, seed=seed, lr=lr,
                                          eval_every=eval_every, error_every=eval_every, threads=threads, device="cpu"))
            for policy in (BASE, *(p for p in policies if p != BASE)) for seed in seeds]


def convergence(model: str = "gpt-tiny", dp: int = 2, mbs: int = 8, steps: int = 400, target_step: int | None = None,
                policies=CONVERGENCE_POLICIES, seeds=(1, 2), eval_every: int = 5, lr: float = 3e-3,
                out_dir: str | None = None, threads: int = 1, progress: bool = True) -> dict:
    """Train every policy (and the uncompressed one) for every seed, measure steps to target and
    fit perfmodel's inflation model (module doc). Returns {"summary", "regime", "rows"}; with
    ``out_dir`` writes the files of the module doc."""
    from tqdm import tqdm

    from realrun.train.launch import run_local

    target_step = target_step or max(eval_every, steps // 4)
    if not 1 <= target_step <= steps:
        raise InputError("target_step", target_step, f"a step from 1 to steps ({steps})")
    configs = _configs(model, dp, mbs, steps, policies, seeds, eval_every, lr, threads)
    if out_dir:
        check_out(out_dir)      # before the runs: hours of training are never lost to a bad --out
    runs = {}
    for policy, seed, cfg in tqdm(configs, desc="convergence runs", unit="run", disable=not progress):
        runs[(policy, seed)] = run_local(cfg)
    target = target_of([r for (p, _), r in runs.items() if p == BASE], target_step)
    batch = configs[0][2].global_batch * configs[0][2].seq_len
    rows = [run_row(p, s, records, target, batch) for (p, s), records in runs.items()]
    summary = {**summarize(rows), "targets": {str(batch): target}, "target_steps": {str(batch): target_step},
               "model": model, "dp": dp, "mbs": mbs, "steps": steps, "seeds": list(seeds), "lr": lr}
    regime = regime_of(summary, model)
    if out_dir:
        write_outputs(out_dir, rows, summary, regime, {f"{p} seed {s}": r for (p, s), r in runs.items()
                                                       if s == seeds[0]})
    return {"summary": summary, "regime": regime, "rows": rows}


def read_campaign(path: str) -> tuple[list[dict], dict]:
    """(rows, summary) of a campaign's folder (``convergence.csv`` and ``convergence.json``), every
    cell checked (``_campaign_row``, ``_campaign_summary``): one line naming the file, the line
    and the column of the first that is not what realrun convergence writes."""
    where = table_path = os.path.join(path, "convergence.csv")
    try:
        with open(table_path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [k for k in CAMPAIGN_COLUMNS if k not in (reader.fieldnames or ())]
            if missing:
                raise InputError(table_path, ",".join(reader.fieldnames or ()) or "empty",
                                 "a convergence.csv realrun convergence wrote (no column " + ", ".join(missing) + ")")
            rows = [_campaign_row(f"{table_path}:{reader.line_num}", r) for r in reader]
        where = os.path.join(path, "convergence.json")
        with open(where) as handle:
            summary = _campaign_summary(where, json.load(handle))
    except InputError:
        raise
    except OSError as exc:
        raise InputError("fit", path, f"a folder realrun convergence wrote ({where}: {exc.strerror})") from None
    except (ValueError, csv.Error) as exc:      # not JSON, not UTF-8, a CSV field over csv's limit
        raise InputError("fit", where, f"a file realrun convergence wrote ({exc})") from None
    _check_campaign(where, rows, summary)
    return rows, summary


# what a campaign's row must hold: column -> (kind, lowest, highest, may be empty); steps_to_target
# is also at most the row's steps, and policy a gradient policy (compressed_axes)
CAMPAIGN_COLUMNS = {
    "policy": (str, None, None, False),
    "seed": (int, 0, 2**63 - 1, False),
    "steps": (int, 1, MAX_STEPS, False),
    "steps_to_target": (float, 0.0, MAX_STEPS, True),
    "dp_rel_error": (float, 0.0, MAX_ERROR, True),
    "dp_contraction": (float, 0.0, MAX_ERROR, True),
    "batch_tokens": (int, 1, MAX_BATCH_TOKENS, False),
}
OPTIONAL_COLUMNS = {"final_val_loss": (float, 0.0, math.inf, True), "campaign": (str, None, None, True)}


def _campaign_row(where: str, raw: dict) -> dict:
    """A row of a campaign's convergence.csv as ``run_row`` made it (``CAMPAIGN_COLUMNS``)."""
    row = {}
    for key, rule in {**CAMPAIGN_COLUMNS, **OPTIONAL_COLUMNS}.items():
        if key in raw:
            row[key] = _cell(f"{where}.{key}", raw[key], *rule)
    if row["steps_to_target"] is not None and not 0 < row["steps_to_target"] <= row["steps"]:
        raise InputError(f"{where}.steps_to_target", row["steps_to_target"],
                         f"a step above 0 and at most the run's steps ({row['steps']}), or empty (never reached)")
    try:
        compressed_axes(row["policy"])
    except InputError as err:
        raise InputError(f"{where}.policy", row["policy"], f"a gradient policy ({err})") from None
    return row


def _cell(field: str, text, kind, low, high, empty: bool):
    """One cell of a campaign's table: None where it may be empty, else a ``kind`` in [low, high]."""
    if text is None or text == "":
        if empty:
            return None
        raise InputError(field, text, "a value (it may not be empty)")
    if kind is str:
        return text
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not low <= value <= high:
        what = f"an integer from {low} to {high}" if kind is int else f"a number from {low:g} to {high:g}"
        raise InputError(field, text, what + (", or empty" if empty else ""))
    return value


def _campaign_summary(path: str, doc) -> dict:
    """The summary of a campaign's convergence.json: the model, and per batch key the target loss
    (a finite number >= 0) and the step it was taken at (an integer >= 1)."""
    summary = doc.get("summary") if isinstance(doc, dict) else None
    if not isinstance(summary, dict):
        raise InputError(f"{path}.summary", summary, "an object, as realrun convergence writes it")
    if not isinstance(summary.get("model"), str) or not summary["model"]:
        raise InputError(f"{path}.summary.model", summary.get("model"), "a model name")
    for key, integer in (("targets", False), ("target_steps", True)):
        values = summary.get(key)
        if not isinstance(values, dict) or not values:
            raise InputError(f"{path}.summary.{key}", values, "an object of batch: value, as realrun convergence "
                             "writes it")
        for batch, value in values.items():
            ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float)) \
                and math.isfinite(value) and value >= (1 if integer else 0)
            if not ok:
                raise InputError(f"{path}.summary.{key}.{batch}", value,
                                 "an integer >= 1" if integer else "a finite number >= 0")
    return summary


def _check_campaign(doc_path: str, rows: list[dict], summary: dict) -> None:
    """A campaign's rows and the summary in ``doc_path`` belong together: runs, one row per
    (policy, seed, batch), and for every batch uncompressed runs and a target."""
    path = os.path.dirname(doc_path)
    if not rows:
        raise InputError("fit", path, "a campaign with runs (its convergence.csv has none)")
    seen = set()
    for r in rows:
        key = (r["policy"], r["seed"], r["batch_tokens"])
        if key in seen:
            raise InputError("fit", path, f"one row per policy, seed and batch (policy {key[0]} seed {key[1]} at "
                             f"{key[2]} tokens twice)")
        seen.add(key)
    for batch in sorted({r["batch_tokens"] for r in rows}):
        if not any(r["policy"] == BASE and r["batch_tokens"] == batch for r in rows):
            raise InputError("fit", path, f"uncompressed (none) runs at every batch (none at {batch} tokens)")
        for key in ("targets", "target_steps"):
            if not any(k.rpartition(": ")[2] == str(batch) for k in summary[key]):
                raise InputError(f"{doc_path}.summary.{key}", summary[key], f"a value for every batch of the runs "
                                 f"(none for {batch})")


def refit(paths: list[str], out_dir: str | None = None) -> dict:
    """One fit over the runs of several campaigns (``read_campaign``: e.g. one per batch size),
    nothing trained: each run's inflation against its own campaign's uncompressed runs, one
    ``B_crit`` for all, each (policy, batch) held out in turn."""
    rows, targets, target_steps, models = [], {}, {}, set()
    if len(set(paths)) != len(paths):
        raise InputError("fit", ",".join(paths), "distinct campaign folders")
    if out_dir:
        check_out(out_dir, paths)
    for path in paths:
        got, summary = read_campaign(path)
        name = os.path.basename(os.path.normpath(path))
        rows += [{**r, "campaign": name} for r in got]
        # keyed "batch" by a campaign, "campaign: batch" by a fit: this fit's campaign names
        targets.update({f"{name}: {k.rpartition(': ')[2]}": v for k, v in summary["targets"].items()})
        target_steps.update({f"{name}: {k.rpartition(': ')[2]}": v for k, v in summary["target_steps"].items()})
        models.add(summary["model"])
    if len(models) > 1:
        raise InputError("fit", ",".join(paths), "campaigns of one model (got " + ", ".join(sorted(models)) + ")")
    summary = {**summarize(rows), "targets": targets, "target_steps": target_steps, "model": models.pop(),
               "campaigns": list(paths)}
    regime = regime_of(summary, summary["model"])
    if out_dir:
        write_outputs(out_dir, rows, summary, regime, {})
    return {"summary": summary, "regime": regime, "rows": rows}
