"""What compression costs in training: the extra steps to reach the uncompressed run's loss.

A policy's per-step error says little about training by itself: error feedback on the gradients
re-sends what one step dropped, so ``ef(topk(0.01))`` loses 96% of a step's gradient energy and
still converges. What a user can act on is the **steps inflation**: steps to reach the loss
the uncompressed run reaches, over its steps. The step time times the steps is then the time to
target, which is what ``perfmodel search`` ranks by.

The model splits the uncompressed run's steps into the part the gradient's curvature sets
and the part its noise sets, as the large-batch literature does. McCandlish et al. 2018 ("An
Empirical Model of Large-Batch Training", the steps-batch relation ``S = S_min (1 + B_crit / B)``)
measure, for a batch of ``B`` tokens and a critical batch ``B_crit`` (the gradient noise
scale), ``S_min`` steps that no batch size removes and ``S_min B_crit / B`` that a larger
batch would: the deterministic fraction of the steps is ``phi = B / (B + B_crit)``, the noise
fraction ``1 - phi``. Compression acts on the two parts differently:

* **Without error feedback** (activations, parameters, gradients cast or quantized) the
  compressor adds ``omega = e^2`` of the gradient's second moment (``e`` the axis's relative
  RMS error): the noise term of SGD's iteration count (Ghadimi & Lan 2013, ``O(L D / eps + L D
  sigma^2 / eps^2)``) grows by ``1 + omega`` (Alistarh et al. 2017, QSGD: iterations grow with
  the variance bound), so the factor is ``1 + (1 - phi) e^2``.
* **With error feedback** the compressor is a contraction ``delta = 1 - e^2`` (``||C(x) - x||^2
  <= (1 - delta) ||x||^2``); error-feedback SGD keeps SGD's noise term and divides the
  deterministic one by ``delta`` (Stich & Karimireddy 2020, "The Error-Feedback Framework",
  JMLR 21: the ``L F_0 / (delta eps)`` term of the non-convex rate; the lower-order middle term
  is left out), so the factor is ``1 + phi (1 - delta) / delta``.

Axes compose as a product of their factors. A recipe preset (``perfmodel.compression.recipes``) runs
a share ``w`` of its steps uncompressed first (PowerSGD's ``start_powerSGD_iter``, 1-bit Adam's
``freeze_step``): the factor above is of the compressed part, and the run's is ``w + (1 - w) k``,
its time per uncompressed step of progress ``w t_none + (1 - w) k t`` (``recipe_cost``). A recipe that
feeds the error back on the server side too (1-bit and 0/1 Adam, LoCo: the reduced chunk is
compressed again with its own residual) makes every lossy hop of its reduction a contraction, so
the reduction's is their product: ``e^2 = 1 - (1 - e_1^2)^h`` for ``h`` hops of error ``e_1``
(``recipe_error``; Tang et al. 2019, DoubleSqueeze) instead of the hops' errors in quadrature. 1-bit and 0/1
Adam compress Adam's momentum, not the gradient; the momentum's error feedback is taken as the
gradient's (Tang et al. 2021, Theorem 1: 1-bit Adam's rate is error-feedback SGD's), the frozen
variance as costing no steps. ``B_crit`` is what a training run has to say: a
``Regime`` holds it with its source. The default is Kaplan et al. 2020 ("Scaling Laws for Neural
Language Models", section 5.1: ``B_crit(L) = B* / L^(1 / alpha_B)``, ``B* = 2e8`` tokens,
``alpha_B = 0.21``) at ``DEFAULT_TARGET_LOSS`` nats per token; ``realrun convergence`` measures
the inflation of compressed runs of the small GPT, fits ``B_crit`` on them (``fit_critical_batch``)
and writes a regime file with the relative errors measured on the run's real gradients, which
replace the unit-Gaussian estimates (a worst case for low-rank and top-k: real gradients are far
more compressible) for the specs it measured.
"""
from __future__ import annotations

import json
import math
import pathlib
import statistics
from dataclasses import dataclass, field

from perfmodel.axes import fed_back
from perfmodel.compression import compile_spec
from topologies import InputError

KAPLAN_B_STAR = 2e8          # tokens: Kaplan et al. 2020, section 5.1, B_crit(L) = B* / L^(1/alpha_B)
KAPLAN_ALPHA_B = 0.21        # the same fit's exponent
DEFAULT_TARGET_LOSS = 2.0    # nats per token: GPT-3's largest models end near 2 (Brown et al. 2020, Figure 3.1)
MAX_CONTRACTION_ERROR = 0.999999   # e below 1: delta = 1 - e^2 > 0 (e >= 1 is no contraction: never converges)


def kaplan_critical_batch(loss: float) -> float:
    """Kaplan et al. 2020's critical batch in tokens at a loss of ``loss`` nats per token."""
    if not isinstance(loss, (int, float)) or isinstance(loss, bool) or not 0 < loss < math.inf:
        raise InputError("target_loss", loss, "a loss in nats per token > 0, e.g. 2.0")
    return KAPLAN_B_STAR / loss ** (1.0 / KAPLAN_ALPHA_B)


@dataclass(frozen=True)
class Regime:
    """The training regime the inflation is of: the critical batch (tokens) and where it comes
    from; ``errors`` {axis: {spec: relative error}} measured on real tensors, used in place of the
    model's unit-Gaussian estimate for those (axis, spec)."""

    critical_batch_tokens: float
    source: str
    errors: dict = field(default_factory=dict)

    def __post_init__(self):
        if not _number_in(self.critical_batch_tokens, 0.0, math.inf) or self.critical_batch_tokens == 0:
            raise InputError("critical_batch_tokens", self.critical_batch_tokens, "a finite number of tokens > 0 (the "
                             "gradient noise scale; realrun convergence fits it at 1 token or more)")
        for axis, specs in self.errors.items():
            for spec, error in specs.items():
                if not _number_in(error, 0.0, math.inf):
                    raise InputError(f"errors.{axis}.{spec}", error, "a relative error: a finite number >= 0")

    def deterministic_fraction(self, batch_tokens: float) -> float:
        """``phi = B / (B + B_crit)``: the part of the steps the batch's noise does not set."""
        return batch_tokens / (batch_tokens + self.critical_batch_tokens) if batch_tokens > 0 else 0.0

    def error(self, axis: str, spec: str, estimate: float) -> float:
        return self.errors.get(axis, {}).get(spec, estimate)


def _number_in(value, low: float, high: float) -> bool:
    """Whether ``value`` is a number (not a bool) from ``low`` to below ``high``."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and low <= value < high


def default_regime(target_loss: float = DEFAULT_TARGET_LOSS) -> Regime:
    return Regime(kaplan_critical_batch(target_loss),
                  f"Kaplan et al. 2020 critical batch at {target_loss:g} nats per token")


def axis_inflation(error: float, feedback: bool, phi: float) -> float:
    """One axis's factor on the steps (module doc): error feedback divides the deterministic
    part by the contraction, no feedback adds ``e^2`` to the noise part."""
    e2 = min(error, MAX_CONTRACTION_ERROR) ** 2
    return 1.0 + phi * e2 / (1.0 - e2) if feedback else 1.0 + (1.0 - phi) * e2


def inflation(specs: dict, errors: dict, batch_tokens: float, regime: Regime) -> tuple[float, dict]:
    """(the policy's steps inflation, {axis: factor}) for ``specs`` {axis: spec text} with their
    relative errors ``errors`` {axis: e} at a global batch of ``batch_tokens``."""
    phi = regime.deterministic_fraction(batch_tokens)
    factors = {}
    for axis, spec in specs.items():
        codec = compile_spec(spec)
        if codec.is_none or axis not in errors:
            continue
        factors[axis] = axis_inflation(regime.error(axis, spec, errors[axis]), fed_back(axis, codec), phi)
    return float(math.prod(factors.values())), factors


def recipe_error(recipe, axis: str, spec: str, error: float) -> float:
    """The dp error ``error`` (``h`` hops of ``spec`` in quadrature, as the step model predicts it)
    of a recipe with server-side error feedback as one contraction (module doc); else ``error``."""
    if recipe is None or not recipe.server_feedback or axis != "dp":
        return error
    single = compile_spec(spec).error
    if not 0 < single < 1:
        return error
    hops = (error / single) ** 2
    return math.sqrt(1.0 - (1.0 - single ** 2) ** hops)


def recipe_cost(recipe, factor: float, step_s: float, uncompressed_s: float) -> tuple[float, float]:
    """(the run's steps inflation, seconds per uncompressed step of progress) of a policy whose
    compressed steps take ``step_s`` and inflate by ``factor``, the same plan uncompressed taking
    ``uncompressed_s``: a recipe's warm-up share runs at ``uncompressed_s`` (module doc); without a
    recipe (None), ``(factor, factor x step_s)``."""
    if recipe is None:
        return factor, factor * step_s
    return recipe.steps_inflation(factor), recipe.run_time(uncompressed_s, step_s, factor)


def policy_inflation(axes: list[tuple[float, bool]], batch_tokens: float, critical_batch: float) -> float:
    """The product of ``axis_inflation`` over (error, error feedback) ``axes`` at a batch of
    ``batch_tokens`` against a critical batch of ``critical_batch`` tokens."""
    phi = batch_tokens / (batch_tokens + critical_batch)
    return math.prod(axis_inflation(e, fb, phi) for e, fb in axes)


def record_inflation(record, regime: Regime | None = None) -> tuple[float, dict]:
    """``inflation`` of a ``StepRecord`` (its policy's axes, error estimates and batch): the factor
    of its compressed steps (a recipe's warm-up apart: ``record_cost``)."""
    regime = regime or default_regime()
    specs = {axis: d["spec"] for axis, d in record.policy_axes.items()}
    batch_tokens = record.tokens_per_s * record.step_time_s
    return inflation(specs, record.error_estimate, batch_tokens, regime)


def record_cost(record, regime: Regime | None = None, steps: int | None = None) -> dict:
    """What a ``StepRecord``'s policy costs in training (module doc): ``compressed_inflation`` (the
    compressed steps' factor), ``warmup`` (a recipe's uncompressed share), ``steps_inflation`` (the
    run's) and ``effective_step_time_s`` (seconds per uncompressed step of progress; the same plan
    uncompressed is the record's step time times its ``speedup_vs_uncompressed``). With the run's
    ``steps`` a recipe is priced step by step (``Recipe.modes``, ``run_cost``)."""
    from perfmodel.compression.policy import parse_policy

    regime = regime or default_regime()
    recipe = parse_policy(record.policy).recipe
    specs = {axis: d["spec"] for axis, d in record.policy_axes.items()}
    errors = {axis: recipe_error(recipe, axis, specs.get(axis, "none"), e) for axis, e in record.error_estimate.items()}
    factor, _ = inflation(specs, errors, record.tokens_per_s * record.step_time_s, regime)
    uncompressed_s = record.step_time_s * record.speedup_vs_uncompressed
    if steps is not None and recipe is not None:
        modes = recipe.modes(check_steps(steps))
        inflated, effective = run_cost(modes, factor, record.step_time_s, uncompressed_s, local_step_s(record))
        warmup = modes.count("exact") / len(modes)
    else:
        inflated, effective = recipe_cost(recipe, factor, record.step_time_s, uncompressed_s)
        warmup = recipe.warmup if recipe else 0.0
    return {"compressed_inflation": factor, "warmup": warmup, "steps_inflation": inflated,
            "effective_step_time_s": effective}


def check_steps(steps) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 10**9:
        raise InputError("steps", steps, "the run's steps: an integer from 1 to 10^9")
    return steps


def run_cost(modes: list, factor: float, step_s: float, uncompressed_s: float, local_s: float) -> tuple:
    """(steps inflation, seconds per uncompressed step of progress) of a recipe run whose steps do
    ``modes`` (``Recipe.modes``): ``exact`` steps as they are at ``uncompressed_s``, the others
    inflated by ``factor`` at ``step_s``, a ``local`` one (0/1 Adam) at ``local_s``."""
    exact, local = modes.count("exact"), modes.count("local")
    compressed = len(modes) - exact - local
    inflated = (exact + factor * (compressed + local)) / len(modes)
    return inflated, (exact * uncompressed_s + factor * (compressed * step_s + local * local_s)) / len(modes)


def local_step_s(record) -> float:
    """A step without its dp synchronisation (0/1 Adam's local step): the record's step less its
    exposed dp communication and the dp kernels on its critical path (the overlap slowdown, partly
    dp's, is kept: an upper bound)."""
    kernels = record.kernel_s.get("dp", {}).get("critical_s", 0.0)
    return record.step_time_s - record.breakdown.get("dp_comm_exposed_s", 0.0) - kernels


# convergence-NAME.json: regimes measured by realrun convergence
CATALOG = pathlib.Path(__file__).parents[1] / "catalog"


def catalog_regimes() -> list[str]:
    return sorted(p.stem.removeprefix("convergence-") for p in CATALOG.glob("convergence-*.json"))


def load_regime(path: str | None) -> Regime:
    """The regime of a ``realrun convergence`` file (``convergence.json``), of a catalog entry by
    name (``catalog_regimes()``: ``gpt-tiny``, measured on the small GPT), or the default."""
    if path is None:
        return default_regime()
    if path in catalog_regimes():
        path = str(CATALOG / f"convergence-{path}.json")
    try:
        with open(path) as handle:
            data = json.load(handle)
        regime = data["regime"]
        return Regime(float(regime["critical_batch_tokens"]), str(regime["source"]),
                      {a: {s: float(e) for s, e in d.items()} for a, d in regime.get("errors", {}).items()})
    except OSError as exc:
        raise InputError("convergence", path, f"a readable convergence.json ({exc.strerror}) or a catalog regime: "
                         + ", ".join(catalog_regimes())) from None
    except InputError as err:
        raise InputError(f"{path}:regime.{err.field}", err.value, err.allowed) from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InputError("convergence", path, "a convergence.json as realrun convergence writes it") from None


def fit_critical_batch(points: list[tuple[float, list[tuple[float, bool]], float]]) -> tuple[float, float]:
    """Least-squares ``B_crit`` (tokens) and its standard error from measured runs: each point
    (batch tokens, [(axis error, error feedback)], measured inflation), residuals in log
    inflation (a factor of 2 too slow weighs as one of 2 too fast). Needs at least one point
    whose prediction depends on B_crit; an inflation at or below 1 pulls B_crit up."""
    from scipy.optimize import least_squares

    if not points:
        raise InputError("convergence", "no compressed runs", "at least one compressed run that reached the target")

    def residuals(x):
        return [math.log(policy_inflation(axes, b, math.exp(x[0]))) - math.log(max(measured, 1e-9))
                for b, axes, measured in points]

    start = math.log(statistics.median(b for b, _, _ in points))
    fit = least_squares(residuals, [start], bounds=([0.0], [math.log(1e15)]))
    jtj = float((fit.jac[:, 0] ** 2).sum())
    sigma2 = 2 * fit.cost / (len(points) - 1) if len(points) > 1 else math.inf
    log_se = math.sqrt(sigma2 / jtj) if jtj > 0 and math.isfinite(sigma2) else math.inf
    b = math.exp(fit.x[0])
    return b, b * log_se      # the standard error of B_crit from that of log B_crit (delta method)
