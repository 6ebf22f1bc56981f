"""Hostile input to every command: one line naming the field, exit code 2, no traceback, no
hang, and nothing created before the arguments are valid."""
import json

import pytest

from perfmodel import compile_spec
from perfmodel.calibration import load_calibration
from perfmodel.measurements import validate_record
from topologies.errors import InputError

PREDICT = ("--model", "gpt2-small", "--cluster", "dgx-a100")


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _profile(tmp_path, body: str):
    name = f"p{len(list(tmp_path.glob('p*.json')))}.json"
    return _write(tmp_path, name, ('{"schema": "commpress.calibration/1", ' + body + "}").encode())


def cases(tmp_path):
    ugly = _write(tmp_path, "bad.toml", b"\xff\xfe\x00name = 1")
    return [
        (("perfmodel", "compare", *PREDICT, "--gpus", "8", "--policies", ";;;"), "policies"),
        (("perfmodel", "sweep", *PREDICT, "--gpus", "8", "--gbs", "64", "--top", "0"), "--top"),
        (("perfmodel", "sweep", *PREDICT, "--gpus", "8", "--gbs", "64", "--max-mbs", "-1"), "--max-mbs"),
        (("perfmodel", "sweep", *PREDICT, "--gpus", "8", "--gbs", "64", "--csv", "/proc/x.csv"), "csv"),
        (("perfmodel", "predict", *PREDICT, "--gpus", "8000000000000"), "gpus"),
        (("perfmodel", "collective", "allreduce", "--size", "1MiB", "--chunks", "1000000000"), "chunks"),
        (("perfmodel", "collective", "allreduce", "--compressor", "ef(" * 500 + "int8" + ")" * 500), "compressor"),
        (("perfmodel", "collective", "allreduce", "--compressor", "int8(block=100000000000000000000)"), "int8.block"),
        (("perfmodel", "collective", "allreduce", "--compressor", "int8+topk(0.1)"), "compressor"),
        (("perfmodel", "predict", "--model", ugly, "--cluster", "dgx-a100", "--gpus", "8"), "model"),
        (("perfmodel", "predict", *PREDICT, "--gpus", "8", "--calibration",
          _profile(tmp_path, '"devices": {"a100-sxm-80gb": {"stream_TBps": Infinity}}')), "stream_TBps"),
        (("perfmodel", "predict", *PREDICT, "--gpus", "8", "--calibration", _profile(tmp_path, '"devices": []')),
         "calibration.devices"),
        (("perfmodel", "predict", *PREDICT, "--gpus", "8", "--calibration",
          _profile(tmp_path, '"devices": {"h999": {}}')), "calibration.devices.h999"),
        (("perfmodel", "predict", *PREDICT, "--gpus", "8", "--calibration",
          _write(tmp_path, "u.json", b"\xff\xfe{")), "calibration"),
        (("topologies", "export", "dgx-a100", "-o", ""), "output"),
        (("realrun", "bench", "kernels", "--sizes", "1TiB", "--compressors", "int8"), "sizes"),
        (("realrun", "cluster", "up", "--name", "", "--hosts", "2"), "name"),
        (("realrun", "validate", "--cluster", "nosuch", "--out", str(tmp_path / "never")), "name"),
    ]


def test_every_hostile_input_is_one_line_and_exit_2(cli, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    todo = cases(tmp_path)
    with ThreadPoolExecutor(4) as pool:   # each command is a process: start-up dominates
        procs = list(pool.map(lambda case: cli(*case[0]), todo))
    for (args, field), proc in zip(todo, procs):
        err = proc.stderr.strip()
        assert proc.returncode == 2, (args[:4], err)
        assert field in err and "Traceback" not in err and len(err.splitlines()) == 1, (args[:4], err)
    assert not (tmp_path / "never").exists()   # validate created nothing before refusing


@pytest.mark.parametrize("record, field", [
    ({"time_s": float("nan")}, "record.time_s"),
    ({"time_s": -1.0}, "record.time_s"),
    ({"size_bytes": "big"}, "record.size_bytes"),
])
def test_measurement_records_refuse_nonfinite_and_wrong_types(record, field):
    base = {"schema": "commpress.record/1", "kind": "kernel", "compressor": "int8", "device": "cpu",
            "size_bytes": 4, "wire_bytes": 4, "compress_s": 1.0, "decompress_s": 1.0, "max_rel_error": 0.0}
    with pytest.raises(InputError, match=field):
        validate_record({**base, **record})


@pytest.mark.parametrize("body, field", [
    ('"protocols": {"net": []}', "protocols.net"),
    ('"kernels": {"int8": {"compress_GBps": NaN, "decompress_GBps": 1}}', "kernels.int8.compress_GBps"),
    ('"overlap_slowdown": Infinity', "overlap_slowdown"),
    ('"compressors": {"sz3": {"ratio": -Infinity}}', "compressors.sz3.ratio"),
])
def test_profiles_refuse_wrong_types_and_nonfinite_numbers(tmp_path, body, field):
    with pytest.raises(InputError, match=field):
        load_calibration(_profile(tmp_path, body))


def test_deep_and_long_specs_are_refused_without_recursion():
    for text in ("ef(" * 2000 + "int8" + ")" * 2000, "+".join(["lossless"] * 40), "x" * 5000):
        with pytest.raises(InputError, match="compressor"):
            compile_spec(text)
    json.dumps(compile_spec("ef(ef(int8))").text)   # a few levels are fine
