"""realrun bench: records in perfmodel's schema, tables, bad input."""
import json

import pytest

from perfmodel.calibration.measurements import RECORD_SCHEMA, make_record, read_records, validate_record
from topologies.errors import InputError

pytest.importorskip("torch", reason="torch is not installed (the real extra)")


@pytest.mark.distributed
def test_bench_allreduce_writes_records(cli, tmp_path):
    out = tmp_path / "r.jsonl"
    proc = cli("realrun", "bench", "allreduce", "--world", "2", "--sizes", "64KiB:128KiB", "--compressors",
               "none,int8", "--algorithms", "auto,ring", "--iters", "2", "--json", str(out), check_rc=0)
    assert "busbw" in proc.stdout and "compress_us" in proc.stdout
    records = read_records(str(out))
    assert len(records) == 2 * 2 * 2
    for r in records:
        assert r["time_min_s"] <= r["time_s"] <= r["time_max_s"]
        assert r["world"] == 2 and r["backend"] == "gloo"
        assert 0 < r["cpu_s"] < 100 * r["time_s"]      # a process's CPU per call: its threads, bounded
        if r["compressor"] == "int8":
            assert r["wire_bytes"] < r["size_bytes"] and 0 < r["max_rel_error"] < 0.05


@pytest.mark.distributed
def test_bench_alltoall_table_and_records(cli, tmp_path):
    """nccl-tests' all-to-all: SIZE is what a rank sends, busbw = algbw x (n-1)/n; every chunk
    compressed once, none exact."""
    from realrun.cli import HEAD

    out = tmp_path / "a.jsonl"
    proc = cli("realrun", "bench", "alltoall", "--world", "3", "--sizes", "12KiB,48KiB", "--compressors",
               "none,fp8,int8", "--iters", "2", "--json", str(out), check_rc=0)
    assert proc.stdout.startswith("# realrun bench alltoall: world=3")
    lines = proc.stdout.splitlines()
    assert tuple(lines[1].split()) == HEAD
    rows = [dict(zip(HEAD, line.split())) for line in lines[3:]]
    records = read_records(str(out))
    assert len(rows) == len(records) == 2 * 3
    for row, r in zip(rows, records):
        assert r["op"] == "alltoall" and r["world"] == 3 and r["busbw_factor"] == pytest.approx(2 / 3)
        assert (int(row["size"]), row["compressor"]) == (r["size_bytes"], r["compressor"])
        algbw = r["size_bytes"] / r["time_s"] / 1e9
        assert float(row["algbw"]) == pytest.approx(algbw, abs=1e-3)
        assert float(row["busbw"]) == pytest.approx(algbw * 2 / 3, abs=1e-3)
        assert r["wrong"] == 0 and int(row["#wrong"]) == 0
        if r["compressor"] == "none":   # two thirds of the array leave the rank, exactly
            assert r["max_rel_error"] == 0 and r["wire_bytes"] == pytest.approx(r["size_bytes"] * 2 / 3, abs=8)
        else:                           # one application's error on the two chunks that cross a link
            assert 0 < r["max_rel_error"] < 0.05 and r["wire_bytes"] < r["size_bytes"] / 3


def test_bench_kernels(cli, tmp_path):
    out = tmp_path / "k.jsonl"
    proc = cli("realrun", "bench", "kernels", "--sizes", "256KiB", "--compressors", "fp16,int8,topk(0.01)",
               "--iters", "2", "--json", str(out), check_rc=0)
    assert "compress_GBps" in proc.stdout
    records = read_records(str(out))
    assert {r["compressor"] for r in records} == {"fp16", "int8", "topk(0.01)"}
    assert all(r["kind"] == "kernel" and r["wire_bytes"] < r["size_bytes"] for r in records)


def test_bench_bad_input_is_one_line_exit_2(cli):
    for args in (["allreduce", "--world", "0"], ["allreduce", "--compressors", "topk(9)"],
                 ["allreduce", "--algorithms", "spiral"], ["kernels", "--device", "cuda"],
                 ["allreduce", "--sizes", "big"], ["allreduce", "--iters", "0"],
                 ["alltoall", "--compressors", "fp9"], ["alltoall", "--compressors", "int8(0)"]):
        proc = cli("realrun", "bench", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_record_schema_validation(tmp_path):
    r = make_record("kernel", compressor="int8", device="cpu", size_bytes=10, wire_bytes=3, compress_s=0.1,
                    decompress_s=0.1, max_rel_error=0.01)
    assert r["schema"] == RECORD_SCHEMA
    with pytest.raises(InputError, match="schema"):
        validate_record({**r, "schema": "x/1"})
    with pytest.raises(InputError, match="time_s"):
        validate_record({**r, "kind": "collective", "op": "allreduce", "algorithm": "ring", "world": 2,
                         "backend": "gloo"})
    with pytest.raises(InputError, match="size_bytes"):
        validate_record({**r, "size_bytes": -1})
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(r) + "\n{oops\n")
    with pytest.raises(InputError, match="bad.jsonl:2"):
        read_records(str(path))


@pytest.mark.distributed
def test_bench_runs_under_torchrun(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "t.jsonl"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "realrun.cli", "bench", "allreduce", "--sizes", "16KiB", "--compressors", "int8",
                           "--iters", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "under torchrun" in proc.stdout
    records = read_records(str(out))
    assert len(records) == 1 and records[0]["world"] == 2


@pytest.mark.distributed
def test_kernels_shared_by_ranks_are_marked_and_accumulate():
    from realrun.bench import run_kernels_shared

    records = run_kernels_shared([2**18], ["int8"], iters=2, ranks=2)
    assert len(records) == 1 and records[0]["concurrent"] == 2 and records[0]["accumulate"]
    assert records[0]["compress_s"] > 0 and records[0]["wire_bytes"] < 2**18
    assert 0 < records[0]["cpu_s"] <= 1.05 * (records[0]["compress_s"] + records[0]["decompress_s"])


def test_loop_commands_refuse_bad_input_in_one_line(cli, tmp_path):
    for args in (["cluster", "run"], ["cluster", "up", "--hosts", "12"], ["cluster", "up", "--bandwidth", "fast"],
                 ["cluster", "down", "--name", "Bad Name"],
                 ["validate", "--calibration", str(tmp_path / "missing.json"), "--out", str(tmp_path / "v")],
                 ["calibrate", "--cluster", "dgx-h100", "-o", str(tmp_path / "p.json")],
                 ["calibrate", "--cluster", "emu", "-o", str(tmp_path / "no" / "p.json")],
                 ["calibrate", "--cluster", "emu", "-o", str(tmp_path / "p.json"), "--model", "gpt-tiny,gpt-huge"]):
        proc = cli("realrun", *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.distributed
@pytest.mark.slow
def test_calibrate_and_validate_run_under_torchrun(tmp_path):
    """On a real cluster the loop runs under torchrun with a topologies cluster name: here two
    local ranks stand in for it (the numbers mean nothing; the path must work end to end)."""
    import subprocess
    import sys

    def torchrun(*args):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                               "2", "-m", "realrun.cli", *args], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    profile = tmp_path / "p.json"
    out = torchrun("calibrate", "--cluster", "emulated:hosts=2", "-o", str(profile), "--quick",
                   "--compressors", "int8", "--iters", "1")
    assert "kernel int8" in out and profile.exists()
    out = torchrun("validate", "--calibration", str(profile), "--cluster", "emulated:hosts=2", "--quick",
                   "--iters", "1", "--out", str(tmp_path / "val"))
    assert "MAPE" in out and out.count("# realrun validate") == 1
    import csv

    with open(tmp_path / "val" / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    from realrun.validate import QUICK_ALLTOALL_SPECS

    alltoalls = 2 * len(QUICK_ALLTOALL_SPECS)   # the quick grid's two sizes, each all-to-all spec
    assert len(rows) == 12 + alltoalls and [r["op"] for r in rows].count("alltoall") == alltoalls
    assert {r["bandwidth"] for r in rows} == {"0"}   # the cluster's own links
