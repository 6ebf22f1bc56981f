"""Measurement tables read from CSV files, checked cell by cell.

The published measurements (``perfmodel.calibration.published``) and realrun's stored results
(``realrun validate --measured``) are CSV tables someone else wrote. ``read_table`` gives each row
with where it stands (``FILE:LINE``) and refuses a file that is no such table; ``integer``,
``number``, ``flag`` and ``text`` read one cell, within a declared bound (``topologies.bounds``)
where the value sizes work, and refuse anything else in one line naming the file, the line, the
column, the value and what is allowed (``InputError``).
"""
from __future__ import annotations

import csv
import math

from topologies import bounds
from topologies.errors import InputError

FLAGS = {"True": True, "False": False}   # how Python's csv writes a bool (every table here does)


def read_table(path, field: str, what: str) -> list[tuple[str, dict]]:
    """[(``FILE:LINE``, row)] of the CSV table at ``path``. A file that cannot be read, is not UTF-8,
    has no rows, a cell past the csv module's field limit or a row of more or fewer cells than its
    header is refused naming ``field`` (or the line) and ``what`` it should be."""
    out, reader = [], None
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            for row in reader:
                line = reader.line_num
                if None in row or None in row.values():
                    cells = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None) or ())
                    raise InputError(f"{path}:{line}", f"{cells} cells",
                                     f"the {len(reader.fieldnames)} cells its header names")
                out.append((f"{path}:{line}", row))
    except OSError as err:
        raise InputError(field, str(path), f"{what} (a readable file: {err.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(field, str(path), f"{what} in UTF-8 text") from None
    except csv.Error as err:
        line = (reader.line_num if reader else 0) + 1     # the lines read before the one it failed on
        raise InputError(f"{path}:{line}", "a malformed row", f"{what} ({err})") from None
    if not out:
        raise InputError(field, str(path), f"{what} (a header and at least one row)")
    return out


def require(path, rows: list[tuple[str, dict]], columns, field: str, what: str) -> None:
    """Refuse the table at ``path`` (its ``read_table`` rows) unless its header names every one of
    ``columns``, naming ``field`` and the first column it lacks."""
    missing = [c for c in columns if c not in rows[0][1]]
    if missing:
        raise InputError(field, str(path), f"{what} (no column {missing[0]}; it needs " + ", ".join(columns) + ")")


def text(where: str, row: dict, column: str, required: bool = True) -> str:
    """The cell as written ('' where the table has no such column; a row mapped from another table's may
    hold numbers: their text); refused if empty and ``required``."""
    value = row.get(column)
    value = "" if value is None else str(value)
    if required and not value.strip():
        raise InputError(f"{where}.{column}", value, "a value (the cell is empty or the column missing)")
    return value


def _allowed(bound: str | None, kind: str, positive: bool) -> str:
    if bound is None:
        return f"{kind} above 0" if positive else f"{kind} of at least 0"
    allowed = bounds.describe(bound)
    return allowed + ", above 0" if positive and bounds.bound(bound)[1] <= 0 else allowed


def integer(where: str, row: dict, column: str, bound: str | None = None, required: bool = True,
            positive: bool = False) -> int | None:
    """The cell as an integer within the declared bound ``bound`` (else at least 0), above 0 where
    ``positive``; None where it is empty and not ``required``."""
    return _parsed(where, row, column, bound, required, positive, int, "an integer")


def number(where: str, row: dict, column: str, bound: str | None = None, required: bool = True,
           positive: bool = True) -> float | None:
    """The cell as a finite number within the declared bound ``bound`` (else at least 0), above 0
    where ``positive`` (the default); None where it is empty and not ``required``."""
    return _parsed(where, row, column, bound, required, positive, float, "a finite number")


def _parsed(where: str, row: dict, column: str, bound: str | None, required: bool, positive: bool, convert,
            kind: str):
    """The cell converted (``int`` or ``float``), finite, within ``bound`` (else at least 0), above 0
    where ``positive``; None where it is empty and not ``required``."""
    cell = text(where, row, column, required).strip()
    if not cell:
        return None
    allowed = _allowed(bound, kind, positive)
    try:
        value = convert(cell)
        if bound is not None:
            bounds.check(column, value, bound)
    except (ValueError, InputError):
        raise InputError(f"{where}.{column}", cell, allowed) from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InputError(f"{where}.{column}", cell, allowed)
    return value


def flag(where: str, row: dict, column: str, required: bool = True) -> bool | None:
    """The cell as True or False (as Python writes a bool); None where it is empty and not ``required``."""
    cell = text(where, row, column, required).strip()
    if not cell:
        return None
    if cell not in FLAGS:
        raise InputError(f"{where}.{column}", cell, "True or False" + ("" if required else " (or empty)"))
    return FLAGS[cell]


def choice(where: str, row: dict, column: str, allowed, required: bool = True) -> str:
    """The cell, one of ``allowed`` (or empty where not ``required``)."""
    cell = text(where, row, column, required).strip()
    if cell and cell not in allowed:
        raise InputError(f"{where}.{column}", cell, "one of " + ", ".join(allowed) + ("" if required else " or empty"))
    return cell


def located(where: str, err: InputError) -> InputError:
    """``err`` (a refusal of a row's value further down) with the row's ``FILE:LINE`` before its field."""
    return InputError(f"{where}.{err.field}", err.value, err.allowed)
