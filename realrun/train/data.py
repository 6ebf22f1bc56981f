"""The corpus: the Python standard library's own top-level source files, read as bytes.

Every machine with Python has it, so training needs no download. Vocabulary: the 256 byte
values. Files are taken in sorted name order from ``sysconfig``'s stdlib folder and joined;
the last ``VAL_FRACTION`` of the bytes is the validation split (fixed: the same files for
every run on one Python version; another version's stdlib is another corpus, recorded by
``Corpus.digest``). A training microbatch (seed, step, index) draws window starts from its own
generator, so DP ranks read different data and two runs with the same arguments read the same.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from topologies.errors import InputError

VAL_FRACTION = 0.05
VOCAB = 256


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray     # uint8
    val: np.ndarray       # uint8
    digest: str           # first 12 hex digits of SHA-256 of the whole corpus
    files: int


@lru_cache(maxsize=1)
def load_corpus(folder: str | None = None) -> Corpus:
    root = Path(folder or sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if not files:
        raise InputError("corpus", str(root), "a folder with Python source files (the standard library)")
    data = b"".join(f.read_bytes() for f in files)
    arr = np.frombuffer(data, np.uint8)
    cut = int(len(arr) * (1 - VAL_FRACTION))
    return Corpus(train=arr[:cut], val=arr[cut:], digest=hashlib.sha256(data).hexdigest()[:12], files=len(files))


def batch(tokens: np.ndarray, rows: int, seq: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` windows of ``seq + 1`` bytes at random starts: (inputs, next-byte targets), int64."""
    if len(tokens) <= seq + 1:
        raise InputError("seq", seq, f"shorter than the corpus split ({len(tokens)} bytes)")
    starts = rng.integers(0, len(tokens) - seq - 1, rows)
    windows = np.stack([tokens[s:s + seq + 1] for s in starts]).astype(np.int64)
    return windows[:, :-1], windows[:, 1:]


def train_batch(corpus: Corpus, *, seed: int, step: int, index: int, rows: int, seq: int):
    """Microbatch ``index`` of ``step`` across the whole data-parallel group (rank r's m-th is
    ``m x dp + r``), so any dp degree reads the same global batch and a run on one rank with
    dp x microbatches reproduces it."""
    return batch(corpus.train, rows, seq, np.random.default_rng([seed, step, index, 0x7472]))


def val_batches(corpus: Corpus, *, rows: int, seq: int, count: int):
    """The same ``count`` validation batches for every rank, step and run."""
    rng = np.random.default_rng([0x76616C])
    return [batch(corpus.val, rows, seq, rng) for _ in range(count)]
