"""Rows streamed to a CSV file as tasks finish, and read back to resume a search that was killed.

``RowStream`` appends each task's rows in one ``write`` followed by ``fsync``, so a search killed
at any moment leaves whole tasks' rows (a machine that loses power can leave the last one cut:
``read_rows`` drops a last line without its newline, and the caller re-runs any task whose rows
are not all there). The file is plain CSV with a fixed header (``columns``), readable by any CSV
reader while the search runs; values are written with ``str`` (floats as ``repr``: they read
back exactly) and read back with ``types`` (column -> int, bool or str; float otherwise), each number
checked against its ``Domain`` where the caller gives one (every number finite): a value the search
could not have written (NaN, a negative time, a cell of another kind, a field of over 128 KiB) is
refused in one line naming the file, line, column and value, so a damaged or edited stream is never
ranked nor written back. Deleting such a line runs its task again.

A stream is held with an exclusive ``flock`` while it is written, so two searches never append
to one file.
"""
from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass

from topologies import InputError
from topologies.clikit import atomic_write, check_writable

SUFFIXES = (".csv",)


def check_stream(path: str, field: str = "stream") -> str:
    """A writable ``.csv`` path."""
    if not isinstance(path, str) or not path.lower().endswith(SUFFIXES):
        raise InputError(field, path, "a .csv file (rows are appended as each task finishes)")
    return check_writable(path, field)


@dataclass(frozen=True)
class Domain:
    """What a streamed number may be: finite, from ``low`` (excluded where ``above``) to ``high``."""

    low: float
    high: float = math.inf
    above: bool = False

    def __contains__(self, value) -> bool:
        return (isinstance(value, int) or math.isfinite(value)) and self.low <= value <= self.high \
            and not (self.above and value == self.low)

    def __str__(self) -> str:
        """Its limits (``> 0``, ``>= 0 and <= 3``; empty where only finite)."""
        limits = [f"{'>' if self.above else '>='} {self.low:g}"] if math.isfinite(self.low) else []
        return " and ".join(limits + ([f"<= {self.high:g}"] if math.isfinite(self.high) else []))


def read_rows(path: str, columns: tuple, types: dict, domains: dict | None = None) -> list[dict]:
    """The rows of a stream (none when the file is missing or empty); a last line cut short is
    dropped. A header other than ``columns``, a value that does not read as its type or is outside
    its domain (``domains``: column -> ``Domain``; every number finite) is refused (module doc)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    if not data:
        return []
    data = data[:data.rfind(b"\n") + 1]          # a write cut short: its tasks run again
    try:
        reader = csv.reader(io.StringIO(data.decode()))
        header = tuple(next(reader, ()))
        if header != tuple(columns):
            raise InputError("resume", path, "a stream written by this version of perfmodel search (its header "
                             f"starts {','.join(columns[:4])},...)")
        return [_typed(values, columns, types, domains or {}, f"{path}:{line}")
                for line, values in enumerate(reader, start=2)]
    except UnicodeDecodeError:
        raise InputError("resume", path, "a CSV stream perfmodel search wrote (UTF-8 text)") from None
    except csv.Error as err:
        raise InputError("resume", f"{path}:{reader.line_num}", f"a CSV stream perfmodel search wrote ({err})") \
            from None


def _typed(values: list, columns: tuple, types: dict, domains: dict, where: str) -> dict:
    if len(values) != len(columns):
        raise InputError("resume", where, f"{len(columns)} values a row ({len(values)} here)")
    row = {}
    for name, text in zip(columns, values):
        kind = types.get(name, float)
        try:
            row[name] = _BOOL[text] if kind is bool else kind(text)
        except (KeyError, ValueError):
            raise InputError(f"{where}.{name}", text, _allowed(kind, domains.get(name))) from None
        if kind in (int, float) and row[name] not in domains.get(name, _FINITE):
            raise InputError(f"{where}.{name}", text, _allowed(kind, domains.get(name)))
    return row


def _allowed(kind, domain: Domain | None) -> str:
    what = " ".join(filter(None, (_KINDS.get(kind, kind.__name__), str(domain or ""))))
    return f"{what} (the stream holds another value than perfmodel search wrote: remove the line to run its task " \
        "again)"


_FINITE = Domain(-math.inf)
_KINDS = {int: "an integer", float: "a finite number", bool: "True or False", str: "text"}
_BOOL = {"True": True, "False": False}


def _locked(path: str):
    """``path`` open to append, under an exclusive lock (refused where another search holds it)."""
    import fcntl

    handle = open(path, "ab")  # noqa: SIM115  (kept open by the stream, closed by close())
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise InputError("stream", path, "a file no other search is writing (another holds its lock)") from None
    return handle


class RowStream:
    """Rows appended to ``path`` (module doc): the header and ``rows`` written first, replacing
    what was there (atomically); then ``append`` per task. A context manager."""

    def __init__(self, path: str, columns: tuple, rows: list = ()):
        self.path, self.columns = path, tuple(columns)
        old = _locked(path)             # no other search writes it while it is replaced
        try:
            atomic_write(path, lambda h: h.write(self._lines(rows, header=True)))
            self._handle = _locked(path)    # the file the rename put in its place
        finally:
            old.close()

    def _lines(self, rows, header: bool = False) -> bytes:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        if header:
            writer.writerow(self.columns)
        for row in rows:
            if len(row) != len(self.columns):
                raise ValueError(f"a row of {sorted(row)} for the stream's columns {self.columns}")
            writer.writerow([row[c] for c in self.columns])
        return buf.getvalue().encode()

    def append(self, rows: list) -> None:
        """One task's rows: one write, flushed and synced to disk before this returns."""
        if not rows:
            return
        self._handle.write(self._lines(rows))
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
