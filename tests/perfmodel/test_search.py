"""perfmodel search: plans x policies under a per-axis error budget, the Pareto front."""
import csv
import json
import math

import pytest

import perfmodel
from perfmodel.explore.families import policies_for
from perfmodel.explore.search import admits, parse_candidates, parse_max_error, pareto_front
from topologies import InputError

KW = dict(gpus=16, gbs=64, candidates="dp=none|int8|topk(0.01)|ef(topk(0.01))+int8;tp=none|fp16|fp8;pp=none|int8",
          schedules=("1f1b",), max_mbs=2)


@pytest.fixture(scope="module")
def result():
    return perfmodel.search("gpt2-medium", "dgx-a100", workers=1, **KW)


@pytest.mark.parametrize("text", ["dp=none|int9", "xx=int8", "dp=int8;dp=fp16", "dp=", "tp"])
def test_bad_candidates_name_the_field(text):
    with pytest.raises(InputError) as err:
        parse_candidates(text)
    assert err.value.field in ("candidates", "compressor", "spec")


@pytest.mark.parametrize("text", ["dp=-1", "tp=abc", "qq=0.1", "pp=inf"])
def test_bad_budgets_name_the_field(text):
    with pytest.raises(InputError) as err:
        parse_max_error(text)
    assert err.value.field == "max_error"


def test_budget_rules():
    budget = parse_max_error("tp=0.01")
    assert admits("tp", "int8", budget) and admits("tp", "fp16", budget)
    assert not admits("tp", "fp8", budget) and not admits("zero", "int4", budget)
    assert admits("dp", "ef(topk(0.01))+int8", budget)           # error feedback: a contraction suffices
    assert not admits("dp", "topk(0.01)", budget)                # the same error without it does not
    assert not admits("tp", "ef(topk(0.01))+int8", budget)       # activations get no feedback


def test_idle_axes_collapse():
    plan = dict(tp=1, pp=1, dp=8, zero=0)
    cands = parse_candidates("dp=none|int8;tp=none|fp16;pp=none|int8;zero=none|int8")
    assert policies_for(plan, cands) == ["none", "dp=int8"]
    assert len(policies_for(dict(tp=2, pp=2, dp=2, zero=1), cands)) == 16


def test_ranked_rows_keep_the_budget_and_compare_with_the_best_uncompressed_plan(result):
    assert result.evaluated == len(result.rows) > 100
    ranked = result.ranked
    assert ranked and all(r["error_tp"] <= 0.01 and r["error_pp"] <= 0.01 for r in ranked)
    assert not any("fp8" in r["policy"] for r in ranked)          # per-application error over the budget
    assert any(not r["within_budget"] for r in result.rows)       # evaluated, kept in the CSV rows
    best = result.best_uncompressed
    assert best["policy"] == "none" and best["step_time_s"] == min(
        r["step_time_s"] for r in result.rows if r["policy"] == "none")
    for r in ranked:
        assert r["speedup_vs_best_uncompressed"] == pytest.approx(best["step_time_s"] / r["step_time_s"])
    assert [r["effective_step_time_s"] for r in ranked] == sorted(r["effective_step_time_s"] for r in ranked)


def test_the_pareto_front_is_undominated(result):
    front = result.pareto
    assert front[0]["total_error"] == 0.0 and front == pareto_front(result.ranked)
    for f in front:
        assert not any(r["step_time_s"] < f["step_time_s"] and r["total_error"] < f["total_error"]
                       for r in result.ranked)
    assert all(a["step_time_s"] > b["step_time_s"] for a, b in zip(front, front[1:]))
    for r in front:
        errors = [r[f"error_{a}"] for a in ("dp", "zero", "tp", "pp")]
        assert r["total_error"] == pytest.approx(math.sqrt(sum(e * e for e in errors)))


def test_workers_give_the_same_rows(result):
    again = perfmodel.search("gpt2-medium", "dgx-a100", workers=2, **KW)
    key = lambda r: (r["policy"], r["tp"], r["pp"], r["dp"], r["mbs"], r["zero"], r["sequence_parallel"], r["hpz"])  # noqa: E731
    assert sorted(map(key, again.rows)) == sorted(map(key, result.rows))
    assert again.pareto[-1]["step_time_s"] == pytest.approx(result.pareto[-1]["step_time_s"])


def test_cli_writes_csv_plot_and_json(cli, tmp_path):
    out, png = tmp_path / "all.csv", tmp_path / "front.png"
    args = ["perfmodel", "search", "--model", "gpt2-medium", "--cluster", "dgx-a100", "--gpus", "8", "--gbs", "32",
            "--candidates", "dp=none|int8;tp=none|fp16", "--schedules", "1f1b", "--max-mbs", "2", "--workers", "1"]
    text = cli(*args, "--csv", str(out), "--plot", str(png), check_rc=0).stdout
    assert "Pareto front" in text and "vs best none" in text and "best uncompressed plan" in text
    rows = list(csv.DictReader(out.open()))
    assert rows and {"error_dp", "error_tp", "within_budget", "speedup_vs_best_uncompressed"} <= set(rows[0])
    assert png.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(cli(*args, "--json", check_rc=0).stdout)
    assert data["ranked"] and data["pareto"] and data["budget"]["tp"] == 0.01
    bad = cli(*args, "--max-error", "tp=-3", check_rc=2)
    assert "max_error" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_sweep_rows_carry_errors_and_both_speedups():
    from perfmodel.explore.sweep import best_uncompressed_s, plan_row

    res = perfmodel.sweep_plans("gpt2-medium", "dgx-a100", gpus=8, gbs=32, policies="naive:int8", max_mbs=2)
    best = best_uncompressed_s(res.records)          # no 'none' policy was asked for
    plain = min(perfmodel.predict("gpt2-medium", "dgx-a100", gpus=8, gbs=32, **{k: r.plan[k] for k in
                ("tp", "pp", "dp", "mbs", "zero")}).step_time_s for r in res.records)
    assert best == pytest.approx(plain)
    row = plan_row(res.records[0], best)
    assert row["error_tp"] >= 0 and row["error_dp"] > 0
    assert row["speedup_vs_best_uncompressed"] == pytest.approx(best / res.records[0].step_time_s)


@pytest.mark.parametrize("schedules", [("1f1b", "zigzag"), ("interleaved:1",)])
def test_a_bad_schedule_is_an_error_not_an_empty_search(schedules):
    with pytest.raises(InputError) as err:
        perfmodel.search("gpt2-medium", "dgx-a100", gpus=8, gbs=32, schedules=schedules)
    assert err.value.field == "schedule"


def test_rows_are_predict_one_by_one_to_the_last_bit():
    """Families timed together (predict_many, the schedule's graph, cached stage parts) give the
    rows predict gives each (plan, policy) alone, interleaving and ZeRO-3 included."""
    from perfmodel.explore.families import _row

    got = perfmodel.search("gpt2-medium", "dgx-a100", gpus=8, gbs=32, max_mbs=2, zero=(1, 3),
                           candidates="dp=none|int8;tp=none|fp16;pp=none|int8;zero=none|int8",
                           schedules=("1f1b", "interleaved:2"))
    assert len({r["pp"] for r in got.rows}) > 2 and any(r["schedule"] == "interleaved:2" for r in got.rows)
    for r in got.rows[::7]:
        plan = {k: r[k] for k in ("tp", "pp", "dp", "mbs", "zero", "recompute", "sequence_parallel", "schedule",
                                  "hpz")}
        alone = _row(perfmodel.predict("gpt2-medium", "dgx-a100", gpus=8, gbs=32, policy=r["policy"], **plan),
                     plan, got.budget, "dgx-a100")
        assert {k: r[k] for k in alone} == alone


def test_predict_many_matches_predict_and_returns_errors_per_plan():
    from perfmodel.plan.parallel import PlanRequest
    from perfmodel.prediction import predict_many

    fits = PlanRequest.of(gpus=8, gbs=32, tp=2, pp=4, dp=1)
    huge = PlanRequest.of(gpus=8, gbs=64, tp=1, pp=1, dp=8, mbs=8)
    out = predict_many("gpt3-2.7b", "dgx-a100", [(fits, ["none", "tp=fp16,pp=int8"]), (huge, ["none"])])
    assert isinstance(out[1], InputError) and out[1].field == "memory"
    for policy, record in zip(["none", "tp=fp16,pp=int8"], out[0]):
        alone = perfmodel.predict("gpt3-2.7b", "dgx-a100", fits, policy=policy)
        assert record.step_time_s == alone.step_time_s and record.breakdown == alone.breakdown
        assert record.speedup_vs_uncompressed == alone.speedup_vs_uncompressed
    with pytest.raises(InputError, match="compressor"):
        predict_many("gpt3-2.7b", "dgx-a100", [(fits, ["tp=nonsense"])])
