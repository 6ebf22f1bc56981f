"""Payloads a hostile peer sends: the checksum covers the header, and forged payloads with a
recomputed checksum (header fields, body bytes, or both) are refused or decode to an array of
the header's shape, for every spec including zfp's accuracy modes, SZ3, lossless and MPC, never
a crash, a read past a stream or another library's exception. A fixed corpus
(``corpus/forged_payloads.jsonl``, made by ``corpus/make_forged_payloads.py``) replays the cases
that once broke, with the field that must refuse each."""
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.compression import families
from realrun.compressors import Compressor
from realrun.compressors.payload import CHECKSUM_AT, PAYLOAD_DTYPES, Header, seal
from topologies.errors import InputError

pytest.importorskip("zfpy", reason="the real extra (zfpy, pysz, numcodecs) is not installed")

CORPUS = Path(__file__).parent / "corpus" / "forged_payloads.jsonl"
SPECS = sorted({s for cls in families.FAMILIES.values() for s in cls.examples() if s != "none"}
               | {"lossless(codec=lz4)", "lossless(shuffle=bit)", "int8+lossless", "topk(0.1)+zfp(tolerance=1e-2)",
                  "ef(topk(0.01))+int8", "topk(0.1)+int4"})
N = 300
_PAYLOADS: dict = {}


def _payload(spec: str) -> tuple[Compressor, bytes]:
    if spec not in _PAYLOADS:
        x = np.random.default_rng(3).standard_normal(N).astype(np.float32)
        _PAYLOADS[spec] = bytes(Compressor(spec).compress(x).data)
    return Compressor(spec), _PAYLOADS[spec]


def _decoded_or_refused(c: Compressor, q: bytes, header: Header) -> None:
    try:
        y = c.decompress(q)
    except InputError:
        return
    assert y.shape == header.shape and y.dtype == header.dtype


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_forged_header_and_body_with_a_valid_checksum_never_crashes(spec, data):
    """Any count up to 2^31 (as one dim or two), any dtype code, body bytes rewritten or not."""
    c, p = _payload(spec)
    header, end = Header.unpack(p)
    count = data.draw(st.one_of(st.integers(1, 4 * N), st.integers(1, 1 << 31)))
    split = data.draw(st.sampled_from([1, 2, 3, 7]))
    shape = (count,) if count % split else (split, count // split)
    forged = Header(dtype=PAYLOAD_DTYPES[data.draw(st.sampled_from(sorted(PAYLOAD_DTYPES)))], shape=shape,
                    digest=header.digest)
    body = bytearray(p[end:])
    for i in data.draw(st.lists(st.integers(0, max(0, len(body) - 1)), max_size=6)) if body else ():
        body[i] = data.draw(st.integers(0, 255))
    q = bytearray(forged.pack()) + body
    seal(q)
    _decoded_or_refused(c, bytes(q), forged)


@pytest.mark.parametrize("spec", ["zfp(tolerance=1e-3)", "zfp(precision=12)", "sz3(abs=1e-3)", "sz3(rel=1e-3)",
                                  "lossless", "lossless(codec=lz4,shuffle=bit)", "mpc"])
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_forged_bodies_of_external_codecs_never_crash(spec, data):
    """The C decoders' streams rewritten byte by byte, checksum recomputed."""
    c, p = _payload(spec)
    header, end = Header.unpack(p)
    q = bytearray(p)
    for i in data.draw(st.lists(st.integers(end, len(p) - 1), min_size=1, max_size=8)):
        q[i] = data.draw(st.integers(0, 255))
    seal(q)
    _decoded_or_refused(c, bytes(q), header)


@pytest.mark.parametrize("spec", ["int8", "zfp(tolerance=1e-3)", "sz3(abs=1e-3)", "topk(0.01)"])
def test_every_changed_header_byte_breaks_the_checksum(spec):
    """dtype code, ndim, count, digest and every dim: a flipped bit without a new checksum is refused."""
    c, p = _payload(spec)
    end = Header.unpack(p)[1]
    for i in [i for i in range(end) if not CHECKSUM_AT <= i < CHECKSUM_AT + 4]:
        for bit in (0, 7):
            q = bytearray(p)
            q[i] ^= 1 << bit
            with pytest.raises(InputError):
                c.decompress(bytes(q))
    q = bytearray(p)
    q[3] = {1: 3, 3: 1, 2: 1}[q[3]]   # another valid dtype code: the checksum names it
    with pytest.raises(InputError, match="payload.checksum"):
        c.decompress(bytes(q))


def _corpus():
    with open(CORPUS) as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.mark.parametrize("case", _corpus(), ids=lambda e: f"{e['spec']}: {e['case']}")
def test_the_forged_corpus_is_refused_by_the_field_it_names(case):
    with pytest.raises(InputError) as err:
        Compressor(case["spec"]).decompress(bytes.fromhex(case["payload"]))
    assert err.value.field == case["refused_by"], str(err.value)


def test_a_count_larger_than_the_stream_holds_is_refused_before_the_library():
    """zfp's accuracy modes hold at most 32 values per byte; the check names the bound."""
    c, p = _payload("zfp(tolerance=1e-3)")
    header, end = Header.unpack(p)
    stream = len(p) - end - 8
    q = bytearray(Header(dtype=header.dtype, shape=(32 * stream + 1,), digest=header.digest).pack()) + p[end:]
    seal(q)
    with pytest.raises(InputError, match=rf"payload.count=.*at most {32 * stream} values"):
        c.decompress(bytes(q))
    struct.pack_into("<Q", q, 8, 32 * stream)     # the most it can hold: decodes (garbage, in bounds)
    struct.pack_into("<Q", q, 32, 32 * stream)
    seal(q)
    assert c.decompress(bytes(q)).shape == (32 * stream,)


@pytest.mark.parametrize("spec", ["zfp(rate=8)", "zfp(tolerance=1e-3)", "sz3(abs=1e-3)"])
def test_float16_is_refused_where_the_library_has_none(spec):
    with pytest.raises(InputError, match="float32 or float64"):
        Compressor(spec).compress(np.ones(64, np.float16))
