"""Hostile input to every command: one line naming the field, exit code 2, no traceback, no
hang, and nothing created before the arguments are valid."""
import json

import pytest

from perfmodel import compile_spec
from perfmodel.calibration.profile import load_calibration
from perfmodel.calibration.measurements import validate_record
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


MODEL = {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "num_kv_heads": 12, "ffn_hidden_size": 3072,
         "vocab_size": 50257, "seq_len": 1024}
MODEL_TAIL = 'activation = "gelu"\nnorm = "layernorm"\ntied_embeddings = true\n'


def _model(tmp_path, **changes):
    body = "".join(f"{k} = {v}\n" for k, v in {**MODEL, **changes}.items()) + MODEL_TAIL
    return _write(tmp_path, f"m{len(list(tmp_path.glob('m*.toml')))}.toml", body.encode())


def _cluster(tmp_path, old: str, new: str):
    """The commodity-25g catalog file with one line changed."""
    from importlib import resources

    text = (resources.files("topologies") / "catalog" / "commodity-25g.toml").read_text()
    assert old in text
    return _write(tmp_path, f"c{len(list(tmp_path.glob('c*.toml')))}.toml", text.replace(old, new, 1).encode())


def _record(tmp_path, **changes):
    record = {"schema": "commpress.record/1", "kind": "kernel", "compressor": "int8", "device": "cpu",
              "size_bytes": 4096, "wire_bytes": 1024, "compress_s": 1e-5, "decompress_s": 1e-5,
              "max_rel_error": 0.01, **changes}
    return _write(tmp_path, "r.jsonl", (json.dumps(record) + "\n").encode())


def bounded_cases(tmp_path):
    """Inputs that size work or memory, past their declared bounds (topologies.bounds), and the
    rest of what once ended in a traceback: (command, what its one line must say)."""
    collective = ("perfmodel", "collective", "allreduce", "--cluster", "dgx-a100", "--size", "1MiB")
    out = [
        (("perfmodel", "predict", "--model", _model(tmp_path, num_layers=10**6), "--cluster", "dgx-a100",
          "--gpus", "8"), "model.num_layers=1000000: an integer from 1 to 16384"),
        (("perfmodel", "predict", "--model", _model(tmp_path, hidden_size=10**9, num_heads=1, num_kv_heads=1),
          "--cluster", "dgx-a100", "--gpus", "8"), "model.hidden_size=1000000000: an integer from 1 to 262144"),
        (("perfmodel", "predict", "--model", _model(tmp_path, seq_len=10**12), "--cluster", "dgx-a100",
          "--gpus", "8"), "model.seq_len"),
        (("perfmodel", "predict", "--model", _model(tmp_path, vocab_size='"many"'), "--cluster", "dgx-a100",
          "--gpus", "8"), "model.vocab_size='many'"),
        (("perfmodel", "collective", "allreduce", "--cluster", "dgx-a100", "--size", "99999999999999999999TiB"),
         "size='99999999999999999999TiB': a size of at most 1024TiB"),
        ((*collective, "--compressor", "ef(ef(int8))"), "ef(...) not nested"),
        ((*collective, "--compressor", "+".join(["lossless"] * 17)), "at most 16 transforms"),
        ((*collective, "--calibration", _profile(tmp_path, '"devices": {"a100-sxm-80gb": {"gemm_efficiency": '
                                                           '{"wide": 0.5}}}')), "gemm_efficiency='wide'"),
        (("perfmodel", "predict", *PREDICT, "--gpus", "8", "--calibration",
          _profile(tmp_path, '"devices": {"a100-sxm-80gb": {"gemm_efficiency": {"1e300": 0.5}}}')),
         "gemm_efficiency='1e300'"),
        ((*collective, "--calibration", _profile(tmp_path, '"protocols": {"net": {"Simple": {"base_us": 1e12}}}')),
         "calibration.protocols.net.Simple.base_us"),
        (("topologies", "show", _cluster(tmp_path, "gpus = 8", 'gpus = "eight"')), "node.gpus='eight'"),
        (("topologies", "show", _cluster(tmp_path, "gpus = 8", "gpus = 0")), "node.gpus=0: an integer from 1"),
        (("topologies", "show", _cluster(tmp_path, "gpus = 8", "gpus = 100000000")), "node.gpus=100000000"),
        (("topologies", "show", _cluster(tmp_path, "gpus_per_switch = 4", "gpus_per_switch = 3")),
         "node.gpus_per_switch=3: a divisor of node.gpus"),
        (("topologies", "show", _cluster(tmp_path, "nic_Gbps = 25.0", "nic_Gbps = 1e30")), "node.nic_Gbps"),
        (("topologies", "show", _cluster(tmp_path, "radix = 32", "radix = 1")), "fabric.radix=1"),
        (("topologies", "show", _cluster(tmp_path, "default_nodes = 2", "default_nodes = 10000000")),
         "default_nodes=10000000"),
        (("topologies", "show", "dgx-a100", "--nodes", "0"), "nodes=0"),
        (("topologies", "show", _cluster(tmp_path, "gpus = 8", "gpus = 16"), "--nodes", "16384"),
         "nodes=16384: at most 131072 GPUs in one cluster"),
        (("perfmodel", "collective", "allreduce", "--cluster", _cluster(tmp_path, 'gpu = "v100-pcie-16gb"',
                                                                         'gpu = "h999"'), "--size", "1MiB"),
         "gpu='h999'"),
        (("topologies", "draw", "dgx-a100", "-o", str(tmp_path / "l.txt")), "output="),
        (("perfmodel", "calibrate", _record(tmp_path, size_bytes=1e308), "-o", str(tmp_path / "never.json")),
         "size_bytes=1e+308"),
        (("realrun", "cluster", "up", "--name", "bw", "--hosts", "2", "--bandwidth", "100000gbit"),
         "bandwidth='100000gbit': a link rate from 1mbit to 100gbit"),
    ]
    import importlib.util

    if importlib.util.find_spec("torch") is not None and not __import__("torch").cuda.is_available():
        out.append((("realrun", "bench", "allreduce", "--backend", "nccl", "--world", "2", "--sizes", "4KiB",
                     "--compressors", "none", "--iters", "1"), "backend nccl needs a CUDA GPU per rank"))
    return out


def test_every_input_past_its_bound_is_one_line_naming_field_value_and_limit(cli, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    todo = bounded_cases(tmp_path)
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda case: cli(*case[0]), todo))
    for (args, said), proc in zip(todo, procs):
        err = proc.stderr.strip()
        assert proc.returncode == 2, (args[:4], err)
        assert said in err and "Traceback" not in err and len(err.splitlines()) == 1, (args[:4], err)
    assert not list(tmp_path.glob("never*")) and not (tmp_path / "l.txt").exists()


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
    json.dumps(compile_spec("ef(topk(0.01))+ef(int8)").text)   # one level per transform is fine
