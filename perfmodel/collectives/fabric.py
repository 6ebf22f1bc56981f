"""The fabric as the collective formulas see it: three links (ring, intra, inter).

Each ``Link`` is one traffic pattern of the topologies fabric view: the bandwidth one
rank gets while all ranks of all concurrent groups send (link sharing applied), the
latency of one step, the tier it is bottlenecked on, and that tier's protocols.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache, partial

from perfmodel.devices import Device, Protocol, device, nvlink_for_arch, nvls_protocols, protocol_table, tier_class
from perfmodel.collectives.alltoall import alltoall_links
from perfmodel.collectives.library import library
from topologies import Cluster, fabric_view


# a primitive measured between two hosts only: each rank sends to and receives from the same
# peer at once (docs/design.md, Emulated cluster: traffic both ways between one pair is slow)
PAIR = "@pair"


@dataclass(frozen=True, kw_only=True, eq=False)
class Link:
    name: str
    tier: str
    bandwidth_Bps: float
    latency_s: float
    protocols: dict
    traversals: tuple = ()   # ((tier, link crossings per byte sent), ...)
    cls: str = ""            # protocol class (nvlink, pcie, net, socket, tcp) its protocols came from
    primitives: dict = field(default_factory=dict)   # {primitive: Protocol} measured (calibration)

    def protocol(self, name: str) -> Protocol:
        return self.protocols[name]

    @cached_property
    def terms(self) -> dict:
        """{protocol: (base_s, step_s, s_per_byte)}: the per-phase cost terms on this link. A step takes
        the longer of the protocol's step and the link's path latency, but for a protocol whose step
        already covers the path (``Protocol.step_includes_path``: NCCL's hwLat inside an NVSwitch node)."""
        return {n: (p.base_s, p.step_s if p.step_includes_path else max(self.latency_s, p.step_s),
                    1.0 / min(self.bandwidth_Bps * p.bw_fraction, p.max_Bps))
                for n, p in self.protocols.items()}

    @cached_property
    def primitive_terms(self) -> dict:
        """{primitive: (step_s, s_per_byte)} where a runtime's primitive was measured on this tier."""
        return {n: (max(self.latency_s, p.step_s), 1.0 / (self.bandwidth_Bps * p.bw_fraction))
                for n, p in self.primitives.items()}


@dataclass(frozen=True, kw_only=True, eq=False)
class Ctx:
    """Everything a formula needs: group shape, links, device, NVLS support.

    ``hosts`` and ``ranks_per_host`` are the formulas' two levels: the NVLink domains the group
    spans and the most ranks on one (``FabricView.domains``, ``ranks_per_domain``). A domain is a
    host wherever NVLink stays inside a machine, and a rack of hosts on NVL72, where NCCL runs
    its intra-node algorithms (rings over NVLink, NVLS) across the rack's trays: the intra level
    is what NVLink reaches, the inter level what crosses the NICs."""

    ranks: int
    hosts: int
    ranks_per_host: int
    ring: Link
    intra: Link
    inter: Link
    device: Device
    nvls: bool
    nvls_link: Link | None = None   # the intra link under NVLS's own protocol (its architecture's constants)
    kernels: object = None   # Calibration.kernel: spec text -> (compress_Bps, decompress_Bps) alone, or None
    in_run: object = None    # Calibration.in_run_factor: (spec text, message bytes) -> factor
    share: float = 1.0       # fraction of one core a rank gets where hosts share CPU cores
    call: object = None      # Calibration.call_cost: (op, algorithm, message bytes) -> runtime seconds per call
    active: int = 1          # ranks computing at once (this group and the concurrent ones)
    alltoall_view: object = None   # () -> AllToAllLinks from the group's traffic matrix, or None
    library: object = None   # the collective library (perfmodel.collectives.library.Library) 'auto' weighs

    @cached_property
    def alltoall(self):
        """The all-to-all's links from its traffic matrix (``perfmodel.collectives.alltoall``),
        routed on first use; None on a context built by hand (the formulas use ``intra``, ``inter``)."""
        return self.alltoall_view() if self.alltoall_view else None

    def kernel_scale(self, spec_text: str, size_bytes: float = 0.0):
        """Equivalent traffic per input byte (compress, decompress) of a calibrated spec, or None,
        so that bytes x scale / device.stream_Bps = bytes / the throughput a rank gets: measured
        with ``active`` ranks sharing the machine where the profile has it (times the profile's
        in-run factor for a message of ``size_bytes``), else measured alone times the core share
        (``self.device`` is already the shared device)."""
        found = self.kernels(spec_text, self.active) if self.kernels else None
        if found is None:
            return None
        (comp, decomp), shared = found
        per_rank = 1.0 if shared else self.share
        slow = self.in_run(spec_text, size_bytes) if shared and self.in_run else 1.0
        return (slow * self.device.stream_Bps / (comp * per_rank), slow * self.device.stream_Bps / (decomp * per_rank))


def _link(name, pattern, fallback, tables, prims, classify) -> Link:
    if pattern is None or pattern.bottleneck_tier is None:
        return fallback
    tier = pattern.bottleneck_tier
    cls = classify(tier)
    return Link(name=name, tier=tier, bandwidth_Bps=pattern.bandwidth_Bps, latency_s=pattern.latency_s,
                protocols=tables(cls), traversals=pattern.traversals, primitives=prims(cls), cls=cls)


def link_class(cluster: Cluster, tier: str) -> str:
    """The protocol class of ``tier`` on ``cluster``: a network tier of a socket fabric is
    ``socket`` (NCCL's TCP transport), else ``tier_class``."""
    cls = tier_class(tier)
    return "socket" if cls == "net" and cluster.transport == "socket" else cls


@lru_cache(maxsize=256)
def make_ctx(cluster: Cluster, group: tuple, concurrent: tuple = (), calib=None) -> Ctx:
    """Context of ``group`` (GPU indices) on ``cluster`` while ``concurrent`` groups run;
    ``calib`` (a Calibration) replaces device and protocol numbers it measured."""
    view = fabric_view(cluster, group, concurrent)
    arch = device(cluster.gpu_model).arch
    tables = _tables(calib, arch)
    pair = view.ranks == 2 and view.domains == 2
    prims = (lambda cls: pair_view(calib.primitive_table(cls), pair)) if calib else (lambda cls: {})
    classify = partial(link_class, cluster)
    idle = Link(name="none", tier="none", bandwidth_Bps=float("inf"), latency_s=0.0, protocols=tables("nvlink"),
                cls="nvlink")
    ring = _link("ring", view.ring, idle, tables, prims, classify)
    intra = _link("intra", view.intra, ring if view.domains == 1 else idle, tables, prims, classify)
    inter = _link("inter", view.inter, ring, tables, prims, classify)
    if view.ring.bottleneck_tier is not None and view.domains > 1:
        # NCCL uses its network transport's protocols for any ring that leaves the NVLink domain
        # (the host, but for multi-node NVLink racks; gloo has only tcp).
        cls = "tcp" if ring.cls == "tcp" else "socket" if cluster.transport == "socket" else "net"
        ring = Link(name="ring", tier=ring.tier, bandwidth_Bps=ring.bandwidth_Bps,
                    latency_s=ring.latency_s, protocols=tables(cls), traversals=ring.traversals,
                    primitives=ring.primitives, cls=cls)
    dev = calib.device(device(cluster.gpu_model)) if calib else device(cluster.gpu_model)
    active = view.ranks * (1 + len(concurrent))
    share = cpu_share(cluster, active)
    if share < 1.0:
        dev = replace(dev, stream_Bps=dev.stream_Bps * share, launch_s=dev.launch_s / share)
    lib = calib.lib if calib else library(None)
    nvls = cluster.supports_nvls and view.domains == 1 and view.ranks > 1 and lib.nccl_caps
    nvls_table = nvls_protocols(arch) if nvls else None
    return Ctx(ranks=view.ranks, hosts=view.domains, ranks_per_host=view.ranks_per_domain,
               ring=ring, intra=intra, inter=inter, device=dev, nvls=nvls,
               nvls_link=replace(intra, protocols=nvls_table) if nvls_table else None,
               kernels=calib.kernel if calib else None, in_run=calib.in_run_factor if calib else None,
               share=share, active=active, call=calib.call_cost if calib and calib.calls else None, library=lib,
               alltoall_view=partial(alltoall_links, cluster, tuple(group), tuple(concurrent),
                                     partial(_matrix_link, tables, prims, classify)))


def _matrix_link(tables, prims, classify, tier: str, bandwidth_Bps: float, latency_s: float, traversals) -> Link:
    """A Link of an all-to-all phase (``alltoall.phase_link``) with its tier's protocols; a network
    tier takes the network transport's, as NCCL does for any traffic that leaves the host."""
    cls = classify(tier)
    return Link(name="alltoall", tier=tier, bandwidth_Bps=bandwidth_Bps, latency_s=latency_s,
                protocols=tables(cls), traversals=traversals, primitives=prims(cls), cls=cls)


def _tables(calib, arch: str):
    """tier class -> protocols: the profile's where it measured the class, else the collective
    library's (``perfmodel.collectives.library``; NCCL's catalog without a profile), with NCCL's per-architecture
    caps on NVLink (``nvlink_for_arch``) where the library is NCCL."""
    lib = calib.lib if calib else library(None)

    def table(cls: str) -> dict:
        if calib and cls in calib.protocols:
            return calib.protocol_table(cls)
        base = calib.protocol_table(cls) if calib else protocol_table()[cls]
        return nvlink_for_arch(base, arch) if cls == "nvlink" and lib.nccl_caps else base
    return table


def pair_view(table: dict, pair: bool) -> dict:
    """A tier's measured primitives as a group sees them: a group of two ranks on two hosts (each
    sends to and receives from the same peer) takes the ``NAME@pair`` entries where measured."""
    plain = {k: v for k, v in table.items() if not k.endswith(PAIR)}
    if pair:
        plain.update({k.removesuffix(PAIR): v for k, v in table.items() if k.endswith(PAIR)})
    return plain


def cpu_share(cluster: Cluster, active_ranks: int) -> float:
    """Fraction of a core each rank gets on realrun's emulated hosts: the host's fixed
    ``cpu_share`` (a cgroup quota on one core) where it has one, else, when the cluster's ranks
    share ``shared_cores`` CPU cores (one thread each), min(1, cores / ranks)."""
    node = cluster.graph.nodes[cluster.gpu(0)]
    if node.get("cpu_share"):
        return node["cpu_share"]
    cores = node.get("shared_cores")
    return min(1.0, cores / active_ranks) if cores else 1.0
