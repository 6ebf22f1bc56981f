"""One training step as events: pipeline stages, their transfers and their gradient buckets,
with link sharing between concurrent traffic.

Ranks that are alike (same stage, same place in their TP and DP groups) behave alike, so one
rank per pipeline stage is simulated: the cost grows with stages x microbatches x buckets, not
with GPUs. Each simulated rank has

* a **compute stream** running its schedule's operations in order (``perfmodel.step.schedule``:
  GPipe, 1F1B); before each operation the exchange of the previous one's output and this
  one's input, as ``run_schedule`` times it (a transfer starts when both ends posted it);
* a **communication stream** for its gradient buckets: each becomes ready during the
  stage's last backward at the point the analytical model puts it (``CommEvent.ready_at`` and
  ``spacing`` of that backward), or, without overlap, once the stage's schedule is done (its
  last send included, as realrun's trainer reduces), and they run in order;
* a **NIC**, one link out and one in, shared as a fluid (``network``): a pipeline transfer
  crosses its sender's out-link and its receiver's in-link; a gradient bucket (a ring) both
  links of its rank. TP collectives stay inside the operations (NVLink, not shared here); a
  MoE all-to-all whose expert-parallel group spans nodes runs at the end of its operation as
  a flow on both NIC links of its rank (``StageWork.nic_fwd``, ``nic_bwd``), so it shares them
  with the gradient buckets of the same rank.

Every piece of work carries the seconds the analytical model gives it alone, so where nothing
runs at the same time on one link the simulation reproduces the closed form (tested on a grid
of plans); where traffic overlaps, it is slower by the sharing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from perfmodel.step.schedule import BLOCKING, exchanges
from perfmodel.step.timing import zero3_backward
from perfmodel.simulate.core import CORES
from perfmodel.simulate.network import Network


BUSIEST_LINKS = 8   # links whose active-flow counts a trace shows


@dataclass(frozen=True)
class StageWork:
    """One pipeline stage: per-microbatch operation and transfer seconds (``StageTime``) and its
    gradient bucket runs (first ready, spacing, count, seconds), fractions of its last backward."""

    fwd: float
    bwd: float
    send_fwd: float
    send_bwd: float
    buckets: tuple = ()
    zero3: tuple = ()     # (layers, fwd and bwd compute per layer, gather fwd, gather bwd, reduce-scatter)
    nic_fwd: float = 0.0  # of fwd: cross-node all-to-all seconds, run as a NIC flow
    nic_bwd: float = 0.0  # of bwd, likewise
    pair: float = 0.0     # all-to-all seconds a paired forward and backward hide (perfmodel.step.expert_overlap)
    pair_nic: bool = False  # whether they cross nodes (a flow on the rank's NIC; else its NVLink, not shared here)


@dataclass
class SimResult:
    end_s: float                      # the last stage's last work: operations and buckets
    stage_end_s: list
    ops: list = field(default_factory=list)        # (stage, kind, microbatch, start, end)
    transfers: list = field(default_factory=list)  # (kind, microbatch, src, dst, start, end)
    buckets: list = field(default_factory=list)    # (stage, index, ready, start, end)
    layer_comm: list = field(default_factory=list)  # ZeRO-3: (stage, "gather"/"reduce-scatter", layer, mb, start, end)
    op_comm: list = field(default_factory=list)     # cross-node all-to-alls: (stage, kind, mb, start, end)
    hidden_comm: list = field(default_factory=list)  # hidden all-to-alls of a pair: (stage, mb, start, end)
    events: int = 0                                # callbacks the event core ran
    link_flows: dict = field(default_factory=dict)  # busiest links: [(time, active flows), ...]


class _Stage:
    def __init__(self, sim, s: int, work: StageWork, plan_items):
        self.sim, self.s, self.work, self.items = sim, s, work, plan_items
        self.pos, self.end, self.waiting = 0, 0.0, False
        self.queue: list = []        # ready buckets (index, seconds, ready time)
        self.paired = _paired(plan_items, work.pair > 0)   # positions of paired forwards (their pair's flow starts)
        self.pair_end = None         # when the running pair's hidden all-to-alls end (None: none running)
        self.comm_busy = False
        self.comm_end = 0.0


class StepSim:
    def __init__(self, stages: list[StageWork], schedule: str, microbatches: int, overlap: bool = True,
                 core: str = "heap", chunks: int = 1):
        self.core = CORES[core]()
        self.net = Network(self.core)
        self.overlap, self.chunks, self.blocking = overlap, chunks, schedule in BLOCKING
        p, m = len(stages), microbatches
        self.stages = [_Stage(self, s, w, exchanges(schedule, s, p, m, chunks)) for s, w in enumerate(stages)]
        self.last_backward = {s: max(i for i, (_, op) in enumerate(st.items) if op and op[0] == "B")
                              for s, st in enumerate(self.stages)}
        self.posted: dict = {}
        self.done: dict = {}
        self.result = SimResult(end_s=0.0, stage_end_s=[0.0] * p)

    def run(self) -> SimResult:
        for st in self.stages:
            self.core.after(0.0, lambda st=st: self._advance(st))
        self.core.run()
        ends = [max(st.end, st.comm_end) for st in self.stages]
        self.result.stage_end_s, self.result.end_s = ends, max(ends)
        self.result.events = self.core.handled
        self.result.link_flows = {link: self.net.link_flows[link] for link in self.net.busiest(BUSIEST_LINKS)}
        return self.result

    # --- the compute stream -------------------------------------------------------------------
    def _advance(self, st: _Stage) -> None:
        """Post this position's exchange; run its operation once every transfer of it is done."""
        if st.pos == len(st.items):
            st.end = self.core.now
            if not self.overlap:   # reduced after the stage's whole schedule, its last send included
                self._buckets_ready(st, self.core.now, 0.0)
            return
        transfers, op = st.items[st.pos]
        for t in transfers:
            ends = self.posted.setdefault(t, set())
            if st.s not in ends:
                ends.add(st.s)
                if len(ends) == 2:
                    self._transfer(t)
        if not all(t in self.done for t in transfers if self.blocking or t[3] == st.s):
            st.waiting = True
            return
        st.waiting = False
        if op is None:
            st.pos += 1
            self._advance(st)
            return
        kind, mb = op[0], op[1]
        d = (st.work.fwd if kind == "F" else st.work.bwd) / self.chunks
        start = self.core.now
        if self.overlap and st.pos == self.last_backward[st.s]:
            self._buckets_ready(st, start, d)
        st.pos += 1

        if st.pos - 1 in st.paired:
            self._hidden(st, mb, st.work.pair / self.chunks)
        closes = kind == "B" and st.pair_end is not None

        def finished():
            self.result.ops.append((st.s, kind, mb, start, self.core.now) + tuple(op[2:]))
            if closes and st.pair_end is not True:     # the pair's hidden all-to-alls still running: wait for them
                st.pair_end = lambda: self._advance(st)
                return
            if closes:
                st.pair_end = None
            self._advance(st)
        nic = (st.work.nic_fwd if kind == "F" else st.work.nic_bwd) / self.chunks
        if st.work.zero3:
            _Layers(self, st, kind == "F", mb, d, finished).start()
        elif nic > 0:
            self.core.after(max(0.0, d - nic), lambda: self._alltoall(st, kind, mb, nic, finished))
        else:
            self.core.after(d, finished)

    def _transfer(self, t) -> None:
        kind, mb, src, dst = t[:4]
        work = self.stages[src].work          # a microbatch's sends, one per chunk
        alone = (work.send_fwd if kind == "act" else work.send_bwd) / self.chunks
        start = self.core.now

        def arrived():
            self.done[t] = self.core.now
            self.result.transfers.append((kind, mb, src, dst) + t[4:] + (start, self.core.now))
            for s in (src, dst):
                if self.stages[s].waiting:
                    self._advance(self.stages[s])
        self.net.start((("out", src), ("in", dst)), alone, arrived)

    def _alltoall(self, st: _Stage, kind: str, mb: int, seconds: float, finished) -> None:
        """An operation's cross-node all-to-all seconds as a flow on its rank's NIC, both ways."""
        start = self.core.now

        def ended():
            self.result.op_comm.append((st.s, kind, mb, start, self.core.now))
            finished()
        self.net.start((("out", st.s), ("in", st.s)), seconds, ended)

    def _hidden(self, st: _Stage, mb: int, seconds: float) -> None:
        """A forward-backward pair's hidden all-to-alls (``expert_overlap``): started with the forward on
        the communication stream, a flow on the rank's NIC where they cross nodes; the pair's backward
        ends no earlier than they do (alone they fit inside the pair's compute: nothing waits)."""
        start = self.core.now
        st.pair_end = False

        def ended():
            self.result.hidden_comm.append((st.s, mb, start, self.core.now))
            waiting, st.pair_end = st.pair_end, True
            if callable(waiting):
                st.pair_end = None
                waiting()
        if st.work.pair_nic:
            self.net.start((("out", st.s), ("in", st.s)), seconds, ended)
        else:
            self.core.after(seconds, ended)

    # --- the communication stream ---------------------------------------------------------------
    def _buckets_ready(self, st: _Stage, start: float, window: float) -> None:
        index = 0
        for first, spacing, count, seconds in st.work.buckets:
            for k in range(int(count)):
                ready = start + (first + k * spacing) * window
                self.core.after(ready - self.core.now, lambda i=index, r=ready, d=seconds: self._bucket(st, i, r, d))
                index += 1

    def _bucket(self, st: _Stage, index: int, ready: float, seconds: float) -> None:
        st.queue.append((index, seconds, ready))
        self._next_bucket(st)

    def _next_bucket(self, st: _Stage) -> None:
        if st.comm_busy or not st.queue:
            return
        index, seconds, ready = st.queue.pop(0)
        st.comm_busy, start = True, self.core.now

        def finished():
            st.comm_busy, st.comm_end = False, self.core.now
            self.result.buckets.append((st.s, index, ready, start, self.core.now))
            self._next_bucket(st)
        self.net.start((("out", st.s), ("in", st.s)), seconds, finished)


def _paired(items, pairs: bool) -> frozenset:
    """Positions (in a stage's exchange list) of forwards paired with the backward right after them
    (``expert_overlap.paired_fraction``): 1F1B's steady forwards, the first dropped where it is the same
    micro-batch as its backward (no warm-up: Megatron pairs a forward with the previous backward)."""
    if not pairs:
        return frozenset()
    ops = [(i, op) for i, (_, op) in enumerate(items) if op]
    out = [(i, a[1:] == b[1:]) for (i, a), (_, b) in zip(ops, ops[1:]) if a[0] == "F" and b[0] == "B"]
    if out and out[0][1]:
        out = out[1:]
    return frozenset(i for i, _ in out)


class _Layers:
    """One operation of a ZeRO-3 stage layer by layer: compute on the compute stream, parameter
    gathers (one layer ahead) and gradient reduce-scatters on one communication stream in the
    order issued, each a flow on the rank's NIC; the rest of the operation (TP, kernels) after
    the layers. ``perfmodel.step.timing.zero3_backward`` is the same without other traffic (tested)."""

    def __init__(self, sim: StepSim, st: _Stage, forward: bool, mb: int, seconds: float, done):
        layers, c_f, c_b, g_f, g_b, rs = st.work.zero3
        self.sim, self.st, self.mb, self.done = sim, st, mb, done
        self.compute, self.gather = (c_f, g_f) if forward else (c_b, g_b)
        self.reduce = 0.0 if forward else rs
        self.order = list(range(layers)) if forward else list(range(layers - 1, -1, -1))
        alone = zero3_backward(layers, self.compute, self.gather, self.reduce)
        self.rest = max(0.0, seconds - alone)       # TP and kernels: the operation beyond its layers
        self.pos, self.computing, self.gathered, self.reducing = 0, False, set(), 0
        self.queue, self.comm_busy, self.ended = [], False, False

    def start(self) -> None:
        self._issue("gather", self.order[0], self.gather)

    def _issue(self, kind: str, layer: int, seconds: float) -> None:
        self.queue.append((kind, layer, seconds))
        self._pump()

    def _pump(self) -> None:
        if self.comm_busy or not self.queue:
            return
        kind, layer, seconds = self.queue.pop(0)
        self.comm_busy, begin, s = True, self.sim.core.now, self.st.s

        def ended():
            self.comm_busy = False
            self.sim.result.layer_comm.append((s, kind, layer, self.mb, begin, self.sim.core.now))
            if kind == "gather":
                self.gathered.add(layer)
                self._compute()
            else:
                self.reducing -= 1
                self._finish()
            self._pump()
        self.sim.net.start((("out", s), ("in", s)), seconds, ended)

    def _compute(self) -> None:
        if self.computing or self.pos == len(self.order) or self.order[self.pos] not in self.gathered:
            return
        self.computing = True
        if self.pos + 1 < len(self.order):
            self._issue("gather", self.order[self.pos + 1], self.gather)
        self.sim.core.after(self.compute, self._computed)

    def _computed(self) -> None:
        layer, self.computing = self.order[self.pos], False
        self.pos += 1
        if self.reduce:
            self.reducing += 1
            self._issue("reduce-scatter", layer, self.reduce)
        self._compute()
        self._finish()

    def _finish(self) -> None:
        if self.pos == len(self.order) and not self.computing and not self.reducing and not self.ended:
            self.ended = True
            self.sim.core.after(self.rest, self.done)


def simulate(stages: list[StageWork], schedule: str, microbatches: int, overlap: bool = True,
             core: str = "heap", chunks: int = 1) -> SimResult:
    """Simulate one step of ``stages`` (module doc); ``chunks``: V of the interleaved schedule."""
    return StepSim(stages, schedule, microbatches, overlap, core, chunks).run()
