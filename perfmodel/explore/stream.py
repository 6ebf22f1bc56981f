"""Rows streamed to a CSV file as tasks finish, and read back to resume a search that was killed.

``RowStream`` appends each task's rows in one ``write`` followed by ``fsync``, so a search killed
at any moment leaves whole tasks' rows (a machine that loses power can leave the last one cut:
``read_rows`` drops a last line without its newline, and the caller re-runs any task whose rows
are not all there). The file is plain CSV with a fixed header (``columns``), readable by any CSV
reader while the search runs; values are written with ``str`` (floats as ``repr``: they read
back exactly) and read back with ``types`` (column -> int, bool or str; float otherwise).

A stream is held with an exclusive ``flock`` while it is written, so two searches never append
to one file.
"""
from __future__ import annotations

import csv
import io
import os

from topologies import InputError
from topologies.clikit import atomic_write, check_writable

SUFFIXES = (".csv",)


def check_stream(path: str, field: str = "stream") -> str:
    """A writable ``.csv`` path."""
    if not isinstance(path, str) or not path.lower().endswith(SUFFIXES):
        raise InputError(field, path, "a .csv file (rows are appended as each task finishes)")
    return check_writable(path, field)


def read_rows(path: str, columns: tuple, types: dict) -> list[dict]:
    """The rows of a stream (none when the file is missing or empty); a last line cut short is
    dropped. A header other than ``columns`` or a value that does not read is refused."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    if not data:
        return []
    data = data[:data.rfind(b"\n") + 1]          # a write cut short: its tasks run again
    reader = csv.reader(io.StringIO(data.decode()))
    header = tuple(next(reader, ()))
    if header != tuple(columns):
        raise InputError("resume", path, "a stream written by this version of perfmodel search (its header "
                         f"starts {','.join(columns[:4])},...)")
    return [_typed(values, columns, types, path, line) for line, values in enumerate(reader, start=2)]


def _typed(values: list, columns: tuple, types: dict, path: str, line: int) -> dict:
    if len(values) != len(columns):
        raise InputError("resume", f"{path}:{line}", f"{len(columns)} values a row ({len(values)} here)")
    row = {}
    for name, text in zip(columns, values):
        kind = types.get(name, float)
        try:
            row[name] = _BOOL[text] if kind is bool else kind(text)
        except (KeyError, ValueError):
            raise InputError("resume", f"{path}:{line}", f"{name} as {kind.__name__} (not {text!r})") from None
    return row


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
