"""``python -P -m realrun.bench.helper JOB``: one helper of ``realrun.bench.instep.in_step``.

JOB (JSON) names the worker (module and function) and its arguments; the worker runs as
``worker(barrier, queue, *args)`` with this side of the barrier and the result queue: the
parent is spoken to over stdin and stdout, one line per message, and the worker's own prints
go to the error output.
"""
from __future__ import annotations

import importlib
import json
import os
import sys


class Barrier:
    """A helper's side of the barrier: say ``wait``, then block until the parent says ``go``."""

    def __init__(self, to_parent, from_parent):
        self.to_parent, self.from_parent = to_parent, from_parent

    def wait(self) -> None:
        self.to_parent.write("wait\n")
        self.to_parent.flush()
        if self.from_parent.readline().strip() != "go":
            sys.exit("the parent of this helper is gone")


class Queue:
    """A helper's side of the result queue: one ``put`` of JSON values."""

    def __init__(self, to_parent):
        self.to_parent = to_parent

    def put(self, result) -> None:
        self.to_parent.write("done " + json.dumps(result) + "\n")
        self.to_parent.flush()


def main(argv: list[str]) -> None:
    with open(argv[0]) as handle:
        job = json.load(handle)
    worker = getattr(importlib.import_module(job["module"]), job["name"])
    to_parent = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)   # the worker's own prints must not mix with the messages
    sys.stdout = sys.stderr
    worker(Barrier(to_parent, sys.stdin), Queue(to_parent), *job["args"])


if __name__ == "__main__":
    main(sys.argv[1:])
