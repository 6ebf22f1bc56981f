"""Many collective predictions at once: sizes x compressors, one cluster."""
from __future__ import annotations

from perfmodel.collectives.predict import collective_time
from perfmodel.compression import split_top_level
from topologies.errors import InputError
from topologies.units import parse_size

MAX_SWEEP_SIZES = 64


def parse_sweep(text: str) -> list[int]:
    """'1MiB:1GiB' -> [1 MiB, 2 MiB, ..., 1 GiB] (doubling, both ends included)."""
    if not isinstance(text, str) or text.count(":") != 1:
        raise InputError("sweep", text, "MIN:MAX, e.g. 1KiB:1GiB (sizes double)")
    lo, hi = (parse_size(part, "sweep") for part in text.split(":"))
    if lo < 1 or hi < lo:
        raise InputError("sweep", text, "MIN:MAX with 1 <= MIN <= MAX")
    sizes = []
    while lo <= hi and len(sizes) <= MAX_SWEEP_SIZES:
        sizes.append(lo)
        lo *= 2
    if len(sizes) > MAX_SWEEP_SIZES:
        raise InputError("sweep", text, f"at most {MAX_SWEEP_SIZES} doublings")
    return sizes


def parse_compressors(text: str) -> list[str]:
    """'none,int8,topk(0.01)' -> ['none', 'int8', 'topk(0.01)'] (commas inside () kept)."""
    items = split_top_level(text or "")
    if not items:
        raise InputError("compressor", text, "one or more specs separated by commas")
    return items


def sweep_collectives(op: str, sizes, compressors, **kwargs) -> list:
    """Records for every (size, compressor), sizes outer; kwargs go to collective_time."""
    return [collective_time(op, size, compressor=c, **kwargs) for size in sizes for c in compressors]
