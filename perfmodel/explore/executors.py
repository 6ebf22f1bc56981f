"""Where a search's tasks run: ``local`` (this machine's processes) or ``dask`` (a Dask cluster).

A task is one job (for ``perfmodel search``: one family of plans, ``perfmodel.explore.families.families_of``) given to
one function; ``run_jobs`` yields ``(index, result)`` in the order tasks finish, so the caller
streams results and advances one progress bar whatever runs them.

* ``local``: ``workers`` processes of a ``multiprocessing`` pool (fork where the platform has it),
  or this process alone for one worker.
* ``dask``: ``dask.distributed`` futures, consumed with ``as_completed``. Without ``scheduler``
  a cluster of ``workers`` processes on this machine (one thread each: the model is pure Python,
  threads would share one interpreter lock) is started and closed, closed to other local users
  (``perfmodel.explore.dask_local``: TLS with keys made for it, no HTTP, workers that do not import
  from the current folder); with it (``PROTOCOL://HOST:PORT``, checked before any connection) the
  tasks go to that cluster's workers, which need commpress installed and the cluster and
  calibration files the search names at the same paths. That cluster is trusted: the tasks and
  their results travel pickled, so whoever runs its scheduler or workers runs code in this
  process; its security (TLS) is Dask's configuration's (``distributed.comm.tls``). A worker that dies mid-task is
  replaced (its nanny restarts it) and the scheduler runs the task again elsewhere, up to
  Dask's ``distributed.scheduler.allowed-failures`` (3) deaths per task; a task that raises
  anything but bad input is tried ``TASK_RETRIES`` more times. A result is kept once, from the
  attempt that finished, so a retried task neither loses nor repeats rows.

The local cluster's workers are spawned processes, which import the calling script: a script that
calls ``search(..., executor="dask")`` needs the ``if __name__ == "__main__":`` guard.

Dask is an optional dependency (the ``scale`` extra, with ``cryptography`` for the local cluster's
keys): ``check_executor`` refuses ``dask`` in one line naming the extra where it is not installed.
"""
from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager

from topologies import InputError, bounds
from topologies.errors import RunError

EXECUTORS = ("local", "dask")
SCALE_EXTRA = "pip install 'commpress[scale]'"
TASK_RETRIES = 2            # more tries of a task that raised (a worker's death is Dask's to retry)
CONNECT_TIMEOUT_S = 20      # waiting for an existing scheduler, and for its first worker
SCHEDULER_PROTOCOLS = ("tcp", "tls", "ws", "wss")   # Dask's between processes (inproc is within one process)
TLS_PROTOCOLS = ("tls", "wss")


def check_executor(executor: str, scheduler: str | None = None, workers: int | None = None) -> None:
    """Refuse an unknown executor, workers past their bound, a scheduler without ``dask``, and
    ``dask`` without Dask."""
    if executor not in EXECUTORS:
        raise InputError("executor", executor, "one of " + ", ".join(EXECUTORS))
    worker_count(workers)
    if scheduler is not None:
        if executor != "dask":
            raise InputError("scheduler", scheduler, "only with executor dask (--executor dask)")
        check_scheduler(scheduler)
    if executor == "dask":
        distributed = _distributed()
        if scheduler is None:
            _tls()
        elif scheduler.partition("://")[0] in TLS_PROTOCOLS:
            _client_tls(distributed, scheduler)


def check_scheduler(address) -> str:
    """A Dask scheduler address ``PROTOCOL://HOST:PORT``, refused in one line before any connection."""
    scheme, sep, location = address.partition("://") if isinstance(address, str) else ("", "", "")
    host, colon, port = location.rpartition(":")
    if not (sep and scheme in SCHEDULER_PROTOCOLS and colon and host.strip("[]") and port.isdigit()
            and 0 < int(port) < 65536) or any(c.isspace() or c in "/?#@" for c in host):
        raise InputError("scheduler", address, f"a Dask scheduler address PROTOCOL://HOST:PORT (protocol "
                         f"{', '.join(SCHEDULER_PROTOCOLS)}; port 1 to 65535), e.g. tcp://host:8786")
    return address


def _client_tls(distributed, scheduler: str) -> None:
    """A ``tls://`` or ``wss://`` scheduler needs this client's certificate in Dask's configuration."""
    why = ""
    try:
        context = distributed.Security().get_connection_args("client")["ssl_context"]
    except (OSError, ValueError) as err:
        context, why = None, f" ({err})"
    if context is None:
        raise RunError("scheduler", scheduler, f"a {scheduler.partition(':')[0]}:// scheduler needs this client's "
                       "certificate in Dask's configuration (distributed.comm.tls.ca-file, distributed.comm.tls."
                       f"client.cert and .key){why}")


def _tls() -> None:
    """The local cluster's keys need ``cryptography`` (and its workers Python 3.11: ``dask_local``)."""
    from perfmodel.explore.dask_local import check_python

    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise RunError("executor", "dask", "a local Dask cluster needs cryptography (its TLS keys), in the scale "
                       f"extra: {SCALE_EXTRA}") from None
    check_python()


def _distributed():
    try:
        from dask import distributed
    except ImportError:
        raise RunError("executor", "dask", f"--executor dask needs Dask, the scale extra: {SCALE_EXTRA}") from None
    return distributed


def worker_count(workers: int | None, jobs: int | None = None) -> int:
    """``workers`` processes within their declared bound (``topologies.bounds``; None: every core, up to
    it), and no more than ``jobs`` where given (a process more than the tasks has nothing to do)."""
    count = min(os.cpu_count() or 1, bounds.bound("workers")[2]) if workers is None else \
        bounds.check("workers", workers)
    return count if jobs is None else max(1, min(count, jobs))


def run_jobs(jobs: list, task, executor: str = "local", workers: int | None = 1, scheduler: str | None = None):
    """``(index, task(jobs[index]))`` for every job, as each finishes (module doc). Bad input
    raised in a task (``InputError``) is raised here."""
    check_executor(executor, scheduler, workers)
    if not jobs:                # a resumed search that had finished: no cluster to start
        return
    if executor == "dask":
        yield from _run_dask(jobs, task, worker_count(workers, len(jobs)), scheduler)
    else:
        yield from _run_local(jobs, task, worker_count(workers, len(jobs)))


def _guarded(task, job):
    """``task(job)``, bad input returned rather than raised: it is not retried, and an
    ``InputError`` does not pickle by its message alone."""
    try:
        return True, task(job)
    except InputError as err:
        return False, (err.field, err.value, err.allowed)


def _unwrap(outcome):
    ok, value = outcome
    if not ok:
        raise InputError(*value)
    return value


def _indexed(item):
    task, index, job = item
    return index, _guarded(task, job)


def _run_local(jobs: list, task, workers: int):
    if workers == 1 or len(jobs) < 2:
        for index, job in enumerate(jobs):
            yield index, task(job)
        return
    import multiprocessing

    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    pool = context.Pool(workers, initializer=_worker_signals)
    try:   # one job per task: their costs differ a hundredfold
        for index, outcome in pool.imap_unordered(_indexed, [(task, i, job) for i, job in enumerate(jobs)]):
            yield index, _unwrap(outcome)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


@contextmanager
def _sigint_ignored():
    """SIGINT ignored while a LocalCluster starts its worker processes, which so start with it
    ignored (Python keeps an ignored SIGINT: Ctrl-C would otherwise interrupt them mid-import,
    each printing a traceback); after that Ctrl-C stops the search, which closes the cluster and
    its workers. A Ctrl-C during those seconds of start-up is lost: press it again."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)


def _worker_signals() -> None:
    """Workers end quietly when the pool ends them (the CLI's own handlers are the parent's)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_dask(jobs: list, task, workers: int, scheduler: str | None):
    distributed = _distributed()
    with _client(distributed, workers, scheduler) as client:
        futures = {client.submit(_guarded, task, job, retries=TASK_RETRIES, pure=False): index
                   for index, job in enumerate(jobs)}
        try:
            for future, outcome in distributed.as_completed(futures, loop=client.loop, with_results=True):
                yield futures[future], _unwrap(outcome)
        except distributed.KilledWorker as err:
            raise RunError("executor", "dask", f"a task killed every worker it ran on ({err}); with --stream "
                           "the rows of the tasks that finished are kept: --resume it") from None
        finally:
            client.cancel(list(futures))


@contextmanager
def _client(distributed, workers: int, scheduler: str | None):
    """A client of the cluster at ``scheduler``, or of a LocalCluster started here and closed after."""
    if scheduler is None:
        from perfmodel.explore.dask_local import local_cluster

        with ExitStack() as stack:
            with _sigint_ignored():
                cluster = stack.enter_context(local_cluster(workers))
            yield stack.enter_context(distributed.Client(cluster, set_as_default=False))
        return
    try:
        client = distributed.Client(scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError, TypeError) as err:
        raise RunError("scheduler", scheduler, f"no Dask scheduler answers at {scheduler!r} ({err}); start one "
                       "(dask scheduler) or leave --scheduler out for a local cluster") from None
    with client:
        try:
            client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError):
            raise RunError("scheduler", scheduler, f"the Dask scheduler at {scheduler!r} has no worker after "
                           f"{CONNECT_TIMEOUT_S} s; start some (dask worker {scheduler})") from None
        yield client
