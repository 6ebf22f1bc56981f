"""The Dask cluster ``perfmodel search --executor dask`` starts on this machine, closed to other users.

A plain ``distributed.LocalCluster`` listens on 127.0.0.1 without authentication, so any local user
can connect a client and run code on its workers as the searcher; its scheduler serves HTTP (on
8787 even without a dashboard) and every worker too; its worker processes start with the current
folder first on their import path (a ``multiprocessing.py`` or ``subprocess.py`` there is imported
in place of the standard library's); and its scratch space is a folder in the shared ``/tmp`` that
goes on the import path as well. The cluster ``local_cluster`` starts instead:

* speaks TLS with mutual authentication (``Security.temporary()``: a key and a self-signed
  certificate made for this cluster, held by this process and handed to its workers over the pipe
  that starts them): scheduler, nanny and workers require the peer's certificate, so a client
  without it cannot connect (``tls://127.0.0.1``; a ``tcp://`` client fails the handshake);
* serves no HTTP: its scheduler and workers start no HTTP server (no dashboard, metrics or health
  pages);
* starts its worker processes with ``PYTHONSAFEPATH`` set (Python 3.11 and later: the current folder
  is not put on their import path; the variable is set while the cluster runs, so a worker its
  nanny restarts has it too, and restored after);
* keeps its scratch space in a new private temporary folder (mode 0700), removed when it closes.

Workers still import what the calling process can (the same ``sys.path``): a script that
starts a search imports its own folder, as Python does for any script.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager

from distributed import Nanny, Scheduler, SpecCluster, Worker
from distributed.http.routing import RoutingApplication
from distributed.security import Security
from distributed.worker_memory import parse_memory_limit

from topologies.errors import RunError

HOST = "127.0.0.1"
LOG = logging.getLogger(__name__)


class _NoHTTP:
    """A node that starts no HTTP server (``distributed`` starts one on every scheduler and worker
    for its dashboard, metrics and health checks)."""

    def start_http_server(self, routes, dashboard_address, default_port=0, ssl_options=None):
        self.http_application = RoutingApplication([])     # what closing the node stops: nothing


class ClosedScheduler(_NoHTTP, Scheduler):
    """A scheduler without an HTTP server."""


class ClosedWorker(_NoHTTP, Worker):
    """A worker without an HTTP server (imported by name in each worker process)."""


def check_python() -> None:
    """Refuse a Python whose worker processes would import from the current folder (before 3.11
    there is no ``PYTHONSAFEPATH``)."""
    if sys.version_info < (3, 11):
        raise RunError("executor", "dask", "a local Dask cluster needs Python 3.11 or later (its workers would "
                       "import modules from the current folder); use --scheduler or --executor local")


@contextmanager
def _safe_path():
    """``PYTHONSAFEPATH=1`` in this process's environment while the cluster runs (its nanny starts,
    and restarts, the worker processes), then as it was."""
    before = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONSAFEPATH", None)
        else:
            os.environ["PYTHONSAFEPATH"] = before


@contextmanager
def local_cluster(workers: int):
    """A cluster of ``workers`` single-threaded worker processes on this machine (module doc),
    closed and its scratch folder removed on exit."""
    check_python()
    security = Security.temporary()
    scratch = tempfile.mkdtemp(prefix="commpress-dask-")
    common = {"host": HOST, "protocol": "tls://", "security": security, "local_directory": scratch,
              "dashboard": False, "dashboard_address": None}
    scheduler = {"cls": ClosedScheduler, "options": {**common, "port": 0}}
    worker = {"cls": Nanny, "options": {**common, "nthreads": 1, "worker_class": ClosedWorker,
                                        "silence_logs": logging.CRITICAL,
                                        "memory_limit": parse_memory_limit("auto", 1, workers, logger=LOG)}}
    try:
        with _safe_path(), SpecCluster(scheduler=scheduler, workers=dict.fromkeys(range(workers), worker),
                                       worker=worker, security=security, silence_logs=logging.CRITICAL) as cluster:
            yield cluster
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
