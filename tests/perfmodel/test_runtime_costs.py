"""The runtime's own costs (perfmodel.calibration.fit fit 5): the per-call seconds of realrun's compressed
collectives and the CPU its socket transport takes, recovered from synthetic records, applied
by the model where the profile has them, and refused when malformed."""
import json

import pytest

from perfmodel import predict
from perfmodel.calibration.profile import load_calibration
from perfmodel.cli import main
from perfmodel.calibration.fit import fit_profile, summary
from perfmodel.calibration.measurements import make_record
from perfmodel.collectives.runtime import runtime_time
from topologies.clikit import run
from topologies.errors import InputError

CLUSTER = "emulated:hosts=4,bandwidth=500mbit,cores=2"
CALL_US, NS_PER_BYTE = 700.0, 0.25           # what the synthetic runtime pays beyond the model
CPU_US, CPU_NS_PER_BYTE = 40.0, 1.5          # what its transport burns per call and per byte sent
SIZES = (2**18, 2**20, 2**22, 2**24)


def _kernels():
    return [make_record("kernel", compressor=spec, device="cpu", size_bytes=size, wire_bytes=size // 4 + 40,
                        compress_s=size / 2e9, decompress_s=size / 3e9, max_rel_error=0.0, concurrent=conc)
            for spec in ("int8", "topk(0.01)") for size in SIZES for conc in (1, 4)]


def _collective(spec, alg, size, time_s, cpu_s=None, world=4):
    extra = {} if cpu_s is None else {"cpu_s": cpu_s}
    return make_record("collective", op="allreduce", compressor=spec, algorithm=alg, world=world, backend="gloo",
                       size_bytes=size, wire_bytes=0, time_s=time_s, compress_s=0, decompress_s=0, max_rel_error=0,
                       cluster=CLUSTER, **extra)


def _records(tmp_path):
    """Kernel records, then compressed collectives the fitted model predicts plus the known call
    cost."""
    records = _kernels()
    path = tmp_path / "k.json"
    path.write_text(json.dumps(fit_profile(records, CLUSTER)))
    for spec, alg in (("int8", "two_phase"), ("topk(0.01)", "allgather")):
        for size in SIZES:
            t = runtime_time("allreduce", size, cluster=CLUSTER, compressor=spec, algorithm=alg,
                             calibration=str(path)).time_s
            records.append(_collective(spec, alg, size, t + CALL_US * 1e-6 + NS_PER_BYTE * 1e-9 * size))
    return records


def _uncompressed():
    """Uncompressed collectives whose CPU per call is the known transport line."""
    records = []
    for alg in ("auto", "ring"):
        for size in SIZES:
            sent = 2 * size * 3 / 4            # a ring rank's bytes on 4 ranks (both algorithms)
            records.append(_collective("none", alg, size, 1e-3 + size / 5e7,
                                       cpu_s=CPU_US * 1e-6 + CPU_NS_PER_BYTE * 1e-9 * sent))
    return records


def test_the_fit_recovers_the_call_cost_and_the_transport_cpu(tmp_path):
    runtime = fit_profile(_records(tmp_path), CLUSTER)["runtime"]
    assert "transport" not in runtime      # no CPU measured
    for key in ("allreduce:two_phase", "allreduce:allgather"):
        call = runtime["calls"][key]
        assert call["call_us"] == pytest.approx(CALL_US, rel=0.02), key
        assert call["ns_per_byte"] == pytest.approx(NS_PER_BYTE, rel=0.02), key
        assert call["records"] == len(SIZES) and call["call_us_sd"] < 0.05 * CALL_US
    transport = fit_profile(_uncompressed(), CLUSTER)["runtime"]["transport"]
    assert transport["cpu_us"] == pytest.approx(CPU_US, rel=0.02)
    assert transport["cpu_ns_per_byte"] == pytest.approx(CPU_NS_PER_BYTE, rel=0.02)
    assert transport["records"] == 2 * len(SIZES)


def test_a_fitted_profile_predicts_what_was_measured_and_prints_its_terms(tmp_path, capsys):
    records = _records(tmp_path)
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "p.json"
    assert run(main, ["calibrate", str(src), "-o", str(out), "--cluster", CLUSTER]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "runtime call allreduce:two_phase" in text and "+-" in text
    measured = {(r["compressor"], r["size_bytes"]): r["time_s"] for r in records
                if r["kind"] == "collective" and r["compressor"] == "int8"}
    for size in SIZES:
        got = runtime_time("allreduce", size, cluster=CLUSTER, compressor="int8", algorithm="two_phase",
                           calibration=str(out)).time_s
        assert got == pytest.approx(measured[("int8", size)], rel=0.01)


def _profile(tmp_path, runtime):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema": "commpress.calibration/1", "runtime": runtime}))
    return str(path)


def test_the_call_cost_applies_to_compressed_calls_only(tmp_path):
    plain = _profile(tmp_path / "..", {})
    (tmp_path / "a").mkdir()
    with_call = _profile(tmp_path / "a", {"calls": {"allreduce:two_phase": {"call_us": 500, "ns_per_byte": 1.0}}})
    size = 2**20
    for spec, extra in (("int8", 500e-6 + 1e-9 * size), ("none", 0.0)):
        a = runtime_time("allreduce", size, cluster=CLUSTER, compressor=spec, algorithm="two_phase",
                         calibration=plain).time_s
        b = runtime_time("allreduce", size, cluster=CLUSTER, compressor=spec, algorithm="two_phase",
                         calibration=with_call).time_s
        assert b - a == pytest.approx(extra, abs=1e-12), spec
    other = runtime_time("allreduce", size, cluster=CLUSTER, compressor="topk(0.01)", algorithm="allgather",
                         calibration=with_call).time_s
    assert other == runtime_time("allreduce", size, cluster=CLUSTER, compressor="topk(0.01)", algorithm="allgather",
                                 calibration=plain).time_s


def test_transport_cpu_slows_the_backward_beside_hidden_gradients(tmp_path):
    """dp4 with overlapped buckets on hosts of a fixed 0.45-core share: the slowdown is the hidden
    part of the transport's CPU run at that share, and grows with the CPU per byte."""
    cluster = "emulated:hosts=4,bandwidth=1gbit,cpu_share=0.45"
    kw = dict(gpus=4, dp=4, tp=1, pp=1, mbs=4, gbs=64, bucket_bytes=2**16, policy="none")
    slow = []
    for i, per_byte in enumerate((0.5, 2.0)):
        (tmp_path / str(i)).mkdir()
        path = _profile(tmp_path / str(i), {"transport": {"cpu_us": 0.0, "cpu_ns_per_byte": per_byte}})
        slow.append(predict("gpt-tiny", cluster, calibration=path, **kw).breakdown["overlap_slowdown_s"])
    assert slow[0] > 0 and slow[1] == pytest.approx(4 * slow[0], rel=1e-9)
    fraction = predict("gpt-tiny", cluster, **kw).breakdown["overlap_slowdown_s"]
    assert fraction != slow[0]


@pytest.mark.parametrize("runtime, field", [
    ({"calls": {"allreduce": {"call_us": 1, "ns_per_byte": 1}}}, "runtime.calls.allreduce"),
    ({"calls": {"gossip:ring": {"call_us": 1, "ns_per_byte": 1}}}, "runtime.calls.gossip:ring"),
    ({"calls": {"allreduce:ring": {"call_us": -5, "ns_per_byte": 1}}}, "call_us"),
    ({"calls": {"allreduce:ring": {"call_us": 1}}}, "runtime.calls.allreduce:ring"),
    ({"transport": {"cpu_us": 1, "cpu_ns_per_byte": "fast"}}, "cpu_ns_per_byte"),
    ({"sockets": {}}, "runtime.sockets"),
])
def test_bad_runtime_sections_are_refused_naming_the_field(tmp_path, runtime, field):
    with pytest.raises(InputError, match=field):
        load_calibration(_profile(tmp_path, runtime))


def test_summary_rows_carry_the_standard_errors():
    rows = summary({"runtime": {"calls": {"allreduce:two_phase": {"call_us": 700, "ns_per_byte": 0.25,
                                                                  "call_us_sd": 12, "ns_per_byte_sd": 0.01,
                                                                  "records": 6}}}, "fits": {}})
    assert rows == [("runtime call allreduce:two_phase", "700 +- 12 us + 0.250 +- 0.010 ns/B", "6 compressed records")]
