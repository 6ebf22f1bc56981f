"""Parallel axes, each declared once: what it carries, its groups, its events, memory and error.

An ``Axis`` is the one place that says, for a parallel axis: the tensor kind its traffic
carries (the name a policy compresses), the mesh dimension whose groups it communicates over,
the generator of its communication events (``perfmodel.events``), the memory it divides, the
error semantics of compressing it (and the search's default budget), where its exposed
seconds go in the step's breakdown, and when it carries traffic (``active``). Plan, mesh,
events, memory, policy, search, the reports and realrun's trainer read these declarations;
adding an axis is one more entry here, its event generator and its runtime collective.

Axes name the kind of tensor at every ZeRO stage (docs/design.md, Compressors): ``dp`` the
gradient reduction (all-reduce, or reduce-scatter under ZeRO; also the tied embedding's
gradient sum between the first and last stage), ``zero`` ZeRO's parameter gathers, ``tp``
activations and their gradients inside a layer, ``pp`` activations between stages, ``ep`` the
tokens a MoE layer dispatches to its experts (the all-to-all towards the experts, forward and
backward), ``ep_combine`` the experts' outputs sent back (the all-to-all towards the tokens),
``cp`` the keys and values context parallelism passes around its ring. ``ep`` and
``ep_combine`` share the ep groups; a policy compresses them apart (``perfmodel.compression.policy``).
The expert layers lay their own groups over the same ranks (Megatron-Core's MoE parallel folding,
``perfmodel.plan.mesh``): the ep all-to-alls run over the folded ep groups, the routed experts'
tensor-parallel collectives (the dispatched rows gathered and reduce-scattered) are ``tp`` traffic
over the ``etp`` groups, and the experts' gradients reduce (``dp``) and their ZeRO gathers
(``zero``) run over the ``edp`` groups, apart from the dense ones over dp x cp; an axis's events
name their groups, its ``mesh_axis`` is the dense layers' one.
Axes marked ``optional`` (ep, ep_combine, cp) exist only in some plans: reports name them
where they carry traffic or a policy compresses them.

Error semantics (``error``): ``reduced`` tensors are summed over the group, so an all-reduce
compresses them at every hop it decodes and re-encodes; with error feedback what one step
drops is re-sent by the next (``feedback``: the search admits any contraction there);
``forwarded`` tensors are compressed once at the source and feed the next computation
uncorrected. Default budgets (``max_error``, relative RMS on unit-Gaussian data): 5% on
gradients, 1% on what feeds the next computation (``perfmodel.explore.search`` explains why), except
the MoE dispatch: 5%, so FP8 (3.6%) passes, because the experts' first GEMM reads its input in
FP8 where training runs its expert GEMMs in FP8 (DeepSeek-V3), and a dispatched token is
quantized once at its source (``forwarded``), never re-summed.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfmodel import events
from perfmodel.phases import LEADING, TRAILING, Phase
from perfmodel.plan.degrees import Degrees
from perfmodel.plan.parallel import MESH_AXES

if TYPE_CHECKING:   # the event generators take a stage's context; its module reads memory, which reads this one
    from perfmodel.stage import StageContext


def _degree(plan, name: str) -> int:
    """A plan field from a ParallelPlan, a realrun TrainConfig or a plan dict alike (a degree a
    plan dict lacks reads its default, as ``Degrees.of`` reads older records: etp reads tp)."""
    if isinstance(plan, dict):
        if name in Degrees.followers() and plan.get(name) is None:
            return _degree(plan, Degrees.followers()[name])
        return plan.get(name, 1) if name in Degrees.names() else plan.get(name)
    return getattr(plan, name)


def _replicas(plan) -> int:
    """Ranks that hold the same dense weights: dp x cp (context-parallel ranks reduce together)."""
    return _degree(plan, "dp") * _degree(plan, "cp")


def _expert_replicas(plan, model=None) -> int:
    """Ranks that hold the same routed experts (edp: tp x cp x dp / (etp x ep)); 1 for a dense model."""
    if model is not None and not model.is_moe:
        return 1
    folded = _degree(plan, "tp") * _replicas(plan)
    return folded // (_degree(plan, "ep") * _degree(plan, "etp"))


def _moe(model) -> bool:
    return model is None or model.is_moe


def _ties_stages(plan, model) -> bool:
    """The tied embedding's gradient is summed between the first and last pipeline stage."""
    return model is not None and bool(model.tied_embeddings) and _degree(plan, "pp") > 1


@dataclass(frozen=True, kw_only=True)
class Axis:
    """One parallel axis (module doc). ``events(ctx)`` lists its communication events on one
    pipeline stage (``perfmodel.stage.StageContext``)."""

    name: str
    tensor: str                           # what its traffic carries
    mesh_axis: str                        # the mesh dimension whose groups it uses
    error: str                            # reduced (summed over the group) or forwarded (compressed once)
    feedback: bool                        # error feedback compensates its error across steps
    max_error: float                      # the search's default budget
    phase: Phase                          # the step phase its exposed seconds go to (perfmodel.phases)
    active: Callable                      # (plan, model or None) -> whether it moves anything
    events: Callable                      # StageContext -> [CommEvent] on one stage
    memory: Callable = lambda plan: {}    # plan -> {memory kind: divisor} it shards
    description: str = ""
    optional: bool = False                # reported only where active or compressed (module doc)


def _zero_shards(plan) -> dict:
    """ZeRO's sharding over the dp group (Rajbhandari et al., SC20): optimizer states from
    stage 1, gradients from 2, weights from 3."""
    dp, zero = _replicas(plan), _degree(plan, "zero")
    return {"optimizer": dp if zero >= 1 else 1, "gradients": dp if zero >= 2 else 1,
            "weights": dp if zero >= 3 else 1}


def _zero_expert_shards(plan) -> dict:
    """ZeRO's sharding of the routed experts: over their expert-data-parallel group (edp), as
    Megatron-Core's distributed optimizer shards expert parameters over the expert-dp group and
    torchtitan's FSDP2 over the ranks that hold the same experts."""
    edp, zero = _expert_replicas(plan), _degree(plan, "zero")
    return {"expert_optimizer": edp if zero >= 1 else 1, "expert_gradients": edp if zero >= 2 else 1,
            "expert_weights": edp if zero >= 3 else 1}


# the axes' step phases (perfmodel.phases): axes that share one share the object
DP_PHASE = Phase(name="dp_comm_exposed_s", short="dp_exposed",
                 description="gradient reductions and ZeRO gathers not hidden behind backward")
TP_PHASE = Phase(name="tp_comm_s", short="tp", description="tensor-parallel collectives inside every layer")
PP_PHASE = Phase(name="pp_comm_s", short="pp", description="activation and gradient transfers between stages")
EP_PHASE = Phase(name="ep_comm_s", short="ep", optional=True,
                 description="MoE dispatch and combine all-to-alls (critical path)")
CP_PHASE = Phase(name="cp_comm_s", short="cp", optional=True,
                 description="context parallelism's K/V ring, the part attention does not hide")

DP = Axis(name="dp", tensor="gradients", mesh_axis="dp", error="reduced", feedback=True, max_error=0.05,
          phase=DP_PHASE, events=events.gradient_events,
          active=lambda plan, model=None: _replicas(plan) > 1 or _ties_stages(plan, model)
          or (_moe(model) and _expert_replicas(plan, model) > 1),
          description="gradient reduction: all-reduce, or reduce-scatter under ZeRO; tied embeddings")
ZERO = Axis(name="zero", tensor="parameters", mesh_axis="dp", error="forwarded", feedback=False, max_error=0.01,
            phase=DP_PHASE, events=events.gather_events,
            active=lambda plan, model=None: _degree(plan, "zero") >= 1 and (
                _replicas(plan) > 1 or (_moe(model) and _expert_replicas(plan, model) > 1)),
            memory=lambda plan: _zero_shards(plan) | _zero_expert_shards(plan),
            description="ZeRO's parameter all-gathers (after the step, or per layer at 3)")
TP = Axis(name="tp", tensor="activations", mesh_axis="tp", error="reduced", feedback=False, max_error=0.01,
          phase=TP_PHASE, events=events.tensor_parallel_events,
          active=lambda plan, model=None: _degree(plan, "tp") > 1 or (_moe(model) and _degree(plan, "etp") > 1),
          memory=lambda plan: {"params": _degree(plan, "tp"), "expert_params": _degree(plan, "etp")},
          description="activations and their gradients inside a layer (a MoE layer's routed experts' over etp)")
PP = Axis(name="pp", tensor="activations", mesh_axis="pp", error="forwarded", feedback=False, max_error=0.01,
          phase=PP_PHASE, events=events.pipeline_events,
          active=lambda plan, model=None: _degree(plan, "pp") > 1,
          description="activations and their gradients between pipeline stages")

EP = Axis(name="ep", tensor="activations", mesh_axis="ep", error="forwarded", feedback=False, max_error=0.05,
          phase=EP_PHASE, events=events.dispatch_events, optional=True,
          active=lambda plan, model=None: _degree(plan, "ep") > 1 and _moe(model),
          memory=lambda plan: {"expert_params": _degree(plan, "ep")},
          description="MoE dispatch: tokens to their experts (all-to-all), forward and backward")
EP_COMBINE = Axis(name="ep_combine", tensor="activations", mesh_axis="ep", error="forwarded", feedback=False,
                  max_error=0.01, phase=EP_PHASE, events=events.combine_events, optional=True,
                  active=lambda plan, model=None: _degree(plan, "ep") > 1 and _moe(model),
                  description="MoE combine: expert outputs back to their tokens (all-to-all), forward and backward")
CP = Axis(name="cp", tensor="activations", mesh_axis="cp", error="forwarded", feedback=False, max_error=0.01,
          phase=CP_PHASE, events=events.context_events, optional=True,
          active=lambda plan, model=None: _degree(plan, "cp") > 1,
          description="context parallel: key and value blocks around a ring, beside attention")

AXES: dict[str, Axis] = {a.name: a for a in (DP, ZERO, TP, PP, EP, EP_COMBINE, CP)}
NAMES = tuple(AXES)                       # the order policies, reports and records list axes in
REPORTED = tuple(name for name, a in AXES.items() if not a.optional)   # the axes every report lists
ISSUE_ORDER = ("tp", "cp", "ep", "ep_combine", "pp", "zero", "dp")   # the order a step issues them: TP,
#                                           cp's ring and the MoE all-to-alls inside every layer, PP
#                                           inside every microbatch, ZeRO's gathers before the layers
#                                           they feed, the gradient reductions after


# The axes' phases in the order reports show them and the breakdown adds them up: tp, pp, the
# optional ep and cp, dp's exposed tail last (the order the breakdown has always had, so a step's
# time is the same sum of the same parts to the last bit); the phase of an axis not named here
# follows them, in ISSUE_ORDER.
REPORT_ORDER = (TP_PHASE, PP_PHASE, EP_PHASE, CP_PHASE, DP_PHASE)
AXIS_PHASES = tuple(dict.fromkeys(REPORT_ORDER + tuple(AXES[name].phase for name in ISSUE_ORDER)))
PHASES: tuple[Phase, ...] = LEADING + AXIS_PHASES + TRAILING   # every step phase, in report order
PHASE_NAMES = tuple(p.name for p in PHASES)   # the breakdown's keys, in the order reports show them


def fed_back(axis: str, codec) -> bool:
    """Whether ``codec`` on ``axis`` is compensated across steps: its spec feeds its error back
    and the axis lets it (gradients: what one step drops the next re-sends)."""
    return AXES[axis].feedback and codec.error_feedback


def active_axes(plan, model=None) -> tuple[str, ...]:
    """The axes that carry traffic in ``plan`` (a ParallelPlan, realrun TrainConfig or plan
    dict); with ``model``, the tied embedding's gradient sum counts for dp when pp > 1."""
    return tuple(name for name, axis in AXES.items() if axis.active(plan, model))


def step_events(ctx: StageContext) -> list:
    """Every axis's events on one stage, in the order the step issues them (``ISSUE_ORDER``)."""
    return [e for name in ISSUE_ORDER for e in AXES[name].events(ctx)]


__all__ = ["AXES", "Axis", "ISSUE_ORDER", "MESH_AXES", "NAMES", "PHASES", "PHASE_NAMES", "active_axes", "step_events"]
