"""The published-measurements suite (perfmodel.calibration.published, `perfmodel validate --published`)."""
import csv
import json
import os

import pytest

from perfmodel.calibration import published as pub
from topologies.errors import InputError


@pytest.fixture(scope="module")
def reports():
    return pub.validate_published()


def test_every_row_names_its_source_date_and_conditions(published):
    for source in pub.load_sources(published).values():
        rows = pub.source_rows(source, published)
        assert rows, source.key
        needed = ("tool_and_settings", "nccl_version") if source.kind == "collective" else \
            ("precision", "recompute", "assumptions")
        for r in rows:
            assert r["source"] and r["source_date"] and all(r[k] for k in needed), (source.key, r)
            if source.kind == "training":   # what is compared: tokens/s, or TFLOP/s with the source's FLOP count
                assert r.get("measured_tokens_per_s") or r.get("measured_tokens_per_s_per_gpu") \
                    or (r.get("measured_tflops_per_gpu") and r.get("flops_formula"))


def test_no_source_rises_above_its_bound(reports, published):
    """The regression guard: today's MAPE per source, rounded up a little, in bounds.json."""
    assert not pub.check_bounds(reports, pub.load_bounds(published))


def test_every_predicted_source_has_a_bound_and_rows(reports, published):
    bounds = pub.load_bounds(published)
    predicted = {r["source"] for r in reports if r["predicted"]}
    assert predicted == set(bounds)
    # a table's MAPE means something over five rows or more; a training report is one run (its bound is tight)
    single_runs = {"deepseek-v3-h800"}
    assert all(r["predicted"] >= 5 or r["source"] in single_runs for r in reports if r["predicted"])
    assert all(bounds[s] <= 0.1 for s in single_runs)


def test_every_measured_training_run_fits_its_gpus_memory(reports):
    """A published run ran, so its plan fit: perfmodel.plan.memory must say so for every row (it said
    10 of 35 did not while it kept the s x s attention scores flash attention never stores, and the
    six NeMo 5B rows before their optimizer's ZeRO-2 was recorded)."""
    rows = [r for rep in reports if rep["kind"] == "training" for r in rep["results"] if r.predicted is not None]
    assert len(rows) >= 30 and all(r.memory_GiB > 1 for r in rows)
    assert [r.label for r in rows if r.fits is False] == []
    assert sum(r.fits is None for r in rows) < len(rows) / 3   # rows whose fit is not checked say why (bridge.py)


def test_check_bounds_names_a_run_predicted_not_to_fit():
    row = pub.RowResult("s", "7B 8 GPUs", 100.0, 90.0, -0.1, "tokens/s", memory_GiB=91.5, fits=False)
    bad = pub.check_bounds([dict(source="s", mape=0.1, results=[row])], {"s": 0.2})
    assert bad == ["s: 7B 8 GPUs ran, but is predicted not to fit (91.5 GiB per GPU)"]
    assert "0/1" in pub.summary_markdown([dict(pub.summarize(pub.Source("s", "training", "f", "t"), [row]),
                                              results=[row])], {"s": 0.2})


def test_check_bounds_names_a_source_above_its_bound():
    rep = [dict(source="x", mape=0.2), dict(source="y", mape=0.05), dict(source="z", mape=None)]
    bad = pub.check_bounds(rep, {"x": 0.1, "y": 0.1})
    assert len(bad) == 1 and bad[0].startswith("x: MAPE 20.0%")
    assert pub.check_bounds([dict(source="w", mape=0.01)], {}) == ["w: MAPE 1.0% and no bound in bounds.json"]


def test_summary_is_mape_bias_and_worst_of_the_rows():
    src = pub.Source(key="s", kind="collective", file="f", title="t")
    rows = [pub.RowResult("s", "a", 100.0, 110.0, 0.10, "u"), pub.RowResult("s", "b", 100.0, 80.0, -0.20, "u"),
            pub.RowResult("s", "c", 100.0, None, None, "u", "cluster q not in the catalog")]
    s = pub.summarize(src, rows)
    assert s["mape"] == pytest.approx(0.15) and s["bias"] == pytest.approx(-0.05)
    assert (s["worst_label"], s["predicted"], s["skipped"]) == ("b", 2, 1)


def test_rows_on_a_cluster_the_catalog_lacks_are_skipped_not_dropped(published, tmp_path):
    """The B200 rows on a cluster the catalog lacks (as they were before dgx-b200): reported, skipped."""
    with open(published / "collectives_h200_b200_8gpu.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["gpu"] == "NVIDIA B200"]
    with open(tmp_path / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(dict(r, cluster="dgx-z900") for r in rows)
    (tmp_path / "sources.toml").write_text('[lacking]\nkind = "collective"\nfile = "rows.csv"\n'
                                           'system = "8x B200"\ntitle = "B200 rows on a cluster not in the catalog"\n')
    (report,) = pub.validate_published(folder=tmp_path)
    assert report["rows"] == 10 and report["mape"] is None
    assert all("not in the catalog" in r.skipped for r in report["results"])


def test_b200_rows_are_predicted_on_the_catalog_dgx_b200(reports):
    b200 = next(r for r in reports if r["source"] == "mleng-b200-nvlink")
    assert b200["rows"] == 10 and b200["mape"] is not None
    assert not any(r.skipped for r in b200["results"])


def test_megatron_core_flops_is_the_repository_formula():
    """megatron/training/training.py num_floating_point_operations for a GPT (ffn 4h, MHA), written out."""
    row = dict(gbs=192, seq_len=4096, num_layers=24, hidden_size=2048, vocab_size=131072)
    b, s, n, h, v = 192, 4096, 24, 2048, 131072
    expected = 12 * b * s * n * h * h * ((1 + 1 + s / h) + 4 + v / (2 * n * h))
    assert pub.source_flops("megatron-core-2024", row) == pytest.approx(expected)
    # the 2021 count has one recomputed forward: 4/3 of the layers' work, the logit layer once
    old = pub.source_flops("megatron-2021", row)
    assert old == pytest.approx(4 / 3 * 72 * b * s * n * h * h * (1 + s / (6 * h)) + 6 * b * s * h * v)


def test_unknown_source_is_refused():
    with pytest.raises(InputError, match="published"):
        pub.select_sources("nope")


def test_a_sources_unknown_key_is_refused_in_one_line(tmp_path):
    (tmp_path / "sources.toml").write_text('[x]\nkind = "training"\nfile = "a.csv"\ntitle = "t"\nsytem = "A"\n')
    with pytest.raises(InputError) as err:
        pub.load_sources(tmp_path)
    assert err.value.field == "sources.x" and "sytem" in str(err.value) and "system" in str(err.value)


def test_cli_outputs(cli, tmp_path):
    out_csv, out_png = tmp_path / "rows.csv", tmp_path / "pv.png"
    proc = cli("perfmodel", "validate", "--published", "mleng-h200-nvlink", "--json", "--csv", str(out_csv),
               "--plot", str(out_png), "--check-bounds", check_rc=0)
    data = json.loads(proc.stdout)
    assert [d["source"] for d in data] == ["mleng-h200-nvlink"] and data[0]["bound"] == 0.03
    assert len(data[0]["results"]) == 16
    with open(out_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16 and {r["source"] for r in rows} == {"mleng-h200-nvlink"}
    assert out_png.stat().st_size > 1000


def test_cli_table_and_bad_source(cli):
    proc = cli("perfmodel", "validate", "--published", "megatron-lm-a100-2021", check_rc=0)
    assert "| `megatron-lm-a100-2021` |" in proc.stdout and "1T 3072 GPUs tp8 pp64 dp6" in proc.stdout
    bad = cli("perfmodel", "validate", "--published", "nope", check_rc=2)
    assert "published='nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_check_bounds_fails_above_a_bound(cli, tmp_path, published):
    import shutil

    for f in published.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "bounds.json").write_text(json.dumps({"mape": {"mleng-h200-nvlink": 0.01}}))
    proc = cli("perfmodel", "validate", "--published", "mleng-h200-nvlink", "--dir", str(tmp_path),
               "--check-bounds", check_rc=1)
    assert "above its bound 1.0%" in proc.stderr


def test_the_rows_models_share_one_temporary_folder():
    a = pub._model_toml(1024, 2, 8, 50257, 512)
    b = pub._model_toml(2048, 2, 16, 50257, 512)
    assert os.path.dirname(a) == os.path.dirname(b) == str(pub._toml_folder())
    assert os.path.basename(a) != os.path.basename(b)


def test_the_packaged_regime_errors_are_todays(reports):
    """perfmodel advise's uncertainty bands read catalog/regime_errors.json: it must be what
    scripts/regime_errors.py makes of today's validation (rerun it after a model change)."""
    from perfmodel.explore.uncertainty import REGIME_FILE, regime_table

    assert json.loads(REGIME_FILE.read_text()) == json.loads(json.dumps(regime_table(reports)))
