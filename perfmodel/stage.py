"""A pipeline stage of a plan, as the axes' event generators see it (``perfmodel.events``).

Its own module because it reads what a GPU of the stage holds (``perfmodel.plan.memory``), and
memory reads the axes' declarations, which name the event generators: the generators take a
``StageContext`` without importing this module, so no import cycle is hidden in a function.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from perfmodel.plan.memory import stage_param_split, stage_params
from perfmodel.plan.mesh import Mesh
from perfmodel.plan.parallel import ParallelPlan
from perfmodel.workload import ModelSpec


@dataclass(frozen=True, kw_only=True)
class StageContext:
    """One pipeline stage of a plan, as the axes' event generators see it (``perfmodel.axes``)."""

    model: ModelSpec
    plan: ParallelPlan
    mesh: Mesh
    stage: int
    layers: int
    gpus_per_host: int = 1

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.plan.pp - 1

    @cached_property
    def start(self) -> int:
        """The stage's first layer."""
        return self.plan.stage_first_layer(self.stage, self.model.num_layers)

    @cached_property
    def moe_layers(self) -> int:
        """The stage's MoE layers (their all-to-alls), the MTP modules' on the last stage
        (Megatron-Core builds them there: multi_token_prediction.py, mtp_on_this_rank)."""
        own = self.model.moe_layers_in(self.start, self.layers) if self.model.is_moe else 0
        return own + (self.model.mtp_moe_layers if self.last else 0)

    @cached_property
    def param_split(self) -> tuple[float, float]:
        """(dense, routed-expert) parameters one GPU of this stage holds."""
        return stage_param_split(self.model, self.plan, self.layers, self.first, self.last, self.start)

    @cached_property
    def stage_params(self) -> float:
        """Parameters one GPU of this stage holds (``perfmodel.plan.memory.stage_params``)."""
        return stage_params(self.model, self.plan, self.layers, self.first, self.last, self.start)
