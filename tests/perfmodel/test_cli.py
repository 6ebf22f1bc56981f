import json


def test_collective_table_has_nccl_tests_columns(cli):
    out = cli("perfmodel", "collective", "allreduce", "--cluster", "dgx-h100", "--nodes", "4",
              "--size", "1GiB", "--compressor", "int8", check_rc=0).stdout
    header = next(line for line in out.splitlines() if line.split()[:2] == ["size", "count"])
    for col in ("count", "type", "algorithm", "time_us", "algbw", "busbw", "sent_bytes"):
        assert col in header
    row = next(line for line in out.splitlines() if "int8" in line and not line.startswith("#"))
    assert row.split()[:3] == ["1073741824", "268435456", "float"]     # bytes and type as nccl-tests


def test_sweep_side_by_side_with_speedups(cli):
    out = cli("perfmodel", "collective", "allreduce", "--cluster", "dgx-a100", "--nodes", "2", "--sweep",
              "1MiB:16MiB", "--compressor", "none,fp16,int8,topk(0.01)", check_rc=0).stdout
    assert "speedup over uncompressed" in out
    assert sum(line.lstrip().startswith(("1048576 ", "16777216 ")) for line in out.splitlines()) == 2 * 4  # bytes
    assert sum(line.startswith(("1MiB", "16MiB")) for line in out.splitlines()) == 2               # the matrix


def test_json_is_a_list_of_records(cli):
    data = json.loads(cli("perfmodel", "collective", "allgather", "--cluster", "lassen", "--gpus", "16",
                          "--sweep", "1KiB:4KiB", "--compressor", "none,int8", "--json", check_rc=0).stdout)
    assert len(data) == 6 and {d["compressor"] for d in data} == {"none", "int8"}
    assert all(d["gpus"] == 16 for d in data)


def test_bad_input_is_one_line_exit_2(cli):
    cases = [("--size", "-5"), ("--size", "12XB"), ("--compressor", "topk(1.5)"), ("--compressor", "bogus"),
             ("--algorithm", "foo"), ("--compressor", "zfp(rate=1)"), ("--gpus", "0"), ("--cluster", "nope"),
             ("--sweep", "1GiB:1KiB"), ("--chunks", "x"), ("--dtype", "fp64")]
    for args in cases:
        proc = cli("perfmodel", "collective", "allreduce", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
