"""A cluster: the validated graph of its hosts and fabric, and the facts read off it.

Two groupings of GPUs: the *host* (a machine: its own CPUs, NICs and PCIe; ``--nodes`` counts
hosts) and the *NVLink domain* (the GPUs that reach each other over NVLink). On every cluster
but a multi-host NVLink rack the two are the same; on GB200/GB300 NVL72 a domain is the 18
compute-tray hosts of one rack, joined by its NVLink Switch trays (``nodes.nvlink_tray_node``).
GPU indices are host-major and a domain's hosts are consecutive, so ranks packed from GPU 0
fill a domain before they cross into the next. A cluster larger than one domain is a whole
number of domains; one smaller than a domain is one partly filled domain.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import networkx as nx

from topologies.attrs import BANDWIDTH, DOMAIN, GPU, HOST, KIND, LATENCY, LOCAL, TIER, validate_graph
from topologies.bounds import MAX_GPUS, MAX_NODES
from topologies.catalog import COMMON_KEYS, load_spec
from topologies.errors import InputError
from topologies.fabrics import FABRIC_BUILDERS
from topologies.nodes import NODE_BUILDERS, gpu_name


@dataclass(frozen=True, kw_only=True, eq=False)
class Cluster:
    """A built cluster. ``graph`` is validated and must be treated as read-only."""

    name: str
    origin: str
    description: str
    gpu_model: str
    hosts: int
    gpus_per_host: int
    node_builder: str
    fabric_builder: str
    graph: nx.Graph = field(repr=False)
    spec: dict = field(repr=False)
    hosts_per_domain: int = 1   # hosts of one NVLink domain as built (module doc)

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host

    @property
    def gpus_per_domain(self) -> int:
        """GPUs that reach each other over NVLink: a host's on most clusters, a rack's on NVL72."""
        return self.gpus_per_host * self.hosts_per_domain

    @property
    def domains(self) -> int:
        return self.hosts // self.hosts_per_domain

    def locate(self, name: str) -> tuple[int, str]:
        """(domain, the same part's name in domain 0) of a host part or domain switch: the
        routing template every domain shares (``topologies.routing``, ``topologies.loads``)."""
        head, tail = name.split(".", 1)
        index = int(head[1:])
        if head[0] == "d":
            return index, f"d0.{tail}"
        return index // self.hosts_per_domain, f"h{index % self.hosts_per_domain}.{tail}"

    def name_in(self, template: str, domain: int) -> str:
        """The graph name in ``domain`` of a part named ``template`` in domain 0 (``locate``'s inverse)."""
        head, tail = template.split(".", 1)
        if head[0] == "d":
            return f"d{domain}.{tail}"
        return f"h{int(head[1:]) + domain * self.hosts_per_domain}.{tail}"

    def in_template(self, data: dict) -> bool:
        """Whether a node (its attributes) is a part of domain 0: a host of it, or its domain switch."""
        if HOST in data:
            return data[HOST] < self.hosts_per_domain
        return data.get(DOMAIN) == 0

    def gpu(self, index: int) -> str:
        """Graph name of GPU ``index`` in host-major order."""
        return gpu_name(index // self.gpus_per_host, index % self.gpus_per_host)

    @cached_property
    def host_of(self) -> dict[str, int]:
        return {n: d[HOST] for n, d in self.graph.nodes(data=True) if d[KIND] == GPU}

    @property
    def transport(self) -> str:
        """How ranks on different hosts talk: ``rdma`` (InfiniBand, RoCE) or ``socket`` (TCP)."""
        return self.spec["fabric"].get("transport", "rdma")

    @cached_property
    def supports_nvls(self) -> bool:
        """In-switch reduction (NVLink SHARP) on the NVSwitch of an NVLink domain (a host's, or a
        rack's on NVL72): NCCL's NVLS algorithm inside the domain."""
        return any(d.get("nvls", False) for _, d in self.graph.nodes(data=True)
                   if d[KIND] == "nvswitch" and self.in_template(d))

    @property
    def supports_sharp(self) -> bool:
        """In-network reduction on the InfiniBand fabric between domains (SHARP, NCCL's CollNet),
        where the cluster file declares it (``fabric.sharp = true``)."""
        return bool(self.spec["fabric"].get("sharp", False))

    @cached_property
    def tiers(self) -> dict[str, dict]:
        """Per tier: link count, bandwidth per link (bytes/s, min and max), latency (s)."""
        out: dict[str, dict] = {}
        for _, _, d in self.graph.edges(data=True):
            t = out.setdefault(d[TIER], {"links": 0, "bandwidth_Bps": [], "latency_s": []})
            t["links"] += 1
            t["bandwidth_Bps"].append(d[BANDWIDTH])
            t["latency_s"].append(d[LATENCY])
        return {k: {"links": v["links"], "min_bandwidth_Bps": min(v["bandwidth_Bps"]),
                    "max_bandwidth_Bps": max(v["bandwidth_Bps"]),
                    "latency_s": max(v["latency_s"])} for k, v in out.items()}

    @cached_property
    def nic_rate_per_host_Bps(self) -> float:
        return sum(d["rate_Bps"] for n, d in self.graph.nodes(data=True)
                   if d[KIND] == "nic" and d[HOST] == 0)

    def local_index(self, gpu: str) -> int:
        return self.graph.nodes[gpu][LOCAL]


def build_graph(spec: dict, hosts: int) -> tuple[nx.Graph, int]:
    """Build and validate the graph of ``hosts`` hosts; return it and GPUs per host."""
    graph = nx.Graph(name=spec["name"])
    node_args = {k: v for k, v in spec["node"].items() if k != "builder"}
    fabric_args = {k: v for k, v in spec["fabric"].items() if k != "builder" and k not in COMMON_KEYS["fabric"]}
    nics = [NODE_BUILDERS[spec["node"]["builder"]](graph, h, **node_args) for h in range(hosts)]
    per_host = sum(1 for _, d in graph.nodes(data=True) if d[KIND] == GPU and d[HOST] == 0)
    if hosts > 1 or spec["fabric"]["builder"] != "single_switch":
        FABRIC_BUILDERS[spec["fabric"]["builder"]](graph, nics, **fabric_args)
    return validate_graph(graph), per_host


@lru_cache(maxsize=32)
def build_cluster(name_or_path: str, nodes: int | None = None, gpus: int | None = None) -> Cluster:
    """Build a catalog cluster (or a TOML file) sized by ``nodes`` or ``gpus``. Cached."""
    spec, origin = load_spec(name_or_path)
    hosts = _hosts(spec, nodes, gpus)
    graph, per_host = build_graph(spec, hosts)
    return Cluster(name=spec["name"], origin=origin, description=spec["description"],
                   gpu_model=spec["gpu"], hosts=hosts, gpus_per_host=per_host,
                   node_builder=spec["node"]["builder"], fabric_builder=spec["fabric"]["builder"],
                   graph=graph, spec=spec, hosts_per_domain=min(hosts, _hosts_per_domain(spec)))


def cluster_for(name_or_path: str, nodes: int | None = None, gpus: int | None = None) -> tuple[Cluster, int]:
    """(cluster, ranks) for a job of ``gpus`` GPUs (or ``nodes`` whole nodes): a GPU count that
    is not a whole number of nodes runs on as few nodes as hold it, the last one partly used;
    past one NVLink domain, on as few whole domains as hold it, the last one partly used (ranks
    packed from GPU 0, so the job's GPUs are 0 .. gpus-1 and fill a domain before the next)."""
    if gpus is None or nodes is not None:
        built = build_cluster(name_or_path, nodes=nodes, gpus=gpus)
        return built, built.gpus
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InputError("gpus", gpus, "a positive whole number of GPUs")
    spec = load_spec(name_or_path)[0]
    per_host, per_domain = _gpus_per_host(spec), _hosts_per_domain(spec)
    whole = -(-gpus // per_host)
    if whole > per_domain:
        whole = -(-whole // per_domain) * per_domain
    if whole > MAX_NODES:
        raise InputError("gpus", gpus, f"at most {MAX_NODES // per_domain * per_domain * per_host}")
    return build_cluster(name_or_path, nodes=whole), gpus


def _hosts(spec: dict, nodes: int | None, gpus: int | None) -> int:
    hosts = _count_hosts(spec, nodes, gpus)
    per_host = _gpus_per_host(spec)
    field, value = ("gpus", gpus) if gpus is not None else ("nodes", hosts)
    if hosts * per_host > MAX_GPUS:
        raise InputError(field, value,
                         f"at most {MAX_GPUS} GPUs in one cluster ({MAX_GPUS // per_host} nodes of {per_host})")
    per_domain = _hosts_per_domain(spec)
    if per_domain < hosts and hosts % per_domain:
        raise InputError(field, value, f"at most {per_domain} nodes (one NVLink domain, partly filled) or a multiple "
                         f"of {per_domain} ({per_domain * per_host} GPUs): whole NVLink domains")
    return hosts


def _count_hosts(spec: dict, nodes: int | None, gpus: int | None) -> int:
    per_host = _gpus_per_host(spec)
    if nodes is not None and gpus is not None and nodes * per_host != gpus:
        raise InputError("gpus", gpus, f"equal to nodes x {per_host} when both are given")
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1 or gpus % per_host \
                or gpus // per_host > MAX_NODES:
            raise InputError("gpus", gpus, f"a positive multiple of {per_host} (GPUs per node), "
                             f"at most {MAX_NODES * per_host}")
        return gpus // per_host
    if nodes is None:
        return spec["default_nodes"]
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise InputError("nodes", nodes, f"an integer from 1 to {MAX_NODES}")
    return nodes


def _hosts_per_domain(spec: dict) -> int:
    """Hosts of one NVLink domain in a cluster file: the node builder's ``hosts_per_domain`` (NVL72:
    18 compute trays), else 1 (the domain is the host)."""
    return int(spec["node"].get("hosts_per_domain", 1))


def _gpus_per_host(spec: dict) -> int:
    node = spec["node"]
    if node["builder"] == "cpu_host":
        return 1
    if "gpus" in node:
        return int(node["gpus"])
    return int(node["sockets"]) * int(node["gpus_per_socket"])
