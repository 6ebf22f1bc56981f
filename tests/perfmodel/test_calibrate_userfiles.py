"""perfmodel calibrate --from-file (nccl-tests stdout and -J JSON) and perfmodel check-step (training
logs): parsing, what a file lacked, one-line refusals (exit 2), and a fit that reproduces the file."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfmodel.calibration import userfiles as u
from perfmodel.calibration.fit import fit_profile
from topologies.errors import InputError

DATA = Path(__file__).parent / "data" / "userfiles"
TXT, JSN = DATA / "all_reduce_perf_8xh100.txt", DATA / "all_reduce_perf_8xh100.json"


def perfmodel(*args):
    code = "import sys; from perfmodel.cli import entry; sys.argv = ['perfmodel'] + sys.argv[1:]; entry()"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True)


def test_ranks_per_host_unlike_the_cluster_are_said(tmp_path):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text("".join(line.replace("node001", "node002") if any(f"Rank  {i} " in line for i in range(4, 8))
                            else line for line in TXT.read_text().splitlines(keepends=True)))
    got = u.read_nccl_tests(str(path), cluster="dgx-h100")
    assert got.about["hosts"] == 2 and any(line.startswith("placement: 8 ranks on 2 host(s)") for line in got.missing)


def test_stdout_and_json_give_the_same_records():
    txt, jsn = u.read_nccl_tests(str(TXT)), u.read_nccl_tests(str(JSN))
    assert txt.about["op"] == jsn.about["op"] == "allreduce"
    assert txt.about["world"] == jsn.about["world"] == 8 and txt.about["hosts"] == 1
    assert [r["size_bytes"] for r in txt.records] == [r["size_bytes"] for r in jsn.records]
    for a, b in zip(txt.records, jsn.records):
        assert a["time_s"] == pytest.approx(b["time_s"], rel=1e-3)   # the table rounds to 4 digits
        assert a["busbw_factor"] == 1.75 and a["compressor"] == "none"
    assert txt.missing == [] and jsn.missing == []


def test_what_the_file_lacks_is_said(tmp_path):
    lines = TXT.read_text().splitlines()
    cut = [line for line in lines if "Rank" not in line and "Collective test starting" not in line]
    rows = [line for line in cut if line.strip() and not line.startswith("#")]
    # one set of columns (nccl-tests' trace replay writes in-place only, util.cu writeBenchMarkLineNullBody);
    # one row with wrong elements
    cut = [" ".join(line.split()[:9]) if line in rows else line for line in cut]
    first = next(i for i, line in enumerate(cut) if line.strip() and not line.startswith("#"))
    cut[first] = cut[first].rsplit(" ", 1)[0] + " 3"
    cut.insert(first, "node001:41872:41872 [0] NCCL INFO Channel 00/24 :    0   1   2   3   4   5   6   7")
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text("\n".join(cut) + "\n")
    got = u.read_nccl_tests(str(path))
    said = "\n".join(got.missing)
    assert "no '#  Rank' lines" in said and "from the file name" in said and "out-of-place: not in the file" in said
    assert "3 wrong elements, row not used" in said and "1 other lines" in said
    assert len(got.records) == len(rows) - 1 and got.about["world"] == 8


@pytest.mark.parametrize("text, where", [
    ("# nThread 1 nGpus 8 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1\n", ":1"),
    ("hello\n", ":1"),
])
def test_nothing_usable_is_refused_in_one_line(tmp_path, text, where):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        u.read_nccl_tests(str(path))
    assert str(path) + where in err.value.field
    out = perfmodel("calibrate", "--from-file", f"nccl-tests:{path}", "--cluster", "dgx-h100",
                    "-o", tmp_path / "p.json")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and str(path) in out.stderr


def test_two_runs_in_one_file_are_refused(tmp_path):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(TXT.read_text() * 2)
    with pytest.raises(InputError, match="one nccl-tests run per file") as err:
        u.read_nccl_tests(str(path))
    assert err.value.field == f"{path}:{len(TXT.read_text().splitlines()) + 3}"


def test_an_op_the_fit_cannot_price_and_a_log_are_refused(tmp_path):
    path = tmp_path / "broadcast_perf.txt"
    path.write_text(TXT.read_text().replace("all_reduce_perf", "broadcast_perf"))
    with pytest.raises(InputError, match="broadcast"):
        u.read_nccl_tests(str(path))
    out = perfmodel("calibrate", "--from-file", f"megatron-log:{DATA / 'megatron_train.log'}", "--cluster",
                    "dgx-h100", "-o", tmp_path / "p.json")
    assert out.returncode == 2 and "check-step" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    with pytest.raises(InputError, match="KIND:PATH"):
        u.split_spec("nccl:foo.txt")


def test_fit_from_nccl_tests_reproduces_its_busbw_within_the_error():
    user = u.read_nccl_tests(str(TXT), cluster="dgx-h100")
    profile = fit_profile(user.records, "dgx-h100", sources=[str(TXT)])
    errors = u.tier_errors(user.records, "dgx-h100", profile)
    assert not errors["separable"]        # one world size: base and alpha share one latency
    assert 0 < errors["primitives"]["nvlink"]["allreduce"]["bw_fraction_sd"] < 0.05
    checked = u.busbw_check(user, "dgx-h100", profile, errors)
    assert len(checked) == len(user.records)
    for r in checked:
        assert abs(r["measured_busbw_GBps"] / r["fitted_busbw_GBps"] - 1) <= u.WITHIN * r["relative_error"]
    # the bandwidth the file shows at its largest size: 364.8 GB/s busbw
    assert checked[-1]["fitted_busbw_GBps"] == pytest.approx(364.8, rel=0.02)


def test_calibrate_cli_from_file(tmp_path):
    out = perfmodel("calibrate", "--from-file", f"nccl-tests:{JSN}", "--cluster", "dgx-h100", "-o", tmp_path / "p.json")
    assert out.returncode == 0, out.stderr
    assert "12 allreduce rows on 8 ranks" in out.stdout and "bw_fraction +-" in out.stdout
    assert "within 2 sd" in out.stdout and " NO" not in out.stdout
    profile = json.loads((tmp_path / "p.json").read_text(), parse_constant=pytest.fail)   # strict JSON: no NaN
    assert "bw_fraction_sd" in json.dumps(profile["fits"]["tiers"]["errors"])


@pytest.mark.parametrize("kind, unit, first_kept", [("megatron", "s", 2.4695), ("torchtitan", "tokens/s/device", None),
                                                    ("deepspeed", "samples/s", None)])
def test_step_logs(kind, unit, first_kept):
    log = u.read_step_log(str(DATA / f"{kind}_train.log"), f"{kind}-log")
    assert log.unit == unit and len(log.samples) >= 10
    seconds = u.step_seconds(log, tokens_per_step=128 * 8192, samples_per_step=256, gpus=8)
    stats = u.step_stats(seconds)
    assert stats.skipped == sum(1 for step, _ in seconds if step <= u.WARMUP_STEPS)
    assert stats.min_s <= stats.median_s <= stats.max_s and stats.spread_s < 0.05 * stats.median_s
    if kind == "megatron":
        assert stats.skipped == 1 and stats.max_s < 3.0       # iteration 1 (31.8 s of set-up) is not kept


def test_rates_need_the_plan_and_a_log_without_steps_is_refused(tmp_path):
    log = u.read_step_log(str(DATA / "torchtitan_train.log"), "torchtitan-log")
    with pytest.raises(InputError, match="--gbs"):
        u.step_seconds(log)
    empty = tmp_path / "train.log"
    empty.write_text("nothing here\n")
    with pytest.raises(InputError) as err:
        u.read_step_log(str(empty), "megatron-log")
    assert err.value.field == f"{empty}:1" and "elapsed time per iteration" in err.value.allowed


def test_check_step_cli():
    out = perfmodel("check-step", "--log", f"torchtitan-log:{DATA / 'torchtitan_train.log'}", "--model", "llama3-8b",
                    "--cluster", "dgx-h100", "--gpus", 8, "--tp", 2, "--mbs", 1, "--gbs", 128, "--seq", 8192,
                    "--recompute", "full", "--zero", 1, "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["warmup_steps"] == u.WARMUP_STEPS and got["steps"] == 10
    assert got["relative_error"] == pytest.approx(got["predicted_s"] / got["median_s"] - 1)


def test_a_cluster_is_needed():
    with pytest.raises(InputError, match="--cluster"):
        u.calibrate([], None, [f"nccl-tests:{TXT}"])    # nccl-tests files do not name a commpress cluster


def test_python_api_calibrate():
    profile, users, errors = u.calibrate([], "dgx-h100", [f"nccl-tests:{TXT}", f"nccl-tests:{JSN}"])
    assert [x.about["world"] for x in users] == [8, 8] and len(errors["cov"]) == 3
    saved = profile["fits"]["tiers"]["errors"]
    assert saved["base_us_sd"] is None and saved["primitives"]["nvlink"]["allreduce"]["bw_fraction_sd"] > 0
    assert profile["provenance"]["records"] == [str(TXT), str(JSN)]


def test_json_cpu_time_is_refused_naming_the_result(tmp_path):
    doc = json.loads(JSN.read_text())
    doc["results"][2]["out_of_place"] = {"cpu_time": 5.0, "alg_bw": 1.0, "bus_bw": 1.0, "nwrong": 0}
    path = tmp_path / "all_reduce.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="without -C") as err:
        u.read_nccl_tests(str(path))
    assert err.value.field == f"{path}: results[2].cpu_time"

