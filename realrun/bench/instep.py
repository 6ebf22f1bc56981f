"""Helper processes computing in step, as the ranks of an emulated cluster share this machine.

``in_step(worker, args, ranks)`` starts ``ranks`` helpers through ``realrun.procs`` (the
interpreter's path only, never the current folder; own process groups; stopped on any exit,
also when this process is killed) as ``python -P -m realrun.bench.helper JOB``. Each runs
``worker(barrier, queue, *args)``, the worker named by module and function in JOB (JSON);
``barrier.wait()`` holds it until every helper got there, ``queue.put(result)`` hands back its
one result (JSON values). They talk over their stdin and stdout, one line per message
(``wait``/``go``, ``done RESULT``); a helper's own prints go to its error output.

Every wait is bounded: a helper that exits, or says nothing for ``timeout_s``, ends the call
at once with one line naming it and the last line of its own error output.
"""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import time

from realrun import procs
from realrun.threads import launch_env
from topologies.errors import RunError

STEP_TIMEOUT_S = 600.0   # longest a helper may take between two messages (one timed case)
ENTRY = "realrun.bench.helper"   # one helper (its own module: the package does not import it)


def in_step(worker, args: tuple, ranks: int, threads: int = 1, place=None,
            timeout_s: float = STEP_TIMEOUT_S) -> list:
    """Run ``worker(barrier, queue, *args)`` in ``ranks`` helpers (``threads`` OMP and numba
    threads each) at once; returns their results, one per helper, in helper order.
    ``place(i, pid)``, if given, runs as helper ``i`` starts (an emulated host's cgroup: the
    share its rank computes with)."""
    with procs.temporary_directory() as tmp:
        job = os.path.join(tmp, "job.json")
        with open(job, "w") as handle:
            json.dump({"module": worker.__module__, "name": worker.__qualname__, "args": list(args)}, handle)
        env = {**os.environ, **launch_env(threads, ranks)}
        helpers = []
        try:
            for i in range(ranks):
                helpers.append(procs.start(procs.python_argv(ENTRY, job), quiet=True, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, env=env))
                if place is not None:
                    place(i, helpers[-1].pid)
            return _conduct(helpers, timeout_s)
        finally:
            procs.stop_all(helpers)


def _conduct(helpers, timeout_s: float) -> list:
    """Release the helpers from each barrier together; collect their results."""
    channel = _Lines(helpers)
    while True:
        said = channel.next_from_each(timeout_s)
        if all(line == "wait" for line in said):
            for h in helpers:
                h.stdin.write(b"go\n")
                h.stdin.flush()
            continue
        if all(line.startswith("done ") for line in said):
            return [json.loads(line[5:]) for line in said]
        raise RunError("helper", said, "helpers that reach the same barriers (they ran different cases)")


class _Lines:
    """Whole lines from each helper's stdout, read without blocking on any one of them."""

    def __init__(self, helpers):
        self.helpers = helpers
        self.buffers = [b""] * len(helpers)
        self.closed: set[int] = set()
        self.sel = selectors.DefaultSelector()
        for i, h in enumerate(helpers):
            os.set_blocking(h.stdout.fileno(), False)
            self.sel.register(h.stdout, selectors.EVENT_READ, i)

    def _line(self, i: int) -> str | None:
        head, sep, rest = self.buffers[i].partition(b"\n")
        if not sep:
            return None
        self.buffers[i] = rest
        return head.decode(errors="replace")

    def next_from_each(self, timeout_s: float) -> list[str]:
        said = [self._line(i) for i in range(len(self.helpers))]
        deadline = time.monotonic() + timeout_s
        while None in said:
            left = deadline - time.monotonic()
            if left <= 0:
                late = [str(i) for i, s in enumerate(said) if s is None]
                raise RunError("timeout_s", timeout_s, f"helper {', '.join(late)} of {len(self.helpers)} said "
                               f"nothing for {timeout_s:g} s; every helper was stopped")
            for key, _ in self.sel.select(min(left, procs.POLL_S * 10)):
                i = key.data
                chunk = os.read(key.fileobj.fileno(), 65536)
                if chunk:
                    self.buffers[i] += chunk
                else:
                    self.sel.unregister(key.fileobj)
                    self.closed.add(i)
            for i in range(len(said)):
                if said[i] is None:
                    said[i] = self._line(i)
                    if said[i] is None and i in self.closed:
                        self._ended(i)
        return said

    def _ended(self, i: int) -> None:
        """Helper ``i`` closed its output before saying what was due: it ended."""
        h = self.helpers[i]
        try:
            h.wait(timeout=procs.GRACE_S)
        except subprocess.TimeoutExpired:
            raise RunError("helper", i, f"helper {i} of {len(self.helpers)} closed its output and did not "
                           "exit; every helper was stopped") from None
        how = "exit 0" if h.returncode == 0 else procs.describe_exit(h)
        raise RunError("helper", i, f"helper {i} of {len(self.helpers)} ended ({how}): {procs.tail(h)}; "
                       "every helper was stopped")
