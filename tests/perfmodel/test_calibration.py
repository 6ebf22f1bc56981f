import json

import pytest

from perfmodel import collective_time
from perfmodel.calibration.profile import SCHEMA, load_calibration
from perfmodel.prediction import predict
from topologies.errors import InputError

PROFILE = {
    "schema": SCHEMA,
    "provenance": {"machine": "test", "date": "2026-12-02", "packages": {"commpress": "0.1.0"}},
    "devices": {"a100-sxm-80gb": {"stream_TBps": 0.5, "kernel_launch_us": 10.0}},
    "protocols": {"net": {"Simple": {"bw_fraction": 0.5}}},
    "compressors": {"sz3": {"ratio": 20.0}},
    "overlap_slowdown": 0.3,
}


def _write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_profile_round_trip(tmp_path):
    calib = load_calibration(_write(tmp_path, PROFILE))
    assert calib.ratios == {"sz3": 20.0} and calib.overlap_slowdown == 0.3
    assert calib.provenance["machine"] == "test"
    assert calib.spec("ef(topk(0.01))+sz3(abs=1e-4)") == "ef(topk(density=0.01))+sz3(abs=0.0001,ratio=20)"
    assert calib.spec("sz3(abs=1e-4,ratio=3)") == "sz3(abs=0.0001,ratio=3)"


def test_profile_changes_the_prediction(tmp_path):
    path = _write(tmp_path, PROFILE)
    base = collective_time("allreduce", 1 << 28, cluster="dgx-a100", nodes=2, compressor="sz3(abs=1e-4)")
    cal = collective_time("allreduce", 1 << 28, cluster="dgx-a100", nodes=2, compressor="sz3(abs=1e-4)",
                          calibration=path)
    assert cal.compression_ratio == pytest.approx(20.0, rel=1e-3) and base.compression_ratio < 7
    assert cal.compressor == "sz3(abs=1e-4)" and "ratio=20" in cal.compressor_spec
    step = dict(nodes=2, tp=8, pp=1, mbs=4, gbs=64, zero=1, policy="naive:int8")
    assert predict("gpt2-medium", "dgx-a100", calibration=path, **step).step_time_s > \
        predict("gpt2-medium", "dgx-a100", **step).step_time_s


@pytest.mark.parametrize("data, field", [
    ({"schema": "other/1"}, "calibration.schema"),
    ({**PROFILE, "colour": 1}, "calibration.colour"),
    ({**PROFILE, "devices": {"a100-sxm-80gb": {"stream_TBps": -1}}}, "calibration.devices.a100-sxm-80gb.stream_TBps"),
    ({**PROFILE, "protocols": {"warp": {}}}, "calibration.protocols.warp"),
    ({**PROFILE, "protocols": {"net": {"LL": {"bw_fraction": 2}}}}, "calibration.protocols.net.LL.bw_fraction"),
    ({**PROFILE, "compressors": {"int8": {"ratio": 4}}}, "calibration.compressors.int8"),
    ({**PROFILE, "overlap_slowdown": 5}, "calibration.overlap_slowdown"),
    ("{not json", "calibration"),
])
def test_bad_or_foreign_profiles_are_refused(tmp_path, data, field):
    with pytest.raises(InputError) as err:
        load_calibration(_write(tmp_path, data))
    assert err.value.field == field


def test_missing_profile(tmp_path):
    with pytest.raises(InputError, match="calibration"):
        load_calibration(str(tmp_path / "nope.json"))


def test_cli_takes_calibration(cli, tmp_path):
    path = _write(tmp_path, PROFILE)
    out = cli("perfmodel", "collective", "allreduce", "--compressor", "sz3(abs=1e-4)", "--calibration", path,
              "--json", check_rc=0).stdout
    assert json.loads(out)[0]["compression_ratio"] == pytest.approx(20.0, rel=1e-3)


def test_calibration_transforms_the_compiled_codec_without_parsing(tmp_path, monkeypatch):
    """Ratios apply to the compiled tree: once a spec is compiled, nothing parses text again."""
    from perfmodel.compression import compile_spec, grammar

    codec = compile_spec("ef(int8+lossless)")
    zfp = compile_spec("zfp(tolerance=1e-3)")
    calib = load_calibration(_write(tmp_path, {**PROFILE, "compressors": {"zfp": {"ratio": 5.0}, "lossless": {
        "ratio": 1.2}}}))

    def refuse(text):
        raise AssertionError(f"parsed again: {text}")

    monkeypatch.setattr(grammar, "parse_spec", refuse)
    monkeypatch.setattr("perfmodel.compression.codec.parse_spec", refuse)
    out = calib.codec(codec)
    assert out.text == "ef(int8(block=256)+lossless(codec=zstd,shuffle=byte,ratio=1.2))"
    assert out.families[1].params["ratio"] == 1.2 and out.error_feedback
    assert codec.families[1].params["ratio"] is None   # the original stays as it was
    assert out.wire_bytes(1 << 20, 4) < codec.wire_bytes(1 << 20, 4)
    assert calib.codec(zfp).text == "zfp(tolerance=0.001,ratio=5)"


def test_a_spec_that_gives_its_ratio_keeps_it_and_exact_specs_are_untouched(tmp_path):
    from perfmodel.compression import compile_spec

    calib = load_calibration(_write(tmp_path, PROFILE))
    given = compile_spec("sz3(abs=1e-4,ratio=3)")
    assert calib.codec(given).text == given.text
    exact = compile_spec("int8")
    assert calib.codec(exact) is exact
