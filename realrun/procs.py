"""Child processes (ranks, helpers): started safely, watched, and always stopped.

Every process realrun starts goes through here (local ranks of ``realrun bench`` and
``realrun train``, one rank per emulated host in ``realrun cluster run``, calibration's
in-step helpers):

* ``python_argv`` runs a module with the interpreter's own path first and never the current
  directory (``-P``; on Python 3.10 a bootstrap that drops it before importing anything), so a
  stray ``socket.py`` in the working folder is never imported by a rank running as root;
* each child is the leader of its own process group (``start_new_session``), so ``stop_all``
  ends it and everything it started, with SIGTERM, then SIGKILL after ``GRACE_S``;
* its error output is read as it comes (never a full pipe that blocks it): a child started
  ``quiet`` keeps it for the error message only; the others' is shown live, except that from
  a traceback or an error line on it is held back, so a rank that fails because another one
  died never prints its consequence before the cause;
* ``wait_all`` returns when every child exited 0 and raises, naming the child that failed
  first (by exit time: the cause, not the ranks that lost their peer) and the last line of
  its own error output, as soon as one fails or the deadline passes;
* a watchdog (one small process per parent, started with the first child, in its own
  session) stops every child's process group and removes the folders of
  ``temporary_directory`` when the parent dies without cleaning up (``kill -9``).

``realrun`` commands turn SIGTERM into an exception (``topologies.clikit.run``), so the
``finally`` blocks that call ``stop_all`` and remove temporary folders run on a signal too.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from topologies.errors import RunError

GRACE_S = 5.0         # seconds a child gets to exit after SIGTERM before SIGKILL
POLL_S = 0.05
DRAIN_S = 2.0         # how long a failed child's error output may take to arrive in full
SETTLE_S = 0.05       # failures closer in time than this: a child killed by a signal is the cause
TAIL_LINES = 40       # lines of error output kept per child
HELD_MARK = re.compile(r"^(Traceback \(most recent call last\)|[\w.-]+: error: )")
_BOOTSTRAP = ("import sys; sys.path.pop(0); import runpy; sys.argv[0] = {0!r}; "
              "runpy.run_module({0!r}, run_name='__main__')")


def python_argv(module: str, *args: str) -> list[str]:
    """argv that runs ``python -m module args`` without the current directory on sys.path."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _BOOTSTRAP.format(module), *args]


class Child(subprocess.Popen):
    """A started child: ``exited_at`` (monotonic seconds, None while it runs), the last lines of
    its error output (``lines``), and what of it was held back (``held``)."""

    def __init__(self, argv, *, show: bool, **popen):
        self.exited_at: float | None = None
        self.lines: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.held: list[str] = []
        self.show = show
        self._reader: threading.Thread | None = None
        super().__init__(argv, **popen)
        if self.stderr is not None:
            self._reader = threading.Thread(target=self._read_errors, daemon=True)
            self._reader.start()
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        with contextlib.suppress(Exception):
            self.wait()
        self.exited_at = time.monotonic()

    def _read_errors(self) -> None:
        """Keep the error output's last lines; show it live (``show``) until it turns to an error."""
        pending = b""
        while True:
            try:
                chunk = os.read(self.stderr.fileno(), 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            pending += chunk
            *done, pending = re.split(rb"(?<=[\n\r])", pending)
            for raw in done:
                self._line(raw.decode(errors="replace"))
        if pending:
            self._line(pending.decode(errors="replace"))

    def _line(self, text: str) -> None:
        if text.strip():
            self.lines.append(text.rstrip())
        if not self.show:
            return
        if self.held or HELD_MARK.match(text):
            if len(self.held) < 10 * TAIL_LINES:
                self.held.append(text)
            return
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(text)
            sys.stderr.flush()

    def drained(self, timeout_s: float = DRAIN_S) -> None:
        """Wait (bounded) until the error output has been read to its end."""
        if self._reader is not None:
            self._reader.join(timeout_s)

    def release(self) -> None:
        """Show what was held back (the run ended well: nothing it said is a consequence)."""
        self.drained()
        held, self.held = self.held, []
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("".join(held))
            sys.stderr.flush()


def start(argv: list[str], *, quiet: bool = False, **popen) -> Child:
    """One child in its own process group, watched (``Child``). ``quiet``: its stdout is dropped
    and its error output kept only for the error message; else both are shown."""
    kwargs = {"stdout": subprocess.DEVNULL if quiet else None, "stderr": subprocess.PIPE, **popen}
    with _WATCH.lock:
        child = Child(argv, show=not quiet, start_new_session=True, **kwargs)
        _WATCH.send(f"+g{child.pid}")
    return child


def tail(p: subprocess.Popen) -> str:
    """The last line of a child's own error output (what it said before it ended)."""
    lines = getattr(p, "lines", None)
    if lines is None:
        return "see its output above"
    if isinstance(p, Child):
        p.drained()
    return lines[-1].strip() if lines else "no error output"


def describe_exit(p: subprocess.Popen) -> str:
    """``exit N`` or ``killed by signal N (NAME)`` of an ended child."""
    code = p.returncode
    if code >= 0:
        return f"exit {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "unknown signal"
    return f"killed by signal {-code} ({name})"


def _exited_at(p: subprocess.Popen, now: float) -> float:
    at = getattr(p, "exited_at", None)
    return now if at is None else at


def _own_traceback(p: subprocess.Popen) -> None:
    """Show the failed child's own last traceback, if its error output ends with one."""
    lines = list(getattr(p, "lines", ()))
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("\n".join(lines[starts[-1]:]) + "\n")
            sys.stderr.flush()


def first_failure(procs: list[subprocess.Popen]) -> int | None:
    """Index of the child that failed first (None if none has): the earliest to exit, except that
    among failures within ``SETTLE_S`` of it one killed by a signal comes first (it did not end by
    itself, so it is the cause)."""
    now = time.monotonic()
    failed = [(_exited_at(p, now), r) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
    if not failed:
        return None
    earliest = min(at for at, _ in failed)
    close = sorted((procs[r].returncode >= 0, at, r) for at, r in failed if at - earliest <= SETTLE_S)
    return close[0][2]


def wait_all(procs: list[subprocess.Popen], timeout_s: float, what: str = "rank") -> None:
    """Wait for every child; the first to fail (or the deadline) ends the wait with one line that
    names it and what it said last. Output held back is shown when all of them succeeded."""
    deadline = time.monotonic() + timeout_s
    while True:
        for p in procs:
            p.poll()
        r = first_failure(procs)
        if r is not None:
            time.sleep(SETTLE_S)   # a cause that exited a moment earlier is reaped by now
            r = first_failure(procs)
            p = procs[r]
            message = (f"{what} {r} of {len(procs)} failed ({describe_exit(p)}): {tail(p)}; "
                       f"the other {what}s were stopped")
            _own_traceback(p)
            raise RunError(what, r, message)
        if all(p.returncode == 0 for p in procs):
            for p in procs:
                if isinstance(p, Child):
                    p.release()
            return
        if time.monotonic() > deadline:
            running = [str(i) for i, p in enumerate(procs) if p.returncode is None]
            raise RunError("timeout_s", timeout_s, f"{what} {', '.join(running)} of {len(procs)} did not finish "
                           f"within {timeout_s:g} s; every {what} was stopped")
        time.sleep(POLL_S)


def stop_all(procs: list[subprocess.Popen]) -> None:
    """End every child that still runs, with its process group: SIGTERM, then SIGKILL."""
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
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=GRACE_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)   # whatever the child left running in its group
        _WATCH.send(f"-g{p.pid}")


@contextlib.contextmanager
def temporary_directory(prefix: str = "commpress-"):
    """A private temporary folder, removed on exit, and by the watchdog if this process dies first."""
    with tempfile.TemporaryDirectory(prefix=prefix) as path:
        _WATCH.send(f"+d{path}")
        try:
            yield path
        finally:
            _WATCH.send(f"-d{path}")


# The watchdog: reads "+g PGID", "-g PGID", "+d DIR", "-d DIR" lines; at end of input (this
# process ended: exited, or was killed) it stops the groups still listed and removes the folders.
WATCHDOG = f"""
import os, shutil, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups, dirs = set(), set()
for line in sys.stdin:
    op, kind, value = line[0], line[1], line[2:].rstrip("\\n")
    items = groups if kind == "g" else dirs
    item = int(value) if kind == "g" else value
    items.add(item) if op == "+" else items.discard(item)
def alive(g):
    try:
        os.killpg(g, 0)
        return True
    except OSError:
        return False
def running():  # groups with a member that is not a zombie (orphans may wait for a reaper)
    if not os.path.isdir("/proc"):
        return {{g for g in groups if alive(g)}}
    out = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{{pid}}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            out.add(int(fields[2]))
    return out
def signal_all(sig):
    for g in running():
        try:
            os.killpg(g, sig)
        except OSError:
            pass
if groups:
    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + {GRACE_S}
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_all(signal.SIGKILL)
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
"""


class _Watchdog:
    """This process's watchdog, started on first use; writes to it never raise."""

    def __init__(self):
        self.lock = threading.RLock()
        self.proc: subprocess.Popen | None = None
        self.owner = 0

    def send(self, line: str) -> None:
        with self.lock:
            if self.proc is None or self.owner != os.getpid():
                self.owner = os.getpid()
                try:
                    self.proc = subprocess.Popen([sys.executable, "-I", "-c", WATCHDOG], stdin=subprocess.PIPE,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                 start_new_session=True, close_fds=True)
                except OSError:
                    self.proc = None
                    return
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.write(f"{line}\n".encode())
                self.proc.stdin.flush()


    def close(self) -> None:
        """At exit: end of input tells the watchdog there is nothing left to do."""
        with self.lock:
            if self.proc is not None and self.owner == os.getpid():
                with contextlib.suppress(OSError, ValueError):
                    self.proc.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=1.0)


_WATCH = _Watchdog()
atexit.register(_WATCH.close)
