"""Fit each training stack's constants (perfmodel/catalog/frameworks.toml) on its published runs.

For every stack with published rows (``FITS``: the constants it fits and the sources of
validation/published/sources.toml it fits them on), least squares on the log ratio of predicted to
measured step time (scipy's ``least_squares``, within each constant's ``range`` where the catalog
gives one, else ``BOUNDS``); the standard error of each constant from the Jacobian at the optimum
(s^2 (J^T J)^-1, s^2 the residual variance over n - p rows). The measured step time is the row's
own: its source's FLOP count over its TFLOP/s per GPU, or its tokens over its tokens/s. Each row is
predicted as ``perfmodel validate --published`` predicts it, with the stack's profile in place of
the catalog's (``AnalyticalEngine.time_steps(steps, profiles)``) and the overlaps a row leaves
open (an empty ``tp_overlap`` or ``dp_overlap`` cell) at the stack's defaults.

Prints, per stack, each fitted constant with its standard error, the MAPE of its fit sources and of
its check sources (``CHECKS``: published rows of the stack not fitted on) before (megatron-core's
neutral profile) and after, and each row's error; ``--write`` puts the fitted values, standard
errors and sources into frameworks.toml (the lines of the fitted constants only).

    python scripts/fit_framework_profiles.py [--stack NAME] [--write]
"""
from __future__ import annotations

import argparse
import csv
import math
import re
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from perfmodel.calibration.published import (PUBLISHED_DIR, row_model, row_plan, load_sources, source_flops,
                                             source_rows)
from perfmodel.compression.policy import parse_policy
from perfmodel.devices import device
from perfmodel.engines import Env, StepInputs
from perfmodel.engines.analytical import ANALYTICAL
from perfmodel.plan.framework import framework_profile
from perfmodel.plan.parallel import PlanRequest
from perfmodel.step.timing import DEFAULT_OVERLAP_SLOWDOWN
from perfmodel.workload import load_model
from topologies import cluster_for

CATALOG = Path(__file__).resolve().parents[1] / "perfmodel" / "catalog" / "frameworks.toml"
# stack -> (constants fitted, sources fitted on)
FITS = {
    "megatron-deepspeed": (("microbatch_host_ms",), ("bloom-megatron-deepspeed-a100-2022",)),
    "torchtitan": (("eager_traffic",), ("torchtitan-a100-2024",)),
}
# stack -> published runs that are reported, not fitted on: sources (their rows marked skip included:
# torchtitan's H100 rows ran on a GPU the catalog lacks, reported on h100-sxm), or a file of
# validation/published that is no source of the suite (one row: the suite asks five per source)
CHECKS = {"torchtitan": ("torchtitan-h100-2024",), "deepspeed": ("deepspeed_zero3_granite_a100.csv",)}
BOUNDS = {"microbatch_host_ms": (0.0, 100.0), "layer_host_us": (0.0, 2000.0), "score_accesses_bwd": (5.0, 9.0),
          "step_host_ms": (0.0, 5000.0)}


def measured_step_s(row: dict) -> float:
    """The row's step time from what it measured (its TFLOP/s per GPU with its FLOP count, or tokens/s)."""
    gpus, tokens = int(row["gpus"]), int(row["gbs"]) * int(row["seq_len"])
    if row.get("measured_tokens_per_s_per_gpu"):
        return tokens / (float(row["measured_tokens_per_s_per_gpu"]) * gpus)
    if row.get("measured_tokens_per_s"):
        return tokens / float(row["measured_tokens_per_s"])
    return source_flops(row["flops_formula"], row) / (float(row["measured_tflops_per_gpu"]) * 1e12 * gpus)


def step_inputs(row: dict, profile) -> StepInputs:
    """What the engine times for ``row`` under ``profile`` (prediction's setup, without its caches)."""
    plan = dict(row_plan(row), framework=profile.name)     # open overlaps: make_plan takes the stack's defaults
    request = PlanRequest.of(gpus=int(row["gpus"]), **plan)
    arch = load_model(row_model(row))
    built, ranks = cluster_for(row["cluster"], gpus=request.gpus)
    dev = profile.device(device(built.gpu_model))
    built_plan = request.build(arch, ranks, "bf16" if plan["precision"] == "bf16" else "fp16")
    return StepInputs(model=arch, plan=built_plan, env=Env(built, dev, None, DEFAULT_OVERLAP_SLOWDOWN),
                      policy=parse_policy("none"))


def log_errors(rows: list[dict], profile) -> np.ndarray:
    """log(predicted / measured step time) of every row under ``profile``."""
    steps = [step_inputs(r, profile) for r in rows]
    timed = ANALYTICAL.time_steps(steps, [profile] * len(steps))
    return np.array([math.log(t.breakdown.total / measured_step_s(r)) for t, r in zip(timed, rows)])


def rows_of(keys, skipped: bool = False) -> list[dict]:
    """The rows of the sources (or CSV files) ``keys``, with the rows marked ``skip`` where ``skipped``."""
    sources = load_sources()
    rows = []
    for key in keys:
        if key.endswith(".csv"):
            with open(PUBLISHED_DIR / key, newline="") as handle:
                rows += list(csv.DictReader(handle))
        else:
            rows += source_rows(sources[key])
    return [r for r in rows if skipped or not r.get("skip")]


def bounds_of(profile, names) -> tuple[list, list]:
    spans = [profile.constant(n).range or BOUNDS[n] for n in names]
    return [s[0] for s in spans], [s[1] for s in spans]


def fit(stack: str) -> dict:
    """The stack's fitted constants, their standard errors and the fit's residuals."""
    names, keys = FITS[stack]
    profile, rows = framework_profile(stack), rows_of(keys)
    lo, hi = bounds_of(profile, names)
    x0 = np.clip([profile.constant(n).value for n in names], lo, hi)

    def residuals(x):
        return log_errors(rows, profile.with_values(**dict(zip(names, map(float, x)))))
    result = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3)
    dof = len(rows) - len(names)
    stderr = [None] * len(names)
    if dof > 0:
        s2 = float(result.fun @ result.fun) / dof
        cov = np.linalg.pinv(result.jac.T @ result.jac) * s2
        stderr = [float(math.sqrt(max(v, 0.0))) for v in np.diag(cov)]
    return dict(stack=stack, names=names, values=[float(v) for v in result.x], stderr=stderr, sources=keys,
                profile=profile.with_values(**dict(zip(names, map(float, result.x)))))


def mape(rows: list[dict], profile) -> tuple[float, list]:
    """(MAPE of the rows' throughput, each row's signed throughput error) under ``profile``."""
    errors = [math.exp(-e) - 1.0 for e in log_errors(rows, profile)]
    return sum(abs(e) for e in errors) / len(errors), errors


def report(stack: str, fitted: dict | None) -> None:
    profile = fitted["profile"] if fitted else framework_profile(stack)
    neutral = framework_profile("megatron-core")
    print(f"\n== {stack}")
    if fitted:
        for name, value, se in zip(fitted["names"], fitted["values"], fitted["stderr"]):
            print(f"  {name} = {value:.4g}" + (f" +- {se:.2g}" if se is not None else " (no dof for a standard error)"))
    for role, keys in (("fit", FITS.get(stack, ((), ()))[1]), ("check", CHECKS.get(stack, ()))):
        for key in keys:
            rows = rows_of((key,), skipped=role == "check")
            before, _ = mape(rows, neutral)
            after, errors = mape(rows, profile)
            print(f"  {role} {key}: MAPE {before:.1%} (neutral) -> {after:.1%} ({len(rows)} rows)")
            for row, err in zip(rows, errors):
                print(f"    {row['model_label']:<32} {row['gpus']:>5} GPUs tp{row['tp']} pp{row['pp']} dp{row['dp']} "
                      f"mbs{row['mbs']} {row['recompute']:<9} {err:+.1%}")


def write(fitted: dict, path: Path = CATALOG) -> None:
    """The fitted constants' lines of frameworks.toml with their new value, stderr and fitted_on."""
    text = path.read_text()
    section = re.search(rf"^\[{re.escape(fitted['stack'])}\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    body = section.group(1)
    for name, value, se in zip(fitted["names"], fitted["values"], fitted["stderr"]):
        line = re.search(rf"^{name} = \{{.*\}}$", body, re.M).group(0)
        number = f"{value:.4g}" if re.search(r"[.e]", f"{value:.4g}") else f"{value:.4g}.0"
        new = re.sub(r"value = [^,]+", f"value = {number}", line)
        new = re.sub(r", stderr = [^,]+", "", new)
        new = re.sub(r", fitted_on = \[[^\]]*\]", "", new)
        extra = (f", stderr = {se:.2g}" if se is not None else "") + ", fitted_on = [" + \
            ", ".join(f'"{k}"' for k in fitted["sources"]) + "]"
        new = new.replace(f"value = {number}", f"value = {number}{extra}", 1)
        body = body.replace(line, new)
    path.write_text(text[:section.start(1)] + body + text[section.end(1):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", choices=sorted(set(FITS) | set(CHECKS)), help="one stack (default: all)")
    parser.add_argument("--write", action="store_true", help="write the fitted constants into frameworks.toml")
    args = parser.parse_args()
    for stack in [args.stack] if args.stack else sorted(set(FITS) | set(CHECKS)):
        fitted = fit(stack) if stack in FITS else None
        report(stack, fitted)
        if fitted and args.write:
            write(fitted)


if __name__ == "__main__":
    main()
