"""The step's timeline as Chrome trace-event JSON (perfmodel predict --trace)."""
import json

import pytest

from perfmodel import predict
from perfmodel.prediction import compare

KW = dict(model="gpt2-medium", cluster="commodity-25g", nodes=2, tp=1, pp=4, mbs=1, gbs=32)   # dp 4, 8 microbatches


def test_the_trace_holds_every_operation_and_transfer_of_the_schedule(tmp_path):
    path = tmp_path / "step.json"
    r = predict(**KW, policy="pp=int8", trace=str(path))
    events = json.loads(path.read_text())["traceEvents"]
    p, m = 4, 8
    slices = [e for e in events if e["ph"] == "X"]
    ops = [e for e in slices if e["cat"] == "compute"]
    sends = [e for e in slices if e["cat"].startswith("send")]
    assert len(ops) == 2 * m * p and len(sends) == 2 * m * (p - 1)
    assert sum(e["ph"] == "s" for e in events) == sum(e["ph"] == "f" for e in events) == len(sends)
    assert {e["pid"] for e in ops} == set(range(p))
    assert min(e["ts"] for e in ops) == 0.0
    end = max(e["ts"] + e["dur"] for e in slices) / 1e6
    assert end == pytest.approx(r.step_time_s, rel=1e-6)    # the pipeline, then what follows backward
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"compute", "send ->", "send <-", "after backward", "gradient buckets",
                     "ZeRO-3 gathers, reduce-scatters"}


def test_each_stage_runs_its_operations_one_after_another(tmp_path):
    path = tmp_path / "step.json"
    predict(**KW, schedule="gpipe", trace=str(path))
    events = json.loads(path.read_text())["traceEvents"]
    for s in range(4):
        ops = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and e["pid"] == s
                     and e["cat"] == "compute")
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(ops, ops[1:]))


def test_compare_writes_one_trace_with_every_policy(tmp_path):
    path = tmp_path / "cmp.json"
    compare("gpt2-medium", "commodity-25g", "none,naive:int8", nodes=2, tp=1, pp=2, mbs=1, gbs=8, trace=str(path))
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1, 100, 101}


def test_an_interleaved_trace_names_each_model_chunk(tmp_path):
    path = tmp_path / "x.json"
    p, m, v = 4, 8, 2
    r = predict("gpt2-medium", "dgx-a100", nodes=1, tp=1, pp=p, mbs=1, gbs=2 * m, schedule="interleaved:2",
                trace=str(path))
    slices = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    ops = [e for e in slices if e["cat"] == "compute"]
    assert len(ops) == 2 * m * p * v and {e["args"]["chunk"] for e in ops} == {0, 1}
    assert sum(e["cat"].startswith("send") for e in slices) == 2 * m * (p * v - 1)
    assert max(e["ts"] + e["dur"] for e in ops) / 1e6 <= r.step_time_s


def test_the_des_trace_counts_flows_on_the_busiest_links(tmp_path):
    path = tmp_path / "des.json"
    r = predict(**KW, policy="dp=int8", engine="des", trace=str(path))
    assert r.simulated_events > 0
    assert predict(**KW).simulated_events == 0
    events = json.loads(path.read_text())["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and {e["name"] for e in counters} <= {"NIC out flows", "NIC in flows"}
    assert max(e["args"]["flows"] for e in counters) >= 2          # a bucket beside a transfer
    assert all(e["args"]["flows"] >= 0 for e in counters)
    assert any(e["cat"] == "gradient buckets" for e in events if e["ph"] == "X")


def test_the_timeline_picture_is_written_from_the_api_and_the_cli(tmp_path, cli):
    png = tmp_path / "step.png"
    predict(**KW, engine="des", timeline=str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tmp_path / "cmp.svg"
    compare("gpt2-medium", "commodity-25g", "none,pp=fp16", nodes=2, tp=1, pp=2, mbs=1, gbs=8, timeline=str(svg))
    assert b"<svg" in svg.read_bytes()[:400]
    cli_png = tmp_path / "cli.png"
    cli("perfmodel", "predict", "--model", "gpt2-medium", "--cluster", "commodity-25g", "--nodes", "2", "--tp", "1",
        "--pp", "4", "--mbs", "1", "--gbs", "32", "--engine", "des", "--timeline", str(cli_png), check_rc=0)
    assert cli_png.stat().st_size > 10_000


@pytest.mark.parametrize("flag,value,field", [("--trace", "missing/step.json", "trace"),
                                              ("--timeline", "missing/step.png", "timeline"),
                                              ("--timeline", "step.txt", "timeline"),
                                              ("--engine", "fluid", "engine")])
def test_bad_outputs_and_engines_are_one_line_and_exit_2(tmp_path, cli, flag, value, field):
    args = ["perfmodel", "predict", "--model", "gpt2-medium", "--cluster", "commodity-25g", "--nodes", "2",
            "--tp", "1", "--pp", "2", "--mbs", "1", "--gbs", "8", flag, str(tmp_path / value)]
    if flag == "--engine":
        args[-1] = value
    proc = cli(*args, check_rc=2)
    assert len(proc.stderr.strip().splitlines()) == 1 and field in proc.stderr
    assert not list(tmp_path.iterdir())        # nothing, not even part of a file, is left
