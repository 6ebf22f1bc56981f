"""How many threads a rank's codecs run on: the host's cores shared by the ranks on it.

Several ranks on one host each default to numba's and torch's thread count (every core), beside
gloo's threads, and they oversubscribe: a DDP hook with ``int8`` on 2 ranks of 2 cores took 15x the
plain step with numba's default threads and 1.4x with one thread a rank (measured when this module
was written, recorded nowhere else; docs/runtime.md, Threads, has the hook's benchmark as it runs
now). So a rank's codec threads default to

    max(1, cores available to this process (os.sched_getaffinity) // ranks on this host)

where the ranks on this host are ``LOCAL_WORLD_SIZE`` (torchrun, realrun's launchers), else an MPI
launcher's local size (``OMPI_COMM_WORLD_LOCAL_SIZE``, ``MPI_LOCALNRANKS``), else the world size
of the default process group where one is initialized (every rank on this host, as
``torch.multiprocessing.spawn`` starts them: a multi-host run without any of these gets fewer
threads than it could, never more), else 1.

Overrides, first that applies: an explicit ``threads`` argument (``compression_hook(threads=)``,
``Comm(threads=)``, ``--threads``), the environment variable ``COMMPRESS_CODEC_THREADS``, and
``NUMBA_NUM_THREADS`` where the user set it (numba's own setting is then left as it is).
``apply`` sets numba's count (per calling thread, as numba keeps it) and, only in processes
realrun starts itself (``torch_too``), torch's intra-op threads; ``launch_env`` is what realrun's
launchers put in the environment of the ranks they start. Where numba is not yet imported,
``apply`` also makes its pool that size (``NUMBA_NUM_THREADS`` in the environment, as the user
would): an idle pool of every core slowed the HF GPT-2 hook run on 2 shared cores 6x. numba's
OpenMP layer then starts with that count, and on builds where it shares torch's OpenMP runtime
(torch 2.13 CPU here) torch's intra-op threads read the same count afterwards, exactly as with
a user's ``NUMBA_NUM_THREADS``.
"""
from __future__ import annotations

import os
import sys
import threading

from topologies.errors import InputError

ENV = "COMMPRESS_CODEC_THREADS"
LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")

_applied = threading.local()   # numba's thread count is per thread: set once per thread and count
_own_numba_env: list = []      # the NUMBA_NUM_THREADS this module put in the environment (not the user's)


def host_cores() -> int:
    """The cores this process may run on (its affinity mask: a cgroup or taskset counts)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):   # not Linux
        return max(1, os.cpu_count() or 1)


def _positive(name: str, value) -> int:
    """A positive integer from an int or a string of digits; one clear error otherwise."""
    text = str(value).strip()
    if isinstance(value, bool) or not (isinstance(value, int) or text.isdigit()) or int(text) < 1:
        raise InputError(name, value, "a positive integer")
    return int(text)


def local_ranks() -> int:
    """The ranks on this host (module doc): a launcher's local size, else the default process
    group's world size where one is initialized, else 1."""
    for var in LOCAL_SIZE_VARS:
        if os.environ.get(var, "").strip():
            return _positive(var, os.environ[var].strip())
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return max(1, dist.get_world_size())
    except ImportError:
        pass
    return 1


def codec_threads(threads: int | None = None, local: int | None = None, cores: int | None = None) -> int:
    """A rank's codec threads: ``threads`` where given, else ``COMMPRESS_CODEC_THREADS``, else
    ``max(1, cores // local)`` (``cores``: ``host_cores()``; ``local``: ``local_ranks()``)."""
    if threads is not None:
        return _positive("threads", threads)
    if os.environ.get(ENV, "").strip():
        return _positive(ENV, os.environ[ENV].strip())
    cores = host_cores() if cores is None else _positive("cores", cores)
    local = local_ranks() if local is None else _positive("local", local)
    return max(1, cores // local)


def user_set_numba() -> bool:
    """Whether the user set ``NUMBA_NUM_THREADS`` (then numba is left as it is); the value ``apply``
    put there itself does not count."""
    value = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    return bool(value) and value not in _own_numba_env


def apply(threads: int | None = None, torch_too: bool = False) -> int | None:
    """Set this thread's numba thread count to ``codec_threads(threads)`` (and torch's intra-op
    threads with ``torch_too``, for processes realrun starts itself); idempotent: once per thread
    and count. Returns the count set, or None where nothing was set: numba not installed, or
    ``NUMBA_NUM_THREADS`` set by the user and no explicit count or ``COMMPRESS_CODEC_THREADS``."""
    explicit = threads is not None or bool(os.environ.get(ENV, "").strip())
    if user_set_numba() and not explicit:
        return None
    n = codec_threads(threads)
    if torch_too and getattr(_applied, "torch", None) != n:
        import torch

        torch.set_num_threads(n)
        _applied.torch = n
    if getattr(_applied, "numba", None) == n:
        return _applied.count
    if "numba" not in sys.modules and not user_set_numba():
        # numba starts its pool of NUMBA_NUM_THREADS threads (default: every core) at its import; a
        # pool larger than the count set stays idle but measurably slows a shared host, so it is
        # made of n threads (a later, larger count is then capped at n)
        os.environ["NUMBA_NUM_THREADS"] = str(n)
        _own_numba_env.append(str(n))
    from realrun.compressors import fast

    _applied.count = fast.set_threads(n)
    _applied.numba = n
    return _applied.count


def launch_env(threads: int | None, local: int, cores: int | None = None) -> dict:
    """The environment realrun's launchers give each of the ``local`` ranks they start on this
    host: ``threads`` each where given, else ``codec_threads(local=local)``, as
    ``COMMPRESS_CODEC_THREADS``, ``NUMBA_NUM_THREADS`` and ``OMP_NUM_THREADS``."""
    n = codec_threads(threads, local=local, cores=cores)
    return {ENV: str(n), "NUMBA_NUM_THREADS": str(n), "OMP_NUM_THREADS": str(n)}
