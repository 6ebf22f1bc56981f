import math

import pytest

from perfmodel import compile_spec
from perfmodel.compression.codec import header_bytes

HEADER = header_bytes(1)   # every compressed payload starts with it; `none` sends the raw buffer


def wire(spec, count, dtype_bytes=4):
    return compile_spec(spec).wire_bytes(count, dtype_bytes)


@pytest.mark.parametrize("spec, count, expected", [
    ("none", 1000, 4000),
    ("fp16", 1000, 2000),
    ("bf16", 1000, 2000),
    ("fp8", 1000, 1000),
    ("int8", 1000, 1000 + 4 * 4),                   # 4 blocks of 256, fp32 scale each
    ("int8(block=100)", 1000, 1000 + 10 * 4),
    ("int4", 1001, 501 + 4 * 4),
    ("sign", 1000, 125 + 4 * 4),
    ("qsgd(bits=3)", 1000, 375 + 4 * 4),
    ("topk(0.01)", 10**6, 10**4 * 4 + 10**4 * 4),   # values + int32 indices
    ("topk(0.5)", 1000, 500 * 4 + 125),            # values + bitmap when denser than 1/32
    ("randk(0.01)", 10**6, 10**4 * 4 + 8),         # shared seed: no indices, the 8-byte step
    ("powersgd(rank=4)", 1 << 20, (1024 + 1024) * 4 * 4),
    ("zfp(rate=8)", 1000, 1000),                   # 250 blocks x 32 bits, 64-bit words
    ("zfp(rate=5)", 10, 8),                        # 3 blocks x 20 bits = 60 bits -> one 64-bit word
    ("topk(0.01)+int8", 10**6, 10**4 * 4 + 10**4 + math.ceil(10**4 / 256) * 4),
    ("ef(int8)", 1000, 1016),
])
def test_exact_wire_sizes(spec, count, expected):
    assert compile_spec(spec).exact
    assert wire(spec, count) == expected + (0 if spec == "none" else HEADER)


def test_data_dependent_sizes_use_ratio_and_are_marked():
    assert not compile_spec("sz3(abs=1e-4)").exact
    prefix = HEADER + 8   # data-dependent transforms carry a length
    assert wire("sz3(abs=1e-4)", 10**6) == prefix + math.ceil(4e6 / 6.8)
    assert wire("sz3(abs=1e-4,ratio=10)", 10**6) == prefix + 400000
    assert wire("lossless(ratio=2)", 1000) == prefix + 2000
    assert wire("zfp(tolerance=1e-3,ratio=8)", 1000) == prefix + 500


def test_casts_do_not_grow_narrow_inputs():
    assert wire("fp16", 1000, dtype_bytes=2) == HEADER + 2000


@pytest.mark.parametrize("spec, expected", [
    ("none", 0.0),
    ("fp16", 2 ** -11 / math.sqrt(3)),
    ("bf16", 2 ** -8 / math.sqrt(3)),
    ("sign", math.sqrt(1 - 2 / math.pi)),
    ("randk(0.25)", math.sqrt(0.75)),
    ("lossless", 0.0),
    ("sz3(abs=0.003)", 0.003 / math.sqrt(3)),
])
def test_error_formulas(spec, expected):
    assert compile_spec(spec).error == pytest.approx(expected)


def test_topk_error_falls_with_density():
    errs = [compile_spec(f"topk({d})").error for d in (0.001, 0.01, 0.1, 0.5, 1.0)]
    assert errs == sorted(errs, reverse=True) and errs[-1] == 0.0


def test_reducible_and_lossless_flags():
    assert compile_spec("fp16").reducible and compile_spec("powersgd").reducible
    assert not compile_spec("int8").reducible and not compile_spec("topk(0.1)").reducible
    assert compile_spec("lossless").lossless and not compile_spec("int8").lossless
    assert not compile_spec("fp16+int8").reducible


def test_error_feedback_costs_traffic_not_wire():
    plain, ef = compile_spec("int8").apply(4096, 4), compile_spec("ef(int8)").apply(4096, 4)
    assert ef.values == plain.values and ef.compress_bytes > plain.compress_bytes


def test_family_constants_are_attributes_of_the_family():
    """A data-dependent family carries its own DEFAULT_RATIO and a ratio parameter; calibration's
    allowed keys are read from the classes, not from a table of names."""
    from perfmodel.compression.families import FAMILIES, data_dependent

    ratios = data_dependent()
    assert set(ratios) == {"zfp", "sz3", "lossless", "mpc"}
    for name, ratio in ratios.items():
        cls = FAMILIES[name]
        assert ratio == cls.DEFAULT_RATIO >= 1 and "ratio" in [p.name for p in cls.PARAMS]
    for name, cls in FAMILIES.items():
        if name not in ratios:
            assert all(f.exact for f in compile_spec(cls.examples()[0]).families), name


def test_a_new_data_dependent_family_is_calibrated_by_its_class(tmp_path):
    import json

    from perfmodel.calibration.profile import load_calibration
    from perfmodel.compression import contract
    from perfmodel.compression.lossless import Lossless

    @contract.register
    class Fancy(Lossless):
        NAME, DEFAULT_RATIO = "fancy", 2.5

    try:
        assert compile_spec("fancy").wire_bytes(1 << 20, 4) < compile_spec("lossless").wire_bytes(1 << 20, 4)
        path = tmp_path / "p.json"
        path.write_text(json.dumps({"schema": "commpress.calibration/1", "provenance": {},
                                    "compressors": {"fancy": {"ratio": 4.0}}}))
        calib = load_calibration(str(path))
        assert calib.spec("fancy") == "fancy(codec=zstd,shuffle=byte,ratio=4)"
    finally:
        contract.unregister(Fancy)


def test_cast_error_reads_the_mantissa_of_its_format():
    assert compile_spec("fp8(format=e5m2)").error == pytest.approx(2.0 ** -3 / 3 ** 0.5)
    assert compile_spec("fp8").error == pytest.approx(2.0 ** -4 / 3 ** 0.5)
    assert compile_spec("bf16").error == pytest.approx(2.0 ** -8 / 3 ** 0.5)
