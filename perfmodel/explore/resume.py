"""A search streamed to a file and resumed from it: the rows of every finished family are
appended as they come (``perfmodel.explore.stream``), tagged with what the search is of, and a
resumed search keeps the families whose rows are all there and runs the rest.
"""
from __future__ import annotations

import contextlib
import os

from perfmodel.explore.executors import run_jobs
from perfmodel.explore.families import (PLAN_KEYS, plan_columns, ROW_DOMAINS, ROW_TYPES, STREAM_COLUMNS, evaluate,
                                        family_items, option_fields, plan_policies, refused)
from perfmodel.explore.stream import RowStream, check_stream, read_rows
from perfmodel.plan.degrees import Degrees
from perfmodel.prediction import PredictOptions, predict_many
from perfmodel.workload import load_model
from topologies import InputError


def run_families(jobs: list, total: int, progress, executor: tuple, stream: str | None, resume: bool, tag: str):
    """Every family's rows: those a resumed stream holds, then the others as they finish on
    ``executor`` = (executor, workers, scheduler), appended to the stream; (rows, plans that do not
    fit, plans whose rows came from the stream)."""
    rows, skipped, resumed, todo = _resumed(jobs, stream, tag) if resume else ([], 0, 0, jobs)
    done = resumed
    if progress and done:
        progress(done, total)
    with RowStream(stream, STREAM_COLUMNS, _tagged(rows, tag)) if stream else contextlib.nullcontext() as out:
        for _, (family_rows, oom, count) in run_jobs(todo, evaluate, *executor):
            if out:
                out.append(_tagged(family_rows, tag))
            rows += family_rows
            skipped += oom
            done += count
            if progress:
                progress(done, total)
    return rows, skipped, resumed


def search_tag(*arguments) -> str:
    """What a stream's rows are of (model, job size, batch, admitted candidates, error budget and
    options; the plan space is not in it: a plan's rows depend on these alone): 12 hex digits of
    their hash, in every streamed row, so a resume with other arguments is refused."""
    import hashlib

    return hashlib.sha256(repr(_canonical(arguments)).encode()).hexdigest()[:12]


def _canonical(value):
    if isinstance(value, dict):
        return tuple(sorted((str(k), _canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(v) for v in value)
    return value


def _tagged(rows: list, tag: str) -> list:
    return [{"search": tag, **r} for r in rows]


def check_stream_args(stream: str | None, resume: bool) -> None:
    """A new stream file (or one to resume), checked before any work."""
    if stream is None:
        if resume:
            raise InputError("resume", resume, "a stream file to continue (stream=FILE, --resume FILE)")
        return
    check_stream(stream, "resume" if resume else "stream")
    if not resume and os.path.exists(stream) and os.path.getsize(stream) > 0:
        raise InputError("stream", stream, "a new file (it exists: resume it, --resume FILE, or remove it)")


def row_key(row: dict) -> tuple:
    return (row["cluster"], *(row[k] for k in PLAN_KEYS), row["policy"])


def _plan_keys(job) -> list[tuple]:
    """(plan, the row keys it makes if it fits) for each plan of a family."""
    model, cluster, _, _, plans, candidates, _, _ = job
    spec = load_model(model)
    out = []
    for plan in plans:
        head = (cluster, *plan_columns(plan).values())
        out.append((plan, [(*head, p) for p in plan_policies(plan, candidates, spec)]))
    return out


def _read_stream(path: str) -> list[dict]:
    """A stream's rows; one written before a degree existed (its header lacks only degrees'
    columns) reads that degree as ``Degrees.of`` reads older records: 1, or its leader's value (etp: tp)."""
    header = _header(path)
    missing = [c for c in STREAM_COLUMNS if c not in header]
    if not missing or set(missing) - set(Degrees.names()) or set(header) - set(STREAM_COLUMNS):
        return read_rows(path, STREAM_COLUMNS, ROW_TYPES, ROW_DOMAINS)   # this version's, or refused naming its header
    rows = read_rows(path, header, ROW_TYPES, ROW_DOMAINS)
    return [{c: row[c] if c in row else getattr(Degrees.of(row), c) for c in STREAM_COLUMNS} for row in rows]


def _header(path: str) -> tuple:
    """The first line of a stream, as CSV (empty where there is none)."""
    import csv

    try:
        with open(path, newline="") as handle:
            return tuple(next(csv.reader([handle.readline()]), ()))
    except (FileNotFoundError, UnicodeDecodeError):
        return ()


def _resumed(jobs: list, path: str, tag: str) -> tuple[list, int, int, list]:
    """What a stream already holds: (its rows of the families that finished, their plans that do
    not fit, their plans, the jobs still to run). A family finished when every plan that fits has
    all its rows there (plans without rows are checked to be ones that do not fit or are not
    allowed; nothing is timed). Rows of another ``tag`` or that no family makes are refused:
    another search's stream."""
    present: dict = {}
    for row in _read_stream(path):
        if row.pop("search") != tag:
            raise InputError("resume", path, "a stream of this search (its rows are of another model, job size, "
                             "batch, candidates, error budget or options: resume with the same arguments)")
        key = row_key(row)
        if key in present:
            raise InputError("resume", path, f"each row once (cluster {key[0]}, policy {key[-1]} repeats)")
        present[key] = row
    rows, oom, done, todo, expected = [], 0, 0, [], set()
    for job in jobs:
        keys = _plan_keys(job)
        expected.update(k for _, ks in keys for k in ks)
        finished = _finished(job, keys, present)
        if finished is None:
            todo.append(job)
            continue
        rows += finished[0]
        oom += finished[1]
        done += len(job[4])
    strangers = len(set(present) - expected)
    if strangers:
        raise InputError("resume", path, f"a stream of this search ({strangers} of its rows are of plans or policies "
                         "this one does not try: resume with the same arguments)")
    return rows, oom, done, todo


def _finished(job, keys: list, present: dict) -> tuple[list, int] | None:
    """(rows, plans that do not fit) of a family whose rows are all in ``present``, else None."""
    rows, absent = [], []
    for plan, plan_keys in keys:
        found = [present[k] for k in plan_keys if k in present]
        if found and len(found) < len(plan_keys):
            return None
        rows += found
        if not found:
            absent.append(plan)
    if not rows:            # nothing streamed (or no plan fits: quick to run again)
        return None
    oom = 0
    if absent:
        model, cluster, *_, fixed = job
        for got in predict_many(model, cluster, family_items(job, absent, with_policies=False),
                                PredictOptions(**option_fields(fixed))):
            if not refused(got):
                return None         # a plan that fits has no rows
            oom += got.field == "memory"
    return rows, oom
