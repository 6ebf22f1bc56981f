"""realrun validate --training: its grid and arithmetic on synthetic runs, and a small
end-to-end run on an emulated cluster (netns)."""
import csv
import math
import os
import shutil
from types import SimpleNamespace

import pytest

pytest.importorskip("torch", reason="torch is not installed (the real extra)")

from perfmodel.plan.degrees import Degrees  # noqa: E402
from realrun.validate_training import (COMPARED_PHASES, REPEAT_FIELDS, StoredCluster, TrainCase, add_speedups,  # noqa: E402
                                       grid, plans, predicted_phases, repredict, row, summarize, summary_lines,
                                       validate_training, write_outputs)
from topologies import InputError  # noqa: E402

HAVE_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
BREAKDOWN = dict(compute_s=0.2, tp_comm_s=0.0, pp_comm_s=0.0, dp_comm_exposed_s=0.3, compression_s=0.0,
                 bubble_s=0.0, optimizer_s=0.01, overlap_slowdown_s=0.0)


def _records(step_s: float, dp_s: float, losses) -> list[dict]:
    base = dict(forward_s=0.05, backward_s=0.1, compute_s=0.15, tp_comm_s=0.0, pp_comm_s=0.0, dp_comm_exposed_s=dp_s,
                compression_s=0.0, optimizer_s=0.01, tp_kernel_s=0.0, pp_kernel_s=0.0, dp_kernel_s=0.0,
                zero_kernel_s=0.0, dp_rel_error=None, tp_rel_error=None, pp_rel_error=None)
    return [dict(base, step=i, step_s=step_s, loss=loss, val_loss=(loss if i == len(losses) - 1 else None))
            for i, loss in enumerate(losses)]


def _old_records(step_s: float, dp_s: float, losses) -> list[dict]:
    """Step records as realrun train wrote them before the phases took perfmodel's names."""
    out = []
    for r in _records(step_s, dp_s, losses):
        r = {("dp_comm_s" if k == "dp_comm_exposed_s" else "compress_s" if k == "compression_s" else k): v
             for k, v in r.items() if k != "compute_s"}
        out.append(r)
    return out


def _predicted(step_s: float, dp_s: float):
    return SimpleNamespace(step_time_s=step_s, breakdown=dict(BREAKDOWN, dp_comm_exposed_s=dp_s),
                           error_estimate={"dp": 0.01}, kernel_s={})


def test_the_grid_covers_the_targets():
    def d(tp, pp, dp):
        return Degrees(tp=tp, pp=pp, dp=dp)

    assert plans(4) == [(d(1, 1, 4), 0), (d(2, 1, 2), 0), (d(1, 2, 2), 0), (d(2, 2, 1), 0), (d(1, 1, 4), 1)]
    assert plans(2) == [(d(1, 1, 2), 0), (d(2, 1, 1), 0), (d(1, 2, 1), 0), (d(1, 1, 2), 1)]
    full = grid(4, quick=False)
    assert len(full) >= 40 and {c.bandwidth for c in full} == {10**8, 10**9}
    assert {"none", "naive:fp16", "naive:int8", "dp=ef(topk(0.01))+int8", "hybrid", "zeropp",
            "mzhybrid"} == {c.policy for c in full}
    assert len(grid(4, quick=True)) >= 20
    cfg = full[0].config(5)
    assert cfg.world == 4 and cfg.microbatches == 2 and not cfg.plan().dp_overlap


def test_rows_speedups_and_summary(tmp_path):
    none = TrainCase(Degrees(dp=4), 0, "none", 10**8)
    int8 = TrainCase(Degrees(dp=4), 0, "naive:int8", 10**8)
    rows = [row(none, _predicted(0.5, 0.3), [_records(0.55, 0.35, [5.0, 4.0, 3.5, 3.2])]),
            row(int8, _predicted(0.3, 0.1), [_records(0.4, 0.2, [5.0, 4.1, 3.4, 3.3])])]
    add_speedups(rows)
    r = rows[1]
    assert r["predicted_speedup"] == pytest.approx(0.5 / 0.3) and r["measured_speedup"] == pytest.approx(0.55 / 0.4)
    assert r["time_to_target_s"] is None and rows[0]["time_to_target_s"] == pytest.approx(4 * 0.55)
    assert r["measured_dp_comm_exposed_s"] == pytest.approx(0.2)
    assert r["predicted_dp_comm_exposed_s"] == pytest.approx(0.1)
    s = summarize(rows)
    assert s["cases"] == 2 and s["sign_agree"] == s["sign_total"] == 1 and s["fastest_agree"] == 1
    assert s["mape"] == pytest.approx((0.05 / 0.55 + 0.1 / 0.4) / 2)
    assert any("MAPE" in line for line in summary_lines(s))
    write_outputs(str(tmp_path), rows, s)
    with open(tmp_path / "results_training.csv") as handle:
        got = list(csv.DictReader(handle))
    assert len(got) == 2 and set(f"measured_{p}" for p in COMPARED_PHASES) <= set(got[0])
    assert "| tp1-pp1-dp4 | `naive:int8` | 100 |" in (tmp_path / "report.md").read_text()
    for name in ("step_predicted_vs_measured.png", "loss_curves.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_steps_that_measure_errors_are_left_out_of_the_times():
    """Their exact reference collectives are no part of a training step: the medians are over the
    steady steps without them (all of them where no other is left)."""
    from realrun.train.report import steady, summary

    records = _records(0.3, 0.1, [5.0, 4.0, 3.5, 3.2, 3.0, 2.9, 2.8])
    for r in records:
        r["error_step"] = r["step"] % 3 == 0
        r["step_s"] = 0.9 if r["error_step"] else 0.3 + 0.01 * r["step"]   # steps 2, 4, 5 clean
    assert [r["step"] for r in steady(records)] == [2, 4, 5]
    assert summary(records)["median_step_s"] == pytest.approx(0.34)
    got = row(TrainCase(Degrees(dp=4), 0, "none", 10**8), _predicted(0.3, 0.1), [records])
    assert got["measured_step_s"] == pytest.approx(0.34)
    every = [dict(r, error_step=True) for r in records]
    assert [r["step"] for r in steady(every)] == [2, 3, 4, 5, 6]


def test_kernels_go_to_the_phase_that_times_them():
    """The trainer times dp and ZeRO kernels inside its reduction, tp and pp kernels apart."""
    p = SimpleNamespace(step_time_s=1.0, breakdown=dict(BREAKDOWN, compression_s=0.05, dp_comm_exposed_s=0.1),
                        error_estimate={}, kernel_s={"dp": {"critical_s": 0.02, "beside_compute_s": 0.0},
                                                     "tp": {"critical_s": 0.03, "beside_compute_s": 0.0}})
    got = predicted_phases(p)
    assert got["dp_comm_exposed_s"] == pytest.approx(0.12) and got["compression_s"] == pytest.approx(0.03)


def test_a_stored_run_is_predicted_again_without_training(tmp_path, cli):
    """--measured: the stored measurements against today's model; the report and picture written,
    the stored time to target kept; a file that is not a results_training.csv is one error."""
    none = TrainCase(Degrees(dp=2), 0, "none", 10**8)
    int8 = TrainCase(Degrees(dp=2), 0, "naive:int8", 10**8)
    rows = [row(none, _predicted(0.5, 0.3), [_records(0.55, 0.35, [5.0, 4.0, 3.5, 3.2])]),
            row(int8, _predicted(0.3, 0.1), [_records(0.4, 0.2, [5.0, 4.1, 3.2, 3.3])])]
    add_speedups(rows)
    (tmp_path / "run").mkdir()
    write_outputs(str(tmp_path / "run"), rows, summarize(rows))
    summary = repredict(str(tmp_path / "run" / "results_training.csv"), None, str(tmp_path / "again"))
    assert summary["cases"] == 2
    with open(tmp_path / "again" / "results_training.csv") as handle:
        again = list(csv.DictReader(handle))
    assert [float(r["measured_step_s"]) for r in again] == [0.55, 0.4]
    assert float(again[1]["time_to_target_s"]) == pytest.approx(3 * 0.4)
    assert float(again[0]["predicted_step_s"]) != 0.5          # predicted by perfmodel, not copied
    assert (tmp_path / "again" / "step_predicted_vs_measured.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InputError):
        repredict(str(tmp_path / "bad.csv"), None, str(tmp_path / "x"))
    proc = cli("realrun", "validate", "--training", "--measured", str(tmp_path / "bad.csv"), "--out",
               str(tmp_path / "y"))
    assert proc.returncode == 2 and "measured" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_NETNS, reason="needs root and iproute2 (ip, tc)")
def test_a_small_training_validation_end_to_end(tmp_path, monkeypatch):
    """Two emulated hosts, dp=2, none and int8, three steps each: predicted and measured step
    times of the same order, the outputs written, the cluster's own rate restored."""
    from realrun.cluster import EmulatedSpec, down, emulated, up
    from realrun.measure import EmulatedRunner
    from realrun.validate_training import validate_training

    monkeypatch.setattr(emulated, "STATE_DIR", str(tmp_path / "state"))
    name = f"t{os.getpid() % 100000}"
    try:
        up(EmulatedSpec(hosts=2, bandwidth="1gbit"), name)
        runner = EmulatedRunner(name)
        cases = [TrainCase(Degrees(dp=2), 0, p, 2 * 10**8) for p in ("none", "naive:int8")]
        summary = validate_training(runner, None, str(tmp_path / "out"), cases=cases, steps=4, repeats=2)
        assert summary["cases"] == 2 and summary["mape"] < 3.0 and summary["repeats"] == 2
        assert summary["noise_floor"] >= 0.0   # measured on two real runs of each case
        assert runner.spec.bandwidth == 10**9
        for name_ in ("results_training.csv", "report.md", "step_predicted_vs_measured.png", "loss_curves.png"):
            assert (tmp_path / "out" / name_).stat().st_size > 0
    finally:
        down(name)
        assert emulated.netns.ours(name) == []


class FakeTrainer:
    """Emulated hosts that answer each run of a policy with the next of its scripted runs
    (step time, dp time, losses), and keep which runs they were asked for."""

    emulated, hosts = True, 4

    def __init__(self, runs: dict):
        self.runs = {k: list(v) for k, v in runs.items()}
        self.asked, self.restored = [], 0

    def topology(self, hosts=None, bandwidth=None):
        return StoredCluster().topology(hosts or self.hosts, bandwidth)

    def set_bandwidth(self, bits_per_s):
        pass

    def restore(self):
        self.restored += 1

    def train(self, cfg):
        self.asked.append((cfg.policy, cfg.steps))
        return _records(*self.runs[cfg.policy].pop(0))


LOSSES = [5.0, 4.0, 3.5, 3.2]
RUNS = {"none": [(0.50, 0.30, LOSSES), (0.60, 0.35, [5.0, 4.0, 3.6, 3.6]), (0.52, 0.32, [5.0, 4.0, 3.6, 3.6])],
        "naive:int8": [(0.40, 0.20, LOSSES), (0.412, 0.22, LOSSES), (0.405, 0.21, LOSSES)]}
CASES = [TrainCase(Degrees(dp=4), 0, "none", 10**8), TrainCase(Degrees(dp=4), 0, "naive:int8", 10**8)]


def test_every_case_is_run_repeats_times_round_robin(tmp_path):
    """R runs per case, round-robin over the bandwidth's cases; the step is the median of the
    runs, its spread max/min - 1, flagged over 5%; phases the median over runs; losses (and so
    the time to the none run's final loss) the first run's."""
    runner = FakeTrainer(RUNS)
    summary = validate_training(runner, None, str(tmp_path), cases=CASES, steps=4, repeats=3)
    assert runner.asked == [("none", 4), ("naive:int8", 4)] * 3 and runner.restored == 1
    assert summary["repeats"] == 3 and summary["flagged"] == 1
    assert summary["noise_floor"] == pytest.approx((0.2 + 0.03) / 2)
    with open(tmp_path / "results_training.csv") as handle:
        got = {r["policy"]: r for r in csv.DictReader(handle)}
    none, int8 = got["none"], got["naive:int8"]
    assert float(none["measured_step_s"]) == pytest.approx(0.52) and float(none["spread"]) == pytest.approx(0.2)
    assert [float(v) for v in none["measured_step_all_s"].split(";")] == [0.50, 0.60, 0.52]
    assert none["repeats"] == "3" and float(int8["spread"]) == pytest.approx(0.03)
    assert float(none["measured_dp_comm_exposed_s"]) == pytest.approx(0.32)
    assert float(int8["measured_speedup"]) == pytest.approx(0.52 / 0.405)
    assert float(none["val_loss"]) == 3.2 and float(int8["time_to_target_s"]) == pytest.approx(4 * 0.405)
    report = (tmp_path / "report.md").read_text()
    assert "noise floor 11.5%" in report and "1/2 spread over 5%" in report
    assert "| 20.0% * |" in report and "| 3.0% |" in report
    assert "noise floor 11.5%" in summary_lines(summary)[0] and "MAPE" in summary_lines(summary)[0]
    with pytest.raises(InputError, match="repeats"):
        validate_training(FakeTrainer(RUNS), None, str(tmp_path / "x"), cases=CASES, repeats=21)
    assert not (tmp_path / "x").exists()


def test_an_old_stored_run_without_repeats_is_predicted_again(tmp_path):
    """A results_training.csv written before repeats (and before the ep and cp phases): one run
    each, spread unknown, said so."""
    rows = [row(c, _predicted(0.5, 0.3), [_records(0.55, 0.35, LOSSES)]) for c in CASES]
    add_speedups(rows)
    write_outputs(str(tmp_path), rows, summarize(rows))
    with open(tmp_path / "results_training.csv") as handle:
        stored = list(csv.DictReader(handle))
    with open(tmp_path / "old.csv", "w", newline="") as handle:
        fields = [f for f in stored[0] if f not in REPEAT_FIELDS and not f.endswith(("ep_comm_s", "cp_comm_s"))]
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(stored)
    summary = repredict(str(tmp_path / "old.csv"), None, str(tmp_path / "again"))
    assert summary["repeats"] == 1 and math.isnan(summary["noise_floor"]) and summary["flagged"] == 0
    assert "noise floor unknown" in (tmp_path / "again" / "report.md").read_text()
    with open(tmp_path / "again" / "results_training.csv") as handle:
        again = list(csv.DictReader(handle))
    assert [(r["repeats"], r["spread"], r["measured_step_all_s"]) for r in again] == [("1", "", "0.55")] * 2


def test_expert_and_context_parallel_plans_run_only_where_named():
    """ep2xdp4 (gpt-tiny-moe, ep carved from dp) and cp2xdp2 on 4 hosts: not in the grid unless
    --plans names them; their configs are what realrun train --ep / --cp runs; the CSV's plan
    text reads back."""
    from realrun.validate_training import _plan_of, extra_plans, plan_name

    assert [plan_name(*p) for p in extra_plans(4)] == ["ep2xdp4", "cp2xdp2"] and extra_plans(3) == []
    assert all(c.ep == c.cp == 1 for c in grid(4, quick=False))
    both = grid(4, quick=True, plan_names=["ep2xdp4", "cp2xdp2"], policies=["naive:int8"])
    assert [(c.name, c.policy) for c in both] == [("ep2xdp4", "none"), ("ep2xdp4", "naive:int8"),
                                                  ("cp2xdp2", "none"), ("cp2xdp2", "naive:int8")]
    ep, cp = (c.config(5) for c in both[::2])
    assert (ep.model, ep.ep, ep.dp, ep.world, ep.microbatches) == ("gpt-tiny-moe", 2, 4, 4, 2)
    assert (cp.model, cp.cp, cp.dp, cp.world, cp.plan().cp, cp.global_batch) == ("gpt-tiny", 2, 2, 4, 2, 16)
    for c in both + grid(4, quick=True):
        assert _plan_of(c.plan) == (c.degrees, c.zero)
    assert both[2].plan == "tp1-pp1-dp2-cp2" and both[0].plan == "tp1-pp1-dp4-ep2"
    with pytest.raises(InputError, match="plans='ep2xdp2'.*ep2xdp4, cp2xdp2"):
        grid(4, quick=True, plan_names=["ep2xdp2"])


def test_perfmodel_predicts_the_all_to_alls_and_the_ring_and_rows_compare_them():
    """The prediction side without a cluster: perfmodel's ep and cp phases of the run's own plan
    (nonzero only where the plan has the axis), against the records' ep_comm_s and cp_comm_s,
    their kernels in the compression phase."""
    from realrun.validate_training import predict

    cases = grid(4, quick=True, plan_names=["dp4", "ep2xdp4", "cp2xdp2"], policies=["none"])
    got = {c.name: predicted_phases(predict(c, StoredCluster(), None, 5)) for c in cases}
    assert got["ep2xdp4"]["ep_comm_s"] > 0 and got["ep2xdp4"]["cp_comm_s"] == 0
    assert got["cp2xdp2"]["cp_comm_s"] > 0 and got["cp2xdp2"]["ep_comm_s"] == 0
    assert got["dp4"]["ep_comm_s"] == got["dp4"]["cp_comm_s"] == 0
    # the trainer's compression_s holds every axis's kernels
    records = [dict(r, cp_comm_s=0.07, cp_kernel_s=0.01, compression_s=0.01) for r in _records(0.5, 0.3, LOSSES)]
    r = row(cases[2], _predicted(0.5, 0.3), [records])
    assert r["measured_cp_comm_s"] == pytest.approx(0.07) and r["measured_compression_s"] == pytest.approx(0.01)
    assert r["measured_ep_comm_s"] == 0 and r["predicted_cp_comm_s"] == 0   # _predicted's breakdown has none


def test_the_step_picture_draws_each_cases_runs_as_error_bars(tmp_path, error_bars):
    from realrun.validate_training import plot_steps

    drawn = error_bars
    rows = [row(CASES[0], _predicted(0.5, 0.3), [_records(t, 0.3, LOSSES) for t in (0.5, 0.6, 0.52)])]
    plot_steps(rows, str(tmp_path / "p.png"))
    (x, (lo, hi)), = drawn
    assert x == [pytest.approx(0.52)] and lo[0] == pytest.approx(0.02) and hi[0] == pytest.approx(0.08)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plans_and_policies_narrow_the_grid():
    """Eight hosts: dp8 and tp2xpp2xdp2 alone; --policies replace the grid's, none kept."""
    from realrun.validate_training import plan_name

    eight = grid(8, quick=False, plan_names=["dp8", "tp2xpp2xdp2"])
    assert {plan_name(c.degrees, c.zero) for c in eight} == {"dp8", "tp2xpp2xdp2"}
    assert len(eight) == 2 * 2 * 7
    assert [plan_name(*p) for p in plans(4)] == ["dp4", "tp2xdp2", "pp2xdp2", "tp2xpp2", "dp4xzero1"]
    only = grid(4, quick=True, policies=["zeropp"])
    assert {c.policy for c in only} == {"none", "zeropp"} and len(only) == 2 * 5
    with pytest.raises(InputError, match="plans='dp8'.*dp4, tp2xdp2"):
        grid(4, quick=False, plan_names=["dp8"])


def test_plan_and_policy_filters_are_refused_in_one_line(cli, tmp_path):
    for args, field in ((("--plans", "dp4"), "only with --training"), (("--training", "--policies", "dp=int9"),
                                                                       "compressor='int9'")):
        proc = cli("realrun", "validate", *args, "--out", str(tmp_path / "v"))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and field in proc.stderr, proc.stderr
        assert not (tmp_path / "v").exists()


def _plan_name_before(tp, pp, dp, zero, ep=1, cp=1) -> str:
    """plan_name as it was written before the cases held a Degrees record (the labels' oracle)."""
    parts = [f"{axis}{n}" for axis, n in (("tp", tp), ("cp", cp), ("ep", ep), ("pp", pp), ("dp", dp))
             if n > 1] or ["dp1"]
    return "x".join(parts + ([f"zero{zero}"] if zero else []))


def _plan_before(tp, pp, dp, zero, ep=1, cp=1) -> str:
    return (f"tp{tp}-pp{pp}-dp{dp}" + (f"-ep{ep}" if ep > 1 else "") + (f"-cp{cp}" if cp > 1 else "")
            + (f"-zero{zero}" if zero else ""))


@pytest.mark.parametrize("hosts", [2, 4, 8])
def test_the_grids_labels_are_unchanged(hosts):
    """Every case of the grid and of the extra plans keeps its name (--plans) and its plan text
    (results files), as they were written before the degrees record; the text reads back."""
    from realrun.validate_training import _plan_of, extra_plans, plan_name

    extra = [plan_name(*p) for p in extra_plans(hosts)]
    for c in grid(hosts, quick=False) + grid(hosts, quick=True, plan_names=extra or None):
        layout = (c.tp, c.pp, c.dp, c.zero, c.ep, c.cp)
        assert c.name == _plan_name_before(*layout) and c.plan == _plan_before(*layout)
        assert _plan_of(c.plan) == (c.degrees, c.zero)
    if hosts == 4:
        assert {c.name: c.plan for c in grid(4, quick=True, plan_names=["dp4", "tp2xdp2", "pp2xdp2", "tp2xpp2",
                                                                        "dp4xzero1", "ep2xdp4", "cp2xdp2"])} == {
            "dp4": "tp1-pp1-dp4", "tp2xdp2": "tp2-pp1-dp2", "pp2xdp2": "tp1-pp2-dp2", "tp2xpp2": "tp2-pp2-dp1",
            "dp4xzero1": "tp1-pp1-dp4-zero1", "ep2xdp4": "tp1-pp1-dp4-ep2", "cp2xdp2": "tp1-pp1-dp2-cp2"}


def test_step_records_under_the_older_phase_names_give_the_same_row():
    """Records realrun train wrote before its phases took perfmodel's names (dp_comm_s, compress_s,
    no compute_s) give the row today's records give."""
    for case in CASES:
        new = row(case, _predicted(0.5, 0.3), [_records(0.55, 0.35, LOSSES)])
        old = row(case, _predicted(0.5, 0.3), [_old_records(0.55, 0.35, LOSSES)])
        assert old.keys() == new.keys() and new[f"measured_{COMPARED_PHASES[0]}"] == pytest.approx(0.15)
        for key, value in new.items():
            assert old[key] == (pytest.approx(value, nan_ok=True) if isinstance(value, float) else value), key


def test_a_results_file_under_the_older_phase_names_is_predicted_again(tmp_path):
    """A results_training.csv from before the phases took perfmodel's names (measured_dp_comm_s,
    predicted_dp_comm_s) and before the ep and cp columns: read under today's names."""
    rows = [row(c, _predicted(0.5, 0.3), [_records(0.55, 0.35, LOSSES)]) for c in CASES]
    add_speedups(rows)
    write_outputs(str(tmp_path), rows, summarize(rows))
    with open(tmp_path / "results_training.csv") as handle:
        stored = list(csv.DictReader(handle))
    rename = {f"{side}_dp_comm_exposed_s": f"{side}_dp_comm_s" for side in ("predicted", "measured")}
    old = [{rename.get(k, k): v for k, v in r.items() if not k.endswith(("ep_comm_s", "cp_comm_s"))} for r in stored]
    with open(tmp_path / "old.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(old[0]))
        writer.writeheader()
        writer.writerows(old)
    assert "measured_dp_comm_s" in old[0] and "measured_dp_comm_exposed_s" not in old[0]
    repredict(str(tmp_path / "old.csv"), None, str(tmp_path / "again"))
    with open(tmp_path / "again" / "results_training.csv") as handle:
        again = list(csv.DictReader(handle))
    assert [float(r["measured_dp_comm_exposed_s"]) for r in again] == [float(r["measured_dp_comm_exposed_s"])
                                                                       for r in stored]
    assert all(float(r["measured_ep_comm_s"]) == 0.0 for r in again)
