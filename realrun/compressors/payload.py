"""The payload: a small header, then the compressed body, refused unless it is whole.

Header (little-endian, 32 bytes + 8 per dim): magic ``CP``, format version, dtype code (the
tensor's dtype: 1 float32, 2 float16, 3 float64, 4 bfloat16, 5 float8_e4m3fn, 6 float8_e5m2),
ndim, 3 pad bytes, element count, the first 8 bytes of BLAKE2b of the canonical spec (so
a payload is never decoded with another spec), a 32-bit checksum of the header and the body,
4 pad bytes (the body starts 8-byte aligned), then the shape. perfmodel's ``header_bytes``
gives the same size; a contract test keeps them equal.

The checksum of a byte string is a position-weighted sum of its little-endian 32-bit words,
``(len + sum_i (2i+1) * w_i) mod 2^32`` (a short last word zero padded). It detects every
error inside one word (a changed word changes the sum by an odd multiple of a nonzero
difference, never 0 mod 2^32) and any other corruption but with probability 2^-32; unlike
CRC-32 it is one parallel reduction, so the GPU path computes the same value on the device
(the body's backend does the reduction: ``backends``). It costs one read of the body (numba:
one pass, ~memcpy speed). The header's field holds the sum of the body's checksum and the
header's own (its bytes with the field zero, on the host: a few dozen bytes), so a flipped
dtype code, count or dim is caught as a flipped body byte is.

``Header.unpack`` checks magic, version, dtype, ndim (at most ``MAX_NDIM``), that the count
equals the product of the shape and stays under ``MAX_COUNT``, and the checksum (``verify``):
every field is checked before any byte of the body is interpreted. A peer that forges a
payload can recompute the checksum: the decoders' own bounds (``transforms``, ``external``) are
what keep such a payload from reading or writing outside its buffers.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, replace

import numpy as np

from perfmodel.compression.codec import HEADER_FIXED_BYTES, header_bytes
from realrun.compressors import backends, dtypes
from topologies.errors import InputError

MAGIC, VERSION = b"CP", 3   # 3: the checksum covers the header too
_FIXED = struct.Struct("<2sBBB3sQ8sI4s")
PAD = (b"\0" * 3, b"\0" * 4)
assert _FIXED.size == HEADER_FIXED_BYTES
# the dtype code of the header: the tensor's own dtype (bf16 and fp8 are ml_dtypes' numpy types; a
# decoder without ml_dtypes refuses their codes in one line)
PAYLOAD_DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.float16), 3: np.dtype(np.float64),
                  **{code: d for code, d in ((4, dtypes.BFLOAT16), (5, dtypes.FLOAT8_E4M3), (6, dtypes.FLOAT8_E5M2))
                     if d is not None}}
DTYPE_CODES = {v: k for k, v in PAYLOAD_DTYPES.items()}
MAX_NDIM = 8
MAX_COUNT = 1 << 32   # values one payload may claim (16 GiB of float32): a decoder allocates this much
CHECKSUM_AT = 24      # byte offset of the checksum inside the header


def spec_digest(spec_text: str) -> bytes:
    return hashlib.blake2b(spec_text.encode(), digest_size=8).digest()


def checksum(body) -> int:
    """The body checksum (module doc); ``body`` is a uint8 array of any backend (numpy, CuPy)."""
    be = backends.of(body)
    n = int(body.size)
    whole = n // 4
    total = be.weighted_sum(body[: whole * 4].view(be.xp.uint32))
    if n % 4:
        tail = bytes(be.to_host(body[whole * 4:])).ljust(4, b"\0")
        total += int.from_bytes(tail, "little") * (2 * whole + 1)
    return (total + n) & 0xFFFFFFFF


def _as_u8(data) -> np.ndarray:
    return np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)


@dataclass(frozen=True)
class Header:
    dtype: np.dtype
    shape: tuple
    digest: bytes
    checksum: int = 0

    @property
    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def size(self) -> int:
        return header_bytes(len(self.shape))

    def pack(self) -> bytes:
        fixed = _FIXED.pack(MAGIC, VERSION, DTYPE_CODES[self.dtype], len(self.shape), PAD[0], self.count, self.digest,
                            self.checksum, PAD[1])
        return fixed + struct.pack(f"<{len(self.shape)}Q", *self.shape)

    def own_checksum(self) -> int:
        """The checksum of this header's bytes with the checksum field zero."""
        return checksum(np.frombuffer(replace(self, checksum=0).pack(), np.uint8))

    def sealed(self, body_checksum: int) -> bytes:
        """This header's bytes, its checksum field covering itself and a body of ``body_checksum``."""
        return replace(self, checksum=(body_checksum + self.own_checksum()) & 0xFFFFFFFF).pack()

    @classmethod
    def unpack(cls, data, verify: bool = True) -> tuple[Header, int]:
        """The header of ``data`` and where the body starts; InputError for anything malformed
        (with ``verify``, also a body that does not match its checksum)."""
        if len(data) < _FIXED.size:
            raise InputError("payload", f"{len(data)} bytes", "a commpress payload (too short for a header)")
        magic, version, code, ndim, pad, count, digest, check, pad2 = _FIXED.unpack_from(data, 0)
        if magic != MAGIC or version != VERSION or (pad, pad2) != PAD:
            raise InputError("payload", bytes(data[:4]), f"a commpress payload of format version {VERSION}")
        if code not in PAYLOAD_DTYPES:
            raise InputError("payload.dtype", code, "a dtype code of " + ", ".join(map(str, PAYLOAD_DTYPES)))
        if not 1 <= ndim <= MAX_NDIM:
            raise InputError("payload.ndim", ndim, f"1 to {MAX_NDIM} dims")
        end = header_bytes(ndim)
        if len(data) < end:
            raise InputError("payload", f"{len(data)} bytes", f"at least {end} bytes for a {ndim}-dim header")
        shape = struct.unpack_from(f"<{ndim}Q", data, _FIXED.size)
        product = 1
        for dim in shape:
            product *= dim
        if product != count or count > MAX_COUNT:
            raise InputError("payload.count", count, f"the product of the shape {tuple(shape)}, "
                             f"at most {MAX_COUNT}")
        header = cls(dtype=PAYLOAD_DTYPES[code], shape=tuple(shape), digest=digest, checksum=check)
        if verify:
            header.verify(_as_u8(data)[end:])
        return header, end

    def verify(self, body) -> None:
        """InputError unless this header and ``body`` (a uint8 array of any backend) match the checksum."""
        if (checksum(body) + self.own_checksum()) & 0xFFFFFFFF != self.checksum:
            raise InputError("payload.checksum", f"{self.checksum:#010x}", "the checksum of the header and the body "
                             "(the payload was corrupted on the way)")


def seal(buf) -> None:
    """Write the checksum of ``buf`` (a writable header + body) into its header."""
    u8 = _as_u8(buf)
    end = header_bytes(int(u8[4]))
    struct.pack_into("<I", buf, CHECKSUM_AT, 0)
    total = checksum(u8[end:]) + checksum(u8[:end].copy())
    struct.pack_into("<I", buf, CHECKSUM_AT, total & 0xFFFFFFFF)


@dataclass(frozen=True)
class Payload:
    """Compressed bytes (a bytes-like object); ``len(payload)`` is what crosses the wire."""

    data: bytes | bytearray

    def __len__(self) -> int:
        return len(self.data)

    def header(self) -> Header:
        return Header.unpack(self.data)[0]
