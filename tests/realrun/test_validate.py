"""realrun validate: its arithmetic on synthetic rows, and a small end-to-end run (netns)."""
import csv
import os
import shutil

import pytest

from realrun.validate import MIB, Case, crossover, grid, summarize, summary_lines, write_outputs

HAVE_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _row(compressor, algorithm, predicted, measured, size=2 * MIB, bandwidth=10**9, hosts=4):
    return dict(hosts=hosts, bandwidth=bandwidth, size_bytes=size, compressor=compressor, algorithm=algorithm,
                crossover=False, predicted_s=predicted, measured_s=measured, error=(predicted - measured) / measured)


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
    (tmp_path / "bad.csv").write_text("x\n1\n")
    proc = cli("realrun", "validate", "--measured", str(tmp_path / "bad.csv"), "--out", str(tmp_path / "y"))
    assert proc.returncode == 2 and "measured" in proc.stderr and "Traceback" not in proc.stderr
