"""The clock of a training rank's phases: on a GPU, kernels run asynchronously, so the
device is synchronized before the time is read (what a phase took, not what it queued)."""
from __future__ import annotations

import time

import torch


def now(device: torch.device | None = None) -> float:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
