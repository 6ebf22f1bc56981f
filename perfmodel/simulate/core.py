"""Event cores for the step simulation: callbacks run at simulated times, in time order.

Two interchangeable cores with one interface (``now``, ``after(delay, fn)``, ``run()``):
``HeapCore`` (a binary heap of (time, sequence, callback), written here) and ``SimPyCore``
(SimPy's environment, each callback a timeout's callback). The simulation only schedules
callbacks, so both give the same timeline; ``HeapCore`` is the default because it is faster
for this workload (``benchmarks/bench_des.py``; numbers in docs/design.md, The discrete-event
engine). Ties run in the order they were scheduled, in both.
"""
from __future__ import annotations

import heapq


class HeapCore:
    """A time-ordered heap of callbacks."""

    name = "heap"

    def __init__(self):
        self.now = 0.0
        self.handled = 0          # callbacks run: the simulation's events
        self._queue: list = []
        self._seq = 0

    def after(self, delay: float, fn) -> None:
        heapq.heappush(self._queue, (self.now + max(0.0, delay), self._seq, fn))
        self._seq += 1

    def run(self) -> None:
        while self._queue:
            self.now, _, fn = heapq.heappop(self._queue)
            self.handled += 1
            fn()


class SimPyCore:
    """The same interface on SimPy (``pip install simpy``)."""

    name = "simpy"

    def __init__(self):
        import simpy

        self.env = simpy.Environment()
        self.handled = 0

    @property
    def now(self) -> float:
        return self.env.now

    def after(self, delay: float, fn) -> None:
        self.env.timeout(max(0.0, delay)).callbacks.append(lambda _event: self._handle(fn))

    def _handle(self, fn) -> None:
        self.handled += 1
        fn()

    def run(self) -> None:
        self.env.run()


CORES = {"heap": HeapCore, "simpy": SimPyCore}
