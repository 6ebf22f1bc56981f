"""Calibration fits (perfmodel.calibration.fit, perfmodel calibrate): known numbers come back from
synthetic records, profiles round-trip, and the runtime model applies what was fitted."""
import json

import pytest

from perfmodel.calibration.profile import load_calibration
from perfmodel.cli import main
from perfmodel.calibration.fit import fit_kernels, fit_profile
from perfmodel.calibration.measurements import make_record
from perfmodel.collectives.runtime import runtime_algorithm, runtime_time
from topologies.clikit import run
from topologies.errors import InputError

KNOWN = {"allreduce": (300.0, 0.95), "p2p": (450.0, 0.85), "allgather": (250.0, 0.80), "alltoall": (600.0, 0.70)}
BASE_US = 200.0
RUNS = [("auto", "none"), ("ring", "none"), ("allgather", "none"), ("two_phase", "none")]


def _profile(tmp_path, primitives=KNOWN, base=BASE_US):
    prof = {"schema": "commpress.calibration/1",
            "protocols": {"tcp": {n: {"base_us": base, "step_us": primitives["allreduce"][0],
                                      "bw_fraction": primitives["allreduce"][1]} for n in ("LL", "LL128", "Simple")}},
            "primitives": {"tcp": {k: {"step_us": a, "bw_fraction": f} for k, (a, f) in primitives.items()}}}
    path = tmp_path / "known.json"
    path.write_text(json.dumps(prof))
    return str(path)


def _synthetic(known_path):
    """Uncompressed records the model itself predicts under a known profile."""
    records = []
    for bw in ("100mbit", "300mbit", "1gbit"):
        for hosts in (2, 4):
            cluster = f"emulated:hosts={hosts},bandwidth={bw},cores=64"
            for size in (2**14, 2**18, 2**22):
                for alg, spec in RUNS:
                    t = runtime_time("allreduce", size, cluster=cluster, compressor=spec, algorithm=alg,
                                     calibration=known_path).time_s
                    records.append(make_record("collective", op="allreduce", compressor=spec, algorithm=alg,
                                               world=hosts, backend="gloo", size_bytes=size, wire_bytes=0, time_s=t,
                                               compress_s=0, decompress_s=0, max_rel_error=0, cluster=cluster))
    return records


def test_fitting_recovers_known_alpha_and_beta_within_2_percent(tmp_path):
    profile = fit_profile(_synthetic(_profile(tmp_path)), "emulated:hosts=4,bandwidth=1gbit,cores=64")
    assert profile["protocols"]["tcp"]["Simple"]["base_us"] == pytest.approx(BASE_US, rel=0.02)
    for prim, (alpha, frac) in KNOWN.items():
        got = profile["primitives"]["tcp"][prim]
        assert got["step_us"] == pytest.approx(alpha, rel=0.02), prim
        assert got["bw_fraction"] == pytest.approx(frac, rel=0.02), prim
    assert profile["fits"]["tiers"]["r2"] > 0.9999


def test_kernel_fit_recovers_throughput_and_launch():
    records = []
    for size in (2**18, 2**20, 2**22, 2**24):
        for conc, (tc, td) in ((1, (2e9, 3e9)), (4, (1e9, 1.2e9))):
            records.append(make_record("kernel", compressor="int8", device="cpu", size_bytes=size,
                                       wire_bytes=size // 4 + 40, compress_s=5e-5 + size / tc,
                                       decompress_s=5e-5 + size / td, max_rel_error=0.0, concurrent=conc))
        records.append(make_record("kernel", compressor="sz3(abs=1e-3)", device="cpu", size_bytes=size,
                                   wire_bytes=size // 5, compress_s=5e-5 + size / 2e8, decompress_s=5e-5 + size / 4e8,
                                   max_rel_error=0.0))
    kernels, launch, ratios, _ = fit_kernels(records)
    assert kernels["int8"]["compress_GBps"] == pytest.approx(2.0, rel=0.02)
    assert kernels["int8"]["decompress_GBps"] == pytest.approx(3.0, rel=0.02)
    assert kernels["int8"]["shared"]["4"]["compress_GBps"] == pytest.approx(1.0, rel=0.02)
    assert launch == pytest.approx(5e-5, rel=0.05)
    assert ratios == {"sz3": {"ratio": pytest.approx(5.0)}}


def test_profile_round_trip_through_the_cli(tmp_path, capsys):
    records = _synthetic(_profile(tmp_path))
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "profile.json"
    assert main(["calibrate", str(path), "-o", str(out)]) == 0
    assert "tcp" in capsys.readouterr().out
    calib = load_calibration(str(out))
    assert set(calib.primitives["tcp"]) == set(KNOWN) | {f"{k}@pair" for k in KNOWN}   # 2-host records: pairs
    raw = json.loads(out.read_text())
    assert raw["provenance"]["packages"]["numpy"] and raw["provenance"]["date"]
    cluster = "emulated:hosts=4,bandwidth=1gbit,cores=64"
    fitted = runtime_time("allreduce", 2**22, cluster=cluster, algorithm="two_phase", calibration=str(out)).time_s
    known = runtime_time("allreduce", 2**22, cluster=cluster, algorithm="two_phase",
                         calibration=_profile(tmp_path)).time_s
    assert fitted == pytest.approx(known, rel=0.01)


@pytest.mark.parametrize("bad, field", [
    ({"primitives": {"tcp": {"gossip": {"step_us": 1, "bw_fraction": 0.5}}}}, "primitives.tcp.gossip"),
    ({"primitives": {"tcp": {"p2p": {"step_us": 1, "bw_fraction": 1.5}}}}, "bw_fraction"),
    ({"kernels": {"int8": {"compress_GBps": 1.0}}}, "kernels.int8"),
    ({"kernels": {"int8": {"compress_GBps": 1, "decompress_GBps": 1, "shared": {"x": {}}}}}, "shared"),
    ({"kernels": {"int8(": {"compress_GBps": 1, "decompress_GBps": 1}}}, "kernels"),
])
def test_bad_profiles_are_refused_naming_the_field(tmp_path, bad, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": "commpress.calibration/1", **bad}))
    with pytest.raises(InputError, match=field.replace("(", r"\(")):
        load_calibration(str(path))


def test_calibrate_without_usable_records_is_one_clear_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert run(main, ["calibrate", str(path), "-o", str(tmp_path / "p.json"), "--cluster", "emulated:hosts=2"]) == 2
    assert not (tmp_path / "p.json").exists()


def test_runtime_algorithm_follows_realrun():
    assert runtime_algorithm("allreduce", "none", "auto") == "torch"
    assert runtime_algorithm("allreduce", "fp16", "auto") == "torch"
    assert runtime_algorithm("allreduce", "ef(topk(0.01))", "auto") == "allgather"
    assert runtime_algorithm("allreduce", "int8", "auto") == "two_phase"
    assert runtime_algorithm("allreduce", "none", "ring") == "ring"
    with pytest.raises(InputError, match="algorithm"):
        runtime_time("allreduce", 2**20, cluster="emulated:hosts=2", algorithm="tree")


def test_shared_kernels_are_used_at_their_rank_count_and_core_share_elsewhere(tmp_path):
    prof = {"schema": "commpress.calibration/1",
            "kernels": {"int8": {"compress_GBps": 2.0, "decompress_GBps": 2.0,
                                 "shared": {"4": {"compress_GBps": 0.25, "decompress_GBps": 0.25}}}}}
    path = tmp_path / "k.json"
    path.write_text(json.dumps(prof))

    def kernel_s(hosts, cores):
        return runtime_time("allreduce", 2**24, cluster=f"emulated:hosts={hosts},cores={cores}", compressor="int8",
                            algorithm="allgather", calibration=str(path)).timed.kernel_s

    # 4 ranks: the measured shared numbers (8x slower than alone), whatever the cores
    assert kernel_s(4, 2) == pytest.approx(kernel_s(4, 64), rel=0.05)
    # 2 ranks on 1 core: alone numbers at half a core each; on 2 cores: alone numbers
    assert kernel_s(2, 1) == pytest.approx(2 * kernel_s(2, 2), rel=0.1)


def _compute(op, m, n, k, flops=0.0, nbytes=0.0, time_s=1e-3):
    return make_record("compute", op=op, device="cpu", m=m, n=n, k=k, flops=flops, bytes=nbytes, time_s=time_s,
                       concurrent=4)


def test_compute_fit_gives_the_efficiency_table_and_streaming_rate(tmp_path):
    """GEMM records at known FLOP rates come back as efficiencies of the catalog's fp32 peak
    (median per size); elementwise records as the streaming rate; and the device predicts with them."""
    from perfmodel.devices import device
    from perfmodel.calibration.fit import fit_compute

    cpu = device("host-cpu")
    peak = cpu.peak("fp32")
    records = [_compute("gemm", 512, 384, 128, flops=3e6, time_s=3e6 / (0.4 * peak)),
               _compute("gemm", 512, 384, 128, flops=3e6, time_s=3e6 / (0.5 * peak)),
               _compute("gemm", 512, 384, 128, flops=3e6, time_s=3e6 / (0.45 * peak)),
               _compute("attention", 128, 128, 32, flops=1e6, time_s=1e6 / (0.2 * peak)),
               _compute("elementwise", 512, 128, 512, nbytes=6e6, time_s=2e-3)]
    over, report = fit_compute(records, cpu)
    assert over["gemm_efficiency"] == {"81": pytest.approx(0.2), "293": pytest.approx(0.45)}
    assert over["stream_TBps"] == pytest.approx(3e-3) and "fp32_TFLOPS" not in over
    profile = fit_profile(records, "emulated:hosts=4,bandwidth=1gbit")
    path = tmp_path / "compute.json"
    path.write_text(json.dumps(profile))
    fitted = load_calibration(str(path)).device(cpu)
    assert fitted.efficiency(512, 384, 128) == pytest.approx(0.45, rel=0.02)
    assert fitted.stream_Bps == pytest.approx(3e9) and report["records"] == 5


def test_eager_ring_blocks_give_the_seconds_per_score_beyond_their_gemms(tmp_path):
    """A scores record's time less its block products' (the attention record of its size, at the
    fitted rate) over its scores; perfmodel's eager ring prices it, fused kernels do not."""
    from perfmodel.devices import device
    from perfmodel.step.compute import score_elements, stage_compute
    from perfmodel.calibration.fit import fit_compute
    from perfmodel.plan.parallel import make_plan
    from perfmodel.workload import load_model

    cpu = device("host-cpu")
    rate = 0.3 * cpu.peak("fp32")
    flops, scores = 3 * 2 * 16 * 2.0 * 64 * 64 * 32, 16 * 64 * 64
    block = _compute("attention", 64, 64, 32, flops=flops, time_s=flops / rate)
    ring = flops * 7 / 6   # realrun's ring block: its backward recomputes the scores
    eager = make_record("compute", op="scores", device="cpu", m=64, n=64, k=32, flops=ring, bytes=0.0,
                        time_s=ring / rate + scores * 20e-9, scores=scores, concurrent=4)
    over, _ = fit_compute([block, eager], cpu)
    assert over["eager_score_ns"] == pytest.approx(20.0)
    assert "eager_score_ns" not in fit_compute([block], cpu)[0]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(fit_profile([block, eager], "emulated:hosts=4,bandwidth=1gbit")))
    fitted = load_calibration(str(path)).device(cpu)
    tiny = load_model("gpt-tiny")
    plans = {k: make_plan(tiny, 4, cp=2, mbs=4, compute_dtype="fp32", kernels=k) for k in ("fused", "eager")}
    times = {k: stage_compute(tiny, p, fitted, 2, True, True).attention_s for k, p in plans.items()}
    recomputed = 2 * (flops / 6) / rate   # a layer's QK^T of the two blocks at the fitted rate
    assert times["eager"] - times["fused"] == pytest.approx(2 * (score_elements(tiny, plans["eager"]) * 20e-9
                                                                 + recomputed), rel=1e-3)


def test_a_cpu_faster_than_the_catalog_peak_sets_a_measured_peak():
    from perfmodel.devices import device
    from perfmodel.calibration.fit import fit_compute

    cpu = device("host-cpu")
    fast = 2.0 * cpu.peak("fp32")
    over, _ = fit_compute([_compute("gemm", 512, 384, 128, flops=3e6, time_s=3e6 / fast),
                           _compute("gemm", 512, 128, 128, flops=1e6, time_s=1e6 / (0.5 * fast))], cpu)
    assert over["fp32_TFLOPS"] == pytest.approx(fast / 1e12)
    assert max(over["gemm_efficiency"].values()) == pytest.approx(1.0)
    assert min(over["gemm_efficiency"].values()) == pytest.approx(0.5)


def test_on_hosts_with_a_quota_compute_is_priced_at_the_declared_share_and_a_busy_machine_is_flagged():
    """A helper on a 0.45-core quota that got only 0.15 of a core (a busy machine: the quota caps,
    it does not guarantee) is priced at what 0.45 gives; the report and summary say what it got."""
    from perfmodel.devices import device
    from perfmodel.calibration.fit import fit_compute, fit_kernels, summary

    cpu = device("host-cpu")
    peak = cpu.peak("fp32")
    share, granted = 0.45, 0.15
    work = 3e6 / (0.4 * peak)          # CPU seconds of the GEMM at 0.4 of the core's peak
    rec = _compute("gemm", 512, 384, 128, flops=3e6, time_s=work / granted)
    rec |= {"cpu_s": work, "cpu_share": share}
    over, report = fit_compute([rec], cpu)
    assert over["gemm_efficiency"]["293"] == pytest.approx(0.4 * share)
    assert report["granted_share"] == pytest.approx(granted) and report["declared_share"] == share
    row = next(r for r in summary({"fits": {"compute": report}}) if r[0] == "compute CPU share")
    assert "BUSY MACHINE" in row[2] and "0.15" in row[1]
    calm = next(r for r in summary({"fits": {"compute": report | {"granted_share": 0.44}}})
                if r[0] == "compute CPU share")
    assert "BUSY" not in calm[2]
    plain = _compute("gemm", 512, 384, 128, flops=3e6, time_s=work / granted)   # no quota: wall time
    assert fit_compute([plain], cpu)[0]["gemm_efficiency"]["293"] == pytest.approx(0.4 * granted)
    # kernels at once on quota hosts: wall seconds scaled to the declared share the same way
    kern = [make_record("kernel", compressor="int8", device="cpu", size_bytes=s, wire_bytes=s // 4,
                        compress_s=3 * s / 1e9, decompress_s=s / 1e9, max_rel_error=0.0, iters=5, concurrent=4,
                        cpu_s=granted * 4 * s / 1e9, cpu_share=share) for s in (2**20, 2**22, 2**24)]
    alone = [make_record("kernel", compressor="int8", device="cpu", size_bytes=s, wire_bytes=s // 4,
                         compress_s=s / 2e9, decompress_s=s / 2e9, max_rel_error=0.0, iters=5) for s in (2**20, 2**24)]
    shared = fit_kernels(alone + kern)[0]["int8"]["shared"]["4"]
    assert shared["compress_GBps"] == pytest.approx(1 / 3 * share / granted, rel=0.01)
    assert shared["decompress_GBps"] == pytest.approx(1.0 * share / granted, rel=0.01)


def test_a_compute_record_with_an_unknown_op_is_refused():
    with pytest.raises(InputError, match="op"):
        _compute("conv", 1, 1, 1, flops=1.0)


def test_a_pair_of_hosts_gets_its_own_bandwidth(tmp_path):
    """Two ranks on two hosts send to and receive from the same peer: calibration fits their
    bandwidth apart (``NAME@pair``, the primitive's step latency shared) and a two-host group is
    predicted with it, a four-host group without."""
    pair = {f"{k}@pair": (a, f * 0.6) for k, (a, f) in KNOWN.items()}
    known = _profile(tmp_path, {**KNOWN, **pair})
    profile = fit_profile(_synthetic(known), "emulated:hosts=4,bandwidth=1gbit,cores=64")
    assert profile["protocols"]["tcp"]["Simple"]["base_us"] == pytest.approx(BASE_US, rel=0.02)
    got = profile["primitives"]["tcp"]
    for prim, (alpha, frac) in {**KNOWN, **pair}.items():
        if prim in got:
            assert got[prim]["bw_fraction"] == pytest.approx(frac, rel=0.02), prim
            assert got[prim]["step_us"] == pytest.approx(alpha, rel=0.02), prim
    assert {"allreduce@pair", "p2p@pair"} <= set(got)
    out = tmp_path / "fitted.json"
    out.write_text(json.dumps(profile))
    load_calibration(str(out))   # a valid profile
    two = "emulated:hosts=2,bandwidth=1gbit,cores=64"
    fitted = runtime_time("allreduce", 2**24, cluster=two, calibration=str(out)).time_s
    assert fitted == pytest.approx(runtime_time("allreduce", 2**24, cluster=two, calibration=known).time_s, rel=0.03)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({**profile, "primitives": {"tcp": {k: v for k, v in got.items() if "@" not in k}}}))
    assert fitted > 1.5 * runtime_time("allreduce", 2**24, cluster=two, calibration=str(plain)).time_s


def test_kernels_inside_a_run_give_the_in_run_factor(tmp_path):
    """Compressed collective records whose kernels took 1.8x what the kernel benchmark predicts
    give ``in_run`` 1.8 at their sizes; the loaded profile then predicts those kernels 1.8x
    slower at that rank count."""
    cluster = "emulated:hosts=4,bandwidth=500mbit,cores=2"
    records = []
    for size in (2**18, 2**20, 2**22, 2**24):
        for conc, (tc, td) in ((1, (2e9, 3e9)), (4, (1e9, 1.2e9))):
            records.append(make_record("kernel", compressor="int8", device="cpu", size_bytes=size,
                                       wire_bytes=size // 4 + 40, compress_s=size / tc, decompress_s=size / td,
                                       max_rel_error=0.0, concurrent=conc))
    first = fit_profile(records, cluster)
    path = tmp_path / "k.json"
    path.write_text(json.dumps(first))
    for size in (2**20, 2**22):
        t = runtime_time("allreduce", size, cluster=cluster, compressor="int8", algorithm="two_phase",
                         calibration=str(path))
        records.append(make_record("collective", op="allreduce", compressor="int8", algorithm="two_phase", world=4,
                                   backend="gloo", size_bytes=size, wire_bytes=0, time_s=t.time_s,
                                   compress_s=0.9 * t.timed.kernel_s, decompress_s=0.9 * t.timed.kernel_s,
                                   max_rel_error=0, cluster=cluster))
    profile = fit_profile(records, cluster)
    assert profile["kernels"]["int8"]["in_run"] == {str(2**20): pytest.approx(1.8, rel=0.01),
                                                    str(2**22): pytest.approx(1.8, rel=0.01)}
    assert profile["fits"]["in_run"]["int8"]["records"] == 2
    path.write_text(json.dumps(profile))
    slow = runtime_time("allreduce", 2**22, cluster=cluster, compressor="int8", algorithm="two_phase",
                        calibration=str(path)).timed.kernel_s
    assert slow == pytest.approx(1.8 * t.timed.kernel_s, rel=0.05)


def test_the_in_run_factor_follows_message_size():
    from perfmodel.calibration.profile import Calibration

    calib = Calibration(path="x", provenance={}, devices={}, protocols={}, ratios={}, overlap_slowdown=None,
                        in_run={"int8": ((2**20, 0.5), (2**24, 2.0))})
    assert calib.in_run_factor("int8", 2**18) == 0.5 and calib.in_run_factor("int8", 2**26) == 2.0
    assert calib.in_run_factor("int8", 2**22) == pytest.approx(1.25)   # halfway in log size
    assert calib.in_run_factor("fp16", 2**22) == 1.0


def test_summary_without_a_fitted_launch_cost():
    """A profile whose launch intercept was not positive has no kernel_launch_us: the summary
    still prints (it once raised KeyError under a noisy calibration)."""
    from perfmodel.calibration.fit import summary

    profile = {"devices": {"cpu-host": {"gemm_efficiency": {"1": 0.5}}}, "fits": {"kernels": {}}}
    rows = summary(profile)
    assert any("gemm_efficiency" in str(r) for r in rows)
