"""Collective-library profiles (--library) and the break-even kernel throughput (perfmodel breakeven)."""
import json

import pytest

from perfmodel import collective_time, predict
from perfmodel.explore.breakeven import breakeven, parse_target
from perfmodel.calibration.profile import SCHEMA
from perfmodel.collectives.library import library, libraries
from topologies.errors import InputError

NEOX = dict(gpus=192, tp=4, pp=4, mbs=4, gbs=1056, zero=1, recompute="full")
NEOX_ARGS = ["--model", "gpt-neox-20b", "--cluster", "lassen", "--gpus", "192", "--tp", "4", "--pp", "4", "--mbs",
             "4", "--gbs", "1056", "--zero", "1", "--recompute", "full"]


def test_catalog_gives_every_library_every_tier_class():
    classes = set(library("nccl").protocols)
    for lib in libraries().values():
        assert set(lib.protocols) == classes and lib.auto["allreduce"]
    assert library(None).name == "nccl"


def test_mpi_weighs_its_own_algorithms_and_protocols():
    for size in (1 << 12, 1 << 20, 1 << 28):
        r = collective_time("allreduce", size, cluster="dgx-a100", nodes=2, library="mpi")
        assert r.algorithm in ("ring", "recursive_doubling") and r.protocol in ("eager", "rendezvous")
    small = collective_time("allreduce", 1 << 12, cluster="dgx-a100", nodes=2, library="mpi")
    large = collective_time("allreduce", 1 << 28, cluster="dgx-a100", nodes=2, library="mpi")
    assert (small.protocol, large.protocol) == ("eager", "rendezvous")
    # NCCL's double binary tree wins small all-reduces on 16 GPUs; MPI has no such tree
    assert collective_time("allreduce", 1 << 16, cluster="dgx-a100", nodes=2).algorithm == "tree"


def test_mpi_costs_move_in_the_expected_direction():
    # small messages: MPI's per-message latency (GPU buffers) is above NCCL's LL
    nccl = collective_time("allreduce", 1 << 14, cluster="lassen", gpus=4)
    mpi = collective_time("allreduce", 1 << 14, cluster="lassen", gpus=4, library="mpi")
    assert mpi.time_s > 1.5 * nccl.time_s
    # large messages across nodes: the rendezvous path's 0.96 of InfiniBand against NCCL Simple's 0.97
    big = dict(cluster="lassen", nodes=4, ranks=4, placement="spread", algorithm="ring")
    nccl, mpi = (collective_time("allreduce", 1 << 30, library=lib, **big) for lib in ("nccl", "mpi"))
    assert mpi.time_s == pytest.approx(nccl.time_s * 0.9697 / 0.96, rel=0.02)


def test_mpi_compressed_reductions_stay_within_its_algorithms():
    r = collective_time("allreduce", 1 << 28, cluster="dgx-a100", nodes=4, compressor="int8", library="mpi")
    assert r.algorithm in ("ring", "recursive_doubling")
    anything = collective_time("allreduce", 1 << 28, cluster="dgx-a100", nodes=4, compressor="int8")
    assert anything.time_s <= r.time_s


def test_default_library_changes_nothing():
    kw = dict(model="gpt-neox-20b", cluster="lassen", policy="hybrid", **NEOX)
    assert predict(**kw).step_time_s == predict(library="nccl", **kw).step_time_s
    assert predict(library="mpi", **kw).step_time_s != predict(**kw).step_time_s


def test_a_profile_overrides_the_library_constants(tmp_path):
    path = tmp_path / "mpi.json"
    path.write_text(json.dumps({"schema": SCHEMA, "protocols": {"net": {"rendezvous": {"bw_fraction": 0.48}}}}))
    kw = dict(cluster="lassen", nodes=4, ranks=4, placement="spread", algorithm="ring", library="mpi")
    plain = collective_time("allreduce", 1 << 30, **kw)
    slow = collective_time("allreduce", 1 << 30, calibration=str(path), **kw)
    assert slow.bandwidth_s == pytest.approx(2 * plain.bandwidth_s, rel=1e-6)


def test_unknown_library_is_refused(cli):
    with pytest.raises(InputError, match="library"):
        collective_time("allreduce", 1 << 20, library="gloo")
    with pytest.raises(InputError, match="library"):
        predict("gpt-neox-20b", "lassen", library="gloo", **NEOX)
    for cmd in (["predict", *NEOX_ARGS], ["collective", "allreduce", "--cluster", "lassen"],
                ["search", "--model", "gpt-neox-20b", "--cluster", "lassen", "--gpus", "192", "--gbs", "1056"]):
        proc = cli("perfmodel", *cmd, "--library", "gloo", check_rc=2)
        assert proc.stderr.strip().splitlines() == ["perfmodel: error: library='gloo': one of nccl, mpi"]


def test_target_forms():
    assert parse_target("+12.7%") == pytest.approx(1.127) and parse_target("1.05") == 1.05
    for bad in ("abc", "-200%", "0", "nan"):
        with pytest.raises(InputError, match="target"):
            parse_target(bad)


def test_breakeven_reproduces_the_target(tmp_path):
    kw = dict(policy="naive:zfp(rate=8)", **NEOX)
    r = breakeven("gpt-neox-20b", "lassen", "+10%", **kw)
    assert r.reachable and r.model_speedup < 1.10 < r.limit_speedup
    assert r.speedup_at_solution == pytest.approx(1.10, abs=1e-4)
    assert r.compress_GBps > r.model_GBps["zfp(rate=8)"][0]     # faster than the model's own kernel
    # the same throughput in a calibration profile, predicted the ordinary way, gives the target
    path = tmp_path / "zfp.json"
    kernels = {"zfp(rate=8)": {"compress_GBps": r.compress_GBps, "decompress_GBps": r.decompress_GBps}}
    path.write_text(json.dumps({"schema": SCHEMA, "kernels": kernels}))
    got = predict("gpt-neox-20b", "lassen", calibration=str(path), **kw)
    assert got.speedup_vs_uncompressed == pytest.approx(1.10, abs=1e-4)


def test_breakeven_reports_an_unreachable_target():
    r = breakeven("gpt-neox-20b", "lassen", "+50%", policy="naive:zfp(rate=8)", **NEOX)
    assert not r.reachable and r.compress_GBps is None and 1.0 < r.limit_speedup < 1.5
    with pytest.raises(InputError, match="families"):
        breakeven("gpt-neox-20b", "lassen", "+5%", policy="naive:int8", **NEOX)


def test_breakeven_cli(cli):
    out = cli("perfmodel", "breakeven", *NEOX_ARGS, "--policy", "naive:zfp(rate=8)", "--target", "+50%",
              check_rc=0).stdout
    assert "not reachable at any kernel throughput" in out
    data = json.loads(cli("perfmodel", "breakeven", *NEOX_ARGS, "--policy", "naive:zfp(rate=8)", "--target", "1.1",
                          "--library", "mpi", "--json", check_rc=0).stdout)
    assert data["reachable"] and data["library"] == "mpi" and data["speedup_at_solution"] == pytest.approx(1.1, 1e-4)
    cli("perfmodel", "breakeven", *NEOX_ARGS, "--target", "x", check_rc=2)


def test_catalog_lists_the_libraries(cli):
    out = cli("perfmodel", "catalog", "libraries", check_rc=0).stdout
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"nccl", "mpi"} and "rendezvous" in rows["mpi"] and "tree" in rows["nccl"]
