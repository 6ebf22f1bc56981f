"""Rank processes: started safely, watched, and always stopped.

Every launcher of realrun (local ranks of ``realrun bench``, one rank per emulated host in
``realrun cluster run``) goes through here:

* ``python_argv`` runs a module with the interpreter's own path first and never the current
  directory (``-P``; on Python 3.10 a bootstrap that drops it), so a stray ``socket.py`` in
  the working folder is never imported by a rank running as root;
* each rank is the leader of its own process group (``start_new_session``), so ``stop_all``
  ends it and everything it started, with SIGTERM, then SIGKILL after ``GRACE_S``;
* ``wait_all`` returns when every rank exited 0 and raises, naming the first failed rank and
  the last line of its error output, as soon as one fails or the deadline passes.

``realrun`` commands turn SIGTERM into an exception (``topologies.clikit.run``), so the
``finally`` blocks that call ``stop_all`` and remove temporary folders run on a signal too.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from topologies.errors import InputError, RunError

GRACE_S = 5.0        # seconds a rank gets to exit after SIGTERM before SIGKILL
POLL_S = 0.05
_BOOTSTRAP = "import runpy, sys; sys.path.pop(0); sys.argv[0] = {0!r}; runpy.run_module({0!r}, run_name='__main__')"


def python_argv(module: str, *args: str) -> list[str]:
    """argv that runs ``python -m module args`` without the current directory on sys.path."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _BOOTSTRAP.format(module), *args]


def start(argv: list[str], *, quiet: bool = False, **popen) -> subprocess.Popen:
    """One rank in its own process group; its stderr is kept for the error message."""
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL if quiet else None, stderr=subprocess.PIPE
                            if quiet else None, start_new_session=True, **popen)


def tail(p: subprocess.Popen) -> str:
    if p.stderr is None:
        return "see its output above"
    lines = p.stderr.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no error output"


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Wait for every rank; the first to fail (or the deadline) ends the wait with an error."""
    deadline = time.monotonic() + timeout_s
    while True:
        for r, p in enumerate(procs):
            if p.poll() not in (None, 0):
                how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
                raise RunError("rank", r, f"rank {r} of {len(procs)} failed ({how}): {tail(p)}; "
                               "the other ranks were stopped")
        if all(p.poll() == 0 for p in procs):
            return
        if time.monotonic() > deadline:
            raise InputError("timeout_s", timeout_s, "enough time for every rank to finish")
        time.sleep(POLL_S)


def stop_all(procs: list[subprocess.Popen]) -> None:
    """End every rank that still runs, with its process group: SIGTERM, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
