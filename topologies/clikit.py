"""What every commpress command shares: one-line errors with exit code 2, tables, JSON."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

from topologies.attrs import GraphError
from topologies.errors import InputError

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) and exit code 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def run(main, argv=None) -> int:
    """Call ``main(argv)``; bad input becomes one line on stderr and exit code 2."""
    try:
        return main(argv) or 0
    except (InputError, GraphError) as err:
        prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "commpress"
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0


def table(headers, rows, title: str | None = None) -> str:
    """Fixed-width text table; numbers right-aligned, text left-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) if rows else False
               for i in range(len(headers))]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [title] if title else []
    out += [line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out)


def _cell(value) -> str:
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.2f}" if abs(value) >= 10 else f"{value:.3f}"
    return str(value)


def dump_json(obj) -> str:
    return json.dumps(obj, indent=2, default=_jsonable, allow_nan=True)


def _jsonable(obj):
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def check_writable(path: str, field: str = "output") -> str:
    """Refuse, before any work is done, an output path whose folder is missing or read-only."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(field, path, f"a file in an existing folder ({folder} does not exist)")
    if not os.access(folder, os.W_OK) or os.path.isdir(path):
        raise InputError(field, path, "a writable file path")
    return path


def atomic_write(path: str, write) -> str:
    """Write through a temporary file in the same folder, then rename: never half a file."""
    check_writable(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line per 10% otherwise."""

    def __init__(self, label: str, stream=None, width: int = 30):
        self.label, self.stream, self.width = label, stream or sys.stderr, width
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_decile = -1

    def __call__(self, done: int, total: int) -> None:
        frac = done / total if total else 1.0
        if self.tty:
            bar = "#" * int(frac * self.width)
            self.stream.write(f"\r{self.label} [{bar:<{self.width}}] {done}/{total}")
            if done >= total:
                self.stream.write("\n")
        elif int(frac * 10) != self._last_decile:
            self._last_decile = int(frac * 10)
            self.stream.write(f"{self.label}: {done}/{total}\n")
        self.stream.flush()
