"""A cluster: the validated graph of its hosts and fabric, and the facts read off it."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import networkx as nx

from topologies.attrs import BANDWIDTH, GPU, HOST, KIND, LATENCY, LOCAL, TIER, validate_graph
from topologies.bounds import MAX_GPUS, MAX_NODES
from topologies.catalog import load_spec
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

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host

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

    @property
    def supports_nvls(self) -> bool:
        """In-switch reduction (NVLink SHARP) on the node's NVSwitch."""
        return bool(self.graph.nodes.get("h0.nvsw", {}).get("nvls", False))

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
    fabric_args = {k: v for k, v in spec["fabric"].items() if k not in ("builder", "transport")}
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
                   graph=graph, spec=spec)


def cluster_for(name_or_path: str, nodes: int | None = None, gpus: int | None = None) -> tuple[Cluster, int]:
    """(cluster, ranks) for a job of ``gpus`` GPUs (or ``nodes`` whole nodes): a GPU count that
    is not a whole number of nodes runs on as few nodes as hold it, the last one partly used
    (ranks packed from GPU 0, so the job's GPUs are 0 .. gpus-1)."""
    if gpus is None or nodes is not None:
        built = build_cluster(name_or_path, nodes=nodes, gpus=gpus)
        return built, built.gpus
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InputError("gpus", gpus, "a positive whole number of GPUs")
    per_host = _gpus_per_host(load_spec(name_or_path)[0])
    whole = -(-gpus // per_host)
    if whole > MAX_NODES:
        raise InputError("gpus", gpus, f"at most {MAX_NODES * per_host}")
    return build_cluster(name_or_path, nodes=whole), gpus


def _hosts(spec: dict, nodes: int | None, gpus: int | None) -> int:
    hosts = _count_hosts(spec, nodes, gpus)
    per_host = _gpus_per_host(spec)
    if hosts * per_host > MAX_GPUS:
        raise InputError("gpus" if gpus is not None else "nodes", gpus if gpus is not None else hosts,
                         f"at most {MAX_GPUS} GPUs in one cluster ({MAX_GPUS // per_host} nodes of {per_host})")
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


def _gpus_per_host(spec: dict) -> int:
    node = spec["node"]
    if node["builder"] == "cpu_host":
        return 1
    if "gpus" in node:
        return int(node["gpus"])
    return int(node["sockets"]) * int(node["gpus_per_socket"])
