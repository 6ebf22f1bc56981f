"""The schedule's graph (perfmodel.step.makespan) against the operation-by-operation schedule."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.step.makespan import makespans, program
from perfmodel.step.schedule import StageCost, run_schedule
from perfmodel.step.timing import StageTime, pipeline_spans

times = st.floats(min_value=1e-4, max_value=10.0, allow_nan=False)


@st.composite
def shapes(draw):
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved"]))
    p = draw(st.integers(1, 6))
    chunks = draw(st.integers(2, 3)) if name == "interleaved" else 1
    m = p * draw(st.integers(1, 4)) if name == "interleaved" else draw(st.integers(1, 12))
    n = draw(st.integers(1, 4))
    stage_times = draw(st.lists(st.tuples(times, times, times, times), min_size=n * p, max_size=n * p))
    return name, p, m, chunks, np.array(stage_times).reshape(n, p, 4)


def _reference(name, m, chunks, plan):
    return run_schedule(name, [StageCost(*map(float, row)) for row in plan], m, chunks, record=False)


@settings(max_examples=150, deadline=None)
@given(shapes())
def test_graph_equals_the_operation_loop(shape):
    """Different stages with different times, transfers nonzero: end, busy and finish agree."""
    name, p, m, chunks, t = shape
    end, busy, finish = makespans(name, m, t[..., 0], t[..., 1], t[..., 2], t[..., 3], chunks)
    for i, plan in enumerate(t):
        ref = _reference(name, m, chunks, plan)
        assert math.isclose(end[i], ref.end_s, rel_tol=1e-9)
        assert np.allclose(busy[i], ref.busy_s, rtol=1e-9, atol=0)
        assert np.allclose(finish[i], ref.finish_s, rtol=1e-9, atol=0)


@pytest.mark.parametrize("name,p,m,chunks", [("gpipe", 4, 6, 1), ("1f1b", 5, 9, 1), ("interleaved", 4, 8, 2),
                                             ("interleaved", 3, 6, 3), ("1f1b", 1, 4, 1)])
def test_the_same_floating_point_operations(name, p, m, chunks):
    """Bit for bit: each node adds one time to a max, in the loop's order (a search's rows do not move)."""
    rng = np.random.default_rng(p * m + chunks)
    t = rng.uniform(0.01, 3.0, (5, p, 4))
    end, busy, _ = makespans(name, m, t[..., 0], t[..., 1], t[..., 2], t[..., 3], chunks)
    for i, plan in enumerate(t):
        ref = _reference(name, m, chunks, plan)
        assert end[i] == ref.end_s and tuple(busy[i]) == ref.busy_s


@pytest.mark.parametrize("name,p,m,chunks", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2),
                                             ("interleaved", 2, 6, 3)])
def test_uniform_free_transfers_closed_forms(name, p, m, chunks):
    """(m + p - 1) T for GPipe and 1F1B; m T + (p - 1) T / V interleaved (Narayanan et al. SC21)."""
    f, b = np.full((2, p), 1.0), np.full((2, p), 2.0)
    zero = np.zeros((2, p))
    end, _, _ = makespans(name, m, f, b, zero, zero, chunks)
    expect = m * 3.0 + (p - 1) * 3.0 / chunks
    assert np.allclose(end, expect, rtol=1e-12)


def test_program_is_cached_and_refuses_unknown_schedules():
    assert program("1f1b", 3, 4) is program("1f1b", 3, 4)
    with pytest.raises(ValueError, match="schedule"):
        program("zigzag", 3, 4)


def test_pipeline_spans_batches_plans_of_one_shape():
    """A batch of StageTimes: duplicates evaluated once, each plan its own numbers as alone."""
    def stages(scale):
        return [StageTime(fwd_op=scale * (1 + s), bwd_op=2 * scale, send_fwd=0.1, send_bwd=0.2 * scale)
                for s in range(3)]

    batch = [stages(1.0), stages(1.5), stages(1.0)]
    end, busy = pipeline_spans(batch, 6, 1, "1f1b")
    for plan, e, b in zip(batch, end, busy):
        ref = run_schedule("1f1b", [StageCost(s.fwd_op, s.bwd_op, s.send_fwd, s.send_bwd) for s in plan], 6)
        assert e == ref.end_s and tuple(b) == ref.busy_s
    assert end[0] == end[2] != end[1]


def test_a_microbatchs_sends_split_over_its_chunks():
    """A stage's send seconds are a microbatch's (V transfers when interleaved), as its compute is: more
    chunks shrink the bubble and never multiply the transfer time (it once grew as V^2: 8 chunks of a
    405B plan on DGX B200 took a 2.7 s bubble where 1F1B took 1.1 s)."""
    import numpy as np
    from perfmodel.step.makespan import makespans
    from perfmodel.step.schedule import StageCost, run_schedule
    p, m = 8, 32
    fwd, bwd, send = np.ones((1, p)), 2 * np.ones((1, p)), 0.1 * np.ones((1, p))
    ends = {v: makespans("interleaved" if v > 1 else "1f1b", m, fwd, bwd, send, send, v)[0][0] for v in (1, 2, 8)}
    assert ends[8] < ends[2] < ends[1]
    stages = tuple(StageCost(fwd=1.0, bwd=2.0, send_fwd=0.1, send_bwd=0.1) for _ in range(p))
    assert run_schedule("interleaved", stages, m, 8).end_s == ends[8]
