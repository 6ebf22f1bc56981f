"""One contract per compressor: every family resolves on every side it claims, a new family
is one module (shown by one defined here), and no corrupted payload is ever decoded."""
import inspect
import math
import re
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel import collective_time, compile_spec
from perfmodel.compression import families
from realrun.compressors import Compressor, fast
from realrun.compressors.payload import CHECKSUM_AT, MAX_COUNT, checksum, seal
from realrun.compressors.transforms import Transform
from realrun.gpu import gpu_families, kernels
from topologies.errors import InputError

pytest.importorskip("zfpy", reason="the real extra (zfpy, pysz, numcodecs) is not installed")

CHAINS = ["ef(topk(0.01))+int8", "topk(0.1)+int4", "int8+lossless"]
SPECS = [s for cls in families.FAMILIES.values() for s in cls.examples() if s != "none"] + CHAINS


def test_every_family_has_a_numpy_implementation_and_examples_that_compile():
    for name, cls in families.FAMILIES.items():
        assert "numpy" in cls.IMPLEMENTATIONS, name
        for spec in cls.examples():
            assert name == compile_spec(spec).families[0].NAME


def test_gpu_implementations_belong_to_registered_families():
    """Every cupy implementation sits on a family of the grammar, and none landed on the base
    class every family inherits (one there would claim the GPU for every family)."""
    registered = {name for name, cls in families.FAMILIES.items() if "cupy" in cls.IMPLEMENTATIONS}
    assert set(gpu_families()) == registered
    assert "cupy" not in families.Family.IMPLEMENTATIONS


def test_the_gpu_backend_covers_exactly_the_families_it_declares():
    """Without CuPy too: the families of the GPU backend's declaration (``SERVES``) are exactly
    those with a cupy implementation, each the same transform class as on the host (one transform,
    two backends); the kernels they declare (and the dtype kernels at the codec boundary,
    ``DTYPE_KERNELS``) are exactly the kernels kernels.cu defines and the backend launches, so no
    family claims a kernel that is missing and no kernel is dead."""
    assert {cls.NAME for cls in kernels.SERVES} == set(gpu_families())
    for cls in kernels.SERVES:
        assert cls.IMPLEMENTATIONS["cupy"] is cls.IMPLEMENTATIONS["numpy"], cls.NAME
    declared = {name for serves in kernels.SERVES.values() for name in serves.kernels} | set(kernels.DTYPE_KERNELS)
    defined = set(re.findall(r'extern "C" __global__ void (\w+)', kernels.kernel_source()))
    launched = set(re.findall(r'_launch\("(\w+)"', inspect.getsource(kernels)))
    assert declared == defined == launched


def test_a_family_without_an_implementation_is_a_clear_error():
    with pytest.raises(InputError, match="cupy implementation"):
        compile_spec("sz3(abs=1e-3)").families[0].implementation("cupy")


# --- a compressor defined in one module: the contract and its numpy implementation ---------

class Halve(families.Family):
    """Test-only: keeps every other value (a fixed 2x), metadata: one float32 norm."""

    NAME = "halve"
    EXAMPLES = ("halve", "halve(2)")
    PARAMS = (families.Param(name="stride", kind=int, default=2, check=lambda v: isinstance(v, int) and v >= 1,
                             allowed="an integer >= 1"),)

    def layout(self, count, dtype):
        return families.Layout(math.ceil(count / self.stride), np.dtype(dtype), 4)

    def error(self):
        return math.sqrt(1 - 1 / self.stride)


class HalveTransform(Transform):
    def encode(self, x, ctx):
        return np.ascontiguousarray(x[:: self.params["stride"]]), np.float32(np.linalg.norm(x)).tobytes()

    def decode(self, values, meta, n, dtype, ctx):
        out = ctx.output(n, dtype)
        out[:] = 0
        out[:: self.params["stride"]] = values
        return out


@pytest.fixture
def halve():
    families.register(Halve)
    Halve.implements("numpy")(HalveTransform)
    compile_spec.cache_clear()
    yield Halve
    families.unregister(Halve)
    compile_spec.cache_clear()


def test_a_registered_test_compressor_works_on_both_sides(halve):
    x = np.arange(1001, dtype=np.float32)
    for spec in ("halve", "halve(stride=3)", "ef(halve)+int8"):
        c = Compressor(spec)
        p = c.compress(x)
        assert len(p) == compile_spec(spec).wire_bytes(len(x), 4)
        assert c.decompress(p).shape == x.shape
    assert np.array_equal(Compressor("halve").decompress(Compressor("halve").compress(x))[::2], x[::2])
    rec = collective_time("allgather", 1 << 20, cluster="dgx-a100", nodes=1, compressor="halve")
    assert rec.compression_ratio == pytest.approx(2.0, rel=0.01) and rec.exact_wire_size
    assert rec.error_estimate == pytest.approx(math.sqrt(0.5))
    with pytest.raises(InputError, match="halve.stride"):
        compile_spec("halve(0)")


def test_an_unregistered_family_is_gone(halve):
    families.unregister(halve)
    compile_spec.cache_clear()
    with pytest.raises(InputError, match="compressor"):
        compile_spec("halve")


# --- memory-safe decoding --------------------------------------------------------------------

def _payload(spec, n=700, seed=0):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return Compressor(spec), bytes(Compressor(spec).compress(x).data)


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_corrupted_payload_is_always_refused(spec, data):
    """Any flipped byte (header or body), truncation or extension: InputError, never a result."""
    c, p = _payload(spec)
    kind = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    q = bytearray(p)
    if kind == "flip":
        for i in data.draw(st.lists(st.integers(0, len(p) - 1), min_size=1, max_size=4, unique=True)):
            q[i] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        q = q[: data.draw(st.integers(0, len(p) - 1))]
    else:
        q += bytes(data.draw(st.integers(1, 64)))
    with pytest.raises(InputError):
        c.decompress(bytes(q))


HOSTILE = [s for s in SPECS if not s.startswith(("zfp(tolerance", "zfp(precision", "sz3"))]


@pytest.mark.parametrize("spec", HOSTILE)
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_forged_payload_with_a_valid_checksum_never_crashes(spec, data):
    """A peer that rewrites the body and fixes the checksum: a clear error or an array of the
    header's shape, never a crash or a write outside the output."""
    c, p = _payload(spec)
    q = bytearray(p)
    start = c.codec.wire_bytes(0, 4) - (0 if c.codec.exact else 8)   # the header's size
    for i in data.draw(st.lists(st.integers(start, len(p) - 1), min_size=1, max_size=8)):
        q[i] = data.draw(st.integers(0, 255))
    seal(q)
    try:
        y = c.decompress(bytes(q))
    except InputError:
        return
    assert y.shape == (700,)


def test_forged_topk_indices_are_refused_before_any_write():
    c = Compressor("topk(0.01)")
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    p = bytearray(c.compress(x).data)
    meta = c.codec.wire_bytes(1000, 4) - 10 * 4 - 10 * 4   # where the int32 indices start
    for bad in (2**31 - 1, 1000, -5):
        q = bytearray(p)
        struct.pack_into("<i", q, meta + 9 * 4, bad)
        seal(q)
        with pytest.raises(InputError, match="payload.indices"):
            c.decompress(bytes(q))


def test_header_count_must_match_shape_and_bounds():
    c, p = _payload("int8")
    q = bytearray(p)
    struct.pack_into("<Q", q, 8, 701)          # count != product of the shape
    with pytest.raises(InputError, match="payload.count"):
        c.decompress(bytes(q))
    struct.pack_into("<Q", q, 8, MAX_COUNT + 1)
    struct.pack_into("<Q", q, 32, MAX_COUNT + 1)
    with pytest.raises(InputError, match="payload.count"):
        c.decompress(bytes(q))


def test_checksum_detects_every_single_byte_change_and_paths_agree(monkeypatch):
    body = np.random.default_rng(2).integers(0, 256, 1003, dtype=np.uint8)
    base = checksum(body)
    for i in range(0, 1003, 7):
        changed = body.copy()
        changed[i] ^= 0x5A
        assert checksum(changed) != base
    monkeypatch.setattr(fast, "AVAILABLE", False)
    assert checksum(body) == base   # numpy path (and CuPy's, the same expression) = numba path
    assert CHECKSUM_AT == 24
