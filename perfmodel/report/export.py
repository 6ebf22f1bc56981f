"""The predicted step for other simulators: a Chakra execution trace and a SimAI (AICB) workload.

Both are written from the step ``predict`` times (``predicted_step``): compute durations from the
model (``StageTime``: a stage's forward and backward compute per microbatch) and every collective
at its size AFTER compression: the message the collective carries on the wire, ``nbytes /
compression_ratio`` of its ``CollectiveRecord`` under the policy (a ``none`` policy and a compressed
one give different files); the compressor is named beside each (a Chakra attribute, a SimAI row's
name). Sizes are the message of the call as commpress counts it (the whole buffer: an all-gather's
output, a reduce-scatter's input, nccl-tests' convention); the simulator applies its own algorithm.

The order of a stage's operations is the trace's (``perfmodel.report.trace.trace_events``: the
schedule's forward and backward operations, its transfers with their flow ids): each operation's
compute is cut into equal pieces between the collectives that sit inside it (TP, the MoE
all-to-alls, cp's K/V ring, ZeRO-3's per-layer gathers; ``CommEvent.where`` critical, attention,
zero3: ``round(count / microbatches)`` calls per microbatch, a model chunk's share with interleaving);
gradient buckets (``overlap``) follow the stage's last backward, each waiting for the piece of it at
its ``ready_at``; then the optimizer and the ``tail`` events (ZeRO's parameter gather, the tied
embedding).

**Chakra** (mlcommons/chakra @ 6dc63e14, ``schema/protobuf/et_def.proto``): one file per rank,
``<folder>/<name>.<rank>.et``, a ``GlobalMetadata`` then ``Node`` messages, each preceded by its
length as a varint (``src/third_party/utils/protolib.py``, ``encodeMessage``); COMP_NODE with
``duration_micros``, COMM_COLL_NODE with ``comm_type`` and ``comm_size`` (int64, as
``src/converter/text_converter.py`` @ 34f95f96 writes them), COMM_SEND_NODE / COMM_RECV_NODE with
``comm_src``, ``comm_dst``, ``comm_tag``; ``is_cpu_op`` false; dependencies as ``data_deps``;
the attribute names ASTRA-sim reads (astra-sim/astra-sim @ 518bd513, ``astra-sim/workload/Workload.cc``:
``issue_coll_comm`` line 337 on, the send and receive at 395-403, through astra-sim/chakra's
``src/feeder_v3/et_feeder_node.cpp``). Each collective names its group in ``pg_name``;
``comm_group.json`` maps it to its ranks, ``{"1": [0, 1], ...}`` (ASTRA-sim's
``--comm-group-configuration``, read by ``initialize_comm_groups``, line 75; ids from 1: ``""`` and
``"0"`` mean every rank, ``extract_comm_group``, line 589). The messages are encoded by the ``protobuf`` package (the
``export`` extra) from a descriptor built here with et_def.proto's message, field and enum numbers
(the subset written: no protoc at install time).

**SimAI** (aliyun/SimAI @ cef83f9d, ``astra-sim-alibabacloud/astra-sim/workload/Workload.cc``,
``initialize_workload``, lines 1136-1550): a header line ``HYBRID_TRANSFORMER_FWD_IN_BCKWD
model_parallel_NPU_group: tp ep: ep pp: pp vpp: V ga: microbatches all_gpus: N checkpoints: 0
checkpoint_initiates: 0 pp_comm: BYTES`` (as aliyun/aicb @ 23eec3c4,
``workload_generator/SimAI_training_workload_generator.py``, ``dump_file``, writes it), the row count,
then one row per layer piece: ``name -1 fwd_ns fwd_type fwd_bytes ig_ns ig_type ig_bytes wg_ns wg_type
wg_bytes update_ns``, times in ns (SimAI's tick: ``CLOCK_PERIOD 1``, ``system/Common.hh``). It
describes stage 0 (SimAI prices the pipeline from ``pp_comm``): its microbatches' forward pieces in
order, the backward pieces in the order SimAI runs them (rows backwards), then the gradient
buckets, optimizer and tail as weight-gradient rows (the DP group). What the format cannot hold
(cp's ring sends, a DP-group collective in a forward or input-gradient slot) is left out and said.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

from perfmodel.engines import engine_for
from perfmodel.engines.analytical import cost
from perfmodel.phases import OPTIMIZER
from perfmodel.plan.mesh import mesh_for
from perfmodel.prediction import _check_fits, _policy, _setup, request_and_options
from perfmodel.report.trace import COMPUTE, SEND_NEXT, SEND_PREV, trace_events
from topologies import InputError
from topologies.clikit import atomic_write, check_writable

INSIDE = ("critical", "attention", "zero3")     # CommEvent.where of the calls inside an operation
CHAKRA_COLL = {"allreduce": 0, "allgather": 2, "broadcast": 5, "alltoall": 6, "reduce_scatter": 7}  # et_def.proto
CHAKRA_NODE = {"comp": 4, "send": 5, "recv": 6, "coll": 7}    # NodeType: COMP_NODE, COMM_SEND/RECV_NODE, COMM_COLL_NODE
CHAKRA_SCHEMA = "1.0.2-chakra.1.0.0"            # text_converter.py's GlobalMetadata "schema"
SIMAI_OPS = {"allreduce": "ALLREDUCE", "allgather": "ALLGATHER", "reduce_scatter": "REDUCESCATTER",
             "alltoall": "ALLTOALL"}            # Workload.cc's comm types (a suffix _EP, _DP_EP picks the group)
RING_TAG = 1_000_000                            # tags of cp's ring sends, above the pipeline's flow ids


@dataclass(frozen=True)
class Call:
    """One collective or transfer as exported: its event, the message before and after compression."""

    event: object
    message_bytes: int
    wire_bytes: int
    compressor: str

    @property
    def label(self) -> str:
        """``event@compressor``, no whitespace (a SimAI row name)."""
        return re.sub(r"\s+", "_", f"{self.event.name}@{self.compressor}")


@dataclass
class Item:
    """One node of a stage's program: ``comp`` (``seconds``), ``coll``, ``send`` or ``recv`` (``call``;
    ``peer``: the other stage, or for cp's ring +1 / -1 along the ring; ``tag``); ``deps``: indices
    of the items it waits for; ``op``: (F or B, microbatch, chunk) of the operation it belongs to."""

    kind: str
    name: str
    seconds: float = 0.0
    call: Call | None = None
    peer: int = 0
    ring: bool = False
    tag: int = 0
    deps: tuple = ()
    op: tuple | None = None


@dataclass
class Program:
    """A stage's step for one of its ranks (all ranks of a stage run the same one)."""

    stage: int
    items: list = field(default_factory=list)

    def add(self, item: Item) -> int:
        self.items.append(item)
        return len(self.items) - 1


def predicted_step(model: str, cluster: str, plan=None, options=None, **kw) -> tuple:
    """(StepInputs, StepTiming) of the step ``perfmodel.prediction.predict`` times for the same
    arguments (its checks included: a plan that does not fit is refused unless ``allow_oom``)."""
    request, opts = request_and_options(plan, options, **kw)
    setup = _setup(model, cluster, request, opts)
    pol = _policy(opts.policy)
    _check_fits(setup, opts, [pol])
    step = setup.inputs(pol)
    return step, engine_for(opts.engine).time_step(step)


def call_of(step, event) -> Call:
    """The event's call under the step's policy: its message and, compressed, its wire size."""
    rec = cost(step.env, event, step.policy)
    ratio = rec.compression_ratio if rec.compression_ratio > 0 else 1.0
    return Call(event, int(event.nbytes), int(round(event.nbytes / ratio)), rec.compressor)


def programs(step, timing) -> list[Program]:
    """Every stage's program (module doc), in the order of the step's trace."""
    trace = trace_events(timing.stages, step.plan, vars(timing.breakdown), "", 0, timing.simulation)
    calls: dict = {}
    out = []
    for s, events in enumerate(timing.stage_events):
        prog = Program(s)
        events = list(events) + _shared_tail(timing.stage_events, step.plan, s)
        inside = [e for e in events if e.where in INSIDE and e.axis != "pp"]   # pp: the transfers
        last, waits, ops = (), (), []      # what the next operation waits for; each operation's pieces
        for _, _, what, data in _timeline(trace, s):
            if what == "recv":
                waits += (prog.add(Item("recv", data["name"], call=_call(step, calls, data["event"]),
                                        peer=data["peer"], tag=data["tag"])),)
            elif what == "send":
                prog.add(Item("send", data["name"], call=_call(step, calls, data["event"]), peer=data["peer"],
                              tag=data["tag"], deps=ops[-1][-1:] if ops else last))
            else:
                last, pieces = _operation(prog, step, timing.stages[s], calls, inside, data, last + waits)
                waits = ()
                ops.append(pieces)
        _after_backward(prog, step, calls, events, timing, ops[-1] if ops else [], last)
        out.append(prog)
    return out


def _shared_tail(stage_events: list, plan, s: int) -> list:
    """Other stages' tail events whose groups hold ranks of stage ``s`` (the tied embedding's
    all-reduce, which the model lists on the first stage only): ``s`` calls them too, or its
    partners would wait for it."""
    ranks = {g[s] for g in mesh_for(plan).groups["pp"]}
    own = {e.name for e in stage_events[s]}
    return [e for t, events in enumerate(stage_events) if t != s for e in events
            if e.where == "tail" and e.name not in own and any(r in ranks for g in e.concurrent for r in g)]


def _timeline(trace: list, s: int) -> list:
    """Stage ``s``'s operations, sends and recvs as (time, order, kind, data), by time (a recv
    before the operation that starts when it arrives), from the trace's slices and flow arrows
    (each transfer's slice is followed by its flow's start and finish)."""
    out = []
    for i, e in enumerate(trace):
        if e.get("ph") != "X":
            continue
        if e["tid"] == COMPUTE and e["pid"] == s:
            out.append((e["ts"], 1, "op", {"kind": "F" if e["name"].startswith("forward") else "B",
                                           "mb": e["args"]["microbatch"], "chunk": e["args"].get("chunk", 0),
                                           "name": e["name"]}))
        elif e["tid"] in (SEND_NEXT, SEND_PREV) and s in (e["pid"], e["args"]["to_stage"]):
            start, finish = trace[i + 1], trace[i + 2]
            assert start["ph"] == "s" and finish["ph"] == "f" and start["id"] == finish["id"]
            event = ("pp", "fwd" if e["tid"] == SEND_NEXT else "bwd")
            if e["pid"] == s:
                out.append((e["ts"], 2, "send", {"name": e["name"], "peer": e["args"]["to_stage"],
                                                 "tag": start["id"], "event": event}))
            else:
                out.append((finish["ts"], 0, "recv", {"name": e["name"].split(" ->")[0] + f" <- stage {e['pid']}",
                                                      "peer": e["pid"], "tag": start["id"], "event": event}))
    return sorted(out, key=lambda t: (t[0], t[1]))


def _call(step, calls: dict, event) -> Call:
    """The (cached) call of an event, or of the stage's pipeline transfer (``("pp", phase)``)."""
    if isinstance(event, tuple):
        event = next(e for e in step_pp_events(step) if e.phase == event[1])
    key = id(event)
    if key not in calls:
        calls[key] = call_of(step, event)
    return calls[key]


def step_pp_events(step) -> list:
    """The plan's pipeline transfers (one per direction; every boundary moves the same message)."""
    from perfmodel.events import pp_events

    return pp_events(step.model, step.plan, mesh_for(step.plan))


def _op_calls(inside: list, kind: str, chunk: int, m: int, virtual: int) -> list:
    """The events called inside one operation, one-off ones first, then one call of each in turn (a
    layer's collectives in order): ``round(count / m)`` per microbatch, a chunk every ``virtual``-th."""
    phase = "fwd" if kind == "F" else "bwd"
    per = [(e, [i for i in range(int(round(e.count / m))) if i % virtual == chunk]) for e in inside
           if e.phase == phase]
    per.sort(key=lambda p: len(p[1]) > 1)     # one-off calls first: the embedding's forward, the head's backward
    out = []
    for k in range(max((len(idx) for _, idx in per), default=0)):
        out += [e for e, idx in per if k < len(idx)]
    return out


def _operation(prog: Program, step, st, calls: dict, inside: list, op: dict, deps: tuple) -> tuple:
    """Append one operation: compute pieces between its calls. (the items the next one waits
    for, the indices of its compute pieces)."""
    plan = step.plan
    seconds = (st.bwd if op["kind"] == "B" else st.compute - st.bwd) / plan.virtual_stages
    events = _op_calls(inside, op["kind"], op["chunk"], plan.microbatches, plan.virtual_stages)
    key = (op["kind"], op["mb"], op["chunk"])
    piece = seconds / (len(events) + 1)
    pieces = []
    for i in range(len(events) + 1):
        c = prog.add(Item("comp", f"{op['name']} compute {i}", seconds=piece, deps=deps, op=key))
        pieces.append(c)
        deps = (c,)
        if i == len(events):
            break
        call = _call(step, calls, events[i])
        if call.event.op == "sendrecv":          # cp's K/V ring: send to the next rank, recv from the previous
            tag = RING_TAG + len(prog.items)
            a = prog.add(Item("send", f"{call.event.name} send", call=call, peer=1, ring=True, tag=tag, deps=deps,
                              op=key))
            b = prog.add(Item("recv", f"{call.event.name} recv", call=call, peer=-1, ring=True, tag=tag, deps=deps,
                              op=key))
            deps = (a, b)
        else:
            deps = (prog.add(Item("coll", call.event.name, call=call, deps=deps, op=key)),)
    return deps, pieces


def _after_backward(prog: Program, step, calls: dict, events: list, timing, backward: list, last: tuple) -> None:
    """The gradient buckets against the stage's last backward (``backward``: its compute pieces),
    then the optimizer and the tail."""
    buckets = []
    for e in (e for e in events if e.where == "overlap"):
        for k in range(max(1, int(round(e.count)))):
            buckets.append((min(1.0, e.ready_at + k * e.spacing), e))
    buckets.sort(key=lambda b: b[0])
    prev = ()
    for ready, e in buckets:
        at = backward[min(len(backward) - 1, int(ready * len(backward)))] if backward else None
        deps = prev + ((at,) if at is not None else last)
        prev = (prog.add(Item("coll", e.name, call=_call(step, calls, e), deps=deps)),)
    seconds = vars(timing.breakdown).get(OPTIMIZER.name, 0.0)
    deps = tuple(dict.fromkeys(last + prev))
    deps = (prog.add(Item("comp", "optimizer", seconds=seconds, deps=deps)),)
    for e in (e for e in events if e.where == "tail"):
        for _ in range(max(1, int(round(e.count)))):
            deps = (prog.add(Item("coll", e.name, call=_call(step, calls, e), deps=deps)),)


# --- Chakra -------------------------------------------------------------------------------------

def _chakra_classes():
    """(GlobalMetadata, Node, AttributeProto) message classes with et_def.proto's numbers, from
    the protobuf package; refused in one line where it is missing."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise InputError("export_chakra", "protobuf", "the protobuf package (pip install 'commpress[export]')") \
            from None
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="commpress_et_def.proto", package="ChakraProtoMsg",
                                               syntax="proto3")
    attr = proto.message_type.add(name="AttributeProto")
    attr.oneof_decl.add(name="value")
    for name, number, kind in (("name", 1, f.TYPE_STRING), ("doc_string", 2, f.TYPE_STRING)):
        attr.field.add(name=name, number=number, type=kind, label=f.LABEL_OPTIONAL)
    for name, number, kind in (("double_val", 3, f.TYPE_DOUBLE), ("int32_val", 7, f.TYPE_INT32),
                               ("int64_val", 9, f.TYPE_INT64), ("uint64_val", 13, f.TYPE_UINT64),
                               ("bool_val", 27, f.TYPE_BOOL), ("string_val", 29, f.TYPE_STRING)):
        attr.field.add(name=name, number=number, type=kind, label=f.LABEL_OPTIONAL, oneof_index=0)
    meta = proto.message_type.add(name="GlobalMetadata")
    meta.field.add(name="version", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    meta.field.add(name="attr", number=2, type=f.TYPE_MESSAGE, type_name=".ChakraProtoMsg.AttributeProto",
                   label=f.LABEL_REPEATED)
    node = proto.message_type.add(name="Node")
    for name, number, kind, label in (("id", 1, f.TYPE_UINT64, f.LABEL_OPTIONAL),
                                      ("name", 2, f.TYPE_STRING, f.LABEL_OPTIONAL),
                                      ("type", 3, f.TYPE_INT32, f.LABEL_OPTIONAL),   # an enum: the same varint
                                      ("ctrl_deps", 4, f.TYPE_UINT64, f.LABEL_REPEATED),
                                      ("data_deps", 5, f.TYPE_UINT64, f.LABEL_REPEATED),
                                      ("start_time_micros", 6, f.TYPE_UINT64, f.LABEL_OPTIONAL),
                                      ("duration_micros", 7, f.TYPE_UINT64, f.LABEL_OPTIONAL)):
        node.field.add(name=name, number=number, type=kind, label=label)
    node.field.add(name="attr", number=10, type=f.TYPE_MESSAGE, type_name=".ChakraProtoMsg.AttributeProto",
                   label=f.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())
    get = getattr(message_factory, "GetMessageClass", None) or message_factory.MessageFactory(pool).GetPrototype
    return tuple(get(pool.FindMessageTypeByName(f"ChakraProtoMsg.{n}"))
                 for n in ("GlobalMetadata", "Node", "AttributeProto"))


def _varint(n: int) -> bytes:
    """protolib's length prefix: a base-128 varint."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while True:
        bits, n = n & 0x7F, n >> 7
        out.append(bits | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _delimited(body: bytes) -> bytes:
    """A message's bytes after their length (protolib's stream)."""
    return _varint(len(body)) + body


def export_chakra(folder: str, model: str, cluster: str, plan=None, options=None, ranks=None, name: str = "commpress",
                  **kw) -> dict:
    """Write the predicted step as Chakra execution traces, ``<folder>/<name>.<rank>.et`` for each of
    ``ranks`` (default every rank), and ``comm_group.json`` (module doc). The arguments are
    ``predict``'s. Returns {"files": [...], "comm_group": path, "ranks": n, "nodes": nodes per rank}."""
    check_exports(chakra=folder)
    meta_cls, node_cls, attr_cls = _chakra_classes()
    step, timing = predicted_step(model, cluster, plan, options, **kw)
    progs = programs(step, timing)
    os.makedirs(folder, exist_ok=True)
    mesh = mesh_for(step.plan)
    everyone = range(step.plan.degrees.gpus)
    ranks = list(everyone) if ranks is None else [_rank(r, len(everyone)) for r in ranks]
    groups: dict = {}
    for r in everyone:          # group ids fixed over all ranks, whichever are written
        pp = mesh.group_of("pp", r)
        for event in dict.fromkeys(i.call.event for i in progs[pp.index(r)].items if i.kind == "coll"):
            groups.setdefault(_group(event, r), len(groups) + 1)
    policy = request_and_options(plan, options, **kw)[1].policy
    templates = [[_template(node_cls, attr_cls, i, item) for i, item in enumerate(prog.items)] for prog in progs]
    attr = _AttrBytes(attr_cls)
    events = [list(dict.fromkeys(i.call.event for i in prog.items if i.kind == "coll")) for prog in progs]
    files, nodes = [], {}
    for r in ranks:
        pp = mesh.group_of("pp", r)
        s = pp.index(r)
        path = os.path.join(folder, f"{name}.{r}.et")
        meta = meta_cls(version="0.0.4", attr=[attr_cls(name="schema", string_val=CHAKRA_SCHEMA),
                                               attr_cls(name="commpress_policy", string_val=policy),
                                               attr_cls(name="commpress_model", string_val=str(model)),
                                               attr_cls(name="commpress_cluster", string_val=str(cluster)),
                                               attr_cls(name="commpress_rank", int64_val=r),
                                               attr_cls(name="commpress_stage", int64_val=s)])
        pg = {id(e): attr("pg_name", string_val=str(groups[_group(e, r)])) for e in events[s]}
        blobs = [_delimited(meta.SerializeToString())]
        for item, template in zip(progs[s].items, templates[s]):
            if item.kind == "coll":
                blobs.append(_delimited(template + pg[id(item.call.event)]))
            else:
                blobs.append(_delimited(template + _peers(attr, item, r, pp)))
        atomic_write(path, lambda h, b=blobs: h.write(b"".join(b)))
        files.append(path)
        nodes[r] = len(progs[s].items)
    group_path = os.path.join(folder, "comm_group.json")
    text = "{\n" + ",\n".join(f' "{i}": {json.dumps(list(g))}' for g, i in groups.items()) + "\n}\n"
    atomic_write(group_path, lambda h: h.write(text.encode()))
    return {"files": files, "comm_group": group_path, "ranks": len(ranks), "nodes": nodes}


def _rank(r, n: int) -> int:
    if not isinstance(r, int) or not 0 <= r < n:
        raise InputError("ranks", r, f"ranks of the plan, 0 to {n - 1}")
    return r


def check_exports(chakra: str | None = None, simai: str | None = None) -> None:
    """Refuse, before any work, an output that cannot be written, or Chakra without protobuf."""
    if chakra is not None:
        _chakra_classes()
        if os.path.exists(chakra) and not os.path.isdir(chakra):
            raise InputError("export_chakra", chakra, "a folder (it is a file)")
        check_writable(os.path.join(chakra, "commpress.0.et") if os.path.isdir(chakra) else chakra, "export_chakra")
    if simai is not None:
        check_writable(simai, "export_simai")


def _group(event, rank: int) -> tuple:
    """The group of ``event`` that ``rank`` is in (one of ``concurrent``)."""
    return _group_index(event.concurrent).get(rank, tuple(event.group))


@lru_cache(maxsize=1024)
def _group_index(concurrent) -> dict:
    """{rank: its group} of a set of concurrent groups."""
    return {r: tuple(g) for g in reversed(concurrent) for r in g}


def _template(node_cls, attr_cls, i: int, item: Item) -> bytes:
    """A node's bytes but for the attributes that differ between the ranks of its stage (the
    group: ``pg_name``; the peers: ``_peers``), which are appended to them (a repeated field's entries
    may follow the message's other fields: the encoding is a concatenation of fields)."""
    node = node_cls(id=i, name=item.name, type=CHAKRA_NODE[item.kind], data_deps=list(item.deps))
    attrs = [attr_cls(name="is_cpu_op", bool_val=False)]
    if item.kind == "comp":
        node.duration_micros = int(round(item.seconds * 1e6))
        attrs.append(attr_cls(name="commpress_seconds", double_val=item.seconds))
    else:
        call = item.call
        attrs += [attr_cls(name="comm_size", int64_val=call.wire_bytes),
                  attr_cls(name="commpress_message_bytes", int64_val=call.message_bytes),
                  attr_cls(name="commpress_compressor", string_val=call.compressor),
                  attr_cls(name="commpress_axis", string_val=call.event.axis)]
    if item.kind == "coll":
        attrs.append(attr_cls(name="comm_type", int64_val=CHAKRA_COLL[item.call.event.op]))
    elif item.kind in ("send", "recv"):
        attrs.append(attr_cls(name="comm_tag", int32_val=item.tag))
    node.attr.extend(attrs)
    return node.SerializeToString()


class _AttrBytes:
    """Node.attr entries (field 10) as bytes, each encoded once by protobuf."""

    def __init__(self, attr_cls):
        self.attr_cls, self.cache = attr_cls, {}

    def __call__(self, name: str, **value) -> bytes:
        key = (name, *value.items())
        if key not in self.cache:
            body = self.attr_cls(name=name, **value).SerializeToString()
            self.cache[key] = bytes([10 << 3 | 2]) + _varint(len(body)) + body
        return self.cache[key]


def _peers(attr: _AttrBytes, item: Item, rank: int, pp: tuple) -> bytes:
    """A transfer's ``comm_src`` and ``comm_dst`` on ``rank`` (nothing for a compute node)."""
    if item.kind not in ("send", "recv"):
        return b""
    peer = _ring_peer(item, rank) if item.ring else pp[item.peer]
    src, dst = (rank, peer) if item.kind == "send" else (peer, rank)
    return attr("comm_src", int32_val=src) + attr("comm_dst", int32_val=dst)


def _ring_peer(item: Item, rank: int) -> int:
    """The next (send) or previous (recv) rank of ``rank`` in its ring group of the event."""
    group = _group(item.call.event, rank)
    ring = sorted({r for pair in item.call.event.concurrent if rank in pair for r in pair} | {rank}) \
        if len(group) == 2 else list(group)
    i = ring.index(rank)
    return ring[(i + item.peer) % len(ring)]


# --- SimAI --------------------------------------------------------------------------------------

NS = 1e9


def export_simai(path: str, model: str, cluster: str, plan=None, options=None, **kw) -> dict:
    """Write the predicted step as a SimAI workload file (module doc): stage 0's rows. Returns
    {"path", "rows", "left_out": [what the format cannot hold, one line each]}."""
    check_exports(simai=path)
    step, timing = predicted_step(model, cluster, plan, options, **kw)
    prog = programs(step, timing)[0]
    rows, left_out = simai_rows(step, prog)
    text = simai_header(step, prog) + "\n" + f"{len(rows)}\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows)
    atomic_write(path, lambda h: h.write(text.encode()))
    return {"path": path, "rows": len(rows), "left_out": left_out}


def simai_header(step, prog: Program) -> str:
    """The first line: parallel degrees and the (compressed) pipeline message (``pp_comm``)."""
    plan = step.plan
    pp = next((i.call.wire_bytes for i in prog.items if i.kind in ("send", "recv") and not i.ring), 0)
    if plan.pp > 1 and not pp:
        pp = call_of(step, step_pp_events(step)[0]).wire_bytes
    return (f"HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: {plan.tp} ep: {plan.degrees.ep} "
            f"pp: {plan.pp} vpp: {plan.virtual_stages} ga: {plan.microbatches} all_gpus: {plan.degrees.gpus} "
            f"checkpoints: 0 checkpoint_initiates: 0 pp_comm: {pp if plan.pp > 1 else 0}")


def simai_rows(step, prog: Program) -> tuple[list, list]:
    """(rows, lines left out): the forward pieces, the backward pieces (rows run backwards there),
    and the buckets, optimizer and tail as weight-gradient rows before them."""
    left: dict = {}
    fwd, bwd, after = [], [], []       # forward and backward pieces: [name, ns, type, bytes, wg type, wg bytes]
    for item in prog.items:
        if item.op is None:
            after.append(item)
        elif item.kind == "comp":
            (fwd if item.op[0] == "F" else bwd).append([item.name, _ns(item.seconds), "NONE", 0, "NONE", 0])
        elif item.kind == "coll":
            piece = (fwd if item.op[0] == "F" else bwd)[-1]
            slot = "wg" if item.op[0] == "B" and item.call.event.axis in ("dp", "zero") else "fp"
            kind = _slot_type(item.call, slot, left)
            if kind:
                piece[0] += "|" + item.call.label
                piece[2 if slot == "fp" else 4:4 if slot == "fp" else 6] = [kind, item.call.wire_bytes]
        elif item.kind == "send" and item.ring:
            left[f"{item.call.event.name}: cp's K/V ring sends (no ring send/recv in SimAI's workload)"] = 1
    n = max(len(fwd), len(bwd))
    pad = ["pad", 0, "NONE", 0, "NONE", 0]
    rows = []
    for j in range(n):
        f = fwd[j] if j < len(fwd) else pad
        b = bwd[n - 1 - j] if n - 1 - j < len(bwd) else pad
        name = re.sub(r"\s+", "_", f"{f[0]}||{b[0]}")
        rows.append([name, -1, f[1], f[2], f[3], b[1], b[2], b[3], 0, b[4], b[5], 0])
    tail = []
    for item in after:      # run last in SimAI's backward: buckets first ready at the highest row
        if item.kind == "comp":
            tail.append([re.sub(r"\s+", "_", item.name), -1, 0, "NONE", 0, 0, "NONE", 0, _ns(item.seconds), "NONE",
                         0, 0])
        elif _slot_type(item.call, "wg", left):
            tail.append([item.call.label, -1, 0, "NONE", 0, 0, "NONE", 0, 0, _slot_type(item.call, "wg", left),
                         item.call.wire_bytes, 0])
    return tail[::-1] + rows, list(left)


def _ns(seconds: float) -> int:
    return int(round(seconds * NS))


def _slot_type(call: Call, slot: str, left: dict) -> str | None:
    """SimAI's comm type of a call in a forward/input-gradient (``fp``: TP or EP groups) or a
    weight-gradient (``wg``: DP groups) slot; None (and a line in ``left``) where it has none."""
    e = call.event
    op = SIMAI_OPS.get(e.op)
    if op is not None and slot == "fp" and e.axis == "tp":
        return op
    if op is not None and slot == "fp" and e.axis in ("ep", "ep_combine"):
        return op + "_EP"
    if op is not None and slot == "wg" and e.axis in ("dp", "zero"):
        return op + ("_DP_EP" if "expert" in e.name else "")
    if e.op != "sendrecv":
        where = "forward/input-gradient" if slot == "fp" else "weight-gradient"
        left[f"{e.name}: {e.op} on the {e.axis} axis in a {where} slot (SimAI gives that slot no such group)"] = 1
    return None


def describe(result: dict, what: str) -> list[str]:
    """One line per output written (the CLI prints them on stderr)."""
    if what == "chakra":
        return [f"wrote {result['ranks']} Chakra traces ({max(result['nodes'].values(), default=0)} nodes "
                f"the largest) and {result['comm_group']}"]
    return [f"wrote SimAI workload {result['path']} ({result['rows']} rows)"] + \
        [f"not in the SimAI file: {line}" for line in result["left_out"]]


__all__ = ["Call", "Item", "Program", "call_of", "check_exports", "describe", "export_chakra", "export_simai",
           "predicted_step", "programs", "simai_header", "simai_rows"]
