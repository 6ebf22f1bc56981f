"""``python -P -m realrun.train RANK WORLD STORE CONFIG``: one local rank of ``realrun train``."""
import sys

from realrun.train.config import TrainConfig
from realrun.train.trainer import train

with open(sys.argv[4]) as handle:
    train(TrainConfig.from_json(handle.read()), int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
