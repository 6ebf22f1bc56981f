"""Writes ``forged_payloads.jsonl``: payloads a hostile peer can send (the checksum recomputed,
or a field changed without it), each with the field of the error that must refuse it. Every
case is one the decoders once got wrong (a crash in libzfp, a read past the stream, a
traceback, another dtype decoded). Run from the repository root after a payload format change:

    python tests/realrun/corpus/make_forged_payloads.py
"""
import json
import os
import struct

import numpy as np

from realrun.compressors import Compressor
from realrun.compressors.payload import CHECKSUM_AT, Header, seal

HERE = os.path.dirname(os.path.abspath(__file__))
X = np.random.default_rng(7).standard_normal(64).astype(np.float32)


def _payload(spec: str) -> bytearray:
    return bytearray(Compressor(spec).compress(X).data)


def _reheaded(spec: str, reseal: bool = True, **changes) -> bytearray:
    """The payload of ``spec`` with header fields replaced (dtype, shape), resealed or not."""
    p = _payload(spec)
    header, end = Header.unpack(bytes(p))
    fields = {"dtype": header.dtype, "shape": header.shape, "digest": header.digest, **changes}
    q = bytearray(Header(**fields).pack()) + p[end:]
    if reseal:
        seal(q)
    else:
        struct.pack_into("<I", q, CHECKSUM_AT, header.checksum)
    return q


def _body_patched(spec: str, at: int, data: bytes) -> bytearray:
    """The payload with bytes of its body replaced (``at`` from the body's start), resealed."""
    p = _payload(spec)
    end = Header.unpack(bytes(p))[1]
    p[end + at:end + at + len(data)] = data
    seal(p)
    return p


def cases():
    f64, f16 = np.dtype(np.float64), np.dtype(np.float16)
    yield "zfp(tolerance=1e-3)", "claims 2^28 values (libzfp segfaulted)", _reheaded(
        "zfp(tolerance=1e-3)", shape=(1 << 28,)), "payload.count"
    yield "zfp(tolerance=1e-3)", "claims 2^20 values (read past the stream)", _reheaded(
        "zfp(tolerance=1e-3)", shape=(1 << 20,)), "payload.count"
    yield "zfp(precision=12)", "claims 2^17 values (read past the stream)", _reheaded(
        "zfp(precision=12)", shape=(1 << 17,)), "payload.count"
    yield "zfp(tolerance=1e-3)", "dtype code flipped 1 -> 3, checksum kept", _reheaded(
        "zfp(tolerance=1e-3)", reseal=False, dtype=f64), "payload.checksum"
    yield "int8", "shape changed (64,) -> (8, 8), checksum kept", _reheaded(
        "int8", reseal=False, shape=(8, 8)), "payload.checksum"
    yield "zfp(tolerance=1e-3)", "dtype float16 (zfpy raised TypeError)", _reheaded(
        "zfp(tolerance=1e-3)", dtype=f16, shape=(64,)), "payload.dtype"
    yield "sz3(abs=1e-3)", "dtype float16 (pysz raised TypeError)", _reheaded(
        "sz3(abs=1e-3)", dtype=f16), "payload.dtype"
    yield "sz3(abs=1e-3)", "claims 2^31 values", _reheaded("sz3(abs=1e-3)", shape=(1 << 31,)), "payload"
    yield "lossless", "zstd frame declares 2^40 bytes", _body_patched(
        "lossless", 8 + 4, bytes([0xE0]) + (1 << 40).to_bytes(8, "little")), "payload"
    yield "lossless(codec=lz4)", "LZ4 size prefix 2^31", _body_patched(
        "lossless(codec=lz4)", 8, (1 << 31).to_bytes(4, "little")), "payload"
    yield "lossless(shuffle=bit)", "Blosc nbytes 2^31", _body_patched(
        "lossless(shuffle=bit)", 8 + 4, (1 << 31).to_bytes(4, "little")), "payload"
    yield "lossless", "claims 2^30 values from a short stream", _reheaded("lossless", shape=(1 << 30,)), \
        "payload.count"
    yield "mpc", "claims more values than its bitmap holds", _reheaded("mpc", shape=(1 << 20,)), "payload"


def main() -> None:
    with open(os.path.join(HERE, "forged_payloads.jsonl"), "w") as handle:
        for spec, case, payload, field in cases():
            handle.write(json.dumps({"spec": spec, "case": case, "refused_by": field,
                                     "payload": bytes(payload).hex()}) + "\n")


if __name__ == "__main__":
    main()
