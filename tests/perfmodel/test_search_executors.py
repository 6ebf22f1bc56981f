"""perfmodel search on a Dask cluster, rows streamed per family and a killed search resumed."""
import csv
import functools
import logging
import os
import re
import subprocess
import sys

import pytest

import perfmodel
from perfmodel.explore.families import ROW_TYPES, ROW_COLUMNS, STREAM_COLUMNS, evaluate
from perfmodel.explore import resume   # the module whose run_families hands families to evaluate
from perfmodel.explore.resume import row_key
from perfmodel.explore.stream import read_rows
from topologies import InputError

# 14 families of plans, 344 rows, in well under a second on one core
CASE = dict(gpus=8, gbs=32, candidates="dp=none|int8;tp=none|fp16", schedules=("1f1b",), max_mbs=2)
# 104 plans of which 10 do not fit: a family can be finished with plans that have no rows
TIGHT = ("gpt3-6.7b", "dgx-a100")
CLI_CASE = ["--model", "gpt2-medium", "--cluster", "dgx-a100", "--gpus", "8", "--gbs", "32", "--candidates",
            "dp=none|int8;tp=none|fp16", "--schedules", "1f1b", "--max-mbs", "2"]


def _dask():
    return pytest.importorskip("dask.distributed", reason="the scale extra (dask[distributed]) is not installed")


@pytest.fixture(scope="module")
def local():
    return perfmodel.search("gpt2-medium", "dgx-a100", workers=1, **CASE)


@pytest.fixture(scope="module")
def tight():
    return perfmodel.search(*TIGHT, workers=1, **CASE)


def _stream_keys(path):
    return [row_key(r) for r in read_rows(str(path), STREAM_COLUMNS, ROW_TYPES)]


def test_streamed_rows_read_back_exactly(local, tmp_path):
    path = tmp_path / "rows.csv"
    again = perfmodel.search("gpt2-medium", "dgx-a100", workers=1, stream=str(path), **CASE)
    assert again.rows == local.rows
    streamed = read_rows(str(path), STREAM_COLUMNS, ROW_TYPES)
    assert len({r.pop("search") for r in streamed}) == 1          # every row names the search it is of
    assert sorted(map(row_key, streamed)) == sorted(map(row_key, local.rows))
    by_key = {row_key(r): r for r in local.rows}
    assert all(by_key[row_key(r)][c] == r[c] for r in streamed for c in ROW_COLUMNS)   # floats exact, types kept


class _Stop(Exception):
    pass


def _stops_after(families, seen, job):
    """A search killed after ``families`` tasks (``seen`` counts them)."""
    if len(seen) >= families:
        raise _Stop
    seen.append(job)
    return evaluate(job)


def test_a_killed_search_resumes_without_repeating_rows(tight, tmp_path, monkeypatch):
    path = tmp_path / "rows.csv"
    monkeypatch.setattr(resume, "evaluate", functools.partial(_stops_after, 6, []))
    with pytest.raises(_Stop):
        perfmodel.search(*TIGHT, workers=1, stream=str(path), **CASE)
    monkeypatch.undo()
    partial = _stream_keys(path)
    assert 0 < len(partial) < len(tight.rows)
    calls = []
    resumed = perfmodel.search(*TIGHT, workers=1, stream=str(path), resume=True,
                               progress=lambda done, total: calls.append(done), **CASE)
    # the plans that do not fit are counted again
    assert resumed.rows == tight.rows and resumed.skipped_oom == tight.skipped_oom > 0
    assert 0 < calls[0] < resumed.plans and calls[-1] == resumed.plans    # the finished families count at once
    keys = _stream_keys(path)
    assert len(keys) == len(set(keys)) == len(tight.rows)


def test_a_cut_stream_reruns_the_families_it_does_not_hold_whole(tight, tmp_path):
    path = tmp_path / "rows.csv"
    perfmodel.search(*TIGHT, workers=1, stream=str(path), **CASE)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:150]) + lines[150][:25])    # mid-family, the last line cut short
    resumed = perfmodel.search(*TIGHT, workers=1, stream=str(path), resume=True, **CASE)
    assert resumed.rows == tight.rows and resumed.skipped_oom == tight.skipped_oom
    keys = _stream_keys(path)
    assert len(keys) == len(set(keys)) == len(tight.rows)
    again = perfmodel.search(*TIGHT, workers=1, stream=str(path), resume=True, **CASE)   # all there: nothing runs
    assert again.rows == tight.rows and path.read_text().count("\n") == len(tight.rows) + 1


def test_resume_refuses_another_searchs_stream(tmp_path):
    path = tmp_path / "rows.csv"
    perfmodel.search("gpt2-medium", "dgx-a100", workers=1, stream=str(path), **CASE)
    with pytest.raises(InputError) as err:
        perfmodel.search("gpt2-medium", "dgx-a100", workers=1, stream=str(path), resume=True,
                         **{**CASE, "candidates": "dp=none|fp16;tp=none|fp16"})
    assert err.value.field == "resume" and "same arguments" in str(err.value)
    with pytest.raises(InputError, match="same arguments"):    # the same plans and policies, other numbers
        perfmodel.search("gpt2-medium", "dgx-a100", workers=1, stream=str(path), resume=True, library="mpi", **CASE)
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="header"):
        perfmodel.search("gpt2-medium", "dgx-a100", workers=1, stream=str(tmp_path / "other.csv"), resume=True,
                         **CASE)


@pytest.mark.parametrize("kwargs, field", [
    (dict(stream="rows.parquet"), "stream"), (dict(resume=True), "resume"), (dict(executor="ray"), "executor"),
    (dict(scheduler="tcp://127.0.0.1:8786"), "scheduler"), (dict(executor="dask", scheduler=" "), "scheduler")])
def test_bad_executor_and_stream_arguments_are_refused(kwargs, field, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as err:
        perfmodel.search("gpt2-medium", "dgx-a100", workers=1, **{**CASE, **kwargs})
    assert err.value.field == field


def test_a_stream_is_new_unless_resumed(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("anything\n")
    with pytest.raises(InputError, match="resume"):
        perfmodel.search("gpt2-medium", "dgx-a100", workers=1, stream=str(path), **CASE)
    assert path.read_text() == "anything\n"


def test_cli_refuses_a_bad_executor_and_missing_dask_in_one_line(cli):
    bad = cli("perfmodel", "search", *CLI_CASE, "--executor", "ray", check_rc=2)
    assert "executor" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    code = ("import sys; sys.modules['dask'] = None; from perfmodel.cli import entry; "
            f"sys.argv = ['perfmodel', 'search', *{CLI_CASE!r}, '--executor', 'dask']; entry()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "commpress[scale]" in proc.stderr, proc.stderr


def test_cli_resumes_a_cut_stream_to_the_uninterrupted_csv(cli, tmp_path):
    whole, again, stream = tmp_path / "whole.csv", tmp_path / "again.csv", tmp_path / "rows.csv"
    cli("perfmodel", "search", *CLI_CASE, "--workers", "1", "--csv", str(whole), "--stream", str(stream), check_rc=0)
    lines = stream.read_text().splitlines(keepends=True)
    stream.write_text("".join(lines[:200]))
    out = cli("perfmodel", "search", *CLI_CASE, "--workers", "1", "--csv", str(again), "--resume", str(stream),
              check_rc=0).stdout
    resumed = re.search(rf"; (\d+) of the plans from {re.escape(str(stream))}", out)
    assert resumed and 0 < int(resumed.group(1)) < 104, out
    assert again.read_bytes() == whole.read_bytes()
    for clash in (["--stream", str(stream), "--resume", str(whole)], ["--stream", str(whole), "--csv", str(whole)]):
        bad = cli("perfmodel", "search", *CLI_CASE, *clash, check_rc=2).stderr
        assert ("stream" in bad or "csv" in bad) and len(bad.strip().splitlines()) == 1, bad


# Dask: a LocalCluster started by the search, and one started here that the search joins (--scheduler)

def test_dask_local_cluster_gives_the_local_rows_in_the_same_order(cli, tmp_path):
    _dask()
    mine, theirs, stream = tmp_path / "local.csv", tmp_path / "dask.csv", tmp_path / "rows.csv"
    cli("perfmodel", "search", *CLI_CASE, "--workers", "1", "--csv", str(mine), check_rc=0)
    out = cli("perfmodel", "search", *CLI_CASE, "--executor", "dask", "--workers", "2", "--csv", str(theirs),
              "--stream", str(stream), check_rc=0)
    assert "Pareto front" in out.stdout and "plans: 104/104" in out.stderr      # one progress bar, to the end
    assert theirs.read_bytes() == mine.read_bytes()
    rows = list(csv.DictReader(mine.open()))
    keys = _stream_keys(stream)
    assert len(keys) == len(set(keys)) == len(rows)


@pytest.fixture(scope="module")
def cluster():
    distributed = _dask()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                                  silence_logs=logging.ERROR) as running:
        yield running


def _dies_once(marker, job):
    """The first task to run kills its worker process (only here: a test hook); later ones run."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return evaluate(job)
    os._exit(1)


def test_a_dead_worker_is_replaced_and_its_task_run_again(cluster, local, tmp_path, monkeypatch):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])    # the workers cannot import this file
    marker, path = tmp_path / "died", tmp_path / "rows.csv"
    monkeypatch.setattr(resume, "evaluate", functools.partial(_dies_once, str(marker)))
    got = perfmodel.search("gpt2-medium", "dgx-a100", executor="dask", scheduler=cluster.scheduler_address,
                           stream=str(path), **CASE)
    assert marker.exists()                 # a worker did die
    assert got.rows == local.rows
    keys = _stream_keys(path)
    assert len(keys) == len(set(keys)) == len(local.rows)


def test_dask_resumes_a_partial_stream(cluster, local, tmp_path):
    path = tmp_path / "rows.csv"
    perfmodel.search("gpt2-medium", "dgx-a100", workers=1, stream=str(path), **CASE)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:120]))
    got = perfmodel.search("gpt2-medium", "dgx-a100", executor="dask", scheduler=cluster.scheduler_address,
                           stream=str(path), resume=True, **CASE)
    assert got.rows == local.rows
    keys = _stream_keys(path)
    assert len(keys) == len(set(keys)) == len(local.rows)


def test_an_unreachable_scheduler_is_one_error(monkeypatch):
    _dask()
    monkeypatch.setattr(sys.modules["perfmodel.explore.executors"], "CONNECT_TIMEOUT_S", 2)
    with pytest.raises(InputError) as err:
        perfmodel.search("gpt2-medium", "dgx-a100", executor="dask", scheduler="tcp://127.0.0.1:9", **CASE)
    assert err.value.field == "scheduler" and "no Dask scheduler" in str(err.value)


def _bad_input(log, job):
    """Every family refused as bad input, each attempt logged (a test hook)."""
    with open(log, "a") as handle:
        handle.write(repr(job[4][0]) + "\n")
    raise InputError("calibration", "x.json", "an existing calibration profile (JSON)")


def test_bad_input_met_on_a_worker_is_one_error_not_retried(cluster, tmp_path, monkeypatch):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    log = tmp_path / "attempts"
    monkeypatch.setattr(resume, "evaluate", functools.partial(_bad_input, str(log)))
    with pytest.raises(InputError) as err:
        perfmodel.search("gpt2-medium", "dgx-a100", executor="dask", scheduler=cluster.scheduler_address, **CASE)
    assert err.value.field == "calibration" and err.value.value == "x.json"
    attempts = log.read_text().splitlines()
    assert attempts and len(attempts) == len(set(attempts))        # no family tried twice


def test_a_finished_stream_resumes_without_a_cluster(local, tmp_path):
    _dask()
    path = tmp_path / "rows.csv"
    perfmodel.search("gpt2-medium", "dgx-a100", workers=1, stream=str(path), **CASE)
    got = perfmodel.search("gpt2-medium", "dgx-a100", executor="dask", scheduler="tcp://127.0.0.1:9",  # none there
                           stream=str(path), resume=True, **CASE)
    assert got.rows == local.rows and got.resumed == got.plans
