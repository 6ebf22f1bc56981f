"""perfmodel.report.export: the predicted step as Chakra traces and a SimAI workload, read back.

The Chakra files are read with a decoder of the protobuf wire format written here (independent of
the protobuf package that writes them), by et_def.proto's field numbers (mlcommons/chakra @ 6dc63e14,
schema/protobuf/et_def.proto); the SimAI file with a parser that follows SimAI's own
(aliyun/SimAI @ cef83f9d, astra-sim-alibabacloud/astra-sim/workload/Workload.cc, initialize_workload:
the first line's tokens read as ``key: value`` at lines 1155-1191 and 1257-1262, the row count at
1274-1278, twelve whitespace-separated fields per row at 1284-1311, comm types by prefix at 1320-1492).
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections import Counter, defaultdict

import networkx as nx
import pytest

from perfmodel.engines.analytical import cost
from perfmodel.prediction import predict
from perfmodel.report.export import export_chakra, export_simai, predicted_step, programs
from topologies import InputError



def _has_protobuf() -> bool:
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        return False
    return True


needs_protobuf = pytest.mark.skipif(not _has_protobuf(), reason="the Chakra export needs the protobuf package "
                                    "(pip install 'commpress[export]')")

COMP, SEND, RECV, COLL = 4, 5, 6, 7           # et_def.proto NodeType
ALL_REDUCE, ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER = 0, 2, 6, 7
PIPELINE = ("gpt2-small", "dgx-a100", dict(gpus=8, tp=2, pp=2, gbs=16))
RING = ("gpt-tiny", "dgx-a100", dict(gpus=8, cp=2, zero=3, gbs=8, seq=1024))
EXPERTS = ("gpt-tiny-moe", "dgx-a100", dict(gpus=8, ep=4, tp=2, gbs=16))
INTERLEAVED = ("gpt2-small", "dgx-a100", dict(gpus=8, pp=4, gbs=16, schedule="interleaved:3", engine="des"))


# --- an independent reader of the protobuf wire format ------------------------------------------

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, pos


def _fields(buf: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) of one message: varints as int, 64-bit as bytes, LEN as bytes."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise AssertionError(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _attr(buf: bytes) -> tuple[str, object]:
    """AttributeProto: name 1; double_val 3, int32_val 7, int64_val 9, uint64_val 13, bool_val 27, string_val 29."""
    name, value = "", None
    for number, _, v in _fields(buf):
        if number == 1:
            name = v.decode()
        elif number == 3:
            value = struct.unpack("<d", v)[0]
        elif number in (7, 9, 13):
            value = _signed(v)
        elif number == 27:
            value = bool(v)
        elif number == 29:
            value = v.decode()
    return name, value


def _repeated(wire: int, value) -> list[int]:
    if wire == 0:
        return [value]
    out, pos = [], 0                       # packed
    while pos < len(value):
        v, pos = _varint(value, pos)
        out.append(v)
    return out


def _node(buf: bytes) -> dict:
    """Node: id 1, name 2, type 3, ctrl_deps 4, data_deps 5, start_time_micros 6, duration_micros 7, attr 10."""
    node = {"id": 0, "name": "", "type": 0, "deps": [], "duration_micros": 0, "attr": {}}
    for number, wire, v in _fields(buf):
        if number == 1:
            node["id"] = v
        elif number == 2:
            node["name"] = v.decode()
        elif number == 3:
            node["type"] = v
        elif number in (4, 5):
            node["deps"] += _repeated(wire, v)
        elif number == 7:
            node["duration_micros"] = v
        elif number == 10:
            key, value = _attr(v)
            node["attr"][key] = value
    return node


def read_et(path) -> tuple[dict, list[dict]]:
    """(GlobalMetadata's attributes, nodes) of one varint-delimited .et file (protolib's stream)."""
    with open(path, "rb") as f:
        buf = f.read()
    messages, pos = [], 0
    while pos < len(buf):
        size, pos = _varint(buf, pos)
        messages.append(buf[pos:pos + size])
        pos += size
    meta = dict(_attr(v) for number, _, v in _fields(messages[0]) if number == 2)
    return meta, [_node(m) for m in messages[1:]]


# --- a reader that follows SimAI's Workload::initialize_workload ---------------------------------

SIMAI_TYPES = ("ALLREDUCEALLTOALL", "REDUCESCATTER", "ALLREDUCE", "ALLGATHER", "ALLTOALL")


def read_simai(path) -> tuple[dict, list[dict]]:
    with open(path) as f:
        tokens = f.readline().split()
        header = {"policy": tokens[0]}
        for i, t in enumerate(tokens[1:], 1):
            if t.endswith(":") and i + 1 < len(tokens):
                header[t[:-1]] = int(tokens[i + 1])
        count = int(f.readline())
        words = f.read().split()
    assert len(words) == 12 * count, "twelve fields a row"
    rows = []
    for k in range(count):
        w = words[12 * k:12 * k + 12]
        rows.append({"id": w[0], "depen": int(w[1]), "fp_ns": int(w[2]), "fp": w[3], "fp_bytes": int(w[4]),
                     "ig_ns": int(w[5]), "ig": w[6], "ig_bytes": int(w[7]), "wg_ns": int(w[8]), "wg": w[9],
                     "wg_bytes": int(w[10]), "update_ns": int(w[11])})
    return header, rows


def _simai_kind(text: str) -> str | None:
    """Workload.cc's ComType by prefix (None for NONE and anything it does not know)."""
    return next((t for t in SIMAI_TYPES if text.startswith(t)), None)


# --- Chakra --------------------------------------------------------------------------------------

def _export(tmp_path, case, policy):
    model, cluster, kw = case
    folder = tmp_path / policy.replace("=", "-").replace(",", "_")
    result = export_chakra(str(folder), model, cluster, policy=policy, **kw)
    groups = json.loads((folder / "comm_group.json").read_text())
    return result, {int(p.name.split(".")[1]): read_et(p) for p in folder.glob("commpress.*.et")}, groups


@needs_protobuf
@pytest.mark.parametrize("case", [PIPELINE, RING, EXPERTS, INTERLEAVED],
                         ids=["pipeline", "cp-ring-zero3", "experts", "interleaved-des"])
def test_chakra_reads_back(tmp_path, case):
    model, cluster, kw = case
    result, ranks, groups = _export(tmp_path, case, "dp=int8")
    step, timing = predicted_step(model, cluster, policy="dp=int8", **kw)
    progs = programs(step, timing)
    assert sorted(ranks) == list(range(kw["gpus"])) and result["ranks"] == kw["gpus"]
    sends, recvs, by_group = Counter(), Counter(), defaultdict(dict)
    for r, (meta, nodes) in ranks.items():
        assert meta["schema"] == "1.0.2-chakra.1.0.0" and meta["commpress_policy"] == "dp=int8"
        assert len(nodes) == len(progs[meta["commpress_stage"]].items) == result["nodes"][r]
        ids = {n["id"] for n in nodes}
        g = nx.DiGraph()
        g.add_nodes_from(ids)
        g.add_edges_from((d, n["id"]) for n in nodes for d in n["deps"])
        assert set(g.nodes) == ids and nx.is_directed_acyclic_graph(g), f"rank {r}: dependencies"
        assert {n["type"] for n in nodes} <= {COMP, SEND, RECV, COLL}
        for n in nodes:
            a = n["attr"]
            assert a["is_cpu_op"] is False
            if n["type"] == COMP:
                assert n["duration_micros"] == round(a["commpress_seconds"] * 1e6)
            elif n["type"] == COLL:
                assert r in groups[a["pg_name"]]
                by_group[a["pg_name"]].setdefault(r, []).append((a["comm_type"], a["comm_size"], n["name"]))
            else:
                key = (a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"])
                (sends if n["type"] == SEND else recvs)[key] += 1
                assert r == (a["comm_src"] if n["type"] == SEND else a["comm_dst"])
    assert sends == recvs, "every send has its recv (peer, tag, size)"
    for pg, seqs in by_group.items():     # a collective's ranks call the same sequence of the same sizes
        assert set(seqs) == set(groups[pg]), pg
        assert len({tuple(s) for s in seqs.values()}) == 1, pg
    nodes = {r: n for r, (_, n) in ranks.items()}
    assert replay(nodes, groups) == sum(map(len, nodes.values())), "a rank waits forever"


def replay(ranks: dict, groups: dict) -> int:
    """Run every rank's nodes as a simulator would (a node once its dependencies are done; a
    collective once every rank of its group has its k-th call on that group ready; a send with its
    recv): the nodes done. All of them: no rank waits forever."""
    calls: dict = {}                      # (rank, node id) -> (pg, k)
    for r, nodes in ranks.items():
        seen: Counter = Counter()
        for n in sorted(nodes, key=lambda n: n["id"]):
            if n["type"] == COLL:
                pg = n["attr"]["pg_name"]
                calls[r, n["id"]] = (pg, seen[pg])
                seen[pg] += 1
    done: set = set()
    ready_coll: dict = defaultdict(set)   # (pg, k) -> ranks ready
    ready_p2p: dict = {}                  # (src, dst, tag, send?) -> (rank, node id)
    progress = True
    while progress:
        progress = False
        for r, nodes in ranks.items():
            for n in nodes:
                key = (r, n["id"])
                if key in done or not all((r, d) in done for d in n["deps"]):
                    continue
                if n["type"] == COMP:
                    done.add(key)
                elif n["type"] == COLL:
                    pg, k = calls[key]
                    ready_coll[pg, k].add(r)
                    if ready_coll[pg, k] == set(groups[pg]):
                        done.update((m, i) for (m, i), c in calls.items() if c == (pg, k))
                else:
                    a = n["attr"]
                    link = (a["comm_src"], a["comm_dst"], a["comm_tag"])
                    ready_p2p[link + (n["type"] == SEND,)] = key
                    other = ready_p2p.get(link + (n["type"] != SEND,))
                    if other is None:
                        continue
                    done.update((key, other))
                progress = progress or key in done
    return len(done)


@needs_protobuf
def test_chakra_sizes_are_the_predicted_wire_bytes(tmp_path):
    model, cluster, kw = PIPELINE
    step, timing = predicted_step(model, cluster, policy="dp=int8", **kw)
    record = predict(model, cluster, policy="dp=int8", **kw)
    events = {(e.name, e.nbytes): e for events in timing.stage_events for e in events}   # buckets: 2 sizes
    _, ranks, _ = _export(tmp_path, PIPELINE, "dp=int8")
    _, plain, _ = _export(tmp_path, PIPELINE, "none")
    seen = set()
    for (_, nodes), (_, plain_nodes) in zip(ranks.values(), plain.values()):
        assert len(nodes) == len(plain_nodes)
        for n, p in zip(nodes, plain_nodes):
            if n["type"] == COMP:
                continue
            a = n["attr"]
            event = events[n["name"], a["commpress_message_bytes"]] if n["type"] == COLL else None
            if event is not None:
                rec = cost(step.env, event, step.policy)
                assert a["comm_size"] == round(event.nbytes / rec.compression_ratio)
                assert a["commpress_message_bytes"] == event.nbytes
                assert a["commpress_compressor"] == rec.compressor
                named = record.collectives.get(event.name)       # the record names stage 0's
                assert named is None or named.split(":")[2] == rec.compressor
            if a["commpress_axis"] == "dp":
                seen.add(n["name"])
                assert a["commpress_compressor"] != "none" and p["attr"]["commpress_compressor"] == "none"
                assert 3.5 < p["attr"]["comm_size"] / a["comm_size"] <= 4     # fp32 gradients as int8 and scales
            else:
                assert a["comm_size"] == p["attr"]["comm_size"]
    assert "dp.allreduce.buckets" in seen


@needs_protobuf
def test_chakra_compute_is_the_model_compute(tmp_path):
    model, cluster, kw = PIPELINE
    step, timing = predicted_step(model, cluster, **kw)
    _, ranks, _ = _export(tmp_path, PIPELINE, "none")
    m = step.plan.microbatches
    for meta, nodes in ranks.values():
        st = timing.stages[meta["commpress_stage"]]
        ops = sum(n["attr"]["commpress_seconds"] for n in nodes if n["type"] == COMP and n["name"] != "optimizer")
        assert ops == pytest.approx(m * st.compute, rel=1e-9)


@needs_protobuf
def test_chakra_ranks_subset_and_bad_rank(tmp_path):
    model, cluster, kw = PIPELINE
    result = export_chakra(str(tmp_path / "two"), model, cluster, ranks=[0, 7], **kw)
    assert sorted(p.rsplit("/", 1)[1] for p in result["files"]) == ["commpress.0.et", "commpress.7.et"]
    with pytest.raises(InputError, match="ranks"):
        export_chakra(str(tmp_path / "bad"), model, cluster, ranks=[8], **kw)


def test_chakra_without_protobuf_refuses_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    with pytest.raises(InputError, match="protobuf"):
        export_chakra(str(tmp_path / "x"), *PIPELINE[:2], **PIPELINE[2])
    assert not (tmp_path / "x").exists()
    code = ("import sys; sys.modules['google.protobuf'] = None; from perfmodel.cli import entry; "
            f"sys.argv = ['perfmodel', 'predict', '--model', 'gpt2-small', '--cluster', 'dgx-a100', '--gpus', '8', "
            f"'--export-chakra', {str(tmp_path / 'y')!r}]; entry()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "protobuf" in proc.stderr, proc.stderr
    assert not (tmp_path / "y").exists()


# --- SimAI ---------------------------------------------------------------------------------------

def test_simai_reads_back(tmp_path):
    model, cluster, kw = PIPELINE
    step, timing = predicted_step(model, cluster, policy="dp=int8", **kw)
    out = export_simai(str(tmp_path / "w.txt"), model, cluster, policy="dp=int8", **kw)
    header, rows = read_simai(tmp_path / "w.txt")
    plan = step.plan
    assert header == {"policy": "HYBRID_TRANSFORMER_FWD_IN_BCKWD", "model_parallel_NPU_group": plan.tp, "ep": 1,
                      "pp": plan.pp, "vpp": 1, "ga": plan.microbatches, "all_gpus": 8, "checkpoints": 0,
                      "checkpoint_initiates": 0, "pp_comm": header["pp_comm"]}
    pp = next(e for e in timing.stage_events[0] if e.axis == "pp")
    assert header["pp_comm"] == pp.nbytes            # pp uncompressed under dp=int8
    assert len(rows) == out["rows"] and out["left_out"] == []
    for row in rows:
        for slot in ("fp", "ig", "wg"):
            assert row[slot] == "NONE" or _simai_kind(row[slot]), row
    st = timing.stages[0]
    m = plan.microbatches
    assert sum(r["fp_ns"] for r in rows) == pytest.approx(m * (st.compute - st.bwd) * 1e9, abs=len(rows))
    assert sum(r["ig_ns"] for r in rows) == pytest.approx(m * st.bwd * 1e9, abs=len(rows))
    tp = {e.name: e for e in timing.stage_events[0] if e.axis == "tp"}
    calls = sum(round(e.count / m) for e in tp.values()) * m
    assert sum(1 for r in rows for s in ("fp", "ig") if r[s] == "ALLREDUCE") == calls
    assert {r[s + "_bytes"] for r in rows for s in ("fp", "ig") if r[s] != "NONE"} == {e.nbytes for e in tp.values()}
    buckets = [r for r in rows if r["id"].startswith("dp.allreduce.buckets@")]
    events = [e for e in timing.stage_events[0] if e.name == "dp.allreduce.buckets"]    # full ones, the last
    assert len(buckets) == sum(round(e.count) for e in events) and {b["wg"] for b in buckets} == {"ALLREDUCE"}
    assert Counter(b["wg_bytes"] for b in buckets) == {
        round(e.nbytes / cost(step.env, e, step.policy).compression_ratio): round(e.count) for e in events}
    assert all("int8" in b["id"] for b in buckets)


def test_simai_compressed_differs_from_none(tmp_path):
    model, cluster, kw = PIPELINE
    export_simai(str(tmp_path / "c.txt"), model, cluster, policy="dp=int8", **kw)
    export_simai(str(tmp_path / "n.txt"), model, cluster, policy="none", **kw)
    (_, c), (_, n) = read_simai(tmp_path / "c.txt"), read_simai(tmp_path / "n.txt")
    wg = [(a["wg_bytes"], b["wg_bytes"]) for a, b in zip(c, n) if a["wg"] != "NONE"]
    assert wg and all(3.5 < plain / packed <= 4 for packed, plain in wg)


def test_simai_says_what_it_leaves_out(tmp_path):
    model, cluster, kw = RING
    out = export_simai(str(tmp_path / "w.txt"), model, cluster, **kw)
    assert any("K/V ring" in line for line in out["left_out"])
    assert any(line.startswith("zero.allgather.fwd") for line in out["left_out"])
    _, rows = read_simai(tmp_path / "w.txt")
    assert any(r["wg"] == "REDUCESCATTER" for r in rows)       # ZeRO-3's gradient reduce-scatters, backward
    model, cluster, kw = EXPERTS
    export_simai(str(tmp_path / "e.txt"), model, cluster, policy="deepseek", **kw)
    header, rows = read_simai(tmp_path / "e.txt")
    assert header["ep"] == 4 and any(r["fp"] == "ALLTOALL_EP" for r in rows)


# --- CLI -----------------------------------------------------------------------------------------

@needs_protobuf
def test_cli_exports(tmp_path, cli):
    model, cluster, _ = PIPELINE
    args = ["--model", model, "--cluster", cluster, "--gpus", "8", "--tp", "2", "--pp", "2", "--gbs", "16",
            "--policy", "dp=int8"]
    proc = cli("perfmodel", "predict", *args, "--export-chakra", str(tmp_path / "et"),
               "--export-simai", str(tmp_path / "w.txt"), check_rc=0)
    assert "wrote 8 Chakra traces" in proc.stderr and "wrote SimAI workload" in proc.stderr
    assert "step time" in proc.stdout
    assert read_et(tmp_path / "et" / "commpress.3.et")[0]["commpress_rank"] == 3
    assert read_simai(tmp_path / "w.txt")[0]["ga"] == 8
    (tmp_path / "file").write_text("")
    proc = cli("perfmodel", "predict", *args, "--export-chakra", str(tmp_path / "file"), check_rc=2)
    assert proc.stderr.count("\n") == 1 and "export_chakra" in proc.stderr
