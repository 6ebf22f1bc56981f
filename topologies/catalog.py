"""Cluster catalog: TOML files inside the package, or a user's TOML path.

A name ``BASE:key=value,...`` is a variant of a catalog cluster or file (``topologies.variants``);
``nccl-topo:DUMP.xml[:key=value,...]`` is a node read from an NCCL topology dump (``topologies.nccl_topo``).
A cluster file has the top-level keys of ``TOP_KEYS``; ``[node]`` and ``[fabric]``
each name a ``builder`` and give exactly that builder's keyword arguments (unknown
or missing keys are refused with the list of allowed ones); ``[sources]`` maps a key
(``node.nvlink_GBps``) to where its number comes from.
"""
from __future__ import annotations

import inspect
import itertools
import math
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

from topologies import bounds, nccl_topo, variants
from topologies.clikit import file_format
from topologies.errors import InputError
from topologies.fabrics import FABRIC_BUILDERS
from topologies.nodes import NODE_BUILDERS
from topologies.units import parse_rate

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TOP_KEYS = {"name": True, "description": True, "gpu": True, "default_nodes": True,
            "node": True, "fabric": True, "sources": False}


def catalog_names() -> list[str]:
    """Names of the clusters shipped with the package."""
    folder = resources.files("topologies") / "catalog"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


EMULATED_KEYS = ("hosts", "bandwidth", "groups", "trunk", "slow_host", "slow_bandwidth", "cores", "cpu_share",
                 "latency_us")


def emulated_spec(text: str) -> dict:
    """The cluster spec of ``emulated:hosts=4,bandwidth=1gbit[,groups=2,trunk=200mbit]
    [,slow_host=3,slow_bandwidth=100mbit][,cores=N][,cpu_share=0.45][,latency_us=50]``: realrun's
    emulated cluster (one rank per network namespace on this machine, tc tbf links; ``cpu_share``:
    each host's fixed share of one core, else its ranks share ``cores`` cores)."""
    args = {}
    for item in filter(None, text.split(":", 1)[1].split(",")):
        key, _, value = item.partition("=")
        if key not in EMULATED_KEYS or not value:
            raise InputError("cluster", item, "key=value with a key among " + ", ".join(EMULATED_KEYS))
        args[key] = value
    hosts = _int_arg(args, "hosts", 4, 1, 64)
    rate = parse_rate(args.get("bandwidth", "1gbit")) / 1e9
    groups = _int_arg(args, "groups", 1, 1, hosts)
    node = {"builder": "cpu_host", "nic_Gbps": rate, "memory_GBps": 10.0,
            "cores": _int_arg(args, "cores", os.cpu_count() or 1, 1, 4096)}
    if "cpu_share" in args:
        node["cpu_share"] = _share_arg(args["cpu_share"])
    if "slow_host" in args:
        node.update(slow_host=_int_arg(args, "slow_host", 0, 0, hosts - 1),
                    slow_nic_Gbps=parse_rate(args.get("slow_bandwidth", "100mbit"), "slow_bandwidth") / 1e9)
    latency = _float_arg(args, "latency_us", 5.0)
    fabric = {"builder": "single_switch", "latency_us": latency, "tier_prefix": "tcp"}
    if groups > 1:
        fabric = {"builder": "two_tier", "hosts_per_group": hosts // groups, "latency_us": latency,
                  "trunk_Gbps": parse_rate(args.get("trunk", "1gbit"), "trunk") / 1e9, "tier_prefix": "tcp"}
    return {"name": text, "description": "realrun emulated cluster: network namespaces on one machine, tc tbf links",
            "gpu": "host-cpu", "default_nodes": hosts, "node": node, "fabric": fabric,
            "sources": {"node.nic_Gbps": "the tc tbf rate of each host link (realrun cluster up)",
                        "node.memory_GBps": "benchmarks/bench_realrun.py: numpy copy of 64 MiB, 8.7-11.5 GB/s here",
                        "node.cores": "os.cpu_count() of this machine unless given",
                        "node.cpu_share": "the cgroup quota of each host (realrun cluster up --cpus-per-host)",
                        "fabric.latency_us": "assumption: one veth + bridge hop; the TCP stack per message "
                                             "is the tcp protocol step (fitted)"}}


def _share_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise InputError("cluster.cpu_share", text, "a share of one core in (0, 1]")
    return value


def _float_arg(args: dict, key: str, default: float) -> float:
    try:
        value = float(args.get(key, default))
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1e6:
        raise InputError(f"cluster.{key}", args.get(key), "a number of microseconds >= 0")
    return value


def _int_arg(args: dict, key: str, default: int, low: int, high: int) -> int:
    value = args.get(key, default)
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise InputError(f"cluster.{key}", value, f"an integer from {low} to {high}")
    return number


def _read(name_or_path: str) -> tuple[dict, str]:
    if name_or_path.startswith("emulated:"):
        return emulated_spec(name_or_path), name_or_path
    if name_or_path.startswith(f"{nccl_topo.PREFIX}:"):     # an NCCL topology dump (topologies.nccl_topo)
        return nccl_topo.spec_of(name_or_path), name_or_path
    base, sep, options = name_or_path.partition(":")
    if sep and not Path(name_or_path).exists():       # a variant: BASE:key=value,... (topologies.variants)
        spec, origin = load_spec(base)
        return variants.apply(spec, variants.parse_options(options), name_or_path), f"{origin} (variant)"
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or path.exists():
        if not path.is_file():
            raise InputError("cluster", name_or_path, "a catalog name or an existing TOML file")
        origin = str(path)
        text = path.read_text()
    elif name_or_path in catalog_names():
        origin = f"catalog:{name_or_path}"
        text = (resources.files("topologies") / "catalog" / f"{name_or_path}.toml").read_text()
    else:
        raise InputError("cluster", name_or_path,
                         "one of " + ", ".join(catalog_names()) + ", or a TOML file path")
    try:
        return tomllib.loads(text), origin
    except tomllib.TOMLDecodeError as err:
        looks = file_format(text)
        if looks:
            raise InputError("cluster", name_or_path, f"a cluster TOML file, and this looks like {looks}: pass a "
                             "catalog cluster (topologies list) or a cluster TOML (docs/contributing.md, Write a "
                             "cluster file; the catalog's files are examples)") from None
        raise InputError("cluster", name_or_path, f"valid TOML ({err})") from None


# keys a section takes whatever its builder: the fabric's transport (RDMA verbs, or TCP
# sockets where the NICs or the network have no RDMA: NCCL's socket transport), and whether its
# switches reduce in the network (InfiniBand SHARP, NCCL's CollNet: ``Cluster.supports_sharp``)
COMMON_KEYS = {"fabric": {"transport", "sharp"}}
TRANSPORTS = ("rdma", "socket")


def _check_section(spec: dict, section: str, builders: dict) -> None:
    body = spec[section]
    if not isinstance(body, dict) or body.get("builder") not in builders:
        got = body.get("builder") if isinstance(body, dict) else body
        raise InputError(f"{section}.builder", got, "one of " + ", ".join(builders))
    params = inspect.signature(builders[body["builder"]]).parameters
    allowed = {k for k, p in params.items() if p.kind is p.KEYWORD_ONLY} | COMMON_KEYS.get(section, set())
    required = {k for k in allowed if k in params and params[k].default is inspect.Parameter.empty}
    for key in body:
        if key != "builder" and key not in allowed:
            raise InputError(f"{section}.{key}", body[key],
                             f"not a key of builder {body['builder']!r}; allowed: "
                             + ", ".join(sorted(allowed)))
    missing = sorted(required - set(body))
    if missing:
        raise InputError(f"{section}.{missing[0]}", None,
                         f"required by builder {body['builder']!r} (missing: {', '.join(missing)})")
    for key, value in body.items():
        _check_value(f"{section}.{key}", key, value)


def _check_value(field: str, key: str, value) -> None:
    """A builder argument of the right type, within its declared bound (``topologies.bounds``)."""
    if key in ("builder", "transport"):
        return
    if key in ("nvls", "sharp"):
        if not isinstance(value, bool):
            raise InputError(field, value, "true or false")
    elif key in ("intra_tier", "tier_prefix"):
        if not isinstance(value, str) or not value.replace("-", "").replace("_", "").isalnum():
            raise InputError(field, value, "a name of letters, digits, - and _")
    elif key == "dims":
        if not isinstance(value, list) or not value or len(value) > 3:
            raise InputError(field, value, "a list of 1 to 3 integers")
        for d in value:
            bounds.check(field, d, "nodes")
    elif bounds.bound(key) is not None:
        bounds.check(field, value, key)
    else:
        raise InputError(field, value, "a builder argument with a declared bound (topologies.bounds)")


def _check_shape(node: dict) -> None:
    """Counts that must fit each other: GPUs per PCIe switch, or CPUs of a tray, divide the node's GPUs."""
    if node["builder"] == "pcie" and node["gpus"] % node["gpus_per_switch"]:
        raise InputError("node.gpus_per_switch", node["gpus_per_switch"],
                         f"a divisor of node.gpus ({node['gpus']}): every PCIe switch holds as many GPUs")
    if node["builder"] == "nvlink_tray" and node["gpus"] % node["cpus"]:
        raise InputError("node.cpus", node["cpus"],
                         f"a divisor of node.gpus ({node['gpus']}): every CPU links to as many GPUs")


def validate_spec(spec: dict) -> dict:
    """Refuse unknown or missing keys; return the spec unchanged."""
    for key in spec:
        if key not in TOP_KEYS:
            raise InputError(key, spec[key], "not a cluster key; allowed: " + ", ".join(TOP_KEYS))
    for key, needed in TOP_KEYS.items():
        if needed and key not in spec:
            raise InputError(key, None, "required in a cluster file")
    _check_section(spec, "node", NODE_BUILDERS)
    _check_section(spec, "fabric", FABRIC_BUILDERS)
    _check_shape(spec["node"])
    if spec["fabric"].get("transport", "rdma") not in TRANSPORTS:
        raise InputError("fabric.transport", spec["fabric"]["transport"], " or ".join(TRANSPORTS))
    for key in ("name", "description", "gpu"):
        if not isinstance(spec[key], str) or not spec[key].strip():
            raise InputError(key, spec[key], "a non-empty string")
    bounds.check("default_nodes", spec["default_nodes"])
    return spec


@lru_cache(maxsize=64)
def load_spec(name_or_path: str) -> tuple[dict, str]:
    """(validated spec, origin) for a catalog name or TOML path. Cached."""
    spec, origin = _read(name_or_path)
    return validate_spec(spec), origin


def grid_names(base: str, grid: str | dict) -> list[str]:
    """Variant names of ``base`` over the product of ``grid``'s values, each one checked (built
    spec validated) before any is used."""
    if ":" in base:
        raise InputError("cluster", base, "a catalog name or a cluster file to vary (not a variant or emulated)")
    spec = load_spec(base)[0]
    items = variants.parse_grid(grid) if isinstance(grid, str) else {k: [str(v) for v in vs] for k, vs in grid.items()}
    for key in items:
        variants.resolve(spec, key, "cluster_grid")
    count = math.prod(len(v) for v in items.values())
    if count > variants.MAX_VARIANTS:
        raise InputError("cluster_grid", grid, f"at most {variants.MAX_VARIANTS} clusters per base ({count} asked)")
    names = [f"{base}:" + ",".join(f"{k}={v}" for k, v in zip(items, combo))
             for combo in itertools.product(*items.values())]
    for name in names:
        load_spec(name)
    return names
