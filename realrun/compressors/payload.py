"""The payload: a small header, then the compressed body.

Header (little-endian, 24 bytes + 8 per dim): magic ``CP``, format version, dtype code,
ndim, 3 pad bytes, element count, the first 8 bytes of BLAKE2b of the canonical spec (so
a payload is never decoded with another spec), then the shape. perfmodel's
``header_bytes`` gives the same size; a contract test keeps them equal.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from perfmodel.compression.codec import header_bytes
from topologies.errors import InputError

MAGIC, VERSION = b"CP", 1
_FIXED = struct.Struct("<2sBBB3xQ8s")
DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.float16), 3: np.dtype(np.float64)}
CODES = {v: k for k, v in DTYPES.items()}


def spec_digest(spec_text: str) -> bytes:
    return hashlib.blake2b(spec_text.encode(), digest_size=8).digest()


@dataclass(frozen=True)
class Header:
    dtype: np.dtype
    shape: tuple
    digest: bytes

    @property
    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def pack(self) -> bytes:
        fixed = _FIXED.pack(MAGIC, VERSION, CODES[self.dtype], len(self.shape), self.count, self.digest)
        return fixed + struct.pack(f"<{len(self.shape)}Q", *self.shape)

    @classmethod
    def unpack(cls, data) -> tuple[Header, int]:
        if len(data) < _FIXED.size:
            raise InputError("payload", f"{len(data)} bytes", "a commpress payload (too short for a header)")
        magic, version, code, ndim, count, digest = _FIXED.unpack_from(data, 0)
        if magic != MAGIC or version != VERSION or code not in DTYPES:
            raise InputError("payload", bytes(data[:4]), f"a commpress payload of format version {VERSION}")
        shape = struct.unpack_from(f"<{ndim}Q", data, _FIXED.size)
        magic = bytes(magic)
        end = header_bytes(ndim)
        assert end == _FIXED.size + 8 * ndim
        return cls(dtype=DTYPES[code], shape=tuple(shape), digest=digest), end


@dataclass(frozen=True)
class Payload:
    """Compressed bytes (a bytes-like object); ``len(payload)`` is what crosses the wire."""

    data: bytes | bytearray

    def __len__(self) -> int:
        return len(self.data)

    def header(self) -> Header:
        return Header.unpack(self.data)[0]
