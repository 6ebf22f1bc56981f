"""The ``des`` engine: the analytical engine's stage costs run as events, links shared.

The pipeline and every stage's gradient buckets run on the event core (``perfmodel.simulate``):
per-rank streams, NIC links shared fairly between concurrent flows. Where the closed forms
assume a transfer has its link to itself, the simulation lets it share; the difference of the
two spans is the breakdown's ``contention_s`` (0 where nothing contends, tested). A MoE
all-to-all across nodes is a flow on its rank's NIC there, beside that rank's gradient buckets.
With an expert overlap (``perfmodel.step.expert_overlap``) the stage costs are the analytical
engine's, their hidden all-to-alls taken out; the simulation runs each steady forward-backward pair's
hidden all-to-alls as their own flow (``SimResult.hidden_comm``, drawn in the trace) that the pair's
backward waits for, so where they share the NIC with gradient buckets the step is slower by it.
DualPipe's stages run in 1F1B's order here (its bidirectional schedule is the analytical engine's
closed form, the report's Table 2 bubble): its ``contention_s`` is the link sharing of that order.
"""
from __future__ import annotations

from perfmodel.engines import StepInputs, StepTiming, register
from perfmodel.engines.analytical import ANALYTICAL, bucket_window, cost
from perfmodel.phases import CONTENTION
from perfmodel.simulate.step import StageWork, simulate
from perfmodel.step.timing import overlap_buckets, pipeline_time


def _bucket_runs(step: StepInputs, events: list) -> tuple:
    """A stage's gradient bucket runs (first ready, spacing, count, seconds) as the DP overlap
    prices them (ZeRO-3 reduces per layer inside the operations: none)."""
    if step.plan.zero >= 3:
        return ()
    return tuple((e.ready_at, e.spacing, e.count, cost(step.env, e, step.policy).time_s)
                 for e in events if e.where == "overlap")


def _simulate(step: StepInputs, stages, events):
    """The step's pipeline and every stage's buckets on the event engine (perfmodel.simulate)."""
    plan = step.plan
    work = [StageWork(fwd=st.fwd_op, bwd=st.bwd_op, send_fwd=st.send_fwd, send_bwd=st.send_bwd,
                      buckets=_bucket_runs(step, events[s]), zero3=st.zero3_layers, nic_fwd=st.nic_fwd,
                      nic_bwd=st.nic_bwd, pair=st.ep_pair_s, pair_nic=st.ep_pair_nic)
            for s, st in enumerate(stages)]
    return simulate(work, plan.schedule, plan.microbatches, overlap=plan.dp_overlap, chunks=plan.virtual_stages)


def _analytical_span(step: StepInputs, stages, events) -> float:
    """What the closed forms say the simulated part takes: the pipeline, then stage 0's buckets'
    exposed tail."""
    plan = step.plan       # DualPipe: its stages run in 1F1B's order (the simulated schedule)
    total = pipeline_time(stages, plan.microbatches, plan.virtual_stages, plan.schedule)[0]
    window = bucket_window(step, stages)
    runs = _bucket_runs(step, events[0])
    return total + overlap_buckets([(f * window, sp * window, n, d) for f, sp, n, d in runs], window)[0]


class EventEngine:
    """Events with link sharing (module doc)."""

    name = "des"

    def time_step(self, step: StepInputs) -> StepTiming:
        timing = ANALYTICAL.time_step(step)
        sim = _simulate(step, timing.stages, timing.stage_events)
        timing.breakdown[CONTENTION] = sim.end_s - _analytical_span(step, timing.stages, timing.stage_events)
        timing.simulation, timing.simulated_events = sim, sim.events
        return timing


EVENTS = register(EventEngine())
