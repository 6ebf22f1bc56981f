"""Pictures: predict/compare breakdown bars, collective sweeps, measured busbw, bad picture paths."""
import pytest

from perfmodel.report.plots import plot_measured_collectives

PNG = b"\x89PNG\r\n\x1a\n"
PLAN = ["--model", "gpt2-medium", "--cluster", "commodity-25g", "--nodes", "2", "--tp", "1", "--pp", "2", "--mbs", "1",
        "--gbs", "16"]


def test_breakdown_and_collective_pictures(cli, tmp_path):
    one, many, coll = tmp_path / "one.png", tmp_path / "many.svg", tmp_path / "coll.png"
    cli("perfmodel", "predict", *PLAN, "--plot", str(one), check_rc=0)
    cli("perfmodel", "compare", *PLAN, "--policies", "none,naive:int8,hybrid", "--plot", str(many), check_rc=0)
    cli("perfmodel", "collective", "allreduce", "--cluster", "commodity-25g", "--nodes", "2", "--sweep", "1MiB:8MiB",
        "--compressor", "none,int8", "--plot", str(coll), check_rc=0)
    assert one.read_bytes()[:8] == PNG and coll.read_bytes()[:8] == PNG
    assert b"<svg" in many.read_bytes()[:500] and b"naive:int8" in many.read_bytes()


@pytest.mark.parametrize("command", [["perfmodel", "predict", *PLAN], ["perfmodel", "collective", "allreduce"]])
def test_bad_picture_paths_are_refused_first(cli, tmp_path, command):
    for bad in (tmp_path / "x.txt", tmp_path / "missing" / "x.png"):
        proc = cli(*command, "--plot", str(bad), check_rc=2)
        assert "plot" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_measured_busbw_picture(tmp_path):
    records = [dict(op="allreduce", compressor=c, algorithm="auto", world=2, size_bytes=s, time_s=s / 1e9 / f)
               for c, f in (("none", 1.0), ("int8", 2.5)) for s in (2**20, 2**22)]
    path = plot_measured_collectives(records, str(tmp_path / "bench.png"))
    assert (tmp_path / "bench.png").read_bytes()[:8] == PNG and path.endswith("bench.png")


def test_catalog_lists_every_compressor_family(cli):
    from perfmodel.compression.families import FAMILIES

    out = cli("perfmodel", "catalog", "compressors", check_rc=0).stdout
    names = {line.split()[0] for line in out.splitlines()[3:] if line and not line.startswith(" ")}
    assert set(FAMILIES) <= names
    int8 = next(line for line in out.splitlines() if line.startswith("int8 "))
    assert "block=256" in int8 and "3.938" in int8
