import csv
import json

NEOX = ["--model", "gpt-neox-20b", "--cluster", "lassen", "--gpus", "192", "--tp", "4", "--pp", "4", "--mbs", "4",
        "--gbs", "1056", "--zero", "1", "--recompute", "full"]


def test_predict_table(cli):
    out = cli("perfmodel", "predict", *NEOX, "--policy", "hybrid", check_rc=0).stdout
    for text in ("step time", "TFLOPS/GPU", "samples/s", "speedup", "bubble", "error estimate"):
        assert text in out


def test_predict_json_is_one_record(cli):
    data = json.loads(cli("perfmodel", "predict", *NEOX, "--json", check_rc=0).stdout)
    assert data["gpus"] == 192 and data["speedup_vs_uncompressed"] == 1.0
    assert abs(sum(data["breakdown"].values()) - data["step_time_s"]) < 1e-9 * data["step_time_s"]


def test_compare_side_by_side(cli):
    out = cli("perfmodel", "compare", *NEOX, "--policies", "none,naive:int8,hybrid,tp=none", check_rc=0).stdout
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("none", "naive", "hybrid"))]
    assert rows == ["none", "naive:int8", "hybrid,tp=none"]


def test_sweep_writes_csv_and_ranks(cli, tmp_path):
    path = tmp_path / "plans.csv"
    proc = cli("perfmodel", "sweep", "--model", "gpt2-medium", "--cluster", "dgx-a100", "--gpus", "16", "--gbs", "64",
               "--policies", "none,naive:int8", "--top", "5", "--csv", str(path), check_rc=0)
    assert "plans" in proc.stderr
    rows = list(csv.DictReader(path.open()))
    times = [float(r["step_time_s"]) for r in rows]
    assert len(rows) > 10 and times == sorted(times) and {r["policy"] for r in rows} == {"none", "naive:int8"}
    assert proc.stdout.count("\n") >= 7


def test_catalog(cli):
    out = cli("perfmodel", "catalog", check_rc=0).stdout
    assert "llama3-405b" in out and "h100-sxm" in out and "frontier" in out


def test_bad_plans_are_one_line_exit_2(cli, tmp_path):
    bad_model = tmp_path / "m.toml"
    bad_model.write_text("hidden_size = 8\n")
    cases = [NEOX[:-4], NEOX + ["--tp", "3"], NEOX + ["--gbs", "1000"], NEOX + ["--policy", "dp=topk(3)"],
             NEOX + ["--schedule", "interleaved:x"], ["--model", str(bad_model)], ["--model", "gpt5"],
             NEOX + ["--dp", "x"], NEOX + ["--bucket", "-1MiB"], NEOX + ["--overlap-slowdown", "2"],
             NEOX + ["--calibration", str(tmp_path / "missing.json")]]
    for args in cases:
        proc = cli("perfmodel", "predict", *args)
        assert proc.returncode == 2, (args, proc.stdout[-300:], proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
