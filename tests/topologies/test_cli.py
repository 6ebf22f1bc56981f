import json


def test_list(cli):
    out = cli("topologies", "list", check_rc=0).stdout
    assert "dgx-h100" in out and "lassen" in out


def test_show_table_and_json(cli):
    out = cli("topologies", "show", "dgx-h100", "--nodes", "4", check_rc=0).stdout
    assert "32 GPUs" in out and "bisection bandwidth" in out and "nvlink" in out
    data = json.loads(cli("topologies", "show", "lassen", "--json", check_rc=0).stdout)
    assert data["gpus_per_node"] == 4 and "ib-leaf" in data["tiers"] and data["sources"]


def test_export_and_draw(cli, tmp_path):
    g = tmp_path / "c.graphml"
    j = tmp_path / "c.json"
    png = tmp_path / "c.png"
    cli("topologies", "export", "dgx-a100", "--format", "graphml", "-o", str(g), check_rc=0)
    cli("topologies", "export", "dgx-a100", "--format", "json", "-o", str(j), check_rc=0)
    cli("topologies", "draw", "lassen", "--nodes", "2", "-o", str(png), check_rc=0)
    assert "<graphml" in g.read_text()
    assert json.loads(j.read_text())["nodes"]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bad_input_is_one_line_and_exit_2(cli, tmp_path):
    for args in (("show", "nope"), ("show", "dgx-a100", "--nodes", "0"),
                 ("show", "dgx-a100", "--nodes", "x"), ("export", "dgx-a100", "--format", "gml", "-o", "f")):
        proc = cli("topologies", *args)
        assert proc.returncode == 2, args
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr


def test_unwritable_outputs_are_refused_before_any_work(cli, tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    for args in (("topologies", "export", "dgx-a100", "-o", str(missing / "g.graphml")),
                 ("topologies", "draw", "lassen", "-o", str(missing / "g.png")),
                 ("perfmodel", "sweep", "--model", "gpt2-small", "--cluster", "dgx-a100", "--gbs", "8",
                  "--csv", str(missing / "s.csv"))):
        proc = cli(*args)
        assert proc.returncode == 2 and "existing folder" in proc.stderr, args
        assert len(proc.stderr.strip().splitlines()) == 1
