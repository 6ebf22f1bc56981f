"""Fixed compute per emulated host: one cgroup per host, a CPU quota and one core.

Without this the hosts of an emulated cluster time-share the machine's cores as the kernel
pleases: a host computes faster while its neighbours wait on the network, and gloo's socket
threads take the cores other ranks compute on, so the same case measured twice differed by
up to 30% (docs/design.md, Fixed compute per host). With it, host ``h`` of cluster ``NAME``
lives in cgroup ``commpress/cmp-NAME-h{h}``:

* ``cpuset``: one core, ``cores[h % len(cores)]`` of the cores this process may use, so a
  host never migrates and the hosts sharing a core are always the same ones;
* ``cpu`` quota: ``share`` of that core per ``PERIOD_US`` (cgroup v2 ``cpu.max``, v1
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), and a high scheduler weight. The shares of
  the hosts on one core add up to at most ``MAX_CORE_LOAD`` and other work on the machine
  weighs a tenth of a host, so every host gets its whole share whenever it asks (a ceiling
  that is also a floor) and the rest of the core is left to the runner.

Everything a rank starts (gloo's threads, intra-op threads) is in its host's cgroup, so its
transport's CPU comes out of the same share as its compute, as on a real host. Both cgroup
versions are supported (v2 where its ``cpu`` controller is enabled, else v1's ``cpu`` and
``cpuset`` hierarchies); groups are created with the cluster and removed with it.
"""
from __future__ import annotations

import contextlib
import os

from topologies.errors import InputError

ROOT = os.environ.get("COMMPRESS_CGROUP_ROOT", "/sys/fs/cgroup")
PARENT = "commpress"
# 10 ms: a host waits at most (1 - share) x 10 ms for its next slice, short against the
# transfers and steps we time; the kernel's default 100 ms made a 4-host all-reduce stall for
# up to 55 ms at a share of 0.45 (docs/design.md, Fixed compute per host).
PERIOD_US = 10_000
MAX_CORE_LOAD = 0.9   # of each core, for the hosts on it; the rest is the runner's (tc, the launcher)
MIN_SHARE = 0.05
# Scheduler weight of a host's group against everything else on the machine (v1 cpu.shares,
# default 1024; v2 cpu.weight, default 100): a host gets its whole quota before other work on
# its core gets any, so outside load takes only what the hosts leave (docs/design.md).
SHARES_V1, WEIGHT_V2 = 10240, 1000
QUOTA = True   # False: pinned and weighted but work-conserving (a host may use what its core-mates leave)


def machine_cores() -> list[int]:
    """The cores this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


def core_of(host: int, cores: list[int]) -> int:
    return cores[host % len(cores)]


def max_share(hosts: int, cores: list[int] | None = None) -> float:
    """The largest share each of ``hosts`` hosts can have with the hosts of one core within
    ``MAX_CORE_LOAD`` of it (4 hosts on 2 cores: 0.45)."""
    cores = cores or machine_cores()
    per_core = -(-hosts // len(cores))
    return round(min(1.0, MAX_CORE_LOAD / per_core), 4)


def check_share(share: float, hosts: int, cores: list[int] | None = None) -> float:
    """``share`` if every core can give it to each of its hosts, else a one-line error."""
    top = max_share(hosts, cores)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not MIN_SHARE <= share <= top:
        raise InputError("cpus_per_host", share, f"a share of one core from {MIN_SHARE} to {top} ({hosts} hosts on "
                         f"{len(cores or machine_cores())} cores, the hosts of one core within {MAX_CORE_LOAD} of it)")
    return float(share)


def _mounts() -> list[tuple[str, str, set]]:
    """(mount point, type, options) of every cgroup mount under ``ROOT``."""
    out = []
    with open("/proc/self/mounts") as handle:
        for line in handle:
            _, point, kind, opts, *_ = line.split()
            if kind in ("cgroup", "cgroup2") and point.startswith(ROOT):
                out.append((point, kind, set(opts.split(","))))
    return out


def hierarchy() -> dict | None:
    """{"version": 2, "cpu": dir, "cpuset": dir or None} or {"version": 1, ...}: where the
    controllers are; None where this machine has no cpu controller to use."""
    mounts = _mounts()
    for point, kind, _ in mounts:
        if kind == "cgroup2":
            with contextlib.suppress(OSError), open(os.path.join(point, "cgroup.controllers")) as handle:
                have = handle.read().split()
                if "cpu" in have:
                    return {"version": 2, "cpu": point, "cpuset": point if "cpuset" in have else None}
    v1 = {c: point for point, kind, opts in mounts if kind == "cgroup" for c in ("cpu", "cpuset") if c in opts}
    if "cpu" in v1:
        return {"version": 1, "cpu": v1["cpu"], "cpuset": v1.get("cpuset")}
    return None


def require() -> dict:
    where = hierarchy()
    if where is None:
        raise InputError("cpus_per_host", "cgroups", f"a machine with a cgroup cpu controller under {ROOT} "
                         "(or --cpus-per-host none: hosts time-share the cores)")
    return where


def group_name(ns: str) -> str:
    return f"{PARENT}/{ns}"


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(value)
    except OSError as err:
        raise InputError("cgroup", path, f"a cgroup file this process can write ({err.strerror})") from None


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read().strip()


def _dirs(where: dict, ns: str) -> list[str]:
    """The host's cgroup directory in each hierarchy (one in v2, up to two in v1)."""
    roots = {where["cpu"]} | ({where["cpuset"]} if where["cpuset"] else set())
    return [os.path.join(root, group_name(ns)) for root in sorted(roots)]


def _make_parent(where: dict) -> None:
    for root in sorted({where["cpu"], where["cpuset"]} - {None}):
        parent = os.path.join(root, PARENT)
        os.makedirs(parent, exist_ok=True)
        if where["version"] == 2:
            wanted = " ".join("+" + c for c in ("cpu", "cpuset") if where.get(c))
            _write(os.path.join(root, "cgroup.subtree_control"), wanted)
            _write(os.path.join(parent, "cgroup.subtree_control"), wanted)
        elif root == where["cpuset"]:   # v1 cpuset: a child may use nothing its parent lacks
            for key in ("cpuset.cpus", "cpuset.mems"):
                if not _read(os.path.join(parent, key)):
                    _write(os.path.join(parent, key), _read(os.path.join(root, key)))


def create(ns: str, share: float, core: int) -> None:
    """The cgroup of one host: ``share`` of ``core`` per ``PERIOD_US``."""
    where = require()
    _make_parent(where)
    for path in _dirs(where, ns):
        os.makedirs(path, exist_ok=True)
    quota = max(1000, round(share * PERIOD_US)) if QUOTA else -1
    if where["version"] == 2:
        path = os.path.join(where["cpu"], group_name(ns))
        _write(os.path.join(path, "cpu.max"), f"{quota if quota > 0 else 'max'} {PERIOD_US}")
        _write(os.path.join(path, "cpu.weight"), str(WEIGHT_V2))
        if where["cpuset"]:
            _write(os.path.join(path, "cpuset.cpus"), str(core))
        return
    path = os.path.join(where["cpu"], group_name(ns))
    _write(os.path.join(path, "cpu.cfs_period_us"), str(PERIOD_US))
    _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))
    _write(os.path.join(path, "cpu.shares"), str(SHARES_V1))
    if where["cpuset"]:
        path = os.path.join(where["cpuset"], group_name(ns))
        _write(os.path.join(path, "cpuset.mems"), _read(os.path.join(where["cpuset"], "cpuset.mems")))
        _write(os.path.join(path, "cpuset.cpus"), str(core))


def join(ns: str, pid: int) -> None:
    """Move process ``pid`` (and so everything it starts later) into the host's cgroup."""
    where = require()
    for path in _dirs(where, ns):
        _write(os.path.join(path, "cgroup.procs"), str(pid))


# joins its own pid to each group file before the first argument "--", then becomes the command
_JOIN_THEN_EXEC = 'for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 126; shift; done; shift; exec "$@"'


def joined(ns: str, argv: list[str]) -> list[str]:
    """``argv`` run inside the host's cgroup from its first instruction: a shell joins itself,
    then execs it (same pid), so nothing the command does runs before it is placed."""
    where = require()
    files = [os.path.join(path, "cgroup.procs") for path in _dirs(where, ns)]
    return ["sh", "-c", _JOIN_THEN_EXEC, "sh", *files, "--", *argv]


def exists(ns: str) -> bool:
    where = hierarchy()
    return bool(where) and any(os.path.isdir(p) for p in _dirs(where, ns))


def ours(prefix: str) -> list[str]:
    """Names of our host cgroups that start with ``prefix`` (in any hierarchy)."""
    where = hierarchy()
    if not where:
        return []
    names = set()
    for root in {where["cpu"], where["cpuset"]} - {None}:
        with contextlib.suppress(FileNotFoundError):
            names.update(n for n in os.listdir(os.path.join(root, PARENT)) if n.startswith(prefix))
    return sorted(names)


def remove(ns: str) -> None:
    """Remove the host's cgroup, moving any process still in it back to the root first."""
    where = hierarchy()
    if not where:
        return
    for path in _dirs(where, ns):
        if not os.path.isdir(path):
            continue
        root = os.path.dirname(os.path.dirname(path))
        with contextlib.suppress(OSError):
            for pid in _read(os.path.join(path, "cgroup.procs")).split():
                with contextlib.suppress(OSError):
                    _write(os.path.join(root, "cgroup.procs"), pid)
        try:
            os.rmdir(path)
        except OSError as err:
            raise InputError("cgroup", path, f"a cgroup that can be removed ({err.strerror})") from None
