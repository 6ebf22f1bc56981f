"""perfmodel advise (issue 41, item 3): candidates ranked by time to target, an uncertainty band from
the published runs' regimes, verdicts, why-not lines, the break-even codec speed, and its outputs."""
import json

import pytest

from perfmodel.explore.advise import MIN_GAIN, advise, candidate_policies
from perfmodel.explore.uncertainty import (MIN_ROWS, calibration_error, load_regime_errors, nearest,
                                           speedup_band)
from perfmodel.report.advise import advise_markdown, waterfall_steps
from topologies.errors import InputError

BERT = dict(gpus=64, mbs=8, gbs=512)       # 25 GbE, dp-bound: compression pays


@pytest.fixture(scope="module")
def bert():
    return advise("bert-large", "commodity-25g", check_plans=False, **BERT)


def test_the_band_holds_the_point_and_widens_with_the_saved_share():
    assert speedup_band(10.0, 8.0, 0.0) == pytest.approx((1.25, 1.25))
    low, high = speedup_band(10.0, 8.0, 0.2)
    assert low < 1.25 < high
    # kept 8 s x 1.2 with saved 2 s x 0.8, and kept 8 s x 0.8 with saved 2 s x 1.2 (module doc)
    assert (low, high) == pytest.approx(((9.6 + 1.6) / 9.6, (6.4 + 2.4) / 6.4))
    small, large = speedup_band(10.0, 9.9, 0.2), speedup_band(10.0, 2.0, 0.2)
    assert small[1] - small[0] < 0.01 < large[1] - large[0]
    slower = speedup_band(10.0, 12.0, 0.2)
    assert slower[0] < 10 / 12 < slower[1] < 1                        # a slowdown stays one, with its band
    assert all(map(lambda x: x > 0, speedup_band(10.0, 0.1, 0.9)))     # finite even when the saving dominates


def test_the_nearest_regime_is_the_most_specific_group_with_enough_rows():
    table = {"cluster": {"c/dense": {"rows": MIN_ROWS - 1, "mape": 0.5, "bias": 0.0}},
             "gpu": {"g/dense": {"rows": MIN_ROWS, "mape": 0.1, "bias": 0.02}},
             "family": {"dense": {"rows": 50, "mape": 0.2, "bias": 0.0}}, "all": {"all": {"rows": 99, "mape": 0.3,
                                                                                          "bias": 0.0}}}
    assert nearest("c", "g", "dense", table).key == "g/dense"           # the cluster's two rows are too few
    assert nearest("other", "other", "dense", table).level == "family"
    assert nearest("other", "other", "moe", table).level == "all"
    packaged = load_regime_errors()
    assert nearest("dgx-h100", "h100-sxm", "dense", packaged).level == "cluster"
    assert 0 < packaged["all"]["all"]["mape"] < 1


def test_a_calibrations_fit_error_replaces_the_regime(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"fits": {"tiers": {"mape": 0.04, "records": 30}, "compute": {"mape": 0.07}}}))
    found = calibration_error(str(path))
    assert found.level == "calibration" and found.mape == 0.07
    assert calibration_error(None) is None
    (tmp_path / "bare.json").write_text("{}")
    assert calibration_error(str(tmp_path / "bare.json")) is None


def test_options_are_ranked_by_time_to_target_with_consistent_verdicts(bert):
    speeds = [o.speedup_to_target for o in bert.options]
    assert speeds == sorted(speeds, reverse=True) and len(bert.options) >= 10
    for o in bert.options:
        low, high = o.to_target_band
        assert low <= o.speedup_to_target <= high
        if o.verdict == "pays":
            assert low > 1 and o.speedup_to_target >= 1 + MIN_GAIN and o.fits and not o.why_not
        elif o.verdict == "no":
            assert (high < 1 or not o.fits) and o.why_not
        else:
            assert o.why_not
    by = {o.policy: o for o in bert.options}
    assert by["loco"].verdict == "pays" and by["dp=int8"].verdict == "pays"
    assert by["loco"].memory_delta_GiB > 0                         # its int8 error state, charged
    topk = by["dp=ef(topk(0.01))+int8"]
    assert topk.speedup > 2 and topk.verdict == "no" and "steps its error adds" in topk.why_not
    assert bert.regime["level"] in ("cluster", "gpu", "family", "all") and bert.regime["mape"] > 0


def test_the_candidates_are_the_applicable_presets_and_axes():
    from perfmodel.prediction import _setup, PredictOptions
    from perfmodel.plan.parallel import PlanRequest
    from perfmodel.workload import load_model

    plan = _setup("bert-large", "commodity-25g", PlanRequest.of(zero=1, **BERT), PredictOptions()).plan
    names = candidate_policies(plan, load_model("bert-large"))
    assert "loco" in names and "zeropp" in names and "dp=int8" in names and "zero=int8" in names
    assert "onebit-adam" not in names and "powersgd" not in names      # their references run no ZeRO
    assert not any(n.startswith(("tp=", "pp=", "ep=")) for n in names)  # tp = pp = 1: nothing to compress


def test_why_not_names_hidden_or_intra_node_communication():
    result = advise("gpt3-1.3b", "dgx-a100", gpus=8, mbs=4, gbs=256, check_plans=False,
                    policies=["dp=int8", "dp=fp16"])
    for o in result.options:
        assert o.verdict != "pays"
        assert any(k in o.why_not for k in ("hidden by overlap", "compute-bound", "intra-node only", "under 2%"))


def test_the_waterfall_adds_up_and_the_markdown_has_every_option(bert):
    option, deltas = waterfall_steps(bert)
    assert option is bert.options[0]
    assert bert.step_time_s + sum(d for _, d in deltas) == pytest.approx(option.step_time_s, rel=1e-9)
    text = advise_markdown(bert)
    assert all(f"| {o.policy} |" in text for o in bert.options) and "uncertainty" in text
    with pytest.raises(InputError) as err:
        waterfall_steps(bert, "dp=nothing")
    assert err.value.field == "option"


def test_a_faster_plan_is_said_first():
    # Llama 3 8B at tp 8 on DGX H100 spends its step in tp all-reduces: tp 2 x dp 32 is 1.5x faster
    result = advise("llama3-8b", "dgx-h100", gpus=64, mbs=1, gbs=256, tp=8, zero=1, policies=["dp=int8"])
    best = result.best_plan
    assert best["plan"]["tp"] < 8 and best["plan"]["pp"] == result.plan["pp"]
    assert best["speedup"] == pytest.approx(result.step_time_s / best["step_time_s"]) and best["speedup"] > 1.05
    from perfmodel.report.advise import advise_report
    assert "first, the plan: tp=" in advise_report(result)


def test_advise_cli_table_json_markdown_and_waterfall(cli, tmp_path):
    args = ("perfmodel", "advise", "--model", "bert-large", "--cluster", "commodity-25g", "--gpus", "64",
            "--mbs", "8", "--gbs", "512", "--no-plan-check", "--policies", "loco;dp=int8;dp=ef(topk(0.01))+int8")
    out = cli(*args, "--markdown", str(tmp_path / "a.md"), "--waterfall", str(tmp_path / "a.png"),
              check_rc=0).stdout
    assert out.splitlines()[2].startswith("answer: loco pays") and "why not" in out
    assert (tmp_path / "a.md").read_text().startswith("# Will compression pay off?")
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads(cli(*args, "--json", check_rc=0).stdout)
    assert [o["policy"] for o in data["options"]][0] == "loco" and data["regime"]["mape"] > 0
    bad = cli(*args, "--waterfall", str(tmp_path / "b.png"), "--option", "zeropp", check_rc=2)
    assert "option=" in bad.stderr and len(bad.stderr.splitlines()) == 1 and "Traceback" not in bad.stderr


def test_advise_answers_a_1024_gpu_job_without_a_schedule_sweep():
    """The plan check keeps the job's pipeline depth (one schedule shape): what keeps advise in seconds."""
    result = advise("llama3-70b", "dgx-h100", gpus=1024, tp=8, pp=4, mbs=1, gbs=1024, zero=1,
                    sequence_parallel=True)
    assert result.options and result.regime["key"] == "dgx-h100/dense"
    assert all(o.to_target_band[0] <= o.speedup_to_target <= o.to_target_band[1] for o in result.options)
