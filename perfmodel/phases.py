"""Step phases: the parts a step's time is broken into, each declared once.

A ``Phase`` is one part of the step's breakdown: its key (``compute_s``, ``tp_comm_s``, ...),
the short name tables show, what it holds, whether it is shown only where it is nonzero
(``optional``), and where a real run's measurement holds it (``measured_in``: realrun's trainer
cannot tell the pipeline bubble from the waits of its pipeline transfers, so the predicted
bubble is compared with the measured ``pp_comm_s``).

The breakdown is the fixed parts declared here plus one part per parallel axis, declared on the
axis (``perfmodel.axes.Axis.phase``; axes that share a phase, dp and zero, ep and ep_combine,
share one object). ``perfmodel.axes.PHASES`` lists them all in the order reports show them:
``LEADING``, the axes' phases (``perfmodel.axes.REPORT_ORDER``), then ``TRAILING``. Every consumer
(the breakdown record, the text reports, the plots, realrun's trainer, validation's predicted
and measured columns) derives its columns from that tuple; a new phase is one declaration.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One part of the step's breakdown (module doc)."""

    name: str                  # the breakdown key, in seconds: predicted_<name> / measured_<name> in validation
    short: str                 # the column a table shows
    description: str
    optional: bool = False     # shown only where some record has it nonzero
    measured_in: str = ""      # the phase a real run's measurement holds it in ("": its own, or not measured)
    engines: tuple = ()        # only the engines that produce it (empty: every engine)

    @property
    def label(self) -> str:
        """The words a legend shows (``tp_comm_s`` -> ``tp comm``)."""
        return self.name.removesuffix("_s").replace("_", " ")


COMPUTE = Phase(name="compute_s", short="compute",
                description="the layers' compute on the critical path (GEMMs, attention, memory-bound, host)")
COMPRESSION = Phase(name="compression_s", short="compress",
                    description="compression kernels on the critical path (every axis's codecs)")
BUBBLE = Phase(name="bubble_s", short="bubble", measured_in="pp_comm_s",
               description="pipeline idle time beyond the stage's own transfers")
OPTIMIZER = Phase(name="optimizer_s", short="optim", description="the optimizer step")
OVERLAP_SLOWDOWN = Phase(name="overlap_slowdown_s", short="slowdown", measured_in="optimizer_s",
                         description="compute slowed by communication and kernels running beside it")
CONTENTION = Phase(name="contention_s", short="contention", engines=("des",),
                   description="the event engine's step minus the closed forms' (link sharing)")

LEADING = (COMPUTE,)                                                    # before the axes' phases
TRAILING = (COMPRESSION, BUBBLE, OPTIMIZER, OVERLAP_SLOWDOWN, CONTENTION)   # after them

__all__ = ["BUBBLE", "COMPRESSION", "COMPUTE", "CONTENTION", "LEADING", "OPTIMIZER", "OVERLAP_SLOWDOWN", "Phase",
           "TRAILING"]
