"""``python -P -m realrun.bench RANK WORLD STORE CONFIG OUT`` (a local rank) or ``--env CONFIG
OUT`` (a rank of an env:// launch): one rank of a collective benchmark (``worker``)."""
import os
import sys

from realrun.bench.config import BenchConfig
from realrun.bench.worker import worker


def _load(path: str) -> BenchConfig:
    with open(path) as handle:
        return BenchConfig.from_json(handle.read())


if sys.argv[1] == "--env":
    worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, _load(sys.argv[2]), sys.argv[3])
else:
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], _load(sys.argv[4]), sys.argv[5])
