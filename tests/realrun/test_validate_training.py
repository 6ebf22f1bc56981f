"""realrun validate --training: its grid and arithmetic on synthetic runs, and a small
end-to-end run on an emulated cluster (netns)."""
import csv
import math
import os
import shutil
from types import SimpleNamespace

import pytest

pytest.importorskip("torch", reason="torch is not installed (the real extra)")

from realrun.validate_training import (PHASES, REPEAT_FIELDS, StoredCluster, TrainCase, add_speedups,  # noqa: E402
                                       grid, plans, predicted_phases, repredict, row, summarize, summary_lines,
                                       validate_training, write_outputs)
from topologies import InputError  # noqa: E402

HAVE_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
BREAKDOWN = dict(compute_s=0.2, tp_comm_s=0.0, pp_comm_s=0.0, dp_comm_exposed_s=0.3, compression_s=0.0,
                 bubble_s=0.0, optimizer_s=0.01, overlap_slowdown_s=0.0)


def _records(step_s: float, dp_s: float, losses) -> list[dict]:
    base = dict(forward_s=0.05, backward_s=0.1, tp_comm_s=0.0, pp_comm_s=0.0, dp_comm_s=dp_s, compress_s=0.0,
                optimizer_s=0.01, tp_kernel_s=0.0, pp_kernel_s=0.0, dp_kernel_s=0.0, zero_kernel_s=0.0,
                dp_rel_error=None, tp_rel_error=None, pp_rel_error=None)
    return [dict(base, step=i, step_s=step_s, loss=loss, val_loss=(loss if i == len(losses) - 1 else None))
            for i, loss in enumerate(losses)]


def _predicted(step_s: float, dp_s: float):
    return SimpleNamespace(step_time_s=step_s, breakdown=dict(BREAKDOWN, dp_comm_exposed_s=dp_s),
                           error_estimate={"dp": 0.01}, kernel_s={})


def test_the_grid_covers_the_targets():
    assert plans(4) == [(1, 1, 4, 0), (2, 1, 2, 0), (1, 2, 2, 0), (2, 2, 1, 0), (1, 1, 4, 1)]
    assert plans(2) == [(1, 1, 2, 0), (2, 1, 1, 0), (1, 2, 1, 0), (1, 1, 2, 1)]
    full = grid(4, quick=False)
    assert len(full) >= 40 and {c.bandwidth for c in full} == {10**8, 10**9}
    assert {"none", "naive:fp16", "naive:int8", "dp=ef(topk(0.01))+int8", "hybrid"} <= {c.policy for c in full}
    assert len(grid(4, quick=True)) >= 20
    cfg = full[0].config(5)
    assert cfg.world == 4 and cfg.microbatches == 2 and not cfg.plan().dp_overlap


def test_rows_speedups_and_summary(tmp_path):
    none = TrainCase(1, 1, 4, 0, "none", 10**8)
    int8 = TrainCase(1, 1, 4, 0, "naive:int8", 10**8)
    rows = [row(none, _predicted(0.5, 0.3), [_records(0.55, 0.35, [5.0, 4.0, 3.5, 3.2])]),
            row(int8, _predicted(0.3, 0.1), [_records(0.4, 0.2, [5.0, 4.1, 3.4, 3.3])])]
    add_speedups(rows)
    r = rows[1]
    assert r["predicted_speedup"] == pytest.approx(0.5 / 0.3) and r["measured_speedup"] == pytest.approx(0.55 / 0.4)
    assert r["time_to_target_s"] is None and rows[0]["time_to_target_s"] == pytest.approx(4 * 0.55)
    assert r["measured_dp_comm_s"] == pytest.approx(0.2) and r["predicted_dp_comm_s"] == pytest.approx(0.1)
    s = summarize(rows)
    assert s["cases"] == 2 and s["sign_agree"] == s["sign_total"] == 1 and s["fastest_agree"] == 1
    assert s["mape"] == pytest.approx((0.05 / 0.55 + 0.1 / 0.4) / 2)
    assert any("MAPE" in line for line in summary_lines(s))
    write_outputs(str(tmp_path), rows, s)
    with open(tmp_path / "results_training.csv") as handle:
        got = list(csv.DictReader(handle))
    assert len(got) == 2 and set(f"measured_{p}" for p in PHASES) <= set(got[0])
    assert "| tp1-pp1-dp4 | `naive:int8` | 100 |" in (tmp_path / "report.md").read_text()
    for name in ("step_predicted_vs_measured.png", "loss_curves.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_kernels_go_to_the_phase_that_times_them():
    """The trainer times dp and ZeRO kernels inside its reduction, tp and pp kernels apart."""
    p = SimpleNamespace(step_time_s=1.0, breakdown=dict(BREAKDOWN, compression_s=0.05, dp_comm_exposed_s=0.1),
                        error_estimate={}, kernel_s={"dp": {"critical_s": 0.02, "beside_compute_s": 0.0},
                                                     "tp": {"critical_s": 0.03, "beside_compute_s": 0.0}})
    got = predicted_phases(p)
    assert got["dp_comm_s"] == pytest.approx(0.12) and got["compression_s"] == pytest.approx(0.03)


def test_a_stored_run_is_predicted_again_without_training(tmp_path, cli):
    """--measured: the stored measurements against today's model; the report and picture written,
    the stored time to target kept; a file that is not a results_training.csv is one error."""
    none = TrainCase(1, 1, 2, 0, "none", 10**8)
    int8 = TrainCase(1, 1, 2, 0, "naive:int8", 10**8)
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
        cases = [TrainCase(1, 1, 2, 0, p, 2 * 10**8) for p in ("none", "naive:int8")]
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
CASES = [TrainCase(1, 1, 4, 0, "none", 10**8), TrainCase(1, 1, 4, 0, "naive:int8", 10**8)]


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
    assert float(none["measured_dp_comm_s"]) == pytest.approx(0.32)
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
    """A results_training.csv written before repeats: one run each, spread unknown, said so."""
    rows = [row(c, _predicted(0.5, 0.3), [_records(0.55, 0.35, LOSSES)]) for c in CASES]
    add_speedups(rows)
    write_outputs(str(tmp_path), rows, summarize(rows))
    with open(tmp_path / "results_training.csv") as handle:
        stored = list(csv.DictReader(handle))
    with open(tmp_path / "old.csv", "w", newline="") as handle:
        fields = [f for f in stored[0] if f not in REPEAT_FIELDS]
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(stored)
    summary = repredict(str(tmp_path / "old.csv"), None, str(tmp_path / "again"))
    assert summary["repeats"] == 1 and math.isnan(summary["noise_floor"]) and summary["flagged"] == 0
    assert "noise floor unknown" in (tmp_path / "again" / "report.md").read_text()
    with open(tmp_path / "again" / "results_training.csv") as handle:
        again = list(csv.DictReader(handle))
    assert [(r["repeats"], r["spread"], r["measured_step_all_s"]) for r in again] == [("1", "", "0.55")] * 2


def test_the_step_picture_draws_each_cases_runs_as_error_bars(tmp_path, error_bars):
    from realrun.validate_training import plot_steps

    drawn = error_bars
    rows = [row(CASES[0], _predicted(0.5, 0.3), [_records(t, 0.3, LOSSES) for t in (0.5, 0.6, 0.52)])]
    plot_steps(rows, str(tmp_path / "p.png"))
    (x, (lo, hi)), = drawn
    assert x == [pytest.approx(0.52)] and lo[0] == pytest.approx(0.02) and hi[0] == pytest.approx(0.08)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
