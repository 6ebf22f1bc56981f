"""The few iproute2 commands the emulated cluster needs, with errors a user can act on.

Everything is created *inside* namespaces this package names (``cmp-<cluster>-...``): veth
pairs are created directly in their namespaces (``ip link add ... netns``), so nothing is
ever added to the machine's own namespace, and deleting our namespaces removes every
interface, bridge and qdisc we made.
"""
from __future__ import annotations

import os
import shutil
import subprocess

from topologies.errors import InputError

PREFIX = "cmp-"


def require_root() -> None:
    """Refuse clearly where namespaces cannot be made."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise InputError("cluster", "iproute2", "a machine with the ip and tc commands (apt install iproute2)")
    if os.geteuid() != 0:
        raise InputError("cluster", f"uid {os.geteuid()}", "root (network namespaces and tc need CAP_NET_ADMIN)")


def sh(*args: str, ns: str | None = None, check: bool = True) -> str:
    """Run one command (inside namespace ``ns``); a failure names the command and its error."""
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        why = proc.stderr.strip() or proc.returncode
        raise InputError("cluster", " ".join(cmd), f"a command that succeeds ({why})")
    return proc.stdout


def namespaces() -> list[str]:
    """Names of the machine's network namespaces."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def ours(cluster: str | None = None) -> list[str]:
    """Our namespaces: of one cluster, or of every cluster."""
    head = PREFIX + (f"{cluster}-" if cluster else "")
    return [n for n in namespaces() if n.startswith(head)]


def add_ns(name: str) -> None:
    sh("ip", "netns", "add", name)
    sh("ip", "link", "set", "lo", "up", ns=name)


def delete_ns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def veth(ns_a: str, name_a: str, ns_b: str, name_b: str) -> None:
    sh("ip", "link", "add", name_a, "netns", ns_a, "type", "veth", "peer", "name", name_b, "netns", ns_b)


def bridge(ns: str, name: str) -> None:
    sh("ip", "link", "add", name, "type", "bridge", ns=ns)
    sh("ip", "link", "set", name, "up", ns=ns)


def enslave(ns: str, port: str, bridge_name: str) -> None:
    sh("ip", "link", "set", port, "master", bridge_name, ns=ns)
    sh("ip", "link", "set", port, "up", ns=ns)


def limit(ns: str, dev: str, rate_bps: int, burst_bytes: int, replace: bool = False) -> None:
    """Token bucket on ``dev``'s egress: ``rate_bps`` bits/s, ``burst_bytes`` bucket, 100 ms queue."""
    sh("tc", "qdisc", "replace" if replace else "add", "dev", dev, "root", "tbf", "rate", f"{rate_bps}bit",
       "burst", str(burst_bytes), "latency", "100ms", ns=ns)


def qdiscs(ns: str) -> str:
    return sh("tc", "qdisc", "show", ns=ns, check=False)
