"""realrun's step phases (realrun.train.phases) and parallel runtimes (realrun.train.runtime):
the names a step record measures are perfmodel's declared phases of the plan's axes, every axis
has a runtime answering one interface, and files written under the older names still read."""
from __future__ import annotations

import pytest

from perfmodel.axes import AXES, PHASES
from perfmodel.phases import COMPRESSION, COMPUTE, OPTIMIZER
from perfmodel.workload import load_model

torch = pytest.importorskip("torch")

from realrun.comm import CommStats  # noqa: E402
from realrun.train.config import TrainConfig  # noqa: E402
from realrun.train.context_parallel import ContextParallel  # noqa: E402
from realrun.train.data_parallel import DataParallel  # noqa: E402
from realrun.train.moe import ExpertParallel  # noqa: E402
from realrun.train.phases import MEASURED, compared, reported_axes, upgraded  # noqa: E402
from realrun.train.pipeline import PhaseTimes, Pipeline  # noqa: E402
from realrun.train.runtime import AxisRuntime, AxisTiming  # noqa: E402
from realrun.train.tensor_parallel import TensorParallel  # noqa: E402
from realrun.train.trainer import step_times  # noqa: E402

PLANS = [dict(), dict(dp=2), dict(tp=2, dp=2), dict(pp=2, gbs=8), dict(dp=2, zero=1), dict(cp=2, dp=2),
         dict(ep=2, dp=2, model="gpt-tiny-moe"), dict(ep=2, dp=4, model="gpt-tiny-moe")]


def _runtimes() -> list:
    """One of each runtime, on one rank (no collectives made)."""
    return [TensorParallel(1, 0, None, None), ContextParallel(1, 0, None), ExpertParallel(1, 0, None),
            Pipeline("1f1b", 0, 1, None, None, None, None), DataParallel(None, None, 1, 1, [], [])]


def test_every_axis_has_a_runtime_answering_one_interface():
    runtimes = _runtimes()
    assert all(isinstance(r, AxisRuntime) for r in runtimes)
    carried = [axis for r in runtimes for axis in r.axis_names]
    assert sorted(carried) == sorted(AXES)   # each declared axis, by exactly one runtime
    for r in runtimes:
        assert len({AXES[a].phase.name for a in r.axis_names}) == 1   # a runtime's axes share their phase
        r.start_step(True)
        t = r.take()
        assert isinstance(t, AxisTiming) and set(t.stats) == set(t.errors) == set(r.axis_names)
        assert t.seconds == 0.0 and all(e is None for e in t.errors.values())   # one rank: nothing to measure
    assert (runtimes[2].take().routed, runtimes[2].take().dropped) == (0, 0)   # MoE's counts ride on ep's timing


def _timing(axes, forward_s=0.0, backward_s=0.0, apart_s=0.0, kernel_s=0.0) -> AxisTiming:
    return AxisTiming(forward_s=forward_s, backward_s=backward_s, apart_s=apart_s,
                      stats={a: CommStats(compress_s=kernel_s) for a in axes}, errors=dict.fromkeys(axes))


@pytest.mark.parametrize("kw", PLANS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()) or "one")
def test_a_step_records_phases_are_the_declared_phases_of_its_axes(kw):
    """The phase keys of a step's times: perfmodel's compute, compression and optimizer phases and
    the phase of every axis the record reports (each non-optional axis always, an optional one where
    the plan carries it), under the declared names; each axis's exposed seconds without its kernels."""
    cfg = TrainConfig.of(**{"model": "gpt-tiny", "mbs": 4, "seq": 64, **kw})
    spec = load_model(cfg.model)
    axes = [name for name, axis in AXES.items() if not axis.optional or axis.active(cfg, spec)]
    expected = {COMPUTE.name, COMPRESSION.name, OPTIMIZER.name} | {AXES[a].phase.name for a in axes}
    runtimes = _runtimes()
    inner = {"tp", "cp", "ep"}   # runtimes whose collectives run inside the passes
    timings = [_timing(r.axis_names, *((0.1, 0.2, 0.0) if inner & set(r.axis_names) else (0.0, 0.0, 0.3)),
                       kernel_s=0.01) for r in runtimes]
    assert reported_axes(cfg, spec) == tuple(axes)
    times = step_times(1.0, PhaseTimes(forward_s=0.9, backward_s=1.2), timings, 0.05, reported_axes(cfg, spec))
    phases = {k for k in times if k.endswith("_s") and not k.endswith("_kernel_s")} - {"step_s", "forward_s",
                                                                                         "backward_s"}
    assert phases == expected and list(phases_in(times)) == [p.name for p in PHASES if p.name in expected]
    assert {k.removesuffix("_kernel_s") for k in times if k.endswith("_kernel_s")} == set(axes)
    inside = sum(t.forward_s + t.backward_s for t in timings)
    assert times[COMPUTE.name] == pytest.approx(2.1 - inside)
    assert times[COMPRESSION.name] == pytest.approx(0.01 * len(axes)) and times[OPTIMIZER.name] == 0.05
    for runtime, t in zip(runtimes, timings):
        mine = [a for a in runtime.axis_names if a in axes]
        if mine:
            assert times[AXES[mine[0]].phase.name] == pytest.approx(t.seconds - 0.01 * len(mine))


def phases_in(times: dict):
    return (k for k in times if k in {p.name for p in PHASES})


def test_validation_folds_each_phase_where_a_run_measures_it():
    """Every declared phase lands in the one a run measures it in (its own, or ``measured_in``);
    the kernels of the axes of DP's phase move from compression into it."""
    for phase in PHASES:
        got = compared({phase.name: 1.0}, {})
        into = phase.measured_in or phase.name
        assert sum(got.values()) == (1.0 if into in MEASURED else 0.0)
        assert into not in MEASURED or got[into] == 1.0
    dp_phase = AXES["dp"].phase.name
    dp_axes = [a for a, axis in AXES.items() if axis.phase.name == dp_phase]
    got = compared({COMPRESSION.name: 0.5, dp_phase: 0.1}, {**dict.fromkeys(dp_axes, 0.1), "tp": 0.2})
    assert got[dp_phase] == pytest.approx(0.1 + 0.1 * len(dp_axes))
    assert got[COMPRESSION.name] == pytest.approx(0.5 - 0.1 * len(dp_axes))


def test_records_and_results_under_the_older_names_read_under_todays():
    old = {"forward_s": 0.1, "backward_s": 0.2, "dp_comm_s": 0.3, "compress_s": 0.04, "tp_comm_s": 0.0}
    new = upgraded(old)
    assert new[COMPUTE.name] == pytest.approx(0.3) and new[AXES["dp"].phase.name] == 0.3
    assert new[COMPRESSION.name] == 0.04 and "dp_comm_s" not in new and "compress_s" not in new
    assert upgraded(new) == new
    row = upgraded({"measured_dp_comm_s": "0.2", "predicted_dp_comm_s": "0.1"}, ("predicted_", "measured_"))
    assert row == {f"measured_{AXES['dp'].phase.name}": "0.2", f"predicted_{AXES['dp'].phase.name}": "0.1"}
