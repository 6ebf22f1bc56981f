"""Build, reshape, inspect and remove an emulated cluster (docs/design.md, Facts measured on the development machines).

Layout of cluster ``NAME`` (every name starts with ``cmp-NAME-``, so clusters coexist):

* ``cmp-NAME-h{i}``: one namespace per host, interface ``eth0`` at 10.231.0.{i+1}/24;
* ``cmp-NAME-sw``: the switch namespace: port ``h{i}`` of each host on bridge ``br{g}`` of
  its group; with ``groups > 1`` each group bridge reaches bridge ``core`` over a trunk
  (veth ``t{g}`` / ``c{g}``), which emulates an inter-node tier and its oversubscription.

Every link is limited in both directions with ``tc tbf`` (host egress on ``eth0``, switch
egress on ``h{i}``; both trunk ends), each link's bucket one GSO segment of ``SEGMENT_S``
(``link_shape``). Each host has a fixed CPU share of one core (``cpus_per_host``, a cgroup
per host: ``realrun.cluster.cpu``). State (the spec) lives in ``STATE_DIR/NAME.json``; the
namespaces are the truth, so ``down`` works without it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
from dataclasses import asdict, dataclass

from realrun.cluster import cpu, netns
from topologies import bounds
from topologies.clikit import atomic_write
from topologies.errors import InputError
from topologies.units import format_rate, parse_rate

STATE_DIR = os.environ.get("COMMPRESS_STATE_DIR", "/run/commpress/clusters")
SUBNET = "10.231.0."
# The token bucket holds the line rate from the first byte: each link's GSO segments are cut
# to SEGMENT_S of line time (at most the kernel's 64 KiB, at least MIN_SEGMENT) and its bucket
# is one segment plus HEADROOM, so a transfer after idle compute gets at most one segment early.
# Measured (benchmarks/bench_burst.py, after 50 ms idle): at 1 Gbit/s 64 KiB/256 KiB/16 MiB ran at
# 1.18/1.04/0.96 of the line rate (the old 128 KiB bucket: 1.96/1.57/0.96); at 100 Mbit/s with
# 6 KiB segments 1.05/0.98/0.96 (128 KiB: 17.9/1.79/0.96). A bucket smaller than the segments
# costs throughput instead (8 KiB at 1 Gbit/s with 64 KiB segments: 0.40-0.62).
SEGMENT_S = 0.5e-3
MIN_SEGMENT, MAX_SEGMENT, HEADROOM = 4096, 65536, 2048


def link_shape(rate_bps: int, burst_bytes: int | None = None) -> tuple[int, int]:
    """(GSO segment limit, bucket bytes) of a link at ``rate_bps``: a given bucket keeps the
    segments inside it, else both follow the rate (module note above)."""
    if burst_bytes is not None:
        return max(MIN_SEGMENT, min(MAX_SEGMENT, burst_bytes - HEADROOM)), burst_bytes
    segment = int(min(MAX_SEGMENT, max(MIN_SEGMENT, rate_bps / 8 * SEGMENT_S)))
    return segment, segment + HEADROOM
NAME_RE = re.compile(r"^[a-z0-9]{1,8}$")


@dataclass(frozen=True, kw_only=True)
class EmulatedSpec:
    """``hosts`` (2-8) on links of ``bandwidth`` (bits/s, or a tc rate string); optionally
    ``slow_host`` on ``slow_bandwidth``; ``groups`` (>1: groups of hosts behind trunks of
    ``trunk_bandwidth``); ``burst_bytes`` of the token buckets (None: one GSO segment of half
    a millisecond at each link's rate, ``link_shape``); ``cpus_per_host``: the fixed
    share of one core each host gets ("auto": the most every core can give its hosts, 0.45
    for 4 hosts on 2 cores, or none where the machine has no cgroup cpu controller; "none":
    hosts time-share the cores as the kernel pleases)."""

    hosts: int = 4
    bandwidth: int = 10**9
    slow_host: int | None = None
    slow_bandwidth: int | None = None
    groups: int = 1
    trunk_bandwidth: int | None = None
    burst_bytes: int | None = None
    cpus_per_host: float | str | None = "auto"

    def __post_init__(self):
        for key in ("bandwidth", "slow_bandwidth", "trunk_bandwidth"):
            value = getattr(self, key)
            if isinstance(value, str):
                object.__setattr__(self, key, parse_rate(value, key))
            if getattr(self, key) is not None:
                object.__setattr__(self, key, _check_rate(key, getattr(self, key)))
        _check_int("hosts", self.hosts, 2, 8)
        _check_int("groups", self.groups, 1, self.hosts)
        if self.hosts % self.groups:
            raise InputError("groups", self.groups, f"a divisor of hosts ({self.hosts})")
        if self.groups > 1 and self.trunk_bandwidth is None:
            raise InputError("trunk_bandwidth", None, "a rate (e.g. 1gbit) when groups > 1")
        if (self.slow_host is None) != (self.slow_bandwidth is None):
            raise InputError("slow_host", self.slow_host, "given together with slow_bandwidth")
        if self.slow_host is not None:
            _check_int("slow_host", self.slow_host, 0, self.hosts - 1)
        if self.burst_bytes is not None:
            _check_int("burst_bytes", self.burst_bytes, MIN_SEGMENT + HEADROOM, 64 * 2**20)
        object.__setattr__(self, "cpus_per_host", _resolve_share(self.cpus_per_host, self.hosts))

    def host_rate(self, host: int) -> int:
        return self.slow_bandwidth if host == self.slow_host else self.bandwidth

    def group_of(self, host: int) -> int:
        return host // (self.hosts // self.groups)

    def topology(self, hosts: int | None = None) -> str:
        """The topologies cluster name that models this cluster (or its first ``hosts`` hosts)."""
        hosts = hosts or self.hosts
        if hosts != self.hosts and self.groups > 1:
            raise InputError("hosts", hosts, f"all {self.hosts} hosts of a cluster with groups")
        parts = [f"hosts={hosts}", f"bandwidth={format_rate(self.bandwidth)}"]
        if self.groups > 1:
            parts += [f"groups={self.groups}", f"trunk={format_rate(self.trunk_bandwidth)}"]
        if self.slow_host is not None and self.slow_host < hosts:
            parts += [f"slow_host={self.slow_host}", f"slow_bandwidth={format_rate(self.slow_bandwidth)}"]
        if self.cpus_per_host is not None:
            parts.append(f"cpu_share={self.cpus_per_host:g}")
        return "emulated:" + ",".join(parts)

    def cores(self) -> dict[int, int]:
        """{host: the core it is pinned to} (empty without a fixed share)."""
        cores = cpu.machine_cores()
        return {h: cpu.core_of(h, cores) for h in range(self.hosts)} if self.cpus_per_host is not None else {}


def _resolve_share(value, hosts: int) -> float | None:
    if value is None or value == "none":
        return None
    if value == "auto":
        return cpu.max_share(hosts) if cpu.hierarchy() else None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InputError("cpus_per_host", value, "a share of one core, auto or none") from None
    return cpu.check_share(value, hosts)


def _check_rate(key: str, value) -> int:
    """A link rate (bits/s) within the bound tc can emulate here (``topologies.bounds``)."""
    _, low, high = bounds.bound("link_bits_per_s")
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or not low <= value <= high:
        raise InputError(key, format_rate(value) if number and value > 0 else value,
                         f"a link rate from {format_rate(low)} to {format_rate(high)} (tc tbf on this machine)")
    return int(value)

def _check_int(field, value, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(field, value, f"an integer from {low} to {high}")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InputError("name", name, "1-8 lowercase letters or digits")
    return name


def host_ns(name: str, host: int) -> str:
    return f"{netns.PREFIX}{name}-h{host}"


def switch_ns(name: str) -> str:
    return f"{netns.PREFIX}{name}-sw"


def address(host: int) -> str:
    return f"{SUBNET}{host + 1}"


def _state_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"{name}.json")


@contextlib.contextmanager
def _locked(name: str):
    """Hold the cluster's lock (one ``up`` or ``down`` of a name at a time, across processes)."""
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, f"{name}.lock"), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError("name", name, "a cluster no other command is building or removing now") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def up(spec: EmulatedSpec, name: str = "emu") -> dict:
    """Create the cluster, atomically: under the name's lock, with the state file written last
    (a cluster without it is half-built); on any failure or signal what was made is removed
    before the error goes on. Returns its status."""
    netns.require_root()
    check_name(name)
    with _locked(name):
        if netns.ours(name):
            what = "up" if os.path.exists(_state_path(name)) else "half-built"
            raise InputError("name", name, f"a cluster that is not {what} already (realrun cluster down --name {name})")
        try:
            _build(spec, name)
            atomic_write(_state_path(name), lambda h: h.write(json.dumps(asdict(spec)).encode()))
        except BaseException:
            _remove(name)
            raise
    return status(name)


def _build(spec: EmulatedSpec, name: str) -> None:
    sw = switch_ns(name)
    netns.add_ns(sw)
    for g in range(spec.groups):
        netns.bridge(sw, f"br{g}")
    if spec.groups > 1:
        netns.bridge(sw, "core")
        for g in range(spec.groups):
            netns.veth(sw, f"t{g}", sw, f"c{g}")
            netns.enslave(sw, f"t{g}", f"br{g}")
            netns.enslave(sw, f"c{g}", "core")
    for h in range(spec.hosts):
        ns = host_ns(name, h)
        netns.add_ns(ns)
        netns.veth(ns, "eth0", sw, f"h{h}")
        netns.sh("ip", "addr", "add", f"{address(h)}/24", "dev", "eth0", ns=ns)
        netns.sh("ip", "link", "set", "eth0", "up", ns=ns)
        netns.enslave(sw, f"h{h}", f"br{spec.group_of(h)}")
        if spec.cpus_per_host is not None:
            cpu.create(ns, spec.cpus_per_host, spec.cores()[h])
    _limit(spec, name, replace=False)


def _limit(spec: EmulatedSpec, name: str, replace: bool) -> None:
    sw = switch_ns(name)
    for h in range(spec.hosts):
        _shape_link(host_ns(name, h), "eth0", spec.host_rate(h), spec.burst_bytes, replace)
        _shape_link(sw, f"h{h}", spec.host_rate(h), spec.burst_bytes, replace)
    if spec.groups > 1:
        for g in range(spec.groups):
            for dev in (f"t{g}", f"c{g}"):
                _shape_link(sw, dev, spec.trunk_bandwidth, spec.burst_bytes, replace)


def _shape_link(ns: str, dev: str, rate_bps: int, burst_bytes: int | None, replace: bool) -> None:
    segment, bucket = link_shape(rate_bps, burst_bytes)
    netns.sh("ip", "link", "set", "dev", dev, "gso_max_size", str(segment), ns=ns)
    netns.limit(ns, dev, rate_bps, bucket, replace)


def load(name: str) -> EmulatedSpec:
    """The spec of a cluster that is up."""
    check_name(name)
    if not netns.ours(name):
        raise InputError("name", name, "a cluster that is up (realrun cluster up --name ...)")
    try:
        with open(_state_path(name)) as handle:
            state = json.load(handle)
        state.setdefault("cpus_per_host", None)   # a cluster built before hosts had a fixed share
        return EmulatedSpec(**state)
    except (OSError, ValueError, TypeError) as err:
        raise InputError("name", name, f"a cluster with readable state in {STATE_DIR} ({err})") from None


def shape(name: str, bandwidth=None, trunk_bandwidth=None) -> EmulatedSpec:
    """Change link rates of a running cluster in place (``tc qdisc replace``)."""
    spec = load(name)
    changes = asdict(spec)
    if bandwidth is not None:
        changes["bandwidth"] = bandwidth
    if trunk_bandwidth is not None:
        changes["trunk_bandwidth"] = trunk_bandwidth
    new = EmulatedSpec(**changes)
    _limit(new, name, replace=True)
    atomic_write(_state_path(name), lambda h: h.write(json.dumps(asdict(new)).encode()))
    return new


def status(name: str | None = None) -> dict:
    """{cluster: {spec, topology, namespaces, links}} for one cluster or every one of ours."""
    names = [check_name(name)] if name else sorted({n[len(netns.PREFIX):].rsplit("-", 1)[0] for n in netns.ours()})
    out = {}
    for n in names:
        present = netns.ours(n)
        try:
            spec = load(n)
        except InputError:
            spec = None
        state = "up" if present and spec else ("half-built" if present else "down")
        out[n] = {"up": state == "up", "state": state, "namespaces": present,
                  "spec": asdict(spec) if spec else None, "topology": spec.topology() if spec else None,
                  "qdiscs": {ns: _tbf_rates(netns.qdiscs(ns)) for ns in present},
                  "cgroups": cpu.ours(f"{netns.PREFIX}{n}-"), "cores": spec.cores() if spec else {}}
    return out


def _tbf_rates(text: str) -> dict:
    """{device: rate} from ``tc qdisc show``."""
    out = {}
    for line in text.splitlines():
        m = re.search(r"qdisc tbf \S+ dev (\S+) .*rate (\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def down(name: str) -> list[str]:
    """Remove every namespace of cluster ``name`` (and with them its links, bridges and qdiscs)
    and its state file, under the name's lock. Idempotent; works after a crash and on a
    half-built cluster. Returns what was removed."""
    check_name(name)
    with _locked(name):
        return _remove(name)


def _remove(name: str) -> list[str]:
    removed = netns.ours(name)
    for ns in removed:
        netns.delete_ns(ns)
    groups = cpu.ours(f"{netns.PREFIX}{name}-")
    for ns in groups:
        cpu.remove(ns)
    with contextlib.suppress(FileNotFoundError):
        os.remove(_state_path(name))
    left = netns.ours(name)
    if left:
        raise InputError("cluster", ",".join(left), "namespaces that can be deleted (ip netns del)")
    return removed + [f"cgroup {cpu.group_name(g)}" for g in groups if g not in removed]
