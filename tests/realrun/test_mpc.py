"""MPC's numpy reference: bit-exact for every bit pattern, width and dimensionality; what it
gains on smooth data; malformed payloads refused."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from realrun.compressors import Compressor, mpc
from topologies import InputError

WIDTH = {2: np.float16, 4: np.float32, 8: np.float64}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2, 4, 8]).flatmap(lambda w: hnp.arrays(
    np.dtype(f"u{w}"), st.integers(0, 5000), elements=st.integers(0, 2 ** (8 * w) - 1))),
    st.integers(1, 32))
def test_every_bit_pattern_round_trips(bits, dim):
    x = bits.view(WIDTH[bits.dtype.itemsize])        # NaNs, infinities, denormals, -0 included
    back = mpc.decode(mpc.encode(x, dim), x.size, x.dtype, dim)
    assert back.dtype == x.dtype and np.array_equal(back.view(bits.dtype), bits)


def test_smooth_data_compresses_and_noise_does_not_expand_much():
    rng = np.random.default_rng(1)
    smooth = np.cumsum(rng.standard_normal(1 << 18) * 1e-3).astype(np.float32)
    noise = rng.standard_normal(1 << 18).astype(np.float32)
    assert smooth.nbytes / len(mpc.encode(smooth)) > 1.5
    assert noise.nbytes / len(mpc.encode(noise)) > 1.0       # the bitmap costs 1/32, exponents pay it back
    assert np.zeros(1 << 16, np.float32).nbytes / len(mpc.encode(np.zeros(1 << 16, np.float32))) == 32


def test_dimensionality_finds_interleaved_structure():
    """Three interleaved smooth channels: dim=3 subtracts like from like, dim=1 does not."""
    rng = np.random.default_rng(2)
    chans = np.cumsum(rng.standard_normal((1 << 16, 3)) * 1e-3, axis=0) + np.array([1.0, 100.0, -50.0])
    x = chans.astype(np.float32).reshape(-1)
    assert len(mpc.encode(x, 3)) < 0.9 * len(mpc.encode(x, 1))


def test_through_the_compressor_contract():
    x = np.random.default_rng(3).standard_normal(10_000).astype(np.float32)
    c = Compressor("mpc(dim=2)")
    assert np.array_equal(c.decompress(c.compress(x)), x)


@pytest.mark.parametrize("cut", [1, 100])
def test_a_truncated_payload_is_refused(cut):
    x = np.random.default_rng(4).standard_normal(5000).astype(np.float32)
    data = mpc.encode(x)
    with pytest.raises(InputError):
        mpc.decode(data[:-cut] if cut < len(data) else data[:1], x.size, np.float32)


def test_integers_are_refused():
    with pytest.raises(InputError):
        mpc.encode(np.zeros(10, np.int8))
