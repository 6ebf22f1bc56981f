"""``python -P -m realrun.train RANK WORLD STORE CONFIG`` (a local rank of ``realrun train``)
or ``--env CONFIG`` (a rank of an env:// launch: ``realrun cluster run``, validate --training).

Bad input only a rank can find (a checkpoint this rank's state does not take) ends it with one
line on stderr, ``realrun.train: error: field=value: allowed``, and exit code 2, as the commands
end: the launcher (``realrun.procs.wait_all``) names the rank and quotes that line, and holds it
back from the terminal like a traceback (``HELD_MARK``)."""
import os
import sys

from realrun.train.config import TrainConfig
from realrun.train.trainer import train
from topologies.clikit import EXIT_USAGE
from topologies.errors import InputError


def main(argv: list[str]) -> None:
    with open(argv[1] if argv[0] == "--env" else argv[3]) as handle:
        cfg = TrainConfig.from_json(handle.read())
    if argv[0] == "--env":
        train(cfg, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    else:
        train(cfg, int(argv[0]), int(argv[1]), argv[2])


try:
    main(sys.argv[1:])
except InputError as err:
    print(f"realrun.train: error: {err}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)
