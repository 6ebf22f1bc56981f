"""perfmodel.explore.convergence: the steps inflation a policy costs, and its fit on measured runs."""
import json
import math

import pytest

import perfmodel
from perfmodel.explore.convergence import (Regime, axis_inflation, default_regime, fit_critical_batch, inflation,
                                   kaplan_critical_batch, load_regime, record_inflation)
from topologies.errors import InputError


def test_error_feedback_divides_the_deterministic_steps_by_the_contraction():
    # e^2 = 0.75: delta = 0.25, the deterministic part takes 4x; half the steps are deterministic
    assert axis_inflation(math.sqrt(0.75), True, 0.5) == pytest.approx(0.5 * 4 + 0.5)
    assert axis_inflation(math.sqrt(0.75), True, 0.0) == pytest.approx(1.0)     # noise-bound: EF costs nothing
    # without feedback the noise part grows by 1 + e^2
    assert axis_inflation(0.1, False, 0.25) == pytest.approx(1 + 0.75 * 0.01)
    assert axis_inflation(0.1, False, 1.0) == pytest.approx(1.0)
    assert math.isfinite(axis_inflation(1.5, True, 0.5))                        # no contraction: large, finite


def test_the_deterministic_fraction_is_the_batch_over_batch_plus_critical():
    r = Regime(3000.0, "test")
    assert r.deterministic_fraction(1000) == pytest.approx(0.25)
    assert r.deterministic_fraction(0) == 0.0
    # Kaplan et al. 2020: B* / L^(1/0.21), 2e8 tokens at L = 1
    assert kaplan_critical_batch(1.0) == pytest.approx(2e8)
    assert kaplan_critical_batch(2.0) == pytest.approx(2e8 / 2 ** (1 / 0.21))
    with pytest.raises(InputError, match="target_loss"):
        kaplan_critical_batch(0)
    with pytest.raises(InputError, match="critical_batch_tokens"):
        Regime(-1.0, "x")


def test_axes_compose_and_measured_errors_replace_the_estimates():
    regime = Regime(1000.0, "test", {"dp": {"ef(topk(0.01))": 0.5}})
    specs = {"dp": "ef(topk(0.01))", "tp": "int8", "pp": "none"}
    total, per = inflation(specs, {"dp": 0.96, "tp": 0.008, "pp": 0.0}, 1000, regime)
    assert set(per) == {"dp", "tp"}
    assert per["dp"] == pytest.approx(1 + 0.5 * 0.25 / 0.75)     # the measured 0.5, not the estimate 0.96
    assert total == pytest.approx(per["dp"] * per["tp"])
    assert inflation({"dp": "none"}, {"dp": 0.0}, 1000, regime) == (1.0, {})


def test_a_search_row_and_a_prediction_agree():
    rec = perfmodel.predict("gpt3-1.3b", "dgx-a100", gpus=32, tp=1, pp=1, mbs=4, gbs=256,
                            policy="dp=ef(topk(0.01))+int8,tp=fp16")
    total, per = record_inflation(rec)
    phi = default_regime().deterministic_fraction(256 * 2048)
    assert per["dp"] == pytest.approx(axis_inflation(rec.error_estimate["dp"], True, phi))
    assert total > 1.5          # topk's Gaussian contraction ~0.08: the deterministic steps take ~12x


def test_the_fit_recovers_a_known_critical_batch():
    truth = 5000.0
    points = []
    for batch, e, fb in [(1000, 0.9, True), (4000, 0.9, True), (16000, 0.7, True), (2000, 0.3, False)]:
        phi = batch / (batch + truth)
        points.append((batch, [(e, fb)], axis_inflation(e, fb, phi)))
    b, se = fit_critical_batch(points)
    assert b == pytest.approx(truth, rel=1e-4) and se < 1e-3 * truth
    noisy = [(bt, axes, m * f) for (bt, axes, m), f in zip(points, (1.05, 0.95, 1.02, 1.0))]
    b, se = fit_critical_batch(noisy)
    assert 0.5 * truth < b < 2 * truth and 0 < se < truth
    with pytest.raises(InputError, match="convergence"):
        fit_critical_batch([])


def test_a_regime_file_round_trips_and_bad_ones_are_refused(tmp_path):
    path = tmp_path / "convergence.json"
    path.write_text(json.dumps({"regime": {"critical_batch_tokens": 1234.5, "source": "measured",
                                           "errors": {"dp": {"ef(topk(0.01))+int8": 0.93}}}}))
    r = load_regime(str(path))
    assert r.critical_batch_tokens == 1234.5 and r.error("dp", "ef(topk(0.01))+int8", 0.99) == 0.93
    assert load_regime(None).source.startswith("Kaplan")
    (tmp_path / "bad.json").write_text('{"summary": {}}')
    with pytest.raises(InputError, match="convergence"):
        load_regime(str(tmp_path / "bad.json"))
    with pytest.raises(InputError, match="readable"):
        load_regime(str(tmp_path / "missing.json"))


def test_search_ranks_by_time_to_target_and_weighs_only_uncompensated_error(tmp_path):
    kw = dict(gpus=16, gbs=64, candidates="dp=none|int8|ef(topk(0.01))+int8;tp=none|fp16", recompute="full",
              zero=(0,), schedules=("1f1b",), sequence_parallel=(False,), hpz=(False,), workers=1)
    result = perfmodel.search("gpt2-medium", "commodity-25g", **kw)
    rows = result.ranked
    assert [r["effective_step_time_s"] for r in rows] == sorted(r["effective_step_time_s"] for r in rows)
    for r in rows:
        assert r["effective_step_time_s"] == pytest.approx(r["step_time_s"] * r["steps_inflation"])
        ef = "ef(" in r["policy"]
        assert (r["uncompensated_error"] < r["total_error"]) == ef or r["total_error"] == 0
        assert (r["steps_inflation"] > 1.05) == ef       # phi ~ 0.01 at 65k tokens: topk adds ~10%
    # a noise-bound regime (critical batch far above the batch): error feedback costs no steps
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"regime": {"critical_batch_tokens": 1e12, "source": "noise-bound",
                                           "errors": {}}}))
    noise_bound = perfmodel.search("gpt2-medium", "commodity-25g", convergence=str(path), **kw)
    assert all(r["steps_inflation"] < 1.01 for r in noise_bound.ranked)
    assert noise_bound.regime.source == "noise-bound"
