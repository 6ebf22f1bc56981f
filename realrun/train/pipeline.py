"""Pipeline parallelism on realrun.comm: the layers split into stages as perfmodel splits them
(``ParallelPlan.stage_layers``: earlier stages take the remainder), microbatches run under a
schedule, activations and their gradients move between neighbouring stages under the policy's
``pp`` spec.

Schedules (``schedule``), each a list of ("F", m) / ("B", m) operations per stage:

* ``gpipe`` (Huang et al., NeurIPS 2019): every forward, then every backward; a stage keeps
  all ``m`` microbatches' activations.
* ``1f1b`` (PipeDream-Flush, Narayanan et al., SC21; Megatron-LM's default): ``pp - s - 1``
  warm-up forwards on stage s, then one forward and one backward alternately, then the
  remaining backwards; at most ``pp - s`` microbatches in flight.

Both have the same bubble, ``(pp - 1) / m`` of the ideal time; 1F1B bounds memory. The send
that ends one operation and the receive that starts the next go out together
(``Comm.exchange``: both posted before either waits, as Megatron batches them), so no two
neighbours wait on each other. With ``pp = 1`` a stage is the whole model and ``1f1b`` is
the plain loop: forward and backward per microbatch, gradients accumulating.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from perfmodel.step.schedule import stage_ops
from realrun.comm import Comm, CommStats
from realrun.train.accuracy import RelativeError
from realrun.train.clock import now
from realrun.train.runtime import AxisTiming, meter, value


def schedule(name: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The operations of ``stage`` in order: perfmodel's (``perfmodel.step.schedule.stage_ops``), so
    the run and the prediction time the same lists."""
    return stage_ops(name, stage, stages, microbatches)


@dataclass
class PhaseTimes:
    """Seconds of one run of the passes on this rank (the collectives inside them included)."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    loss_sum: float = 0.0      # the last stage's loss, summed over microbatches (already / m)


class Pipeline:
    """One rank's stage: its neighbours (global ranks, None at the ends), the p2p ``Comm`` and
    the ``pp`` axis of the policy; what its transfers cost since the last ``take`` (the pp axis's
    ``realrun.train.runtime.AxisRuntime``: inside send/recv, transfers, their kernels and the wait
    for a neighbour, all apart from the passes)."""

    axis_names = ("pp",)

    def __init__(self, name: str, stage: int, stages: int, comm: Comm | None, axis,
                 prev_rank: int | None, next_rank: int | None, device: torch.device | None = None):
        self.name, self.stage, self.stages, self.device = name, stage, stages, device
        self.comm, self.axis = comm, axis
        self.prev, self.next = prev_rank, next_rank
        self.first, self.last = stage == 0, stage == stages - 1
        self._sent: list = []   # a measured step's transfers (tensor, dst, like, src, received)
        self.error: RelativeError | None = None   # what this rank received against what was sent (measured steps)
        self._reset()

    def _reset(self) -> None:
        self.pp_s, self.stats = 0.0, CommStats()

    def start_step(self, measure: bool) -> None:
        self.error = meter(measure, self.stages)

    def take(self) -> AxisTiming:
        """What the transfers cost since the last call (their error on a measured step), then reset."""
        out = AxisTiming(apart_s=self.pp_s, stats={"pp": self.stats}, errors={"pp": value(self.error)})
        self._reset()
        self.error = None
        return out

    def run(self, model, batches: list, hidden_shape: tuple, backward: bool = True) -> PhaseTimes:
        """Forward (and backward) of ``batches`` [(inputs, targets)] through this stage under
        the schedule; gradients accumulate in ``model``. ``hidden_shape``: the activation a
        stage sends (mbs, seq, hidden). On a measured step (``start_step``, every rank alike):
        after the schedule, its transfers are made again uncompressed and uncounted, and what
        arrived is measured against them."""
        m = len(batches)
        ops = schedule(self.name, self.stage, self.stages, m) if backward else [("F", i) for i in range(m)]
        times, state = PhaseTimes(), {}
        pending = None   # (tensor, dst, key): the previous operation's send, not yet made
        like = torch.empty(hidden_shape, device=self.device)
        for kind, i in ops:
            src = self.prev if kind == "F" else self.next
            received = self._p2p(pending, like if src is not None else None, src, f"{kind}{i}")
            pending = self._forward(model, batches[i], received, state, i, m, times) if kind == "F" \
                else self._backward(received, state.pop(i), times)
        self._p2p(pending, None, None, "")
        if self.error is not None:
            self._measure(self.error)
        return times

    def _forward(self, model, batch, received, state, i, m, times):
        inputs = self._tensor(batch[0]) if self.first else received.requires_grad_()
        start = now(self.device)
        out = model.stage_forward(inputs, self._tensor(batch[1]) if self.last else None)
        if self.last:
            out = out / m
            times.loss_sum += float(out.detach())
        times.forward_s += now(self.device) - start
        if out.requires_grad:   # kept for the backward (not in evaluation)
            state[i] = (inputs, out)
        return None if self.last else (out.detach(), self.next, "act")

    def _tensor(self, array) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def _backward(self, grad, saved, times):
        inputs, out = saved
        start = now(self.device)
        out.backward(None if self.last else grad)
        times.backward_s += now(self.device) - start
        return None if self.first else (inputs.grad, self.prev, "grad")

    def _p2p(self, pending, like, src, key) -> torch.Tensor | None:
        """Make the pending send and this operation's receive at once (``Comm.exchange``)."""
        if pending is None and like is None:
            return None
        tensor, dst, send_key = pending if pending is not None else (None, None, "")
        start = now(self.device)
        codec = self.axis.codec_for(like.numel() * like.element_size() if like is not None
                                    else tensor.numel() * tensor.element_size())
        out = self.comm.exchange(tensor, dst, like, src, codec, key=send_key or key, stats=self.stats)
        self.pp_s += now(self.device) - start
        if self.error is not None:
            self._sent.append((tensor, dst, like, src, out))
        return out

    def _measure(self, error: RelativeError) -> None:
        """Replay this step's transfers uncompressed, in the same order (so as free of deadlock
        as the schedule), and measure what arrived compressed against what arrives now."""
        for tensor, dst, like, src, received in self._sent:
            exact = self.comm.exchange(tensor, dst, like, src, "none")
            if received is not None:
                error.add(received, exact)
        self._sent = []
