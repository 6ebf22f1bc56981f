"""The step's timeline as Chrome trace-event JSON (perfmodel predict --trace)."""
import json

import pytest

from perfmodel import predict
from perfmodel.pipeline import compare
from topologies import InputError

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
    assert names == {"compute", "send ->", "send <-", "after backward", "gradient buckets"}


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


def test_interleaved_schedules_are_refused_for_a_trace(tmp_path):
    with pytest.raises(InputError) as err:
        predict("gpt2-medium", "dgx-a100", nodes=1, tp=1, pp=4, mbs=1, gbs=8, schedule="interleaved:2",
                trace=str(tmp_path / "x.json"))
    assert err.value.field == "trace"
