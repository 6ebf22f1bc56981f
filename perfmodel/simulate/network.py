"""Flows sharing links, as a fluid: every active flow on a link gets an equal share of it.

A flow crosses one or more links (a rank's NIC out, the peer's NIC in) and carries a volume
measured in seconds *alone* (what the collective model says it takes with the links to itself:
its latency and bandwidth terms, its protocol). With n flows on a link each gets 1/n of it; a
flow moves at the share of its most crowded link. Whenever a flow starts or ends, the others'
progress is settled and their rates recomputed (the classic fluid model of link sharing; for
flows that share at most one link it is max-min fair). Two equal flows on one link both take
twice as long (tested).
"""
from __future__ import annotations

from dataclasses import dataclass, field

EPS_S = 1e-12   # a flow with less work left than this has ended (floating-point residue)


@dataclass(eq=False)
class Flow:
    links: tuple
    remaining: float             # seconds of work alone
    done: object                 # callback when it ends
    rate: float = 1.0
    started: float = 0.0
    busy: list = field(default_factory=list)   # (start, end, rate) pieces, for traces


class Network:
    def __init__(self, core):
        self.core = core
        self.active: list[Flow] = []
        self.link_flows: dict = {}     # link -> [(time, flows on it from then on), ...]: trace counters
        self._last = 0.0
        self._version = 0
        self._load: dict = {}

    def start(self, links: tuple, alone_s: float, done) -> Flow:
        """Start a flow that alone would take ``alone_s`` seconds; ``done()`` when it ends."""
        self._settle()
        flow = Flow(links=tuple(links), remaining=max(0.0, alone_s), done=done, started=self.core.now)
        self.active.append(flow)
        self._reschedule()
        return flow

    def _settle(self) -> None:
        now = self.core.now
        for f in self.active:
            f.remaining = max(0.0, f.remaining - f.rate * (now - self._last))
        self._last = now

    def _reschedule(self) -> None:
        load: dict = {}
        for f in self.active:
            for link in f.links:
                load[link] = load.get(link, 0) + 1
        for f in self.active:
            f.rate = min((1.0 / load[link] for link in f.links), default=1.0)
        self._count(load)
        self._version += 1
        if self.active:
            nxt = min(f.remaining / f.rate for f in self.active)
            version = self._version
            self.core.after(nxt, lambda: self._finish(version))

    def _count(self, load: dict) -> None:
        for link in load.keys() | self._load.keys():
            if load.get(link, 0) != self._load.get(link, 0):
                self.link_flows.setdefault(link, []).append((self.core.now, load.get(link, 0)))
        self._load = load

    def busiest(self, limit: int) -> list:
        """Up to ``limit`` links, most busy seconds first (seconds with at least one flow)."""
        def busy(samples):
            return sum(t1 - t0 for (t0, n), (t1, _) in zip(samples, samples[1:]) if n)
        return sorted(self.link_flows, key=lambda link: -busy(self.link_flows[link]))[:limit]

    def _finish(self, version: int) -> None:
        if version != self._version:   # a start or end since changed every rate: a newer event stands
            return
        self._settle()
        ended = [f for f in self.active if f.remaining <= EPS_S]
        self.active = [f for f in self.active if f.remaining > EPS_S]
        self._reschedule()
        for f in ended:
            f.done()
