"""``python -P -m realrun.train RANK WORLD STORE CONFIG`` (a local rank of ``realrun train``)
or ``--env CONFIG`` (a rank of an env:// launch: ``realrun cluster run``, validate --training)."""
import os
import sys

from realrun.train.config import TrainConfig
from realrun.train.trainer import train

with open(sys.argv[2] if sys.argv[1] == "--env" else sys.argv[4]) as handle:
    cfg = TrainConfig.from_json(handle.read())
if sys.argv[1] == "--env":
    train(cfg, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
else:
    train(cfg, int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
