"""realrun compressors: the contract with perfmodel's wire sizes, round trips, bounds, edge cases."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from perfmodel import compile_spec
from perfmodel.compression.families import FAMILIES
from realrun.compressors import Compressor, Payload
from topologies.errors import InputError

pytest.importorskip("zfpy", reason="the real extra (zfpy, pysz, numcodecs) is not installed")

# Every family's examples (from the registry: a new family is covered without editing this file),
# plus the grammar's compositions: error feedback and chains.
CHAINS = ["ef(int8)", "ef(topk(0.01))+int8", "topk(0.1)+int4", "topk(0.05)+fp16", "int8+lossless", "ef(int4)+lossless"]
EXAMPLES = [s for cls in FAMILIES.values() for s in cls.examples()] + CHAINS
FIXED = [s for s in EXAMPLES if compile_spec(s).exact and not compile_spec(s).is_none]
DATA_DEPENDENT = [s for s in EXAMPLES if not compile_spec(s).exact]


def gaussian(n, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


@pytest.mark.parametrize("spec", FIXED)
@pytest.mark.parametrize("n", [1, 7, 256, 1000, 65537])
def test_contract_payload_length_equals_model_wire_size(spec, n):
    assert compile_spec(spec).exact
    payload = Compressor(spec).compress(gaussian(n))
    assert len(payload) == compile_spec(spec).wire_bytes(n, 4)


@pytest.mark.parametrize("spec", DATA_DEPENDENT)
def test_data_dependent_specs_report_their_measured_ratio(spec, record_property):
    x = gaussian(1 << 16)
    payload = Compressor(spec).compress(x)
    ratio = x.nbytes / len(payload)
    record_property("measured_ratio", ratio)
    assert not compile_spec(spec).exact and ratio > 0.9


@pytest.mark.parametrize("spec", ["lossless", "lossless(codec=lz4)", "lossless(shuffle=bit)",
                                  "lossless(shuffle=none)", "none"])
@settings(max_examples=40, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(0, 3000), elements=st.floats(width=32, allow_nan=True,
                                                                       allow_infinity=True)))
def test_lossless_round_trips_bit_exactly(spec, x):
    c = Compressor(spec)
    y = c.decompress(c.compress(x), like=x)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert y.view(np.uint32).tolist() == x.view(np.uint32).tolist()


FINITE = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@settings(max_examples=60, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(0, 2000), elements=FINITE), block=st.sampled_from([1, 7, 64, 256]))
def test_int8_is_within_half_a_step_per_block(x, block):
    c = Compressor(f"int8(block={block})")
    y = c.decompress(c.compress(x))
    for i in range(0, len(x), block):
        b, yb = x[i:i + block].astype(np.float64), y[i:i + block].astype(np.float64)
        absmax = np.float32(np.max(np.abs(x[i:i + block])))
        step = np.float64(max(np.float32(absmax / np.float32(127)), np.finfo(np.float32).smallest_subnormal)
                          if absmax > 0 else 0.0)
        if step * 127 < absmax:   # the scale never rounds below absmax / 127
            step = np.float64(np.nextafter(np.float32(step), np.float32(np.inf)))
        with np.errstate(over="ignore"):   # float32 rounding of the result
            ulp = 4 * np.spacing(np.abs(b).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(b - yb) <= step / 2 * (1 + 1e-6) + ulp)


@settings(max_examples=30, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 3000), elements=st.floats(-100, 100, width=32)),
       tol=st.sampled_from([1e-1, 1e-2, 1e-3]))
def test_zfp_tolerance_and_sz3_abs_bounds(x, tol):
    for spec in (f"zfp(tolerance={tol})", f"sz3(abs={tol})"):
        c = Compressor(spec)
        y = c.decompress(c.compress(x))
        assert np.max(np.abs(y.astype(np.float64) - x)) <= tol * (1 + 1e-5), spec


@pytest.mark.parametrize("spec", FIXED + DATA_DEPENDENT)
@pytest.mark.parametrize("x", [np.zeros(0, np.float32), np.ones(1, np.float32), np.zeros(1000, np.float32),
                               np.full(300, 1e-42, np.float32), np.full(300, 3e38, np.float32),
                               gaussian(259).reshape(7, 37)], ids=["n0", "n1", "zeros", "subnormal", "huge", "2d"])
def test_edge_inputs_keep_shape_and_stay_finite(spec, x):
    c = Compressor(spec)
    y = c.decompress(c.compress(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    if ("fp16" in spec or "e5m2" in spec) and x.size and np.max(np.abs(x)) > 6e4:
        assert np.any(np.isinf(y)) and not np.any(np.isnan(y))   # documented: overflow to Inf
    else:
        assert np.all(np.isfinite(y))
    if not x.size or not np.any(x):
        assert not np.any(y)
    if x.size and np.all(x == x.flat[0]) and spec in ("sign", "int8", "int4", "ef(int8)"):
        assert np.allclose(y, x, rtol=1e-6)   # a constant block is exact: huge values included


NONFINITE = np.array([1.0, np.nan, -2.0, np.inf, 0.5, -np.inf] * 50, np.float32)


@pytest.mark.parametrize("spec", ["int8", "int4", "qsgd(bits=4)", "sign"])
def test_nonfinite_poisons_its_block(spec):
    c = Compressor(f"{spec[:-1]},block=6)" if "(" in spec else f"{spec}(block=6)")
    y = c.decompress(c.compress(NONFINITE))
    assert np.all(np.isnan(y))


def test_nonfinite_in_a_block_leaves_other_blocks_alone():
    x = np.concatenate([np.full(256, 1.0, np.float32), np.array([np.nan] + [1.0] * 255, np.float32)])
    c = Compressor("int8")
    y = c.decompress(c.compress(x))
    assert np.allclose(y[:256], 1.0) and np.all(np.isnan(y[256:]))


def test_casts_keep_nan_and_inf():
    for spec, inf_becomes in (("fp16", "inf"), ("bf16", "inf"), ("fp8(format=e5m2)", "inf"), ("fp8", "nan")):
        c = Compressor(spec)
        y = c.decompress(c.compress(np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)))
        assert np.isnan(y[0]) and y[3] == 1.0
        assert (np.all(np.isinf(y[1:3])) and y[1] > 0 > y[2]) if inf_becomes == "inf" else np.all(np.isnan(y[1:3]))


def test_topk_keeps_nan_and_inf_it_selects():
    x = np.zeros(1000, np.float32)
    x[10], x[20] = np.nan, -np.inf
    c = Compressor("topk(0.002)")
    y = c.decompress(c.compress(x))
    assert np.isnan(y[10]) and y[20] == -np.inf


@pytest.mark.parametrize("spec", ["zfp(rate=8)", "sz3(abs=1e-3)", "zfp(tolerance=1e-3)"])
def test_error_bounded_codecs_refuse_nonfinite(spec):
    with pytest.raises(InputError, match="NaN or Inf"):
        Compressor(spec).compress(NONFINITE)


def test_error_feedback_sends_what_was_dropped_later():
    x = gaussian(4096, 3)
    ef, plain = Compressor("ef(topk(0.01))"), Compressor("topk(0.01)")
    sent_ef = sum(ef.decompress(ef.compress(x, key="b")) for _ in range(400))
    sent_plain = sum(plain.decompress(plain.compress(x)) for _ in range(400))
    assert np.linalg.norm(sent_ef / 400 - x) < 0.2 * np.linalg.norm(sent_plain / 400 - x)


def test_randk_draws_from_seed_and_step_shared_by_ranks():
    x = gaussian(1000)
    a, b = Compressor("randk(0.1)", seed=5), Compressor("randk(0.1)", seed=5)
    p1, p2 = a.compress(x), a.compress(x)
    assert np.count_nonzero(b.decompress(p1)) == 100
    assert not np.array_equal(b.decompress(p1) != 0, b.decompress(p2) != 0)


def test_measured_error_is_close_to_the_model_estimate():
    x = gaussian(1 << 16, 11)
    for spec in ("fp16", "bf16", "fp8", "int8", "int4", "sign", "topk(0.01)", "randk(0.1)", "zfp(rate=8)"):
        c = Compressor(spec)
        err = np.linalg.norm(c.decompress(c.compress(x)) - x) / np.linalg.norm(x)
        assert err == pytest.approx(compile_spec(spec).error, rel=0.35), spec


def test_bad_inputs_are_clear_errors():
    with pytest.raises(InputError, match="dtype"):
        Compressor("int8").compress(np.arange(10))
    with pytest.raises(InputError, match="floating-point"):
        Compressor("int8+int4").compress(gaussian(10))
    with pytest.raises(InputError, match="payload"):
        Compressor("int8").decompress(Compressor("int4").compress(gaussian(10)))
    with pytest.raises(InputError, match="payload"):
        Compressor("int8").decompress(Payload(b"garbage!" * 4))
    assert math.isfinite(compile_spec("int8").error)


def test_fp16_decode_covers_every_half():
    from realrun.compressors import fast

    if not fast.AVAILABLE:
        pytest.skip("numba is not installed")
    every = np.arange(2**16, dtype=np.uint16).view(np.float16)
    got, ref = fast.fp16_decode(every), every.astype(np.float32)
    assert np.array_equal(got, ref, equal_nan=True)
    finite = np.isfinite(ref)
    assert np.array_equal(got[finite].view(np.uint32), ref[finite].view(np.uint32))


def fp8_edges(fmt: str) -> np.ndarray:
    """Every finite FP8 value of ``fmt``, the midpoints between neighbours (ties) and the float32
    next to each, both signs; +-0, +-Inf, NaNs of both signs and other payloads, the overflow
    and saturation edges (e4m3 448 / 464 / 480, e5m2 57344 / 61440 / 65536), float32
    subnormals and the largest float32."""
    from realrun.compressors.casts import fp8_table

    table = fp8_table(fmt)
    grid = np.unique(np.abs(table[np.isfinite(table)]).astype(np.float64))
    mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    beyond = np.array([grid[-1] * 2, grid[1] / 2, grid[1] / 4], np.float32)   # overflow; tie to 0; below it
    near = np.concatenate([grid.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(0)), beyond])
    special = np.array([0.0, np.inf, 448, 464, 480, 57344, 61440, 65536, 1e-45, 1.1754942e-38, 3.4028235e38],
                       np.float32)
    nans = np.array([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFC00000, 0xFF800001], np.uint32).view(np.float32)
    return np.concatenate([near, -near, special, -special, nans])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_kernels_match_the_reference_on_edge_values(fmt):
    """Bytes of every code's value, tie, neighbour, NaN, Inf, saturation and subnormal edge; and
    the decoded bits of all 256 codes."""
    from realrun.compressors import casts, fast

    if not fast.AVAILABLE:
        pytest.skip("numba is not installed")
    x = fp8_edges(fmt)
    with np.errstate(invalid="ignore"):
        ref = casts.to_fp8(x, fmt)
    assert fast.fp8_encode(x, fmt=fmt).tolist() == ref.tolist()
    codes = np.arange(256, dtype=np.uint8)
    got, ref = fast.fp8_decode(codes, fmt=fmt), casts.from_fp8(codes, fmt)
    assert got.view(np.uint32).tolist() == ref.view(np.uint32).tolist()


@settings(max_examples=60, deadline=None)
@given(bits=hnp.arrays(np.uint32, st.integers(0, 3000)), scale=st.sampled_from([1.0, 2.0**-12, 300.0, 2.0**14]),
       fmt=st.sampled_from(["e4m3", "e5m2"]))
def test_fp8_kernels_match_the_reference_on_random_values(bits, scale, fmt):
    """Any float32 bit pattern (NaN payloads, Inf, subnormals), and gaussians scaled into the
    subnormal, normal and overflow ranges of each format: the reference's codes, byte for byte."""
    from realrun.compressors import casts, fast

    if not fast.AVAILABLE:
        pytest.skip("numba is not installed")
    gauss = (np.random.default_rng(bits.size).standard_normal(bits.size) * scale).astype(np.float32)
    for x in (bits.view(np.float32), gauss):
        with np.errstate(invalid="ignore"):
            ref = casts.to_fp8(x, fmt)
        assert fast.fp8_encode(x, fmt=fmt).tolist() == ref.tolist()


@pytest.mark.parametrize("spec", ["fp16", "fp8", "fp8(format=e5m2)", "int8", "int4", "int8(block=7)",
                                  "int4(block=100)", "sign", "sign(block=13)", "topk(0.01)", "topk(0.2)", "topk(0.9)"])
def test_compiled_paths_match_the_numpy_reference(spec, monkeypatch):
    """With numba, the compiled paths produce the reference's bytes (NaN aside: same NaN-ness)."""
    from realrun.compressors import fast

    if not fast.AVAILABLE:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(10007).astype(np.float32) * 300,
                        rng.standard_normal(999).astype(np.float32),
                        np.array([np.inf, -np.inf, 65520, 65519.99, 2**-25, 2**-24, 1e-45, -0.0, 3e38], np.float32),
                        rng.integers(0, 2**32, 5000, dtype=np.uint32).view(np.float32)])
    x = x[~np.isnan(x)]
    compiled = Compressor(spec).compress(x).data
    monkeypatch.setattr(fast, "AVAILABLE", False)
    reference = Compressor(spec).compress(x).data
    assert compiled == reference
    monkeypatch.setattr(fast, "AVAILABLE", True)
    a = Compressor(spec).decompress(reference)
    monkeypatch.setattr(fast, "AVAILABLE", False)
    b = Compressor(spec).decompress(reference)
    assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("spec", ["topk(0.25)", "topk(0.5)"])
def test_topk_ties_keep_the_lowest_indices(spec, monkeypatch):
    from realrun.compressors import fast

    x = np.array([1, -3, 3, 2, 3, -3, 0, 3], np.float32)   # k = 2 or 4 of the six |x| = 3
    for available in (True, False) if fast.AVAILABLE else (False,):
        monkeypatch.setattr(fast, "AVAILABLE", available)
        y = Compressor(spec).decompress(Compressor(spec).compress(x))
        k = 2 if spec == "topk(0.25)" else 4
        assert np.array_equal(np.flatnonzero(y), [1, 2, 4, 5][:k]), (available, y)


@pytest.mark.parametrize("spec", ["none", "fp16", "int8", "sign", "topk(0.01)", "zfp(rate=8)", "ef(int4)+lossless"])
def test_out_buffers_hold_the_same_bytes_and_values(spec):
    x = gaussian(17 * 241).reshape(17, 241)
    c = Compressor(spec)
    fresh = bytes(c.compress(x).data)
    scratch = bytearray(len(fresh) + 100)
    p = Compressor(spec).compress(x, out=scratch)
    assert bytes(p.data) == fresh and len(p) == len(fresh)
    out = np.full_like(x, 7.0)
    got = Compressor(spec).decompress(fresh, like=x, out=out)
    assert got is out and np.array_equal(out, Compressor(spec).decompress(fresh, like=x), equal_nan=True)
    with pytest.raises(InputError, match="out"):
        Compressor(spec).compress(x, out=bytearray(len(fresh) - 1))
    with pytest.raises(InputError, match="out"):
        Compressor(spec).decompress(fresh, like=x, out=np.empty(5, np.float32))


def test_repeated_calls_do_not_share_returned_arrays():
    """Workspace buffers never leak into what the caller keeps."""
    c = Compressor("int8")
    a, b = gaussian(1000), gaussian(1000) * 2
    pa = bytes(c.compress(a).data)
    ya = c.decompress(pa)
    c.compress(b)
    yb = c.decompress(c.compress(b))
    assert np.array_equal(ya, Compressor("int8").decompress(pa)) and not np.shares_memory(ya, yb)
