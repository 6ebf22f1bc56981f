"""A cluster from an NCCL topology dump (``NCCL_TOPO_DUMP_FILE=topo.xml``) and a fabric description.

NCCL writes the node it runs on as XML (NVIDIA/nccl src/graph/xml.cc ``ncclTopoDumpXmlToFile``): a
``<system>`` of ``<cpu>`` elements (``numaid``, ``affinity``, ``arch``, ``vendor``, ``familyid``,
``modelid``), each holding a tree of ``<pci>`` devices (``busid``, ``class``, ``vendor``, ``device``,
``link_speed`` such as ``"32.0 GT/s PCIe"``, ``link_width``); a GPU's ``<pci>`` holds ``<gpu>`` (``dev``,
``sm``, ``rank``, ``gdr``) with its ``<nvlink>`` rows (``target`` bus id, ``count`` links, ``tclass`` the
target's PCI class: ``0x068000`` an NVSwitch, ``0x0302..`` a GPU), a NIC's holds ``<nic>`` with a
``<net>`` per port (``name``, ``dev``, ``speed`` in Mb/s, ``port``, ``latency``, ``guid``, ``maxconn``,
``gdr``, ``coll``). It is read here with the standard library's ``xml.etree.ElementTree`` (no DTD or
entity is accepted: NCCL writes none) into the node builder's arguments (``topologies.nodes``):
NVSwitch -> ``nvswitch``, every GPU pair on direct NVLinks alike -> ``full_mesh``, no NVLink ->
``pcie``. What the dump cannot say (how many nodes, the network between them) is the fabric
description: ``nodes=``, ``fabric=`` (a builder of ``topologies.fabrics``) and any builder argument,
as a variant's (``topologies.variants``).

A cluster name ``nccl-topo:PATH[:key=value,...]`` goes wherever a cluster does (``--cluster``,
``build_cluster``); ``import_dump`` gives the spec and one line per key of the dump: mapped (``nccl-topo:
net speed 400000 x8 -> nics 8, nic_Gbps 400``), ignored with its reason, or refused (every refusal at
once, in one ``InputError`` whose ``refused`` holds a line each).
"""
from __future__ import annotations

import inspect
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from topologies import variants
from topologies.bounds import MAX_NODES
from topologies.clikit import check_gpu
from topologies.errors import InputError
from topologies.fabrics import FABRIC_BUILDERS

PREFIX = "nccl-topo"
MAX_BYTES = 16 * 2**20   # a dump is tens of KB (NCCL's XML holds at most a few thousand nodes: xml.h MAX_SUBS)
MAX_DEPTH = 64          # levels of elements: a PCIe tree is a few switches deep
NVSWITCH_CLASS = "0x068000"   # NVIDIA/nccl src/graph/xml.h PCI_NVSWITCH_CLASS
BRIDGE_CLASS = "0x060400"     # src/graph/topo.cc PCI_BRIDGE_DEVICE_CLASS: a PCIe switch port
OWN_KEYS = ("nodes", "fabric", "gpu", "transport", "sharp")   # the rest: builder arguments (topologies.variants)
NIC_KEYS = ("nics", "nic_Gbps")   # the dump's own where it lists NICs, else required

# GPU catalog key by PCI device id (vendor 0x10de); names as the PCI ID Repository (pci-ids.ucw.cz, pci.ids) has them
PCI_GPUS = {0x1db1: ("v100-sxm2-16gb", "GV100GL [Tesla V100 SXM2 16GB]", 70),
            0x1db5: ("v100-sxm2-32gb", "GV100GL [Tesla V100 SXM2 32GB]", 70),
            0x1db4: ("v100-pcie-16gb", "GV100GL [Tesla V100 PCIe 16GB]", 70),
            0x20b0: ("a100-sxm-40gb", "GA100 [A100 SXM4 40GB]", 80),
            0x20b2: ("a100-sxm-80gb", "GA100 [A100 SXM4 80GB]", 80),
            0x2330: ("h100-sxm", "GH100 [H100 SXM5 80GB]", 90),
            0x2335: ("h200-sxm", "GH100 [H200 SXM 141GB]", 90),
            0x2901: ("b200", "GB100 [B200]", 100)}
# an sm that one GPU of the catalog has, apart from the Grace superchips (their dumps carry <c2c>, refused)
SM_ONLY = {100: "b200", 103: "b300"}
SM_FAMILY = {70: "V100: gpu=v100-sxm2-16gb, v100-sxm2-32gb or v100-pcie-16gb",
             80: "A100: gpu=a100-sxm-80gb or a100-sxm-40gb", 90: "H100 or H200: gpu=h100-sxm or h200-sxm"}
# NVLink GB/s per link per direction by sm: docs/data/interconnect_specs.csv rows 'NVLink 2 (V100)' 150 GB/s over
# 6 links, 'NVLink 3 (A100)' 300 over 12, 'NVLink 4 (H100/H200/GH200)' 450 over 18, 'NVLink 5 (B200/GB200)' 900 over 18
NVLINK_GEN = {70: (2, 25.0), 80: (3, 25.0), 90: (4, 25.0), 100: (5, 50.0), 103: (5, 50.0)}
# PCIe x16 GB/s per direction by link_speed GT/s: 4 and 5 as docs/data/interconnect_specs.csv rows 'PCIe 4 x16' (31)
# and 'PCIe 5 x16' (63), the catalog's figures; 1-3 and 6: GT/s x 16 lanes x encoding / 8 (8b/10b for 1.x-2.x,
# 128b/130b for 3.0, FLIT 242/256 for 6.0: PCI-SIG base specifications)
PCIE_X16 = {2.5: (1, 4.0), 5.0: (2, 8.0), 8.0: (3, 15.75), 16.0: (4, 31.0), 32.0: (5, 63.0), 64.0: (6, 121.0)}
NVLINK_LATENCY = "NVIDIA/nccl src/graph/tuning.cc hwLat NVLink ring LL (0.47 us), as the catalog's DGX clusters"
PCIE_LATENCY = "NVIDIA/nccl src/graph/tuning.cc hwLat PCI ring LL (1.0 us), as the catalog's clusters"


@dataclass
class Device:
    """A GPU or a network port of the dump: its element, attributes and the chain of elements above it."""

    attrs: dict
    path: list                      # ancestors, outermost first (system, cpu, pci, ...)
    pci: dict                       # its <pci> element's attributes ({} for a socket NIC under <cpu>)
    links: list = field(default_factory=list)   # a GPU's <nvlink> attribute dicts
    extra: list = field(default_factory=list)   # a GPU's other children (<c2c>)


@dataclass
class TopoImport:
    """One dump read: the cluster spec it gives with the fabric description, and a line per key."""

    path: str
    spec: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)
    refused: list = field(default_factory=list)
    sources: dict = field(default_factory=dict)   # the spec's [sources]: where each number comes from

    def mapped(self, key: str, what: str) -> None:
        self.lines.append(f"{PREFIX}: {key} -> {what}")

    def ignored(self, key: str, why: str) -> None:
        self.lines.append(f"{PREFIX}: {key} ignored ({why})")

    def refuse(self, key: str, why: str) -> None:
        self.refused.append(f"{key}: {why}")

    def check(self) -> TopoImport:
        """Itself, or InputError naming every refused key (a line each in ``refused``)."""
        if self.refused:
            err = InputError(f"{PREFIX}:{self.path}", " | ".join(self.refused),
                             "a node this importer maps (a cluster built without these would be wrong)")
            err.refused = [f"{PREFIX}: cannot honour {r}" for r in self.refused]
            raise err
        return self

    def toml(self, name: str | None = None) -> str:
        """The spec as a cluster TOML file (``topologies.catalog``), the lines as comments."""
        spec = dict(self.spec, name=name or self.spec["name"])
        out = [f"# written by topologies import {PREFIX}:{self.path}"] + [f"# {line}" for line in self.lines]
        out += [f"{k} = {_toml_value(spec[k])}" for k in ("name", "description", "gpu", "default_nodes")]
        for section in ("node", "fabric", "sources"):
            out += ["", f"[{section}]"] + [f"{json.dumps(k) if '.' in k else k} = {_toml_value(v)}"
                                           for k, v in spec.get(section, {}).items()]
        return "\n".join(out) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def split_name(text: str) -> tuple[str, dict[str, str]]:
    """``nccl-topo:PATH[:key=value,...]`` -> (PATH, options)."""
    rest = text[len(PREFIX) + 1:]
    head, sep, tail = rest.rpartition(":")
    if sep and "=" in tail and not Path(rest).exists():
        return head, variants.parse_options(tail)
    return rest, {}


def spec_of(text: str) -> dict:
    """The cluster spec a name ``nccl-topo:PATH[:key=value,...]`` gives (``topologies.catalog``)."""
    path, options = split_name(text)
    result = import_dump(path, options)
    result.spec["name"] = text
    return result.spec


def import_dump(path: str, options: dict | None = None) -> TopoImport:
    """Read the dump at ``path`` with the fabric description ``options`` (module doc)."""
    options = {k: str(v) for k, v in (options or {}).items()}
    result = TopoImport(path)
    root = _parse(path)
    gpus, nets = _walk(root, result)
    if not gpus:
        raise InputError(f"{PREFIX}:{path}", "no <gpu>", "a dump with the node's GPUs (NCCL writes a <gpu> under "
                         "each GPU's <pci>)")
    gpu = _gpu_model(gpus, options.get("gpu"), result)
    node = _node(gpus, result)
    _nics(gpus, nets, node, options, result)
    result.check()
    fabric = _fabric(nets, node, options, result)
    nodes = _nodes(options, result)
    spec = {"name": f"{PREFIX}:{path}", "gpu": gpu, "default_nodes": nodes, "node": node, "fabric": fabric,
            "description": f"{node['gpus']}x {gpu} ({node['builder']} node) read from the NCCL topology dump {path}, "
                           f"{node['nics']}x {node['nic_Gbps']:g} Gb/s NICs, {fabric['builder']} fabric"}
    spec["sources"] = dict(result.sources)
    rest = {k: v for k, v in options.items() if k not in OWN_KEYS and not (k in NIC_KEYS and not nets)}
    for key, value in rest.items():
        try:
            dotted = variants.resolve(spec, key)
        except InputError as err:
            raise InputError("cluster", key, f"a key of {PREFIX} ({', '.join(OWN_KEYS)}) or {err.allowed}") from None
        result.mapped(f"{key}={value}", f"{dotted} {value} (given)")
    result.spec = variants.apply(spec, rest, spec["name"]) if rest else spec
    result.spec["description"] = spec["description"] + (f" [given: {', '.join(f'{k}={v}' for k, v in rest.items())}]"
                                                        if rest else "")
    return result


def _parse(path: str) -> ET.Element:
    """The dump's root element, ``<system>``; one line for a file that is not one."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as err:
        raise InputError(PREFIX, path, f"a readable NCCL topology dump ({err.strerror})") from None
    if len(data) > MAX_BYTES:
        raise InputError(PREFIX, path, f"an NCCL topology dump of at most {MAX_BYTES // 2**20} MiB")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise InputError(PREFIX, path, "an NCCL topology dump: NCCL writes no DTD or entity")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        raise InputError(PREFIX, path, f"well-formed XML as NCCL_TOPO_DUMP_FILE writes it ({err})") from None
    if root.tag != "system":
        hint = " (this is NCCL_GRAPH_DUMP_FILE's graph dump)" if root.tag == "graphs" else ""
        raise InputError(PREFIX, path, f"an NCCL topology dump, whose root is <system>; this one's is <{root.tag}>"
                         + hint)
    return root


def _walk(root: ET.Element, result: TopoImport) -> tuple[list[Device], list[Device]]:
    """The GPUs and network ports of the dump, each with the elements above it; every other tag said."""
    gpus, nets, seen = [], [], {}
    hosts = {c.get("host_hash") for c in root.iter("cpu")}
    if len(hosts) > 1:
        result.refuse(f"cpu host_hash x{len(hosts)}", "a dump of several hosts (a fused multi-node NVLink dump); "
                      "give one node's dump")

    def visit(elem: ET.Element, path: list) -> None:
        if len(path) > MAX_DEPTH:
            raise InputError(f"{PREFIX}:{result.path}", f"<{elem.tag}> {len(path)} levels deep",
                             f"an NCCL topology dump (PCIe trees of at most {MAX_DEPTH} levels)")
        for child in elem:
            tag = child.tag
            if tag == "gpu":
                gpus.append(Device(dict(child.attrib), path + [elem], dict(elem.attrib),
                                   [dict(n.attrib) for n in child if n.tag == "nvlink"],
                                   [n.tag for n in child if n.tag != "nvlink"]))
            elif tag == "nic":
                for net in child:
                    if net.tag == "net" and net.get("net", "1") != "0":
                        nets.append(Device(dict(net.attrib), path + [elem, child],
                                           dict(elem.attrib) if elem.tag == "pci" else {}))
                    else:
                        seen[f"nic <{net.tag}>" + (" net 0" if net.tag == "net" else "")] = 1
            elif tag in ("pci", "cpu"):
                visit(child, path + [elem])
            else:
                seen[f"<{tag}>"] = seen.get(f"<{tag}>", 0) + 1

    visit(root, [])
    _say_ignored(root, seen, result)
    return sorted(gpus, key=lambda g: _int(g.attrs.get("dev"), 0)), nets


def _say_ignored(root: ET.Element, seen: dict, result: TopoImport) -> None:
    cpus = root.findall("cpu")
    if cpus:
        arch = sorted({c.get("arch", "?") for c in cpus})
        result.ignored(f"cpu x{len(cpus)} numaid affinity arch {','.join(arch)} vendor familyid modelid",
                       "host CPUs: the GPUs' collectives do not run on them")
    for tag, count in seen.items():
        why = ("a network device NCCL uses for collectives or GIN only (net=0)" if tag.startswith("nic")
               else "links between PCIe switches (NCCL's BCM Gen5 switch pairs): the node's shape is read from its "
               "GPUs' and NICs' places" if tag == "<pcilink>" else "not a tag the importer reads")
        result.ignored(f"{tag} x{count}", why)


def _int(text, default=None):
    try:
        return int(str(text), 0)
    except (TypeError, ValueError):
        return default


def _gpu_model(gpus: list[Device], given: str | None, result: TopoImport) -> str:
    sms = sorted({_int(g.attrs.get("sm"), -1) for g in gpus})
    ids = sorted({_int(g.pci.get("device"), -1) for g in gpus})
    shown = f"gpu x{len(gpus)} sm {','.join(map(str, sms))}" + (
        f" pci device {','.join(hex(i) for i in ids)}" if ids != [-1] else "")
    if given is not None:
        check_gpu(given)
        result.mapped(shown, f"gpu {given} (gpu={given} given)")
        return given
    if len(sms) > 1 or len(ids) > 1:
        result.refuse(shown, "GPUs of several kinds in one node; give gpu=KEY to price every one as KEY")
        return "h100-sxm"
    sm, dev = sms[0], ids[0]
    if dev in PCI_GPUS and PCI_GPUS[dev][2] == sm:
        key, name, _ = PCI_GPUS[dev]
        result.mapped(shown, f"gpu {key} (PCI ID 10de:{dev:04x} {name}: pci.ids)")
        return key
    if sm in SM_ONLY:
        result.mapped(shown, f"gpu {SM_ONLY[sm]} (the catalog's one GPU of sm {sm} without a Grace CPU)")
        return SM_ONLY[sm]
    if sm in SM_FAMILY:
        result.refuse(shown, f"sm {sm} is {SM_FAMILY[sm].split(':')[0]} and the PCI device id does not say which; "
                      f"give {SM_FAMILY[sm].split(': ')[1]}")
    else:
        result.refuse(shown, f"sm {sm} is no GPU of the catalog (known: sm {', '.join(map(str, sorted(NVLINK_GEN)))}); "
                      "give gpu=KEY (topologies list, perfmodel catalog) to price it as one")
    return "h100-sxm"


def _pcie(attrs: dict, what: str, result: TopoImport, say: bool = True) -> float:
    """GB/s per direction of a <pci> element's link (NCCL takes width 0 as 16: topo.cc ncclTopoAddPci)."""
    text = attrs.get("link_speed", "")
    try:
        speed = float(text.split()[0])
    except (IndexError, ValueError):
        speed = None
    width = _int(attrs.get("link_width"), 16) or 16
    unknown = speed not in PCIE_X16     # NCCL takes a rate it does not know as 8 GT/s (topo.cc kvDictPciGen)
    gen, x16 = PCIE_X16[8.0 if unknown else speed]
    rate = round(x16 * width / 16, 3)
    if say:
        result.mapped(f"{what} link_speed {text} link_width {attrs.get('link_width')}",
                      f"pcie_GBps {rate:g} (PCIe {gen} x{width}" + (", width 0 taken as 16 as NCCL does" if
                      attrs.get("link_width") == "0" else "") + (", an unknown rate taken as 8 GT/s as NCCL does"
                                                                 if unknown else "") + ")")
    return rate


def _node(gpus: list[Device], result: TopoImport) -> dict:
    """The node builder's arguments from the GPUs and their NVLinks."""
    for g in gpus:
        if "mlopart" in g.attrs:
            result.refuse(f"gpu dev {g.attrs.get('dev')} mlopart {g.attrs['mlopart']}", "GPU partitions (MLOPart) "
                          "are not modeled: one GPU is one rank here")
        if "c2c" in g.extra:
            result.refuse(f"gpu dev {g.attrs.get('dev')} c2c", "a Grace superchip's NVLink-C2C node (GB200/GB300 "
                          "tray): use the catalog's gb200-nvl72 or gb300-nvl72 and its variants")
    result.ignored("gpu dev rank gdr", "the GPUs are numbered by dev; ranks and GPUDirect support do not change "
                   "the node's links")
    sm = _int(gpus[0].attrs.get("sm"), -1)
    pcie = _pcie(gpus[0].pci, "gpu pci", result)
    kinds = {_link_kind(n.get("tclass", "")) for g in gpus for n in g.links}
    base = {"gpus": len(gpus)}
    if not kinds:
        return _pcie_node(gpus, pcie, result) | base
    gen = NVLINK_GEN.get(sm)
    if gen is None or len(kinds) > 1 or kinds - {"nvswitch", "gpu"}:
        result.refuse(f"nvlink tclass {','.join(sorted(n.get('tclass', '?') for n in gpus[0].links))}",
                      "NVLinks to an NVSwitch (tclass 0x068000) alone or to GPUs alone, on an sm of "
                      + ", ".join(map(str, sorted(NVLINK_GEN))) + " (NVLink to a CPU, POWER9, is not read)")
        return {"builder": "pcie", **base}
    if kinds == {"nvswitch"}:
        return _nvswitch_node(gpus, sm, gen, pcie, result) | base
    return _mesh_node(gpus, gen, pcie, result) | base


def _link_kind(tclass: str) -> str:
    if tclass == NVSWITCH_CLASS:
        return "nvswitch"
    return "gpu" if tclass.startswith("0x03") else tclass


def _nvswitch_node(gpus, sm, gen, pcie, result) -> dict:
    counts = [sum(_int(n.get("count"), 0) for n in g.links) for g in gpus]
    if len(set(counts)) > 1:
        result.refuse(f"nvlink count per GPU {','.join(map(str, counts))}", "every GPU with as many NVLinks to the "
                      "NVSwitches (a GPU with fewer has links down: fix the node, then dump again)")
    rate = counts[0] * gen[1]
    nvls = sm >= 90
    result.mapped(f"nvlink tclass {NVSWITCH_CLASS} count {counts[0]} per GPU",
                  f"node nvswitch, nvlink_GBps {rate:g} ({counts[0]} x {gen[1]:g} GB/s NVLink {gen[0]}), nvls "
                  + ("true (NVSwitch 3 and later: NVLink SHARP)" if nvls else "false (NVLink SHARP needs Hopper)"))
    result.sources.update({
        "node.nvlink_GBps": f"{PREFIX} {result.path}: {counts[0]} NVLinks per GPU to NVSwitch x {gen[1]:g} GB/s per "
                            f"link per direction (docs/data/interconnect_specs.csv NVLink {gen[0]})",
        "node.nvlink_latency_us": NVLINK_LATENCY, "node.pcie_GBps": f"{PREFIX} {result.path}: the GPUs' PCIe link",
        "node.pcie_latency_us": PCIE_LATENCY, "node.nvls": "third-generation NVSwitch (Hopper) and later reduce in "
                                                           "the switch (NVLink SHARP, NCCL's NVLS algorithm)"})
    return {"builder": "nvswitch", "nvlink_GBps": rate, "nvlink_latency_us": 0.47, "pcie_GBps": pcie,
            "pcie_latency_us": 1.0, "nvls": nvls}


def _mesh_node(gpus, gen, pcie, result) -> dict:
    bus = {g.pci.get("busid", "").lower(): i for i, g in enumerate(gpus)}
    pairs = {}
    for i, g in enumerate(gpus):
        for n in g.links:
            j = bus.get(n.get("target", "").lower())
            if j is not None and j != i:
                pairs[(i, j)] = pairs.get((i, j), 0) + _int(n.get("count"), 0)
    counts = {pairs.get((i, j), 0) for i in range(len(gpus)) for j in range(len(gpus)) if i != j}
    if len(counts) != 1 or 0 in counts:
        result.refuse(f"nvlink GPU-to-GPU counts {','.join(map(str, sorted(counts)))}", "every GPU pair on as many "
                      "direct NVLinks (a full mesh); a partial mesh (NVLink bridges, hybrid cube mesh) is no shape of "
                      "the node builders: write a cluster TOML (docs/contributing.md)")
        return {"builder": "full_mesh"}
    count = counts.pop()
    rate = count * gen[1]
    result.mapped(f"nvlink GPU-to-GPU count {count} per pair",
                  f"node full_mesh, gpu_gpu_GBps {rate:g} ({count} x {gen[1]:g} GB/s NVLink {gen[0]}), tier nvlink")
    result.sources.update({"node.gpu_gpu_GBps": f"{PREFIX} {result.path}: {count} NVLinks per GPU pair x "
                                                f"{gen[1]:g} GB/s (docs/data/interconnect_specs.csv NVLink {gen[0]})",
                      "node.link_latency_us": NVLINK_LATENCY, "node.pcie_latency_us": PCIE_LATENCY,
                      "node.pcie_GBps": f"{PREFIX} {result.path}: the GPUs' PCIe link"})
    return {"builder": "full_mesh", "gpu_gpu_GBps": rate, "link_latency_us": 0.47, "pcie_GBps": pcie,
            "pcie_latency_us": 1.0, "intra_tier": "nvlink"}


def _switch_of(dev: Device) -> int:
    """Index in ``dev.path`` of the PCIe switch (bridge) nearest above the device, or of its CPU."""
    for k in range(len(dev.path) - 1, -1, -1):
        elem = dev.path[k]
        if elem.tag == "cpu" or (elem.tag == "pci" and elem.get("class") == BRIDGE_CLASS):
            return k
    return 0


def _pcie_node(gpus, pcie, result) -> dict:
    groups: dict = {}
    for g in gpus:
        k = _switch_of(g)
        groups.setdefault(id(g.path[k]), (g.path[k], []))[1].append(g)
    sizes = sorted({len(v[1]) for v in groups.values()})
    if len(sizes) > 1:
        result.refuse(f"pci GPUs per PCIe switch {','.join(map(str, sizes))}", "as many GPUs behind every PCIe "
                      "switch (the pcie builder's shape)")
    first = next(iter(groups.values()))[0]
    if first.tag == "cpu":
        uplink, size, where = pcie, 1, "on the CPU's root ports"
    else:
        uplink, size = _pcie(dict(first.attrib), "pci switch", result, say=False), sizes[0]
        where = f"behind {len(groups)} PCIe switches"
    cpus = len({id(g.path[1]) for g in gpus if len(g.path) > 1})
    result.mapped(f"gpu x{len(gpus)} {where} (no NVLink)", f"node pcie, gpus_per_switch {size}, uplink_GBps "
                  f"{uplink:g}" + (f" (the {cpus} CPUs taken as one root complex: the link between them is not "
                                   "modeled)" if cpus > 1 else ""))
    result.sources.update({"node.pcie_GBps": f"{PREFIX} {result.path}: the GPUs' PCIe link",
                           "node.uplink_GBps": f"{PREFIX} {result.path}: the PCIe switches' upstream link",
                           "node.pcie_latency_us": PCIE_LATENCY})
    return {"builder": "pcie", "gpus_per_switch": size, "pcie_GBps": pcie, "pcie_latency_us": 1.0,
            "uplink_GBps": uplink}


def _common_depth(a: Device, b: Device) -> int:
    depth = 0
    for x, y in zip(a.path, b.path):
        if x is not y:
            break
        depth += 1
    return depth


def _nics(gpus, nets, node, options, result) -> None:
    """``nics`` and ``nic_Gbps`` from the network ports, and how they sit against the GPUs (rails)."""
    if not nets:
        if "nics" not in options or "nic_Gbps" not in options:
            result.refuse("net (none)", "the dump lists no network device (NCCL ran on one node without one): "
                          "give nics=N,nic_Gbps=R")
            node.update(nics=1, nic_Gbps=1.0)
            return
        try:
            node.update(nics=_int(options["nics"], 0), nic_Gbps=float(options["nic_Gbps"]))
        except ValueError:
            raise InputError("cluster.nic_Gbps", options["nic_Gbps"], "a rate in Gb/s") from None
        result.mapped(f"nics={options['nics']} nic_Gbps={options['nic_Gbps']}", "nics, nic_Gbps (given: the dump "
                      "has no network device)")
        return
    names = ",".join(n.attrs.get("name", "?") for n in nets)
    bad = [n.attrs.get("speed") for n in nets if _int(n.attrs.get("speed", "0")) is None]
    if bad:
        result.refuse(f"net speed {bad[0]!r}", "a whole number of Mb/s, as NCCL writes it")
        node.update(nics=len(nets), nic_Gbps=1.0)
        return
    speeds = sorted({_int(n.attrs.get("speed", "0")) for n in nets})
    if len(speeds) > 1:
        result.refuse(f"net speed {','.join(map(str, speeds))}", "every NIC port at one speed")
    mbps = speeds[0] if speeds[0] > 0 else 10000   # topo.cc ncclTopoAddNet: speed <= 0 taken as 10000 Mb/s
    node.update(nics=len(nets), nic_Gbps=mbps / 1000)
    result.mapped(f"net {names} speed {speeds[0]} x{len(nets)}", f"nics {len(nets)}, nic_Gbps {mbps / 1000:g}"
                  + (" (speed <= 0 taken as 10000 Mb/s, as NCCL does)" if speeds[0] <= 0 else ""))
    no_gdr = any(n.attrs.get("gdr") == "0" for n in nets if n.pci)
    result.ignored("net dev port guid maxconn latency" + ("" if no_gdr else " gdr"), "device numbers and limits: "
                   "the NIC rate and place set the links; the fabric's latency is latency_us=")
    if no_gdr:
        result.ignored("net gdr 0", "no GPUDirect RDMA: NCCL stages through host memory, the model prices the "
                       "NIC as GPUDirect, an optimistic bound")
    _rails(gpus, nets, node, result)
    result.sources.update({"node.nics": f"{PREFIX} {result.path}: {len(nets)} <net> ports ({names})",
                           "node.nic_Gbps": f"{PREFIX} {result.path}: net speed {mbps} Mb/s"})


def _rails(gpus, nets, node, result) -> None:
    """Which GPUs share a PCIe switch with each NIC, against the builder's placement (NIC j on GPU j*gpus//nics)."""
    near = []
    for n in nets:
        depth = {i: _common_depth(n, g) for i, g in enumerate(gpus)}
        best = max(depth.values())
        share = best > 0 and n.path[best - 1].tag == "pci"
        near.append(sorted(i for i, d in depth.items() if d == best) if share else [])
    switches = len({id(g.path[_switch_of(g)]) for g in gpus})
    order = sorted(range(len(nets)), key=lambda j: (near[j][:1] or [len(gpus)], _int(nets[j].attrs.get("dev"), j)))
    shown = "; ".join(f"{nets[j].attrs.get('name', j)}: GPU {','.join(map(str, near[j])) or 'none (on the CPU)'}"
                      for j in order)
    if node["builder"] == "pcie":
        what = "NICs on the CPU root complex (the pcie builder's place)"
    else:
        fits = all(r * len(gpus) // len(nets) in near[j] for r, j in enumerate(order))
        what = (f"rails 0-{len(nets) - 1}, NIC j on GPU j*{len(gpus)}//{len(nets)}'s PCIe switch, as here"
                if fits else f"NIC j on GPU j*{len(gpus)}//{len(nets)}'s PCIe link (the builder's place; here "
                "not every NIC shares a PCIe switch with that GPU, so the model's GPU-NIC path is shorter)")
    result.mapped(f"nic affinity ({switches} PCIe switches) {shown}", what)


def _fabric(nets, node, options, result) -> dict:
    """The fabric builder's arguments: the description's ``fabric=`` and defaults for the keys it takes."""
    default = "rail_optimized" if node["nics"] >= node["gpus"] > 1 else "fat_tree"   # DGX SuperPOD: a rail a GPU
    name = options.get("fabric", default).replace("-", "_")
    if name not in FABRIC_BUILDERS:
        raise InputError("cluster.fabric", options.get("fabric"),
                         "one of " + ", ".join(k.replace("_", "-") for k in FABRIC_BUILDERS))
    params = inspect.signature(FABRIC_BUILDERS[name]).parameters
    ib = any(n.pci.get("class", "").startswith("0x0207") for n in nets)
    rate = node["nic_Gbps"]
    radix, radix_src = ((40, "NVIDIA Quantum QM8700 HDR switch: 40 ports (datasheet), as catalog dgx-a100")
                        if ib and rate <= 200 else
                        (64, "NVIDIA Quantum-2 QM9700 NDR switch: 64 ports (datasheet), as catalog dgx-h100" if ib
                         else "assumption: a 64-port switch (NVIDIA Spectrum-4 SN5600: 64 ports of 800 GbE)"))
    defaults = {"radix": (radix, radix_src),
                "link_Gbps": (rate, "the NICs' rate: the fabric built for its NICs, as the catalog's"),
                "latency_us": (0.6, "docs/data/interconnect_specs.csv row 'InfiniBand latency HDR' (0.6 us), as "
                                    "catalog dgx-a100 and dgx-h100; an assumption for other networks"),
                "oversubscription": (1.0, "full bisection unless oversubscription= says otherwise"),
                "tier_prefix": ("ib" if ib else "eth", "the NICs' PCI class: 0x0207 InfiniBand, else Ethernet")}
    fabric = {"builder": name}
    for key, (value, why) in defaults.items():
        if key in params:
            fabric[key] = value
            result.sources[f"fabric.{key}"] = why
    socket = bool(nets) and all(not n.pci for n in nets)
    transport = options.get("transport", "socket" if socket else "rdma")
    if transport != "rdma":
        fabric["transport"] = transport
    sharp = options.get("sharp", "true" if any(n.attrs.get("coll") == "1" for n in nets) else "false")
    if sharp.lower() not in ("true", "false"):
        raise InputError("cluster.sharp", sharp, "true or false")
    if sharp.lower() == "true":
        fabric["sharp"] = True
    given = "fabric=" + options["fabric"] if "fabric" in options else "fabric (not in the dump)"
    result.mapped(given, f"fabric {name}, " + ", ".join(f"{k} {v}" for k, v in fabric.items() if k != "builder")
                  + (" (defaults; any builder argument as key=value)" if "fabric" not in options else ""))
    return fabric


def _nodes(options: dict, result: TopoImport) -> int:
    text = options.get("nodes", "1")
    nodes = _int(text)
    if nodes is None or not 1 <= nodes <= MAX_NODES:
        raise InputError("cluster.nodes", text, f"an integer from 1 to {MAX_NODES}")
    result.mapped(f"nodes={text}" if "nodes" in options else "nodes (not in the dump)",
                  f"default_nodes {nodes}" + ("" if "nodes" in options else " (one dump is one node; give nodes=N "
                                                                            "or --nodes)"))
    return nodes
