"""Hostile use of perfmodel search (issue 37, item 6): the Dask cluster it starts is closed to other
local users, a resumed stream's values are checked, and its inputs are bounded; bad input is one line
naming the field, exit code 2."""
import asyncio
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import perfmodel
from perfmodel.explore.cost import parse_prices, parse_tokens
from perfmodel.explore.executors import check_scheduler, worker_count
from perfmodel.explore.families import STREAM_COLUMNS
from topologies import InputError

CASE = dict(gpus=8, gbs=16, candidates="dp=none|int8", schedules=("1f1b",), max_mbs=1, workers=1)
CLI = ("perfmodel", "search", "--model", "gpt2-small", "--cluster", "dgx-a100", "--gpus", "8", "--gbs", "16",
       "--candidates", "dp=none|int8", "--schedules", "1f1b", "--max-mbs", "1", "--workers", "1")


def _one_line(proc, said: str) -> None:
    """Exit code 2 and one line on stderr that says ``said``."""
    err = proc.stderr.strip()
    assert proc.returncode == 2 and said in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "Exception ignored" not in err, err


def _all_one_line(cli, cases) -> None:
    """Each (args, said) of ``cases`` run as a command (four at a time) and refused in one line."""
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda case: cli(*case[0]), cases))
    for (_, said), proc in zip(cases, procs):
        _one_line(proc, said)


# The Dask cluster the search starts

def _dask_with_tls():
    distributed = pytest.importorskip("dask.distributed", reason="the scale extra (dask[distributed]) is not "
                                      "installed")
    pytest.importorskip("cryptography", reason="cryptography (the local cluster's TLS keys) is not installed")
    return distributed


def _listening() -> set:
    """The TCP ports this process and its children listen on."""
    import psutil

    procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
    return {c.laddr.port for p in procs for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN}


def test_the_local_cluster_admits_no_client_without_its_keys_and_serves_no_http():
    distributed = _dask_with_tls()
    from distributed.comm import connect

    from perfmodel.explore.dask_local import local_cluster

    before = _listening()
    with local_cluster(1) as cluster:       # closed on the way out, whatever the asserts say
        with distributed.Client(cluster, set_as_default=False) as own:
            info = own.scheduler_info()
            assert own.submit(os.getpid).result() != os.getpid()      # its own client runs tasks on its workers
        servers = {cluster.scheduler_address, *info["workers"], *(w["nanny"] for w in info["workers"].values())}
        assert len(servers) == 3 and all(a.startswith("tls://127.0.0.1:") for a in servers), servers
        # the scheduler, nanny and worker and nothing else: no HTTP server (8787 or any other)
        assert _listening() - before == {int(a.rsplit(":", 1)[1]) for a in servers}
        plain = "tcp://" + cluster.scheduler_address.partition("://")[2]
        with pytest.raises(OSError):       # a client without the keys: the connection is refused, nothing runs
            distributed.Client(plain, timeout=2, set_as_default=False)
        strangers = distributed.Security.temporary().get_connection_args("client")     # another certificate
        for address in servers:
            for url, args in ((address.replace("tls://", "tcp://"), {}), (address, strangers)):
                with pytest.raises(OSError):
                    asyncio.run(connect(url, timeout=2, **args))


def test_dask_workers_import_nothing_from_the_current_folder(cli, tmp_path, monkeypatch):
    _dask_with_tls()
    for name in ("subprocess", "multiprocessing"):
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('{name}.py of the current folder imported')\n")
    monkeypatch.chdir(tmp_path)
    proc = cli(*CLI[:-1], "2", "--executor", "dask")
    assert proc.returncode == 0 and "Pareto front" in proc.stdout, proc.stderr[-2000:]
    assert "current folder imported" not in proc.stderr


def test_the_local_cluster_without_cryptography_is_one_line(cli):
    pytest.importorskip("dask.distributed", reason="the scale extra (dask[distributed]) is not installed")
    code = ("import sys; sys.modules['cryptography'] = None; from perfmodel.cli import entry; "
            f"sys.argv = [*{CLI!r}, '--executor', 'dask']; entry()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    _one_line(proc, "commpress[scale]")


@pytest.mark.parametrize("address", ["nonsense", "tcp://", "tcp://host", "tcp://host:notaport", "tcp://host:0",
                                     "tcp://host:65536", "foo://host:1", "ucx://host:1", "inproc://host:1",
                                     " tcp://host:1", "tcp://a b:1", "tcp://:8786", None, 8786])
def test_a_malformed_scheduler_address_is_refused(address):
    with pytest.raises(InputError) as err:
        check_scheduler(address)
    assert err.value.field == "scheduler"


def test_a_malformed_scheduler_is_one_line_at_once(cli):
    pytest.importorskip("dask.distributed", reason="the scale extra (dask[distributed]) is not installed")
    dask = (*CLI, "--executor", "dask", "--scheduler")
    # before the fix: the error, then 40 s and 'Exception ignored' from the client that failed to start
    _all_one_line(cli, [((*dask, "nonsense"), "scheduler='nonsense'"), ((*dask, "tcp://"), "PROTOCOL://HOST:PORT"),
                        ((*dask, "ucx://127.0.0.1:9"), "PROTOCOL://HOST:PORT"),
                        ((*dask, "tls://127.0.0.1:9"), "certificate in Dask's configuration")])


def test_help_says_a_scheduler_is_trusted_with_pickled_results(cli):
    out = " ".join(cli(*CLI[:2], "--help", check_rc=0).stdout.split())
    assert "cluster is trusted: tasks and results travel pickled" in out
    assert "closed to other users" in out


# A resumed stream

@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "rows.csv"
    perfmodel.search("gpt2-small", "dgx-a100", stream=str(path), **CASE)
    return path.read_text()


def _changed(tmp_path, text: str, column: str, value: str, line: int = 2):
    """A copy of the stream ``text`` with ``column`` of ``line`` set to ``value``."""
    lines = text.splitlines(keepends=True)
    cells = lines[line - 1].rstrip("\n").split(",")
    cells[STREAM_COLUMNS.index(column)] = value
    lines[line - 1] = ",".join(cells) + "\n"
    path = tmp_path / "rows.csv"
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize("column, value", [
    ("step_time_s", "-1.0"), ("step_time_s", "0.0"), ("step_time_s", "nan"), ("samples_per_s", "inf"),
    ("error_dp", "-0.5"), ("total_error", "nan"), ("memory_GiB", "1e400"), ("mfu", "-inf"),
    ("speedup_vs_same_plan_uncompressed", "0"), ("gpus", "0"), ("zero", "7"), ("mbs", "x"), ("tp", "1.5"),
    ("within_budget", "maybe")])
def test_a_resumed_row_out_of_its_domain_is_refused_naming_line_column_and_value(stream, tmp_path, column, value):
    path = _changed(tmp_path, stream, column, value)
    kept = path.read_bytes()
    with pytest.raises(InputError) as err:
        perfmodel.search("gpt2-small", "dgx-a100", stream=str(path), resume=True, **CASE)
    assert err.value.field == f"{path}:2.{column}" and err.value.value == value
    assert "remove the line" in err.value.allowed
    assert path.read_bytes() == kept            # nothing written back


def test_a_negative_step_time_is_one_line_not_the_fastest_plan(cli, stream, tmp_path):
    path = _changed(tmp_path, stream, "step_time_s", "-1.0", line=3)
    _one_line(cli(*CLI, "--resume", str(path)), f"{path}:3.step_time_s='-1.0': a finite number > 0")


def test_a_field_over_the_csv_limit_and_bytes_that_are_not_text_are_one_line(cli, stream, tmp_path):
    path = _changed(tmp_path, stream, "cluster", "x" * 200_000)
    big = cli(*CLI, "--resume", str(path))
    _one_line(big, "field larger than field limit")
    assert big.stderr.startswith(f"perfmodel: error: resume='{path}:2'")
    other = tmp_path / "other.csv"
    other.write_bytes(stream.splitlines(keepends=True)[0].encode() + b"\xff\xfe,\n")
    with pytest.raises(InputError, match="UTF-8"):
        perfmodel.search("gpt2-small", "dgx-a100", stream=str(other), resume=True, **CASE)


def test_a_deleted_bad_line_runs_its_family_again(stream, tmp_path):
    path = _changed(tmp_path, stream, "step_time_s", "-1.0")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + lines[2:]))
    got = perfmodel.search("gpt2-small", "dgx-a100", stream=str(path), resume=True, **CASE)
    assert all(r["step_time_s"] > 0 for r in got.rows) and path.read_text().count("\n") == len(got.rows) + 1


# Search inputs

@pytest.mark.parametrize("value", ["1e300", "1e17", "0.5", "nan"])
def test_a_token_budget_past_its_bound_is_refused(value):
    with pytest.raises(InputError) as err:
        parse_tokens(value)
    assert err.value.field == "tokens" and "1e+16" in err.value.allowed


@pytest.mark.parametrize("value, said", [("1e300", "10000"), ("dgx-a100=1e300", "10000"),
                                         ("dgx-a100=1,dgx-a100=2", "dgx-a100 repeats")])
def test_prices_past_their_bound_or_named_twice_are_refused(value, said):
    with pytest.raises(InputError) as err:
        parse_prices(value, ["dgx-a100"])
    assert err.value.field == "gpu_hour_price" and said in err.value.allowed


def _regime(tmp_path, name: str, regime: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"regime": {"source": "a test", **regime}}))
    return str(path)


def test_search_inputs_are_one_line(cli, tmp_path):
    zero = _regime(tmp_path, "zero.json", {"critical_batch_tokens": 0})
    nan = _regime(tmp_path, "nan.json", {"critical_batch_tokens": 1e6, "errors": {"dp": {"int8": float("nan")}}})
    _all_one_line(cli, [
        ((*CLI, "--tokens", "1e300", "--gpu-hour-price", "1e300"), "tokens=1e+300: a number from 1 to 1e+16"),
        ((*CLI, "--tokens", "1e9", "--gpu-hour-price", "dgx-a100=1,dgx-a100=2"), "dgx-a100 repeats"),
        ((*CLI, "--cluster-grid", ""), "cluster_grid=''"),
        ((*CLI, "--gbs", "100000000000000000000"), "argument --gbs: '100000000000000000000': an integer from 1 to"),
        ((*CLI, "--workers", "3000"), "argument --workers: '3000': an integer from 1 to 256"),
        ((*CLI, "--convergence", zero), f"{zero}:regime.critical_batch_tokens=0.0"),
        ((*CLI, "--convergence", nan), f"{nan}:regime.errors.dp.int8=nan"),
    ])


def test_worker_processes_are_bounded_and_no_more_than_the_tasks():
    assert worker_count(8, jobs=3) == 3 and worker_count(None) <= 256 and worker_count(2) == 2
    for workers in (0, 3000, 2.5, True):
        with pytest.raises(InputError) as err:       # 3000 processes did not start in a minute
            perfmodel.search("gpt2-small", "dgx-a100", **{**CASE, "workers": workers})
        assert err.value.field == "workers"


def test_an_empty_cluster_grid_is_refused():
    for grid in ("", {}):
        with pytest.raises(InputError) as err:
            perfmodel.search("gpt2-small", "dgx-a100", cluster_grid=grid, **CASE)
        assert err.value.field == "cluster_grid"


def test_a_nonfinite_variant_value_is_one_line(cli):
    _all_one_line(cli, [((*CLI, "--cluster-grid", "gpus_per_node=nan"), "gpus_per_node"),
                        ((*CLI, "--cluster-grid", "gpus_per_node=4,inf"), "gpus_per_node"),
                        (("perfmodel", "search", "--model", "gpt2-small", "--cluster", "dgx-a100:gpus_per_node=nan",
                          *CLI[6:]), "gpus_per_node")])


def test_no_scratch_folder_is_left_behind():
    _dask_with_tls()
    import tempfile

    from perfmodel.explore.dask_local import local_cluster

    with local_cluster(1) as cluster:
        scratch = cluster.scheduler_spec["options"]["local_directory"]
        assert os.path.dirname(scratch) == tempfile.gettempdir() and os.stat(scratch).st_mode & 0o077 == 0
    assert not os.path.exists(scratch)
