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
  its own error output, as soon as one fails or the deadline passes; a child stopped by a
  signal (SIGSTOP, a debugger: state ``T`` in ``/proc``) is named as the one that made no
  progress, not the peer that timed out waiting for it. The message is one line: every
  child's error output (the tracebacks) goes to a log file it names (``write_log``);
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
TAIL_LINES = 400      # lines of error output kept per child (for the log: tracebacks are 15-30 lines)
RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")   # what torch.distributed puts before each line of a rank's errors
# a traceback or an error line, also behind that prefix
HELD_MARK = re.compile(r"^(\[rank\d+\]:\s*)?(Traceback \(most recent call last\)|[\w.-]+: error: )")
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
            if len(self.held) < TAIL_LINES:
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
    return RANK_PREFIX.sub("", lines[-1]).strip() if lines else "no error output"


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


def stopped(p: subprocess.Popen) -> bool:
    """Whether a process of ``p``'s group (the child leads its own) is stopped: by SIGSTOP or
    SIGTSTP, or a debugger (state ``T`` or ``t`` in ``/proc/PID/stat``). False where there is
    no ``/proc``."""
    if p.returncode is not None or not os.path.isdir("/proc"):
        return False
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(p.pid) and fields[0] in ("T", "t"):
            return True
    return False


def write_log(procs: list[subprocess.Popen], path: str | None = None, what: str = "rank") -> str | None:
    """Every child's error output (its last ``TAIL_LINES`` lines) into ``path``, or where it
    cannot be written there (or is None) into a new file in the system's temporary folder, kept;
    returns the file's path (None where no child said anything or nothing could be written)."""
    deadline = time.monotonic() + DRAIN_S   # peers failing after the cause: their last lines too
    while time.monotonic() < deadline and any(p.poll() is None and not stopped(p) for p in procs):
        time.sleep(POLL_S)
    for p in procs:
        if isinstance(p, Child) and p.returncode is not None:
            p.drained()
    parts = []
    for r, p in enumerate(procs):
        lines = list(getattr(p, "lines", ()))
        if lines:
            state = "running" if p.returncode is None else describe_exit(p)
            parts.append(f"=== {what} {r} of {len(procs)} (pid {p.pid}, {state}) ===\n" + "\n".join(lines) + "\n")
    if not parts:
        return None
    text = "".join(parts).encode(errors="replace")
    if path is not None:
        with contextlib.suppress(OSError):
            with open(path, "wb") as handle:
                handle.write(text)
            return path
    try:
        fd, path = tempfile.mkstemp(prefix=f"realrun-{what}s-", suffix=".log")
        with os.fdopen(fd, "wb") as handle:
            handle.write(text)
    except OSError:
        return None
    return path


def _said(procs: list[subprocess.Popen], log: str | None, what: str) -> str:
    where = write_log(procs, log, what)
    return f"; every {what}'s error output is in {where}" if where else ""


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


def wait_all(procs: list[subprocess.Popen], timeout_s: float, what: str = "rank", log: str | None = None) -> None:
    """Wait for every child; the first to fail (or the deadline) ends the wait with one line that
    names it and what it said last, or the child that was stopped (``stopped``) where one was:
    its peers fail only because it made no progress. Every child's error output goes to ``log``
    (``write_log``: a temporary file where None), which the line names. Output held back is shown
    when all of them succeeded."""
    deadline = time.monotonic() + timeout_s
    n = len(procs)
    while True:
        for p in procs:
            p.poll()
        r = first_failure(procs)
        if r is not None:
            time.sleep(SETTLE_S)   # a cause that exited a moment earlier is reaped by now
            r = first_failure(procs)
            p = procs[r]
            failed = f"{what} {r} of {n} failed ({describe_exit(p)}): {tail(p)}"
            halted = [i for i, q in enumerate(procs) if stopped(q)]
            if halted:
                raise RunError(what, halted[0], f"{_stopped_text(halted, n, what)}; {failed}, waiting for it; "
                               f"every {what} was stopped" + _said(procs, log, what))
            raise RunError(what, r, f"{failed}; the other {what}s were stopped" + _said(procs, log, what))
        if all(p.returncode == 0 for p in procs):
            for p in procs:
                if isinstance(p, Child):
                    p.release()
            return
        if time.monotonic() > deadline:
            running = [i for i, p in enumerate(procs) if p.returncode is None]
            halted = [i for i in running if stopped(procs[i])]
            head = f"{_stopped_text(halted, n, what)}; " if halted else ""
            raise RunError("timeout_s", timeout_s, f"{head}{what} {', '.join(map(str, running))} of {n} did not "
                           f"finish within {timeout_s:g} s; every {what} was stopped" + _said(procs, log, what))
        time.sleep(POLL_S)


def _stopped_text(halted: list[int], n: int, what: str) -> str:
    return (f"{what} {', '.join(map(str, halted))} of {n} made no progress: stopped by a signal (SIGSTOP or "
            "SIGTSTP, or a debugger; process state T)")


def stop_all(procs: list[subprocess.Popen]) -> None:
    """End every child that still runs, with its process group: SIGTERM, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
                os.killpg(p.pid, signal.SIGCONT)   # a stopped child acts on the SIGTERM only once continued
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
