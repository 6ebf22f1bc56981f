"""Step phases: declared once (perfmodel.phases, each axis's on the axis), and everything that
shows a breakdown (the record, the plot's bars, the text tables) shows all of its seconds."""
from dataclasses import fields

import matplotlib
import pytest
from matplotlib.axes import Axes

from perfmodel import predict
from perfmodel.axes import AXES, PHASE_NAMES, PHASES
from perfmodel.phases import COMPRESSION, CONTENTION, LEADING, TRAILING
from perfmodel.report.plots import plot_breakdown, stacked_parts
from perfmodel.report.text import compare_report, shown_phases, step_report
from perfmodel.step.timing import Breakdown

matplotlib.use("Agg")

MIXTRAL = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=64)
CASES = {   # between them every axis carries traffic, under both engines, compressed or not
    "moe tp2 pp4 ep8": dict(MIXTRAL, tp=2, pp=4, ep=8),
    "every axis, des": dict(MIXTRAL, tp=2, pp=2, ep=4, cp=2, zero=1, policy="hybrid", engine="des"),
    "cp": dict(model="gpt3-1.3b", cluster="dgx-a100", gpus=32, tp=2, pp=2, cp=2),
    "zero-3": dict(model="gpt3-1.3b", cluster="dgx-a100", gpus=32, tp=2, zero=3, policy="zero=int8"),
    "dense des": dict(model="gpt3-1.3b", cluster="dgx-a100", gpus=32, tp=2, pp=2, engine="des", policy="hybrid"),
}


@pytest.fixture(scope="module")
def records():
    return {name: predict(**kw) for name, kw in CASES.items()}


def test_every_axis_owns_one_declared_phase():
    assert len(set(PHASE_NAMES)) == len(PHASES) and PHASES[:len(LEADING)] == LEADING
    assert PHASES[len(PHASES) - len(TRAILING):] == TRAILING
    assert {a.phase for a in AXES.values()} == set(PHASES) - set(LEADING) - set(TRAILING)
    assert AXES["dp"].phase is AXES["zero"].phase and AXES["ep"].phase is AXES["ep_combine"].phase
    assert tuple(f.name for f in fields(Breakdown)) == PHASE_NAMES
    assert all(p.name.endswith("_s") and p.short and p.label for p in PHASES)


def test_the_breakdown_is_read_and_charged_by_phase_or_name():
    b = Breakdown(compute_s=1.0)
    b.add(COMPRESSION, 0.25)
    b[AXES["ep"].phase] = 0.5
    b["tp_comm_s"] += 0.125
    assert b.compression_s == 0.25 and b["ep_comm_s"] == b.ep_comm_s == 0.5 and b[AXES["tp"].phase] == 0.125
    assert b.total == 1.875 and list(b.as_dict()) == list(PHASE_NAMES)
    with pytest.raises(KeyError, match="no step phase"):
        b.add("gemm_s", 1.0)


def test_every_axis_and_phase_is_in_the_cases(records):
    assert set().union(*(r.wire_bytes for r in records.values())) == set(AXES)
    every = records["every axis, des"]
    assert all(every.breakdown[p.name] > 0 for p in PHASES)


@pytest.mark.parametrize("name", CASES)
def test_the_plotted_bars_add_up_to_the_step(records, name):
    r = records[name]
    parts = stacked_parts([r])
    assert sum(values[0] for _, values in parts) == pytest.approx(r.step_time_s, rel=1e-12)
    assert {p.name for p, _ in parts} == {k for k, v in r.breakdown.items() if v}
    assert list(r.breakdown) == list(PHASE_NAMES)
    assert sum(r.breakdown[p.name] for p in shown_phases([r])) == pytest.approx(r.step_time_s, rel=1e-12)


def test_the_picture_draws_every_part_and_the_tables_name_them(records, monkeypatch, tmp_path):
    drawn = []
    bar = Axes.bar

    def spy(self, x, height, *args, **kw):
        drawn.append((kw["label"], list(height)))
        return bar(self, x, height, *args, **kw)

    monkeypatch.setattr(Axes, "bar", spy)
    moe, every = records["moe tp2 pp4 ep8"], records["every axis, des"]
    plot_breakdown([moe, every], str(tmp_path / "two.png"))
    for i, r in enumerate((moe, every)):
        assert sum(heights[i] for _, heights in drawn) == pytest.approx(r.step_time_s, rel=1e-12)
    assert [label for label, _ in drawn] == [p.label for p in PHASES]      # every phase, in order, once
    assert "ep comm" in dict(drawn) and "cp comm" in dict(drawn)
    table = compare_report([moe, every]).splitlines()
    head = next(line for line in table if line.startswith("policy")).split()
    assert head[6:6 + len(PHASES)] == [p.short for p in PHASES]
    assert "ep_comm" in step_report(moe) and "cp_comm" not in step_report(moe)
    assert "contention" not in step_report(moe) and "contention" in step_report(every)


def test_optional_phases_show_where_used_and_engine_phases_where_that_engine_ran(records):
    moe, cp, dense = records["moe tp2 pp4 ep8"], records["cp"], records["dense des"]
    shown = {r: {p.name for p in shown_phases([records[r]])} for r in records}
    assert "ep_comm_s" in shown["moe tp2 pp4 ep8"] and "cp_comm_s" not in shown["moe tp2 pp4 ep8"]
    assert "cp_comm_s" in shown["cp"] and "ep_comm_s" not in shown["cp"]
    assert CONTENTION.name in shown["dense des"] and CONTENTION.name not in shown["cp"]
    assert "dp_comm_exposed_s" in shown["moe tp2 pp4 ep8"]          # a fixed column, shown at 0 too
    both = {p.name for p in shown_phases([moe, cp, dense])}
    assert both == set(PHASE_NAMES)
