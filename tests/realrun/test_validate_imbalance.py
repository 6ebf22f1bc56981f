"""realrun validate --training's routing-imbalance case (ep2xdpNxdropless): its name and plan text,
its two predictions (balanced, and with the histogram its first run writes), the results columns
and report that show them, re-prediction from a stored run; and the case end to end on two
emulated hosts (netns)."""
import csv
import json
import math
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (the real extra)")

from perfmodel.plan.degrees import Degrees  # noqa: E402
from realrun.train.report import WARMUP_STEPS  # noqa: E402
from realrun.validate_training import (DROPLESS_MOE_MODEL, EP_PHASE, ROUTING_FIELDS, StoredCluster,  # noqa: E402
                                       TrainCase, _case_of, first_prediction, grid, histogram_name, imbalance,
                                       imbalance_plans, plan_name, predict, predicted_phases, repredict,
                                       summary_lines, validate_training)
from topologies import InputError  # noqa: E402

HAVE_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
MBIT = 10**6
SKEWED = [[100, 300, 1500, 2100], [400, 600, 1800, 1200]]   # the experts of ep rank 1 take most copies
EVEN = [[1000, 1000, 1000, 1000], [1000, 1000, 1000, 1000]]


def _case(policy: str = "none", dp: int = 4, bandwidth: int = 100 * MBIT) -> TrainCase:
    return TrainCase(Degrees(dp=dp, ep=2), 0, policy, bandwidth, dropless=True)


def _histogram(path, counts) -> str:
    path.write_text(json.dumps({"tokens_per_expert": counts, "model": DROPLESS_MOE_MODEL, "note": "test"}) + "\n")
    return str(path)


def test_the_case_is_named_and_read_back_and_runs_dropless():
    """ep2xdp4xdropless only where --plans names it; plan text tp1-pp1-dp4-ep2-dropless reads back;
    the dropless MoE model; a dense plan cannot be one; its run writes a histogram over the steps
    its times are medians of."""
    assert [plan_name(*p, dropless=True) for p in imbalance_plans(4)] == ["ep2xdp4xdropless"]
    assert imbalance_plans(3) == [] and not any(c.dropless for c in grid(4, quick=False))
    cases = grid(4, quick=True, plan_names=["ep2xdp4xdropless", "ep2xdp4"], policies=["naive:int8"])
    assert [(c.name, c.policy, c.dropless) for c in cases] == [
        ("ep2xdp4", "none", False), ("ep2xdp4", "naive:int8", False),
        ("ep2xdp4xdropless", "none", True), ("ep2xdp4xdropless", "naive:int8", True)]
    case = cases[2]
    assert case.plan == "tp1-pp1-dp4-ep2-dropless" and _case_of(case.plan, case.policy, case.bandwidth) == case
    assert _case_of(cases[0].plan, "none", case.bandwidth) == cases[0]
    cfg = case.config(7, "/x/h.json")
    assert (cfg.model, cfg.ep, cfg.dp, cfg.routing_out, cfg.routing_steps) == (DROPLESS_MOE_MODEL, 2, 4, "/x/h.json",
                                                                               7 - WARMUP_STEPS)
    assert case.config(7).routing_out is None and cases[0].config(7).model == "gpt-tiny-moe"
    with pytest.raises(InputError, match="dropless"):
        TrainCase(Degrees(dp=4), 0, "none", 100 * MBIT, dropless=True)
    with pytest.raises(InputError, match="ep2xdp4xdropless"):
        grid(4, quick=True, plan_names=["ep2xdp2xdropless"])
    names = {histogram_name(_case(p)) for p in ("naive:int8", "naive=int8", "none")}
    assert len(names) == 3 and all(n.startswith("routing-tp1-pp1-dp4-ep2-dropless-100mbit-") for n in names)


def test_the_histogram_prediction_prices_the_measured_routing(tmp_path):
    """A skewed histogram slows the ep phase and the step against balanced routing; an even one
    gives the balanced prediction (the file is what the prediction reads)."""
    case, runner = _case(), StoredCluster()
    balanced = first_prediction(case, runner, None, 7)
    assert balanced.step_time_s == predict(case, runner, None, 7, routing="balanced").step_time_s
    skewed = predict(case, runner, None, 7, routing=_histogram(tmp_path / "skew.json", SKEWED))
    even = predict(case, runner, None, 7, routing=_histogram(tmp_path / "even.json", EVEN))
    ep = [predicted_phases(p)[EP_PHASE] for p in (balanced, skewed, even)]
    assert ep[1] > 1.2 * ep[0] > 0 and ep[2] == pytest.approx(ep[0])
    assert skewed.step_time_s > balanced.step_time_s and even.step_time_s == pytest.approx(balanced.step_time_s)
    expert, rank = imbalance(str(tmp_path / "skew.json"), 2)
    assert expert == pytest.approx((2100 / 1000 + 1800 / 1000) / 2)
    assert rank == pytest.approx((3600 / 2000 + 3000 / 2000) / 2)


def _records(step_s: float, ep_s: float, steps: int) -> list[dict]:
    base = dict(forward_s=0.05, backward_s=0.1, compute_s=0.15, tp_comm_s=0.0, pp_comm_s=0.0, ep_comm_s=ep_s,
                dp_comm_exposed_s=0.05, compression_s=0.0, optimizer_s=0.01, tp_kernel_s=0.0, pp_kernel_s=0.0,
                dp_kernel_s=0.0, zero_kernel_s=0.0, ep_kernel_s=0.0, dp_rel_error=None, tp_rel_error=None,
                pp_rel_error=None)
    return [dict(base, step=i, step_s=step_s, loss=5.0 - 0.1 * i, val_loss=None) for i in range(steps)]


class HistogramTrainer:
    """Four emulated hosts whose runs return fixed records and, where the run asks for one, write
    ``counts`` as its routing histogram (``write``: False, a run that writes none)."""

    emulated, hosts = True, 4

    def __init__(self, counts=SKEWED, write: bool = True):
        self.counts, self.write, self.asked = counts, write, []

    def topology(self, hosts=None, bandwidth=None):
        return StoredCluster().topology(hosts or self.hosts, bandwidth)

    def set_bandwidth(self, bits_per_s):
        pass

    def restore(self):
        pass

    def train(self, cfg):
        self.asked.append((cfg.model, cfg.policy, cfg.routing_out, cfg.routing_steps))
        if cfg.routing_out and self.write:
            _histogram(Path(cfg.routing_out), self.counts)
        return _records(0.9, 0.5, cfg.steps)


def _validated(tmp_path, runner=None, repeats=2):
    runner = runner or HistogramTrainer()
    cases = [TrainCase(Degrees(dp=4, ep=2), 0, "none", 100 * MBIT), _case()]
    out = tmp_path / "out"
    return runner, out, validate_training(runner, None, str(out), cases=cases, steps=7, repeats=repeats)


def test_the_case_is_predicted_with_its_first_runs_histogram_and_balanced(tmp_path):
    """Only the dropless case's first run writes a histogram (into the output folder); its row's
    prediction is the one with that file, the balanced one beside it; the CSV names the routing of
    every row; the report and the summary show measured, histogram and balanced step and ep phase."""
    runner, out, summary = _validated(tmp_path)
    name = histogram_name(_case())
    path = os.path.abspath(out / name)
    assert [a[2:] for a in runner.asked] == [(None, 0), (path, 7 - WARMUP_STEPS), (None, 0), (None, 0)]
    assert runner.asked[1][0] == DROPLESS_MOE_MODEL
    rows = list(csv.DictReader((out / "results_training.csv").read_text().splitlines()))
    assert set(ROUTING_FIELDS) <= set(rows[0])
    padded, dropless = rows
    assert (padded["routing"], padded["predicted_balanced_step_s"]) == ("capacity:1.25", "")
    assert dropless["plan"] == "tp1-pp1-dp4-ep2-dropless" and dropless["routing"] == name
    case, stored = _case(), StoredCluster()
    with_histogram = predict(case, stored, None, 7, routing=str(out / name))
    balanced = predict(case, stored, None, 7, routing="balanced")
    assert float(dropless["predicted_step_s"]) == pytest.approx(with_histogram.step_time_s)
    assert float(dropless["predicted_balanced_step_s"]) == pytest.approx(balanced.step_time_s)
    assert float(dropless[f"predicted_{EP_PHASE}"]) > float(dropless[f"predicted_balanced_{EP_PHASE}"]) > 0
    assert float(dropless[f"measured_{EP_PHASE}"]) == pytest.approx(0.5)
    assert float(dropless["error"]) == pytest.approx(with_histogram.step_time_s / 0.9 - 1)
    assert float(dropless["routing_expert_max_mean"]) == pytest.approx(1.95)
    assert [r["plan"] for r in summary["imbalance"]] == ["tp1-pp1-dp4-ep2-dropless"]
    line = [x for x in summary_lines(summary) if x.startswith("routing imbalance")]
    assert len(line) == 1 and name in line[0] and "balanced" in line[0] and "with the histogram" in line[0]
    report = (out / "report.md").read_text()
    assert "## Routing imbalance" in report and name in report


def test_a_run_that_writes_no_histogram_is_one_line(tmp_path):
    """Not even an earlier validation's file in the folder stands in for the run's histogram."""
    (tmp_path / "out").mkdir()
    _histogram(tmp_path / "out" / histogram_name(_case()), EVEN)
    with pytest.raises(InputError, match="routing.*did not write"):
        _validated(tmp_path, HistogramTrainer(write=False), repeats=1)


def test_a_stored_plan_text_that_is_no_case_is_one_line():
    with pytest.raises(InputError, match="dropless"):
        _case_of("tp1-pp1-dp4-dropless", "none", 100 * MBIT)   # no expert parallelism
    with pytest.raises(InputError, match=r"plan='tp1-pp1-dpX-dropless'.*\[-dropless\]"):
        _case_of("tp1-pp1-dpX-dropless", "none", 100 * MBIT)


def test_a_stored_case_is_predicted_again_with_its_histogram(tmp_path, cli):
    """--measured reads the histogram the row names beside the stored file, gives the same
    predictions and copies it beside its own results; a missing one is one line naming the cell."""
    _, out, first = _validated(tmp_path, repeats=1)
    again = repredict(str(out / "results_training.csv"), None, str(tmp_path / "again"))
    name = histogram_name(_case())
    assert (tmp_path / "again" / name).read_text() == (out / name).read_text()
    keys = ("predicted_step_s", "predicted_balanced_step_s", f"predicted_{EP_PHASE}", "routing")
    assert [{k: r[k] for k in keys} for r in again["imbalance"]] == [{k: r[k] for k in keys}
                                                                     for r in first["imbalance"]]
    again_twice = repredict(str(tmp_path / "again" / "results_training.csv"), None, str(tmp_path / "again"))
    assert again_twice["imbalance"][0]["predicted_step_s"] == first["imbalance"][0]["predicted_step_s"]
    (out / name).unlink()
    with pytest.raises(InputError, match=r"results_training.csv:3.routing"):
        repredict(str(out / "results_training.csv"), None, str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    proc = cli("realrun", "validate", "--training", "--measured", str(out / "results_training.csv"), "--out",
               str(tmp_path / "y"))
    assert proc.returncode == 2 and "routing" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.netns
@pytest.mark.skipif(not HAVE_NETNS, reason="needs root and iproute2 (ip, tc)")
def test_the_imbalance_case_end_to_end(tmp_path, monkeypatch):
    """Two emulated hosts, ep2xdp2xdropless, four steps: the run writes its histogram (the router's
    copies of the steps after warm-up), the case's prediction is the one with that file, finite,
    beside the balanced one; the namespaces are gone afterwards, even on failure."""
    from realrun.cluster import EmulatedSpec, down, emulated, up
    from realrun.measure import EmulatedRunner

    monkeypatch.setattr(emulated, "STATE_DIR", str(tmp_path / "state"))
    name = f"i{os.getpid() % 100000}"
    case, steps, out = _case(dp=2, bandwidth=10**9), 4, tmp_path / "out"
    try:
        up(EmulatedSpec(hosts=2, bandwidth="1gbit"), name)
        runner = EmulatedRunner(name)
        summary = validate_training(runner, None, str(out), cases=[case], steps=steps, repeats=1)
    finally:
        down(name)
        assert emulated.netns.ours(name) == []
    histogram = out / histogram_name(case)
    counts = json.loads(histogram.read_text())["tokens_per_expert"]
    cfg = case.config(steps)
    copies = (steps - WARMUP_STEPS) * cfg.global_batch * cfg.seq_len * 2   # top-2
    assert len(counts) == 2 and all(sum(layer) == copies for layer in counts)
    r, = summary["imbalance"]
    assert r["routing"] == histogram.name and r["routing_rank_max_mean"] >= 1.0
    expected = predict(case, runner, None, steps, routing=str(histogram))
    assert r["predicted_step_s"] == pytest.approx(expected.step_time_s)
    assert math.isfinite(r["predicted_step_s"]) and r["predicted_step_s"] > 0
    assert math.isfinite(r["predicted_balanced_step_s"]) and r[f"measured_{EP_PHASE}"] > 0
