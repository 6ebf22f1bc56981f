"""realrun validate: its arithmetic on synthetic rows, repeats on a fake runner, and a small
end-to-end run (netns)."""
import csv
import math
import os
import shutil

import pytest

from realrun.report import repeated
from realrun.validate import MIB, Case, crossover, grid, measure, summarize, summary_lines, validate, write_outputs
from realrun.validate_training import StoredCluster
from topologies import InputError

HAVE_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _row(compressor, algorithm, predicted, measured, size=2 * MIB, bandwidth=10**9, hosts=4):
    return dict(hosts=hosts, bandwidth=bandwidth, size_bytes=size, compressor=compressor, algorithm=algorithm,
                crossover=False, predicted_s=predicted, **repeated([measured]), error=(predicted - measured) / measured)


class FakeRunner:
    """An emulated cluster of 4 hosts that answers each timed block with the next of its case's
    scripted times (the repeats), and keeps what it was asked."""

    emulated, hosts, rank = True, 4, 0

    def __init__(self, times: dict):
        self.times = {k: list(v) for k, v in times.items()}
        self.configs, self.bandwidths, self.restored = [], [], 0

    def topology(self, hosts=None, bandwidth=None):
        return StoredCluster().topology(hosts or self.hosts, bandwidth)

    def set_bandwidth(self, bits_per_s):
        self.bandwidths.append(bits_per_s)

    def restore(self):
        self.restored += 1

    def collectives(self, config, hosts=None):
        self.configs.append(config)
        op = () if config.op == "allreduce" else (config.op,)
        return [{"time_s": self.times[(*op, c.size_bytes, c.compressor, c.algorithm)].pop(0)} for c in config.cases]


CASES = [Case(4, 10**9, 2 * MIB, "none", "auto"), Case(4, 10**9, 2 * MIB, "int8", "two_phase"),
         Case(4, 10**9, 8 * MIB, "none", "auto")]
TIMES = {(2 * MIB, "none", "auto"): [0.10, 0.1025, 0.098],           # spread 0.1025/0.098 - 1 = 4.6%
         (2 * MIB, "int8", "two_phase"): [0.05, 0.06, 0.052],        # 20%: flagged; median, not mean
         (8 * MIB, "none", "auto"): [0.4, 0.4, 0.4]}                 # 0%


def test_crossover_interpolates_in_log_bandwidth():
    assert crossover([1e8, 1e9], [4.0, 0.25]) == pytest.approx(10 ** 8.5, rel=1e-6)
    assert crossover([1e8, 1e9, 1e10], [3.0, 2.0, 1.5]) is None


def test_summary_counts_mape_worst_and_fastest_agreement(tmp_path):
    rows = [_row("none", "auto", 1.0, 1.0), _row("int8", "two_phase", 0.5, 0.4), _row("int8", "ring", 0.45, 0.6),
            _row("none", "auto", 2.0, 2.2, size=8 * MIB), _row("int8", "ring", 1.0, 1.0, size=8 * MIB),
            _row("none", "auto", 0.001, 0.1, size=MIB // 2)]   # below 1 MiB: not counted
    s = summarize(rows, {"predicted": 2e9, "measured": 1e9})
    assert s["cases"] == 5 and s["fastest_total"] == 2
    assert s["fastest_agree"] == 2   # int8 fastest both ways (best algorithm per compressor)
    assert abs(s["worst"]["error"]) == pytest.approx(0.25)
    assert s["mape"] == pytest.approx((0 + 0.25 + 0.25 + 2 / 22 + 0) / 5)
    assert s["crossover_ratio"] == pytest.approx(2.0)
    lines = summary_lines(s)
    assert any("MAPE" in line for line in lines) and any("factor 2.00" in line for line in lines)
    write_outputs(str(tmp_path), rows, s)
    with open(tmp_path / "results.csv") as handle:
        assert len(list(csv.DictReader(handle))) == len(rows)
    assert "| 4 | 1gbit | 2MiB | `int8` | ring |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "predicted_vs_measured.png").read_bytes()[:4] == b"\x89PNG"


def test_the_grid_covers_the_targets():
    cases = grid(4, quick=True)
    assert {c.bandwidth for c in cases} == {10**8, 10**9}
    assert len({c.compressor for c in cases}) >= 5 and len({c.algorithm for c in cases} - {"auto"}) >= 3
    assert all(c.size_bytes >= MIB for c in cases) and len(grid(4, quick=False)) >= 40
    for quick, specs in ((True, {"none", "fp8", "int8"}), (False, {"none", "fp16", "fp8", "int8"})):   # the all-to-all
        a2a = [c for c in grid(4, quick=quick) if c.op == "alltoall"]
        assert {c.compressor for c in a2a} == specs and {c.algorithm for c in a2a} == {"auto"}
        assert {(c.hosts, c.bandwidth, c.size_bytes) for c in a2a} == {
            (c.hosts, c.bandwidth, c.size_bytes) for c in grid(4, quick=quick) if c.op == "allreduce"}


def test_the_all_to_all_is_predicted_measured_and_reported_beside_the_all_reduces(tmp_path):
    """Its own launch (BenchConfig op alltoall), rows marked with their op, MAPE per op; its
    uncompressed 8 MiB case does not enter the all-reduce's int8 crossover."""
    from realrun.validate import predict, repredict

    a2a = [Case(4, 10**9, 8 * MIB, "none", "auto", "alltoall"), Case(4, 10**9, 8 * MIB, "int8", "auto", "alltoall")]
    runner = FakeRunner(TIMES)
    for c in a2a:   # measured 10% slower than the model says
        runner.times[("alltoall", c.size_bytes, c.compressor, c.algorithm)] = [1.1 * predict(c, runner, None)]
    summary = validate(runner, None, str(tmp_path), cases=CASES + a2a, repeats=1)
    assert [c.op for c in runner.configs] == ["allreduce", "alltoall"]
    assert [(c.compressor, c.algorithm) for c in runner.configs[1].cases] == [("none", "auto"), ("int8", "auto")]
    assert summary["by_op"]["alltoall"] == {"cases": 2, "mape": pytest.approx(1 / 11)}
    assert summary["by_op"]["allreduce"]["cases"] == 3 and summary["cases"] == 5
    assert "direct" in summary["algorithms"] and summary["fastest_total"] == 3   # (4, 1gbit, 8MiB) twice: per op
    assert any(line.startswith("MAPE by op: allreduce") and "alltoall 9.1% (2 cases)" in line
               for line in summary_lines(summary))
    with open(tmp_path / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["op"] for r in rows] == ["allreduce"] * 3 + ["alltoall"] * 2
    assert "| alltoall | 4 | 1gbit | 8MiB | `int8` | auto |" in (tmp_path / "report.md").read_text()
    again = repredict(str(tmp_path / "results.csv"), None, str(tmp_path / "again"))
    assert again["by_op"] == summary["by_op"]

@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_NETNS, reason="needs root and iproute2 (ip, tc)")
def test_a_small_validate_end_to_end(tmp_path, monkeypatch):
    from realrun.calibrate import calibrate
    from realrun.cluster import EmulatedSpec, down, emulated, up
    from realrun.measure import EmulatedRunner
    from realrun.validate import validate

    monkeypatch.setattr(emulated, "STATE_DIR", str(tmp_path / "state"))
    name = f"v{os.getpid() % 100000}"
    try:
        up(EmulatedSpec(hosts=2, bandwidth="1gbit"), name)
        runner = EmulatedRunner(name)
        monkeypatch.setattr("realrun.calibrate.BANDWIDTHS", (500 * 10**6,))
        monkeypatch.setattr("realrun.calibrate.KERNEL_SIZES", (2**20, 2**22))
        monkeypatch.setattr("realrun.calibrate.QUICK_SIZES", (2**16, 2**20, 2**22))
        profile, records = calibrate(runner, ["int8"], quick=True, iters=2)
        a2a = [r for r in records if r["kind"] == "collective" and r["op"] == "alltoall"]
        assert {r["compressor"] for r in a2a} == {"none"} and len(a2a) == 3   # the primitive timed itself
        assert "alltoall@pair" in profile["primitives"]["tcp"]   # 2 hosts: the pair's primitive
        path = tmp_path / "profile.json"
        import json

        path.write_text(json.dumps(profile))
        cases = [Case(2, 10**9, 2 * MIB, c, a) for c, a in (("none", "auto"), ("int8", "two_phase"),
                                                                ("int8", "ring"))]
        summary = validate(runner, str(path), str(tmp_path / "out"), iters=2, cases=cases)
        assert summary["cases"] == 3 and summary["mape"] < 1.0   # the same order of magnitude at least
        assert runner.spec.bandwidth == 10**9   # the cluster's own rate is restored
        for name_ in ("results.csv", "report.md", "predicted_vs_measured.png"):
            assert (tmp_path / "out" / name_).stat().st_size > 0
    finally:
        down(name)
        assert emulated.netns.ours(name) == []


def test_a_stored_collective_validation_is_predicted_again(tmp_path, cli):
    """--measured without --training: the stored cases and measurements against today's model,
    the three outputs written, no cluster needed; a foreign file is one error."""
    from realrun.validate import repredict

    rows = ["hosts,bandwidth,size_bytes,compressor,algorithm,crossover,predicted_s,measured_s,error"]
    for bw, scale in ((10**8, 1.0), (10**9, 0.12)):
        rows += [f"4,{bw},8388608,none,auto,False,0,{1.3 * scale},0",
                 f"4,{bw},8388608,int8,two_phase,False,0,{0.5 * scale + 0.05},0"]
    path = tmp_path / "results.csv"
    path.write_text("\n".join(rows) + "\n")
    summary = repredict(str(path), None, str(tmp_path / "again"))
    assert summary["cases"] == 4 and summary["fastest_total"] == 2
    assert summary["crossover"]["bandwidths"] == [10**8, 10**9]
    for name in ("results.csv", "report.md", "predicted_vs_measured.png"):
        assert (tmp_path / "again" / name).stat().st_size > 0
    # written before repeats were recorded: one repeat each, spread unknown, and the report says so
    assert summary["repeats"] == 1 and math.isnan(summary["noise_floor"]) and summary["flagged"] == 0
    assert "noise floor unknown" in (tmp_path / "again" / "report.md").read_text()
    with open(tmp_path / "again" / "results.csv") as handle:
        again = list(csv.DictReader(handle))
    assert {(r["repeats"], r["spread"]) for r in again} == {("1", "")}
    # a file with repeats keeps them: the same spreads and values after a second repredict
    twice = repredict(str(tmp_path / "again" / "results.csv"), None, str(tmp_path / "twice"))
    assert twice["repeats"] == 1
    runner = FakeRunner(TIMES)
    first = validate(runner, None, str(tmp_path / "fresh"), cases=CASES, repeats=3)
    stored = repredict(str(tmp_path / "fresh" / "results.csv"), None, str(tmp_path / "restored"))
    assert (stored["repeats"], stored["flagged"]) == (3, 1)
    assert stored["noise_floor"] == pytest.approx(first["noise_floor"])
    assert "| 20.0% * |" in (tmp_path / "restored" / "report.md").read_text()
    (tmp_path / "bad.csv").write_text("x\n1\n")
    proc = cli("realrun", "validate", "--measured", str(tmp_path / "bad.csv"), "--out", str(tmp_path / "y"))
    assert proc.returncode == 2 and "measured" in proc.stderr and "Traceback" not in proc.stderr


def test_every_case_is_measured_repeats_times_round_robin_in_one_launch(tmp_path):
    """R timed blocks per case, interleaved with the other cases' (one launch per (hosts,
    bandwidth)); the case is their median, its spread max/min - 1; over 5% is flagged, kept."""
    runner = FakeRunner(TIMES)
    summary = validate(runner, None, str(tmp_path), cases=CASES, repeats=3)
    assert len(runner.configs) == 1 and runner.restored == 1
    asked = [(c.size_bytes, c.compressor, c.algorithm) for c in runner.configs[0].cases]
    assert asked == [(c.size_bytes, c.compressor, c.algorithm) for c in CASES] * 3
    assert runner.configs[0].warmup == 1      # each block warms up on its own
    assert summary["repeats"] == 3 and summary["flagged"] == 1 and summary["noise_cases"] == 3
    assert summary["noise_floor"] == pytest.approx(0.1025 / 0.098 - 1)
    with open(tmp_path / "results.csv") as handle:
        got = {(int(r["size_bytes"]), r["compressor"]): r for r in csv.DictReader(handle)}
    none2, int8 = got[(2 * MIB, "none")], got[(2 * MIB, "int8")]
    assert float(none2["measured_s"]) == pytest.approx(0.10) and float(int8["measured_s"]) == pytest.approx(0.052)
    assert int8["repeats"] == "3" and float(int8["spread"]) == pytest.approx(0.2)
    assert [float(v) for v in int8["measured_all_s"].split(";")] == [0.05, 0.06, 0.052]
    assert float(int8["error"]) == pytest.approx(float(int8["predicted_s"]) / 0.052 - 1)
    report = (tmp_path / "report.md").read_text()
    assert "noise floor 4.6%" in report and "1/3 spread over 5%" in report
    assert "| 20.0% * |" in report and "| 4.6% |" in report and "| 0.0% |" in report
    assert any("noise floor 4.6%" in line and "MAPE" in line for line in summary_lines(summary))


def test_each_bandwidth_is_a_launch_of_its_own_and_one_repeat_has_no_spread():
    times = {(2 * MIB, "none", "auto"): [0.3, 0.1]}
    cases = [Case(4, 10**8, 2 * MIB, "none", "auto"), Case(4, 10**9, 2 * MIB, "none", "auto")]
    runner = FakeRunner(times)
    got = measure(cases + cases[:1], runner, iters=2, repeats=1)      # a case listed twice is measured once
    assert got == {cases[0]: [0.3], cases[1]: [0.1]} and runner.bandwidths == [10**8, 10**9]
    assert [len(c.cases) for c in runner.configs] == [1, 1] and runner.restored == 1
    r = repeated(got[cases[0]])
    assert r["repeats"] == 1 and math.isnan(r["spread"])    # unknown, not zero


def test_repeats_out_of_range_are_refused_before_anything_runs(tmp_path, cli):
    for bad in (0, 21, 2.0, True):
        with pytest.raises(InputError, match="repeats"):
            validate(FakeRunner(TIMES), None, str(tmp_path / "x"), cases=CASES, repeats=bad)
    assert not (tmp_path / "x").exists()
    for extra in ((), ("--training",)):
        proc = cli("realrun", "validate", *extra, "--repeats", "0", "--out", str(tmp_path / "y"))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "repeats=0" in proc.stderr
        assert "Traceback" not in proc.stderr and not (tmp_path / "y").exists()
    text = " ".join(cli("realrun", "validate", "--help").stdout.split())
    assert "--repeats R" in text and "spreads over 5% are starred in report.md (default 3)" in text


def test_the_picture_draws_each_cases_repeats_as_error_bars(tmp_path, error_bars):
    from realrun.report import plot

    drawn = error_bars
    rows = [dict(_row("int8", "ring", 0.5, 0.5), **repeated([0.4, 0.5, 0.7])),
            _row("none", "auto", 1.0, 1.0)]
    plot(rows, str(tmp_path / "p.png"))
    bars = {x[0]: (lo[0], hi[0]) for x, (lo, hi) in drawn}
    assert bars[0.5] == pytest.approx((0.1, 0.2)) and bars[1.0] == (0.0, 0.0)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
