"""Hostile input to the model's validation and calibration (issue 37, item 6): ``perfmodel validate
--dir``/``--check-bounds`` (sources.toml, the tables, bounds.json), ``perfmodel calibrate``'s records
and the profile it writes, and ``realrun validate --measured``. Each refusal is one line naming the
file and field (or line and column), the value and what is allowed, exit code 2, no traceback;
nothing written before the input is valid."""
import json
import math

import pytest

from perfmodel.calibration import published as pub
from topologies.clikit import run
from topologies.errors import InputError


def perfmodel(capsys, *argv) -> tuple[int, str]:
    """``perfmodel ARGV`` in this process: (exit code, its error output)."""
    from perfmodel.cli import main

    try:
        code = run(main, list(argv))
    except SystemExit as stop:     # --check-bounds: exit 1 above a bound
        code = stop.code
    return code, capsys.readouterr().err.strip()


def assert_one_line(code: int, err: str, *said: str) -> None:
    assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    for text in said:
        assert text in err, err


# --- perfmodel validate --dir / --check-bounds -------------------------------------------------

SOURCE = '[s]\nkind = "collective"\nfile = "c.csv"\ntitle = "t"\ncluster = "dgx-a100"\n'
HEADER = "system,total_gpus,message_size_bytes,busbw_GBps"
TABLE = f"{HEADER}\nS,8,1048576,100\n"


def _folder(tmp_path, sources=SOURCE, table=TABLE, bounds='{"mape": {"s": 5.0}}'):
    """A --dir folder: sources.toml, the table c.csv and bounds.json (str, or bytes as written)."""
    for name, body in (("sources.toml", sources), ("c.csv", table), ("bounds.json", bounds)):
        if body is not None:
            (tmp_path / name).write_bytes(body if isinstance(body, bytes) else body.encode())
    return str(tmp_path)


def _row(cells: str) -> str:
    return f"{HEADER}\n{cells}\n"


OUTSIDE = "/".join(("..", "..", "etc", "passwd"))   # a table outside the folder
SOURCES_CASES = [
    ("[s\nkind =", "sources.toml='not TOML'"),
    (b"\xff\xfe[s]", "sources.toml='bytes that are not UTF-8'"),
    ("s = 1\n", "sources.s=1: a [table]"),
    (SOURCE.replace('"collective"', "3"), "sources.s.kind=3: a string"),
    (SOURCE.replace('"collective"', '"bogus"'), "sources.s.kind='bogus': one of collective, training"),
    (SOURCE.replace('"c.csv"', "3"), "sources.s.file=3: a string"),
    (SOURCE + "system = 3\n", "sources.s.system=3: a string"),
    (SOURCE.replace('file = "c.csv"\n', ""), "sources.s.file=None: required"),
    (SOURCE.replace('title = "t"\n', ""), "sources.s.title=None: required"),
    (SOURCE + 'format = "x"\n', "sources.s.format='x': one of absent, megatron-bridge"),
    (SOURCE + 'family = "big"\n', "sources.s.family='big'"),
    (SOURCE.replace('"c.csv"', f'"{OUTSIDE}"'), f"sources.s.file='{OUTSIDE}': a CSV table in"),
    (SOURCE.replace('"c.csv"', '"/etc/passwd"'), "sources.s.file='/etc/passwd'"),
    (SOURCE.replace('"c.csv"', '"nope.csv"'), "sources.s.file='nope.csv'"),
    (SOURCE.replace('"c.csv"', '"."'), "sources.s.file='.'"),
]


@pytest.mark.parametrize("sources, said", SOURCES_CASES)
def test_a_malformed_sources_toml_is_one_line_naming_the_source_and_key(capsys, tmp_path, sources, said):
    assert_one_line(*perfmodel(capsys, "validate", "--dir", _folder(tmp_path, sources=sources), "--check-bounds"),
                    said)


TABLE_CASES = [
    ("system,total_gpus\nS,8\n", "c.csv': a table of collective measurements (no column message_size_bytes"),
    (_row("S,eight,1048576,100"), "c.csv:2.total_gpus='eight': an integer from 1 to 131072"),
    (_row("S,,1048576,100"), "c.csv:2.total_gpus='': a value"),
    (_row("S,-8,1048576,100"), "c.csv:2.total_gpus='-8'"),
    (_row("S,800000000000,1048576,100"), "c.csv:2.total_gpus='800000000000'"),
    (_row("S,8,1" + "0" * 30 + ",100"), "c.csv:2.message_size_bytes="),
    (_row("S,8,1048576,nan"), "c.csv:2.busbw_GBps='nan': a number from 1e-06 to 1e+06"),
    (_row("S,8,1048576,inf"), "c.csv:2.busbw_GBps='inf'"),
    (_row("S,8,1048576,0"), "c.csv:2.busbw_GBps='0'"),
    (_row("S,8,1048576,-5"), "c.csv:2.busbw_GBps='-5'"),
    (_row("S,8,1048576,fast"), "c.csv:2.busbw_GBps='fast'"),
    ("", "c.csv"), (HEADER + "\n", "a header and at least one row"),
    (_row("S,8"), "c.csv:2='2 cells': the 4 cells its header names"),
    (_row("S,8,1048576,100,extra"), "c.csv:2='5 cells'"),
    (_row("S,8,1048576," + "9" * 200_000), "c.csv:2='a malformed row'"),
    (b"\xff\xfe" + TABLE.encode(), "in UTF-8 text"),
    (f"{HEADER},op\nS,8,1048576,100,frob\n", "c.csv:2.op='frob': one of allreduce"),
    (_row("S,1,1048576,100"), "c.csv:2.predicted=inf: a prediction above 0"),   # one GPU: no bus bandwidth
]


@pytest.mark.parametrize("table, said", TABLE_CASES)
def test_a_malformed_table_is_one_line_naming_its_file_line_and_column(capsys, tmp_path, table, said):
    assert_one_line(*perfmodel(capsys, "validate", "--dir", _folder(tmp_path, table=table), "--check-bounds"), said)


TRAINING = '[t]\nkind = "training"\nfile = "c.csv"\ntitle = "t"\n'


def _training_table(published, **changes) -> str:
    """The first row of megatron_training_throughput.csv with ``changes`` (column: cell)."""
    import csv
    import io

    with open(published / "megatron_training_throughput.csv", newline="") as handle:
        row = next(csv.DictReader(handle))
    row.update(changes)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(row))
    writer.writeheader()
    writer.writerow(row)
    return out.getvalue()


@pytest.mark.parametrize("changes, said", [
    ({"gpus": "x"}, "c.csv:2.gpus='x'"),
    ({"tp": "0"}, "c.csv:2.tp='0'"),
    ({"gbs": "1" + "0" * 30}, "c.csv:2.gbs="),
    ({"mbs": "-1"}, "c.csv:2.mbs='-1'"),
    ({"hidden_size": "99999999999"}, "c.csv:2.hidden_size='99999999999': an integer from 1 to 262144"),
    ({"measured_tflops_per_gpu": "nan"}, "c.csv:2.measured_tflops_per_gpu='nan': a finite number above 0"),
    ({"measured_tflops_per_gpu": "0"}, "c.csv:2.measured_tflops_per_gpu='0'"),
    ({"measured_tflops_per_gpu": "-3"}, "c.csv:2.measured_tflops_per_gpu='-3'"),
    ({"measured_tflops_per_gpu": ""}, "c.csv:2.measured_tflops_per_gpu=''"),
    ({"flops_formula": "mine"}, "c.csv:2.flops_formula='mine': one of megatron-2021, megatron-core-2024"),
    ({"sequence_parallel": "maybe"}, "c.csv:2.sequence_parallel='maybe': True or False"),
    ({"recompute": "wat"}, "c.csv:2.recompute='wat'"),
    ({"cluster": ""}, "c.csv:2.cluster=''"),
])
def test_a_malformed_training_row_is_one_line(capsys, tmp_path, published, changes, said):
    folder = _folder(tmp_path, sources=TRAINING, table=_training_table(published, **changes), bounds=None)
    assert_one_line(*perfmodel(capsys, "validate", "--dir", folder), said)


@pytest.mark.parametrize("cells, said", [
    ({"tp": "x"}, "c.csv:2.tp='x': an integer from 1 to 131072"),
    ({"num_gpus": "7", "tp": "2"}, "c.csv:2.num_gpus=7: a multiple of tp x pp x cp"),
    ({"micro_batch_size": "many"}, "c.csv:2.micro_batch_size='many'"),
    ({"alt_values_in_parentheses": "tokens_per_s_per_gpu=5;grad_accum=0"},
     "c.csv:2.alt_values_in_parentheses.grad_accum='0'"),
    ({"alt_values_in_parentheses": "tokens_per_s_per_gpu=5;precision=FP3"},
     "c.csv:2.alt_values_in_parentheses.precision='FP3'"),
    ({"tokens_per_s_per_gpu": "nan"}, "c.csv:2.measured_tokens_per_s_per_gpu='nan'"),
])
def test_a_malformed_megatron_bridge_row_is_one_line(capsys, tmp_path, published, cells, said):
    import csv
    import io

    with open(published / "megatron_bridge_training_throughput.csv", newline="") as handle:
        row = next(r for r in csv.DictReader(handle) if r["model"] == "LLAMA3_8B" and r["system"] == "DGX-H100")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(row))
    writer.writeheader()
    writer.writerow({**row, **cells})
    sources = TRAINING + 'format = "megatron-bridge"\n'
    assert_one_line(*perfmodel(capsys, "validate", "--dir", _folder(tmp_path, sources, out.getvalue(), None)), said)


@pytest.mark.parametrize("bounds, said", [
    ("{", "bounds.json='not JSON'"),
    ("[]", "bounds.json='a JSON list'"),
    ("{}", "bounds.json:mape=None"),
    ('{"mape": []}', "bounds.json:mape='a JSON list'"),
    ('{"mape": {"s": "0.1"}}', "bounds.json:mape.s='0.1': a finite number from 0 to 10"),
    ('{"mape": {"s": NaN}}', "bounds.json:mape.s=nan"),
    ('{"mape": {"s": Infinity}}', "bounds.json:mape.s=inf"),
    ('{"mape": {"s": -0.1}}', "bounds.json:mape.s=-0.1"),
    ('{"mape": {"s": true}}', "bounds.json:mape.s=True"),
    ('{"mape": {"s": null}}', "bounds.json:mape.s=None"),
    (b"\xff\xfe{", "bounds.json='bytes that are not UTF-8'"),
])
def test_a_malformed_bound_is_refused_before_anything_is_predicted(capsys, tmp_path, bounds, said):
    """A NaN or infinite bound, which no MAPE exceeds, would turn the guard off: refused, as is every
    other bound that is no finite number from 0 to 10, with or without --check-bounds."""
    csv_out = tmp_path / "rows.csv"
    for extra in (("--check-bounds",), ("--json",), ("--csv", str(csv_out))):
        assert_one_line(*perfmodel(capsys, "validate", "--dir", _folder(tmp_path, bounds=bounds), *extra), said)
    assert not csv_out.exists()


def test_a_missing_folder_is_one_line(capsys, tmp_path):
    assert_one_line(*perfmodel(capsys, "validate", "--dir", str(tmp_path / "nope")), "dir=")
    assert_one_line(*perfmodel(capsys, "validate", "--dir", str(tmp_path)), "a folder with a readable sources.toml")


def test_a_prediction_that_is_no_number_fails_the_guard():
    row = pub.RowResult("s", "r", 100.0, math.nan, math.nan, "busbw GB/s")
    assert pub.check_bounds([dict(source="s", mape=math.nan, results=[row])], {"s": 0.2}) == \
        ["s: MAPE nan is not a number (a row's prediction is not finite)"]


def test_a_valid_folder_still_validates_and_guards(capsys, tmp_path):
    assert perfmodel(capsys, "validate", "--dir", _folder(tmp_path), "--check-bounds") == (0, "")
    code, err = perfmodel(capsys, "validate", "--dir", _folder(tmp_path, bounds='{"mape": {"s": 0.0}}'),
                          "--check-bounds")
    assert code == 1 and "above its bound 0.0%" in err
    assert pub.load_bounds(tmp_path / "elsewhere") == {}


def test_load_sources_names_the_key_of_a_bad_entry(tmp_path):
    (tmp_path / "sources.toml").write_text('[x]\nkind = "training"\nfile = "a.csv"\ntitle = ["t"]\n')
    with pytest.raises(InputError) as err:
        pub.load_sources(tmp_path)
    assert err.value.field == "sources.x.title"
    json.dumps(err.value.value)


# --- perfmodel calibrate: records and the profile it writes ------------------------------------

EMULATED = "emulated:hosts=4,bandwidth=1gbit"
KERNEL = {"schema": "commpress.record/1", "kind": "kernel", "compressor": "int8", "device": "cpu",
          "max_rel_error": 0.01}
COLLECTIVE = {"schema": "commpress.record/1", "kind": "collective", "op": "allreduce", "compressor": "none",
              "algorithm": "ring", "world": 4, "backend": "gloo", "compress_s": 0, "decompress_s": 0,
              "max_rel_error": 0.0, "cluster": EMULATED}
COMPUTE = {"schema": "commpress.record/1", "kind": "compute", "op": "gemm", "device": "cpu", "m": 256, "n": 256,
           "k": 256, "flops": 2 * 256**3, "bytes": 0, "time_s": 1e-3}


def _records(tmp_path, base: dict, **changes) -> str:
    """A JSON Lines file of four records of ``base`` at 64 KiB - 4 MiB with ``changes`` in every one."""
    lines = []
    for size in (2**16, 2**18, 2**20, 2**22):
        r = dict(base)
        if base["kind"] == "kernel":
            seconds = 1e-5 + size / 1e9
            r.update(size_bytes=size, wire_bytes=size // 4, compress_s=seconds, decompress_s=seconds)
        elif base["kind"] == "collective":
            r.update(size_bytes=size, wire_bytes=size * 1.5, time_s=1e-4 + size / 1e8)
        lines.append(json.dumps({**r, **changes}) + "\n")
    path = tmp_path / "records.jsonl"
    path.write_text("".join(lines))
    return str(path)


CALIBRATE_CASES = [
    (KERNEL, {"concurrent": "x"}, "records.jsonl:1.concurrent='x': an integer from 1 to 131072"),
    (KERNEL, {"concurrent": 0}, "records.jsonl:1.concurrent=0"),
    (KERNEL, {"concurrent": 1.5}, "records.jsonl:1.concurrent=1.5"),
    (KERNEL, {"cpu_share": "x", "cpu_s": 1e-3}, "records.jsonl:1.cpu_share='x': a number from 0 to 1"),
    (KERNEL, {"cpu_share": 5, "cpu_s": 1e-3}, "records.jsonl:1.cpu_share=5"),
    (KERNEL, {"compressor": "sz3(abs=1e-3)", "wire_bytes": 0}, "records.jsonl:1.wire_bytes=0: at least 1 byte"),
    (KERNEL, {"compressor": "zfp(tolerance=1e-3)", "wire_bytes": 0}, "records.jsonl:1.wire_bytes=0"),
    (KERNEL, {"size_bytes": 0}, "records.jsonl:1.size_bytes=0: at least 1 byte"),
    (KERNEL, {"compress_s": 1e-300}, "records.jsonl:1.compress_s=1e-300: 0 (not measured) or a number from 1e-09"),
    (KERNEL, {"decompress_s": 1e-300}, "records.jsonl:1.decompress_s=1e-300"),
    (KERNEL, {"compress_s": 1e300}, "records.jsonl:1.compress_s=1e+300"),
    (KERNEL, {"size_bytes": 2**40, "compress_s": 1e-6},
     "records.jsonl:1.compress_s=1e-06: at least 0.0011 s for its 1.1e+12 bytes"),
    (KERNEL, {"compressor": 3}, "records.jsonl:1.compressor=3: a string"),
    (KERNEL, {"compressor": "wat"}, "records.jsonl:1.compressor='wat': a compressor spec"),
    (KERNEL, {"device": ["cpu"]}, "records.jsonl:1.device=['cpu']: a string"),
    (KERNEL, {"iters": "x"}, "records.jsonl:1.iters='x': a whole number >= 0"),
    (KERNEL, {"accumulate": "yes"}, "records.jsonl:1.accumulate='yes': true or false"),
    (COLLECTIVE, {"cluster": 3}, "records.jsonl:1.cluster=3: a string"),
    (COLLECTIVE, {"time_s": 1e-300}, "records.jsonl:1.time_s=1e-300"),
    (COLLECTIVE, {"time_s": math.inf}, "records.jsonl:1.time_s=inf"),
    (COLLECTIVE, {"cpu_s": 1e300}, "records.jsonl:1.cpu_s=1e+300"),
    (COLLECTIVE, {"busbw_factor": "x"}, "records.jsonl:1.busbw_factor='x'"),
    (COLLECTIVE, {"world": 10**9}, "records.jsonl:1.world=1000000000"),
    (COMPUTE, {"flops": 1e300}, "records.jsonl:1.flops=1e+300: a number from 0 to 1e+21"),
    (COMPUTE, {"flops": 0}, "records.jsonl:1.flops=0: above 0 in a gemm record"),
    (COMPUTE, {"flops": 1e20}, "records.jsonl:1.time_s=0.001: at least 1e+03 s for its 1e+20 FLOPs"),
    (COMPUTE, {"time_s": 1e-300}, "records.jsonl:1.time_s=1e-300"),
    (COMPUTE, {"op": "elementwise", "bytes": 2**50}, "records.jsonl:1.time_s=0.001"),
    (COMPUTE, {"m": 0}, "records.jsonl:1.m=0: a number from 1 to 1e+12"),
    (COMPUTE, {"op": "scores", "scores": "x"}, "records.jsonl:1.scores='x'"),
    (COMPUTE, {"cpu_s": 1e-12, "cpu_share": 0.5}, "records.jsonl:1.cpu_s=1e-12"),
]


@pytest.mark.parametrize("base, changes, said", CALIBRATE_CASES)
def test_a_record_of_a_wrong_type_or_degenerate_is_one_line_and_writes_nothing(capsys, tmp_path, base, changes,
                                                                              said):
    out = tmp_path / "profile.json"
    code, err = perfmodel(capsys, "calibrate", _records(tmp_path, base, **changes), "-o", str(out),
                          "--cluster", EMULATED)
    assert_one_line(code, err, said)
    assert not out.exists()


def test_a_fitted_value_past_its_bound_is_never_written(capsys, tmp_path, monkeypatch):
    """The profile is checked as the loader checks it before it is written: a fit that reached an absurd
    value (what flops 1e300 gave: 1e291 TFLOP/s) is one line naming the fitted field."""
    monkeypatch.setattr("perfmodel.calibration.fit.fit_compute",
                        lambda records, dev: ({"fp32_TFLOPS": 1e291, "gemm_efficiency": {"256": 1.0}}, {}))
    out = tmp_path / "profile.json"
    code, err = perfmodel(capsys, "calibrate", _records(tmp_path, COMPUTE), "-o", str(out), "--cluster", EMULATED)
    assert_one_line(code, err, "fitted profile.devices.host-cpu.fp32_TFLOPS=1e+291", "corrupt or mislabelled")
    assert not out.exists()


@pytest.mark.parametrize("body, said", [
    ('"devices": {"host-cpu": {"fp32_TFLOPS": 1e291}}', "calibration.devices.host-cpu.fp32_TFLOPS=1e+291"),
    ('"devices": {"host-cpu": {"stream_TBps": 1e12}}', "calibration.devices.host-cpu.stream_TBps"),
    ('"devices": {"host-cpu": {"eager_score_ns": 1e300}}', "calibration.devices.host-cpu.eager_score_ns"),
    ('"kernels": {"int8": {"compress_GBps": 1e300, "decompress_GBps": 1}}', "calibration.kernels.int8.compress_GBps"),
    ('"kernels": {"int8": {"compress_GBps": 1, "decompress_GBps": 1, "in_run": {"1024": 1e300}}}',
     "calibration.kernels.int8.in_run.1024"),
    ('"compressors": {"sz3": {"ratio": 1e300}}', "calibration.compressors.sz3.ratio"),
])
def test_the_profile_loader_refuses_a_value_past_its_bound(tmp_path, body, said):
    from perfmodel.calibration.profile import load_calibration

    path = tmp_path / "p.json"
    path.write_text('{"schema": "commpress.calibration/1", ' + body + "}")
    with pytest.raises(InputError) as err:
        load_calibration(str(path))
    assert said in str(err.value)


def test_good_records_still_calibrate(capsys, tmp_path):
    out = tmp_path / "profile.json"
    code, err = perfmodel(capsys, "calibrate", _records(tmp_path, KERNEL), "-o", str(out), "--cluster", EMULATED)
    assert (code, err) == (0, "") and json.loads(out.read_text())["kernels"]["int8"]["compress_GBps"] > 0


# --- realrun validate --measured ---------------------------------------------------------------

RESULTS = ("hosts", "bandwidth", "size_bytes", "compressor", "algorithm", "crossover", "predicted_s", "measured_s",
           "error", "repeats", "spread", "measured_all_s", "op")
STORED_ROW = dict(zip(RESULTS, ("4", "1000000000", "8388608", "int8", "two_phase", "False", "0.1", "0.12", "0.2",
                                "3", "0.1", "0.12;0.11;0.125", "allreduce")))


def realrun(capsys, *argv) -> tuple[int, str]:
    """``realrun ARGV`` in this process: (exit code, its error output)."""
    from realrun.cli import main

    return run(main, list(argv)), capsys.readouterr().err.strip()


def _stored(tmp_path, text: str | None = None, **cells) -> str:
    path = tmp_path / "results.csv"
    path.write_text(text if text is not None else ",".join(RESULTS) + "\n"
                    + ",".join({**STORED_ROW, **cells}[k] for k in RESULTS) + "\n")
    return str(path)


@pytest.mark.parametrize("cells, said", [
    ({"hosts": "x"}, "results.csv:2.hosts='x': an integer from 1 to 16384"),
    ({"hosts": "2.5"}, "results.csv:2.hosts='2.5'"),
    ({"hosts": "0"}, "results.csv:2.hosts='0'"),
    ({"bandwidth": "x"}, "results.csv:2.bandwidth='x': an integer from 1000000 to 100000000000"),
    ({"bandwidth": "0"}, "results.csv:2.bandwidth='0': an emulated link rate in bits/s"),
    ({"bandwidth": "-1"}, "results.csv:2.bandwidth='-1'"),
    ({"size_bytes": "x"}, "results.csv:2.size_bytes='x'"),
    ({"size_bytes": "0"}, "results.csv:2.size_bytes='0'"),
    ({"size_bytes": "-1"}, "results.csv:2.size_bytes='-1'"),
    ({"size_bytes": "1" + "0" * 30}, "results.csv:2.size_bytes="),
    ({"measured_s": "x", "measured_all_s": ""}, "results.csv:2.measured_s='x': a number from 1e-09 to 86400"),
    ({"measured_s": "0", "measured_all_s": ""}, "results.csv:2.measured_s='0'"),
    ({"measured_s": "-1", "measured_all_s": ""}, "results.csv:2.measured_s='-1'"),
    ({"measured_s": "nan", "measured_all_s": ""}, "results.csv:2.measured_s='nan'"),
    ({"measured_s": "inf", "measured_all_s": ""}, "results.csv:2.measured_s='inf'"),
    ({"measured_all_s": "nan;0.1"}, "results.csv:2.measured_all_s='nan'"),
    ({"measured_all_s": "-1;0.1"}, "results.csv:2.measured_all_s='-1'"),
    ({"measured_all_s": "0;0"}, "results.csv:2.measured_all_s='0'"),
    ({"compressor": "wat"}, "results.csv:2.compressor='wat'"),
    ({"algorithm": "wat"}, "results.csv:2.algorithm='wat'"),
    ({"op": "wat"}, "results.csv:2.op='wat'"),
    ({"crossover": "maybe"}, "results.csv:2.crossover='maybe': True or False"),
    ({"compressor": "x" * 200_000}, "results.csv:2='a malformed row'"),
])
def test_a_stored_results_cell_is_checked_before_anything_is_written(capsys, tmp_path, cells, said):
    out = tmp_path / "again"
    assert_one_line(*realrun(capsys, "validate", "--measured", _stored(tmp_path, **cells), "--out", str(out)), said)
    assert not out.exists()


@pytest.mark.parametrize("text, said", [
    ("", "(a header and at least one row)"),
    ("hosts,bandwidth\n4,1000000000\n", "(no column size_bytes"),
    (",".join(RESULTS) + "\n4,1000000000\n", "results.csv:2='2 cells': the 13 cells its header names"),
])
def test_a_stored_results_file_that_is_no_table_is_one_line(capsys, tmp_path, text, said):
    out = tmp_path / "again"
    assert_one_line(*realrun(capsys, "validate", "--measured", _stored(tmp_path, text), "--out", str(out)),
                    "measured=" if "row" in said or "column" in said else "", said)
    assert not out.exists()


@pytest.mark.parametrize("predicted", [0.0, math.nan, math.inf])
def test_a_prediction_that_is_no_time_is_refused_not_reported(capsys, tmp_path, monkeypatch, predicted):
    """A predicted 0 s gave an error of -100%, a NaN one 'MAPE: nan%': refused, naming the row."""
    monkeypatch.setattr("realrun.validate.predict", lambda case, runner, calibration: predicted)
    out = tmp_path / "again"
    assert_one_line(*realrun(capsys, "validate", "--measured", _stored(tmp_path), "--out", str(out)),
                    "results.csv:2.predicted_s=", "a time above 0 predicted for Case(hosts=4")
    assert not out.exists()


def test_a_good_stored_file_is_still_predicted_again(capsys, tmp_path):
    out = tmp_path / "again"
    code, err = realrun(capsys, "validate", "--measured", _stored(tmp_path), "--out", str(out))
    assert (code, err) == (0, "") and (out / "results.csv").exists()
