"""What compression costs in accuracy, measured where it happens: the relative error
``||y - exact|| / ||exact||`` of a compressed result against the exact one, accumulated over
the tensors of one step (sums of squares in float64, so the step's value is the error of all
its tensors taken as one vector: comparable with perfmodel's ``error_estimate`` per axis)."""
from __future__ import annotations

import math

import torch


class RelativeError:
    def __init__(self):
        self.err2 = self.ref2 = 0.0
        self.count = 0

    def add(self, result: torch.Tensor, exact: torch.Tensor) -> None:
        result, exact = result.detach().double(), exact.detach().double()
        self.err2 += float((result - exact).square().sum())
        self.ref2 += float(exact.square().sum())
        self.count += 1

    def value(self) -> float | None:
        """The step's relative error; None where nothing was measured (0.0 for an exact zero)."""
        if not self.count:
            return None
        return math.sqrt(self.err2 / self.ref2) if self.ref2 > 0 else 0.0
