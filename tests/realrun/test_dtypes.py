"""Every floating dtype a framework hands over (fp32, bf16, fp16, fp8) through every registered
spec: round trips keep shape and dtype, lossless specs are exact, lossy ones stay within the
float32 error plus the dtype's rounding, fixed-size payloads are perfmodel's wire size of a
2-byte message, the header records the dtype, and a spec that cannot serve a dtype refuses it
in one line (realrun.compressors.dtypes)."""
import numpy as np
import pytest

from perfmodel import compile_spec
from perfmodel.compression.families import FAMILIES
from realrun.compressors import Compressor, dtypes, fast
from topologies.errors import InputError

pytest.importorskip("zfpy", reason="the real extra (zfpy, pysz, numcodecs) is not installed")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (the real extra)")

CHAINS = ["ef(int8)", "ef(topk(0.01))+int8", "topk(0.1)+int4", "topk(0.05)+fp16", "int8+lossless", "ef(int4)+lossless",
          "ef(powersgd(rank=4))", "fp16+int8", "ef(sign)"]
SPECS = [s for cls in FAMILIES.values() for s in cls.examples()] + CHAINS
NARROW = {"bf16": dtypes.BFLOAT16, "fp16": np.dtype(np.float16)}
EPS = {"bf16": 2.0**-8, "fp16": 2.0**-11}   # unit roundoff of each


def gaussian(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _serves(spec, dtype) -> bool:
    try:
        Compressor(spec).root.check(dtype)
        return True
    except InputError:
        return False


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("name", sorted(NARROW))
def test_every_spec_serves_bf16_and_fp16_or_refuses_in_one_line(spec, name):
    dtype, n = NARROW[name], 5003
    x32 = gaussian(n)
    x = x32.astype(dtype)
    exact = x.astype(np.float32)   # the narrow input's values, exactly
    codec = compile_spec(spec)
    if not _serves(spec, dtype):
        with pytest.raises(InputError) as err:
            Compressor(spec).compress(x)
        assert "\n" not in str(err.value) and err.value.field in ("dtype", "compressor"), str(err.value)
        return
    shaped = Compressor(spec).compress(x.reshape(1, n), key="t")
    y = Compressor(spec).decompress(shaped, like=x.reshape(1, n))
    assert y.dtype == dtype and y.shape == (1, n)
    payload = Compressor(spec).compress(x, key="t")
    if not codec.is_none:
        assert payload.header().dtype == dtype   # the header records the tensor's dtype
    if codec.exact and not codec.is_none:
        assert len(payload) == codec.wire_bytes(n, 2)   # the model's size of a 2-byte message
    if codec.lossless or spec in ("fp16", "bf16"):   # a 2-byte input passes both casts: its own bits
        assert y.reshape(-1).view(np.uint16).tolist() == x.view(np.uint16).tolist()
        return
    ref = Compressor(spec).decompress(Compressor(spec).compress(exact, key="t"))   # float32 on the same values
    assert rel(y.reshape(-1), exact) <= rel(ref, exact) + 4 * EPS[name] + 1e-12, spec


@pytest.mark.parametrize("spec", ["int8", "int4", "sign", "qsgd(bits=4)", "fp8", "fp8(format=e5m2)", "topk(0.01)",
                                  "topk(0.5)+int8", "randk(0.01)"])
@pytest.mark.parametrize("name", sorted(NARROW))
def test_arithmetic_codecs_are_the_float32_path_rounded(spec, name):
    """A narrow input runs the float32 path on its exact values and rounds the result to its
    dtype: the same bits as float32 compression of the widened input, then a cast."""
    dtype = NARROW[name]
    x = (gaussian(4099, 3) * 40).astype(dtype)
    got = Compressor(spec).decompress(Compressor(spec).compress(x))
    ref = Compressor(spec).decompress(Compressor(spec).compress(x.astype(np.float32))).astype(dtype)
    assert got.view(np.uint16).tolist() == ref.view(np.uint16).tolist()


@pytest.mark.parametrize("spec", ["fp8", "int8", "int4(block=7)", "sign(block=13)", "topk(0.01)", "topk(0.9)",
                                  "ef(topk(0.1))+int8"])
@pytest.mark.parametrize("name", sorted(NARROW))
def test_compiled_paths_match_the_reference_on_narrow_types(spec, name, monkeypatch):
    if not fast.AVAILABLE:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(9001) * 300, [np.inf, -np.inf, 65504, 1e-8, -0.0]]).astype(NARROW[name])
    compiled = Compressor(spec).compress(x, key="k").data
    a = Compressor(spec).decompress(compiled)
    monkeypatch.setattr(fast, "AVAILABLE", False)
    assert Compressor(spec).compress(x, key="k").data == compiled
    b = Compressor(spec).decompress(compiled)
    assert np.array_equal(a.astype(np.float32), b.astype(np.float32), equal_nan=True)


def test_topk_decodes_honest_float16():
    """Issue 37: numba's scatter could not write float16; every top-k spec now decodes it."""
    x = gaussian(1 << 16, 1).astype(np.float16)
    for spec in ("topk(0.01)", "topk(0.5)", "ef(topk(0.01))", "topk(0.05)+fp16", "ef(topk(0.01))+int8"):
        y = Compressor(spec).decompress(Compressor(spec).compress(x, key="g"))
        assert y.dtype == np.float16 and y.shape == x.shape and np.count_nonzero(y) > 0, spec
    y = Compressor("topk(0.01)").decompress(Compressor("topk(0.01)").compress(x))
    kept = np.flatnonzero(y)
    assert len(kept) == compile_spec("topk(0.01)").root.kept(len(x)) and np.array_equal(y[kept], x[kept])


def test_error_feedback_keeps_float32_residuals_for_narrow_types():
    for name, dtype in NARROW.items():
        c = Compressor("ef(topk(0.01))")
        x = gaussian(1000, 2).astype(dtype)
        c.compress(x, key="b")
        residuals = [v for k, v in c.ctx.state.items() if k[0] == "ef"]
        assert len(residuals) == 1 and residuals[0].dtype == np.float32, name
    for dtype in (np.float32, np.float64):   # the wide types keep their own
        c = Compressor("ef(int8)")
        c.compress(gaussian(100).astype(dtype), key="f")
        assert next(iter(c.ctx.state.values())).dtype == dtype


def test_error_feedback_sends_what_bf16_rounding_and_compression_dropped():
    """Over many calls the sum of what a bf16 ef(topk) sent approaches the sum of its inputs."""
    c = Compressor("ef(topk(0.1))")
    x = gaussian(512, 4).astype(dtypes.BFLOAT16)
    sent = np.zeros(512)
    for _ in range(60):
        sent += Compressor("ef(topk(0.1))").decompress(c.compress(x, key="s")).astype(np.float64)
    assert rel(sent / 60, x.astype(np.float64)) < 0.1


@pytest.mark.parametrize("fmt", ["FLOAT8_E4M3", "FLOAT8_E5M2"])
def test_fp8_inputs_go_through_none_and_lossless_and_are_refused_elsewhere(fmt):
    dtype = getattr(dtypes, fmt)
    x = gaussian(777).astype(dtype)
    for spec in ("lossless", "lossless(codec=lz4,shuffle=bit)"):
        c = Compressor(spec)
        p = c.compress(x)
        assert p.header().dtype == dtype
        assert c.decompress(p).view(np.uint8).tolist() == x.view(np.uint8).tolist()
    assert Compressor("none").decompress(Compressor("none").compress(x), like=x).view(np.uint8).tolist() == \
        x.view(np.uint8).tolist()
    for spec in ("int8", "topk(0.1)", "fp16", "mpc", "zfp(rate=8)"):
        with pytest.raises(InputError) as err:
            Compressor(spec).compress(x)
        assert "\n" not in str(err.value), spec


def test_torch_tensors_of_every_float_dtype_cross_without_copies():
    torch = pytest.importorskip("torch")
    for tdtype in dtypes.torch_dtypes():
        t = torch.randn(6, 5).to(tdtype)
        arr = dtypes.to_numpy(t)
        assert arr.dtype.itemsize == t.element_size() and arr.shape == (6, 5)
        assert arr.ctypes.data == t.data_ptr()   # a view of the tensor's bytes
        back = dtypes.to_torch(arr)
        assert back.dtype == tdtype and torch.equal(back.view(torch.uint8), t.view(torch.uint8))
    t = torch.randn(300).bfloat16()
    y = Compressor("int8").decompress(Compressor("int8").compress(t))
    assert y.dtype == dtypes.BFLOAT16
    assert torch.allclose(dtypes.to_torch(y).float(), t.float(), atol=0.05)


def test_unserved_dtypes_are_one_clear_line():
    with pytest.raises(InputError) as err:
        Compressor("int8").compress(np.arange(10))
    assert err.value.field == "dtype" and "bfloat16" in str(err.value)
    with pytest.raises(InputError, match="payload.dtype"):   # an unknown dtype code in a header
        data = bytearray(Compressor("int8").compress(gaussian(10)).data)
        data[3] = 99
        Compressor("int8").decompress(bytes(data))
