"""Published GPU codec kernel measurements (perfmodel/catalog/codec_kernels.toml, perfmodel.compression.kernels):
the catalog loads and every cell has its source, bad cells are refused in one line, a measured family is priced
from its measurement on its GPU and scaled by streaming bandwidth on its architecture, an unmeasured one keeps
the traffic model and is reported as an assumption, and the CLI shows it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from perfmodel.compression import compile_spec
from perfmodel.compression.kernel_costs import kernel_costs
from perfmodel.compression.kernels import codec_kernels, device_kernels, load_cells
from perfmodel.devices import device
from topologies.errors import InputError

A100, A100_40, H100, B200 = "a100-sxm-80gb", "a100-sxm-40gb", "h100-sxm", "b200"
N = 1 << 20   # fp32 values per test message


def _cell(**changes) -> dict:
    body = {"family": "sz3", "gpu": A100, "compress_GBps": 200.0, "decompress_GBps": 300.0, "input": "x",
            "implementation": "y", "source": "z"}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not None}


def _refused(body) -> InputError:
    with pytest.raises(InputError) as err:
        load_cells({"kernel": [_cell(), body]})
    return err.value


def test_catalog_loads_with_sources():
    cells = codec_kernels()
    assert {c.family for c in cells} >= {"sz3", "lossless", "fp8", "hadamard"}
    for c in cells:
        assert c.source and c.implementation and c.input
        assert c.traffic and all(t > 0 for t in c.traffic.values())


@pytest.mark.parametrize("changes, key, allowed", [
    ({"compress_GBps": -1.0}, "kernel[1].compress_GBps", "(0, 2000]"),
    ({"compress_GBps": 5000.0}, "kernel[1].compress_GBps", "HBM bandwidth"),
    ({"decompress_GBps": "fast"}, "kernel[1].decompress_GBps", "a number"),
    ({"family": "gzip"}, "kernel[1].family", "a compressor family"),
    ({"gpu": "host-cpu"}, "kernel[1].gpu", "a GPU of gpus.toml"),
    ({"source": ""}, "kernel[1].source", "non-empty string"),
    ({"speed": 3}, "kernel[1].speed", "one of family"),
    ({"match": {"codec": "brotli"}, "family": "lossless"}, "kernel[1].match.codec", "zstd or lz4"),
    ({"match": {"level": 3}, "family": "lossless"}, "kernel[1].match.level", "a parameter of lossless"),
    ({"copy_ratio": 1.2}, "kernel[1].compress_GBps", "copy_ratio alone"),
    ({"compress_GBps": None, "decompress_GBps": None, "copy_ratio": 0.1}, "kernel[1].copy_ratio", "(0.5, 100]"),
])
def test_bad_cell_refused_in_one_line(changes, key, allowed):
    err = _refused(_cell(**changes))
    text = str(err)
    assert "\n" not in text and text.startswith("codec_kernels.toml " + key) and allowed in text


def test_measured_family_priced_from_measurement_on_its_gpu():
    cell = next(c for c in codec_kernels() if c.family == "sz3")
    a100 = device(A100)
    codec = compile_spec("sz3(abs=1e-3)")
    out = codec.on(a100).apply(N, 4)
    raw = 4.0 * N
    # time = traffic / stream = raw / published throughput, each direction
    assert out.compress_bytes / a100.stream_Bps == pytest.approx(raw / (cell.measured_GBps["compress"] * 1e9))
    assert out.decompress_bytes / a100.stream_Bps == pytest.approx(raw / (cell.measured_GBps["decompress"] * 1e9))
    assert out.compress_bytes != codec.apply(N, 4).compress_bytes      # the traffic model's assumption replaced


def test_measured_on_h100_one_direction():
    h100 = device(H100)
    cell = next(c for c in codec_kernels() if c.family == "fp8")
    codec = compile_spec("fp8")
    plain, measured = codec.apply(N, 2), codec.on(h100).apply(N, 2)
    assert measured.decompress_bytes / h100.stream_Bps == pytest.approx(2.0 * N / (cell.measured_GBps["decompress"]
                                                                                     * 1e9))
    assert measured.compress_bytes == plain.compress_bytes   # compress not measured: the traffic model
    assert compile_spec("fp8(gemm=true)").on(h100).apply(N, 2).decompress_bytes == 0.0   # shared with the GEMM


def test_same_architecture_scaled_by_stream_bandwidth():
    codec = compile_spec("lossless(codec=lz4)")
    small, big = device(A100_40), device(A100)
    t_small = codec.on(small).apply(N, 4).compress_bytes / small.stream_Bps
    t_big = codec.on(big).apply(N, 4).compress_bytes / big.stream_Bps
    assert t_small / t_big == pytest.approx(big.stream_Bps / small.stream_Bps)


def test_more_specific_match_wins():
    lz4 = compile_spec("lossless(codec=lz4)").on(device(A100)).apply(N, 4)
    zstd = compile_spec("lossless(codec=zstd)").on(device(A100)).apply(N, 4)
    assert lz4.compress_bytes > zstd.compress_bytes    # nvCOMP LZ4 (96 GB/s) vs DietGPU (250 GB/s)


def test_unmeasured_family_falls_back_and_is_reported_as_assumption():
    for spec in ("int8", "topk(0.01)", "zfp(rate=8)"):
        codec = compile_spec(spec)
        assert codec.on(device(A100)).apply(N, 4) == codec.apply(N, 4)
    b200 = device(B200)
    assert device_kernels(b200) is None and compile_spec("sz3(abs=1e-3)").on(b200) is compile_spec("sz3(abs=1e-3)")
    costs = {c.kernel: c for c in kernel_costs(A100)}
    assert costs["int8(block=256)"].compress.startswith("assumption")
    assert costs["sz3(abs=0.001)"].compress == "measured"
    assert costs["lossless(codec=lz4,shuffle=byte)"].decompress == "measured"
    scaled = {c.kernel: c for c in kernel_costs(A100_40)}
    assert scaled["sz3(abs=0.001)"].compress.startswith("scaled from " + A100)
    assert all(c.compress.startswith(("assumption", "no kernel")) for c in kernel_costs(B200))
    with pytest.raises(InputError):
        kernel_costs("nope")


def test_codec_equality_keeps_the_device():
    codec = compile_spec("sz3(abs=1e-3)")
    bound = codec.on(device(A100))
    assert bound != codec and bound == compile_spec("sz3(abs=1e-3)").on(device(A100))
    assert bound.with_ratios({"sz3": 5.0}).kernels == bound.kernels


def _cli(*args) -> subprocess.CompletedProcess:
    code = "import sys; from perfmodel.cli import entry; sys.argv = ['perfmodel'] + sys.argv[1:]; entry()"
    return subprocess.run([sys.executable, "-c", code, "catalog", *args], capture_output=True, text=True)


def test_cli_catalog_codecs():
    text = _cli("codecs")
    assert text.returncode == 0 and "cuSZp" in text.stdout and "assumption: traffic model" in text.stdout
    data = json.loads(_cli("codecs", "--gpu", H100, "--json").stdout)
    assert set(data) == {"measurements", "costs"} and list(data["costs"]) == [H100]
    assert any(m["family"] == "fp8" and m["gpu"] == H100 for m in data["measurements"])
    bad = _cli("codecs", "--gpu", "nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
