"""GPU node builders, in the style of networkx generators.

Each builder adds one host (GPUs, switches, CPUs, NICs and their links) to a graph
and returns the host's NIC names in rail order. They share parameter names:
``gpus``, ``nics``, ``nic_Gbps``, ``pcie_GBps``, ``*_latency_us``. Rates and
latencies come from the catalog TOML, which cites a source for each. A builder whose
hosts share an NVLink domain (``nvlink_tray_node``) takes ``hosts_per_domain`` and adds
the domain's switch with the domain's first host.
"""
from __future__ import annotations

import networkx as nx

from topologies.attrs import DOMAIN, FORWARDS, GPU, HOST, KIND, LOCAL, add_link
from topologies.units import GBps_to_Bps, Gbps_to_Bps, us_to_s


def gpu_name(host: int, local: int) -> str:
    return f"h{host}.gpu{local}"


def _add_gpu(graph: nx.Graph, host: int, local: int) -> str:
    name = gpu_name(host, local)
    graph.add_node(name, **{KIND: GPU, HOST: host, LOCAL: local})
    return name


def _add_part(graph: nx.Graph, host: int, kind: str, label: str) -> str:
    name = f"h{host}.{label}"
    graph.add_node(name, **{KIND: kind, HOST: host})
    return name


def _add_nics(graph, host, attach_to, *, nic_Gbps, pcie_GBps, pcie_latency_us):
    """NIC j hangs off ``attach_to[j]`` over PCIe; its network side is wired by the fabric."""
    nics = []
    for j, parent in enumerate(attach_to):
        nic = _add_part(graph, host, "nic", f"nic{j}")
        graph.nodes[nic]["rate_Bps"] = Gbps_to_Bps(nic_Gbps)
        add_link(graph, parent, nic, tier="pcie",
                 bandwidth_Bps=GBps_to_Bps(pcie_GBps), latency_s=us_to_s(pcie_latency_us))
        nics.append(nic)
    return nics


def _gpus_on_switch(graph: nx.Graph, host: int, gpus: int, switch: str, *, nvlink_GBps: float,
                    nvlink_latency_us: float) -> list[str]:
    """``gpus`` GPUs of ``host``, each linked to ``switch`` over NVLink at ``nvlink_GBps`` per direction."""
    names = [_add_gpu(graph, host, i) for i in range(gpus)]
    for name in names:
        add_link(graph, name, switch, tier="nvlink", bandwidth_Bps=GBps_to_Bps(nvlink_GBps),
                 latency_s=us_to_s(nvlink_latency_us))
    return names


def _nics_on_gpus(graph: nx.Graph, host: int, gpus: list[str], nics: int, *, nic_Gbps: float, pcie_GBps: float,
                  pcie_latency_us: float) -> list[str]:
    """NIC j on GPU ``j * len(gpus) // nics`` over PCIe (one NIC per GPU where they are as many)."""
    attach = [gpus[j * len(gpus) // nics] for j in range(nics)]
    return _add_nics(graph, host, attach, nic_Gbps=nic_Gbps, pcie_GBps=pcie_GBps, pcie_latency_us=pcie_latency_us)


def nvswitch_node(graph: nx.Graph, host: int, *, gpus: int, nvlink_GBps: float,
                  nvlink_latency_us: float, nics: int, nic_Gbps: float,
                  pcie_GBps: float, pcie_latency_us: float = 0.5,
                  nvls: bool = False) -> list[str]:
    """DGX-style node: every GPU links to one logical NVSwitch at ``nvlink_GBps`` per direction.

    The physical NVSwitch chips form a non-blocking crossbar, so one switch node with
    each GPU's aggregate NVLink bandwidth stands in for them. NIC j sits on the PCIe
    switch of GPU ``j * gpus // nics`` (DGX A100/H100: one NIC per GPU). ``nvls`` marks
    in-switch reduction (NVLink SHARP, Hopper and later).
    """
    switch = _add_part(graph, host, "nvswitch", "nvsw")
    graph.nodes[switch]["nvls"] = bool(nvls)
    names = _gpus_on_switch(graph, host, gpus, switch, nvlink_GBps=nvlink_GBps, nvlink_latency_us=nvlink_latency_us)
    return _nics_on_gpus(graph, host, names, nics, nic_Gbps=nic_Gbps, pcie_GBps=pcie_GBps,
                         pcie_latency_us=pcie_latency_us)


def nvlink_tray_node(graph: nx.Graph, host: int, *, gpus: int, hosts_per_domain: int, nvlink_GBps: float,
                     nvlink_latency_us: float, nics: int, nic_Gbps: float, pcie_GBps: float,
                     pcie_latency_us: float, cpus: int, c2c_GBps: float, c2c_latency_us: float,
                     nvls: bool = False) -> list[str]:
    """A compute tray of a multi-host NVLink rack (GB200/GB300 NVL72): a host of its own (its
    CPUs, NICs and PCIe; an operating system of its own) whose GPUs link to the NVLink domain's
    switch rather than to one of the host's. ``hosts_per_domain`` consecutive hosts share one
    domain: one logical NVSwitch ``d{domain}.nvsw`` stands for the rack's NVLink Switch trays,
    which join every GPU of the rack in a non-blocking crossbar (each GPU has a link to every
    switch chip), so a GPU reaches any other of the rack in one switch hop at ``nvlink_GBps``
    per direction. ``nvls`` marks in-switch reduction (NVLink SHARP) on it.

    Each of the host's ``cpus`` CPUs (Grace) links to its share of the GPUs over NVLink-C2C
    (tier ``c2c``, ``c2c_GBps`` per GPU per direction); the CPUs never forward GPU or NIC traffic
    (NCCL moves data over NVLink and the NICs). NIC j sits on GPU ``j * gpus // nics`` over PCIe
    (one NIC per GPU: GPUDirect RDMA from the GPU's own NIC)."""
    domain = host // hosts_per_domain
    switch = f"d{domain}.nvsw"
    if switch not in graph:
        graph.add_node(switch, **{KIND: "nvswitch", DOMAIN: domain, "nvls": bool(nvls)})
    names = _gpus_on_switch(graph, host, gpus, switch, nvlink_GBps=nvlink_GBps, nvlink_latency_us=nvlink_latency_us)
    for c in range(cpus):
        cpu = _add_part(graph, host, "cpu", f"cpu{c}")
        graph.nodes[cpu][FORWARDS] = False
        for name in names[c * gpus // cpus:(c + 1) * gpus // cpus]:
            add_link(graph, name, cpu, tier="c2c", bandwidth_Bps=GBps_to_Bps(c2c_GBps),
                     latency_s=us_to_s(c2c_latency_us))
    return _nics_on_gpus(graph, host, names, nics, nic_Gbps=nic_Gbps, pcie_GBps=pcie_GBps,
                         pcie_latency_us=pcie_latency_us)


def full_mesh_node(graph: nx.Graph, host: int, *, gpus: int, gpu_gpu_GBps: float, link_latency_us: float,
                   nics: int, nic_Gbps: float, pcie_GBps: float, pcie_latency_us: float,
                   intra_tier: str = "xgmi") -> list[str]:
    """A node whose GPUs are fully meshed, every pair joined by one direct link of
    ``gpu_gpu_GBps`` per direction and no switch (AMD Instinct MI300X/MI325X platforms: 8 GPUs,
    7 Infinity Fabric (xGMI) links each, tier ``intra_tier``). NIC j sits on GPU
    ``j * gpus // nics`` over PCIe (one NIC per GPU)."""
    names = [_add_gpu(graph, host, i) for i in range(gpus)]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            add_link(graph, a, b, tier=intra_tier, bandwidth_Bps=GBps_to_Bps(gpu_gpu_GBps),
                     latency_s=us_to_s(link_latency_us))
    return _nics_on_gpus(graph, host, names, nics, nic_Gbps=nic_Gbps, pcie_GBps=pcie_GBps,
                         pcie_latency_us=pcie_latency_us)


def nvlink_mesh_node(graph: nx.Graph, host: int, *, sockets: int, gpus_per_socket: int,
                     gpu_gpu_GBps: float, gpu_cpu_GBps: float, cpu_cpu_GBps: float,
                     nvlink_latency_us: float, cpu_cpu_latency_us: float,
                     nics_per_socket: int, nic_Gbps: float, pcie_GBps: float,
                     pcie_latency_us: float = 0.5, intra_tier: str = "nvlink") -> list[str]:
    """AC922-style node: per socket a triad (CPU and its GPUs, all pairwise linked), sockets
    joined CPU to CPU (X-bus on POWER9). GPUs on different sockets talk through both CPUs.
    NICs hang off the CPUs. ``intra_tier`` names the GPU link tier (``xgmi`` for AMD)."""
    cpus = [_add_part(graph, host, "cpu", f"cpu{s}") for s in range(sockets)]
    for a in range(sockets):
        for b in range(a + 1, sockets):
            add_link(graph, cpus[a], cpus[b], tier="xbus", bandwidth_Bps=GBps_to_Bps(cpu_cpu_GBps),
                     latency_s=us_to_s(cpu_cpu_latency_us))
    for s, cpu in enumerate(cpus):
        group = [_add_gpu(graph, host, s * gpus_per_socket + i) for i in range(gpus_per_socket)]
        for i, a in enumerate(group):
            add_link(graph, a, cpu, tier=intra_tier, bandwidth_Bps=GBps_to_Bps(gpu_cpu_GBps),
                     latency_s=us_to_s(nvlink_latency_us))
            for b in group[i + 1:]:
                add_link(graph, a, b, tier=intra_tier, bandwidth_Bps=GBps_to_Bps(gpu_gpu_GBps),
                         latency_s=us_to_s(nvlink_latency_us))
    attach = [cpu for cpu in cpus for _ in range(nics_per_socket)]
    return _add_nics(graph, host, attach, nic_Gbps=nic_Gbps, pcie_GBps=pcie_GBps,
                     pcie_latency_us=pcie_latency_us)


def pcie_node(graph: nx.Graph, host: int, *, gpus: int, gpus_per_switch: int,
              pcie_GBps: float, pcie_latency_us: float, uplink_GBps: float,
              nics: int, nic_Gbps: float) -> list[str]:
    """Commodity node: GPUs behind PCIe switches (``gpus_per_switch`` each), switches on
    one CPU root complex over ``uplink_GBps`` links; NICs on the root complex."""
    cpu = _add_part(graph, host, "cpu", "cpu0")
    names = [_add_gpu(graph, host, i) for i in range(gpus)]
    for k in range(0, gpus, gpus_per_switch):
        switch = _add_part(graph, host, "pcie_switch", f"plx{k // gpus_per_switch}")
        add_link(graph, switch, cpu, tier="pcie", bandwidth_Bps=GBps_to_Bps(uplink_GBps),
                 latency_s=us_to_s(pcie_latency_us))
        for name in names[k:k + gpus_per_switch]:
            add_link(graph, name, switch, tier="pcie", bandwidth_Bps=GBps_to_Bps(pcie_GBps),
                     latency_s=us_to_s(pcie_latency_us))
    return _add_nics(graph, host, [cpu] * nics, nic_Gbps=nic_Gbps, pcie_GBps=uplink_GBps,
                     pcie_latency_us=pcie_latency_us)


def cpu_host(graph: nx.Graph, host: int, *, nic_Gbps: float, memory_GBps: float, cores: int,
             slow_host: int = -1, slow_nic_Gbps: float = 0.0, cpu_share: float = 0.0) -> list[str]:
    """An emulated host (realrun's network namespace): one rank on the CPU behind one NIC of
    ``nic_Gbps`` (``slow_nic_Gbps`` on host ``slow_host``). The rank's device link runs at
    ``memory_GBps``. ``cores`` is how many CPU cores all hosts share (perfmodel divides them)
    unless the host has a fixed ``cpu_share`` of one core (realrun's cgroup per host)."""
    rank = _add_gpu(graph, host, 0)
    graph.nodes[rank]["shared_cores"] = cores
    if cpu_share:
        graph.nodes[rank]["cpu_share"] = cpu_share
    rate = slow_nic_Gbps if host == slow_host else nic_Gbps
    return _add_nics(graph, host, [rank], nic_Gbps=rate, pcie_GBps=memory_GBps, pcie_latency_us=0.0)


NODE_BUILDERS = {
    "cpu_host": cpu_host,
    "nvswitch": nvswitch_node,
    "nvlink_tray": nvlink_tray_node,
    "nvlink_mesh": nvlink_mesh_node,
    "full_mesh": full_mesh_node,
    "pcie": pcie_node,
}
