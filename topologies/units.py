"""Unit conversion: the one module where readable catalog units become SI.

Catalogs say ``bandwidth_Gbps = 200`` (network, bits), ``bandwidth_GBps = 300``
(GPU links, bytes), ``latency_us = 0.6``; code works in bytes/s and seconds.
Sizes given by users (``64KiB``, ``1GB``, ``4096``) are parsed here too.
"""
from __future__ import annotations

import re

from topologies.bounds import MAX_SIZE_BYTES
from topologies.errors import InputError

_SIZE_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def Gbps_to_Bps(gbit_per_s: float) -> float:
    """Network rate in Gbit/s (10^9 bit/s) to bytes/s."""
    return gbit_per_s * 1e9 / 8.0


def GBps_to_Bps(gbyte_per_s: float) -> float:
    """Rate in GB/s (10^9 bytes/s) to bytes/s."""
    return gbyte_per_s * 1e9


def TBps_to_Bps(tbyte_per_s: float) -> float:
    """Rate in TB/s (10^12 bytes/s) to bytes/s."""
    return tbyte_per_s * 1e12


def us_to_s(microseconds: float) -> float:
    return microseconds * 1e-6


def Bps_to_GBps(bytes_per_s: float) -> float:
    return bytes_per_s / 1e9


def parse_size(text, field: str = "size") -> int:
    """Parse ``4096``, ``64KiB``, ``256MiB``, ``1GB``, ``1.5GiB`` into bytes (an int >= 0).

    Binary suffixes (KiB, MiB, GiB, TiB and the bare K, M, G, T of nccl-tests) are
    powers of 1024; decimal ones (KB, MB, GB, TB) powers of 1000. At most ``MAX_SIZE_BYTES``
    (``topologies.bounds``).
    """
    if isinstance(text, bool):
        raise InputError(field, text, "a size such as 4096, 64KiB, 256MiB or 1GB")
    if isinstance(text, (int, float)):
        if not text == text or text < 0 or text > MAX_SIZE_BYTES or text != int(text):
            raise InputError(field, text, f"a whole number of bytes from 0 to {MAX_SIZE_BYTES} (1024TiB)")
        return int(text)
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise InputError(field, text, "a size such as 4096, 64KiB, 256MiB or 1GB")
    value = float(m.group(1)) * _SIZE_UNITS[unit]
    if value > MAX_SIZE_BYTES:
        raise InputError(field, text, f"a size of at most {format_size(MAX_SIZE_BYTES)} ({MAX_SIZE_BYTES} bytes)")
    if value != int(value):
        raise InputError(field, text, "a whole number of bytes")
    return int(value)


def format_size(size_bytes: int) -> str:
    """Short binary label: 1048576 -> '1MiB', 1536 -> '1.5KiB'."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= factor:
            value = size_bytes / factor
            return f"{value:g}{unit}" if value != int(value) else f"{int(value)}{unit}"
    return f"{size_bytes}B"


_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*$")


def parse_rate(text, field: str = "bandwidth") -> int:
    """Parse a link rate as tc writes it (``100mbit``, ``1gbit``, ``2.5gbit``) into bits/s."""
    m = _RATE_RE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _RATE_UNITS or float(m.group(1)) <= 0:
        raise InputError(field, text, "a rate such as 100mbit, 1gbit or 2.5gbit")
    return int(float(m.group(1)) * _RATE_UNITS[unit])


def format_rate(bits_per_s: float) -> str:
    """Short tc-style label (4 significant digits): 1e9 -> '1gbit', 1.96372e9 -> '1.964gbit'."""
    for unit, factor in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_s >= factor:
            return f"{float(f'{bits_per_s / factor:.4g}'):g}{unit}"
    return f"{bits_per_s:.4g}bit"
