"""``topologies``: list, show, export and draw the clusters of the catalog (or a TOML file); import a
cluster from an NCCL topology dump (``topologies.nccl_topo``)."""
from __future__ import annotations

import argparse
from pathlib import Path

from topologies import nccl_topo
from topologies.catalog import catalog_names, load_spec, validate_spec
from topologies.clikit import Parser, atomic_write, check_gpu, check_writable, dump_json, run, table
from topologies.cluster import build_cluster
from topologies.describe import describe
from topologies.errors import InputError
from topologies.export import FORMATS, export
from topologies.units import Bps_to_GBps

CLUSTER_HELP = ("a catalog name (see 'topologies list'), the path of a cluster TOML file, or "
                "nccl-topo:DUMP.xml[:nodes=N,...] (an NCCL topology dump: topologies import --help)")
IMPORT_EPILOG = """examples:
  NCCL_TOPO_DUMP_FILE=topo.xml all_reduce_perf -b 8 -e 8 -g 8      (any NCCL job writes the dump)
  topologies import nccl-topo:topo.xml --nodes 16
  topologies import nccl-topo:topo.xml:fabric=fat-tree,oversubscription=2 --nodes 64 -o mycluster.toml

then: perfmodel predict --cluster nccl-topo:topo.xml:nodes=16 ... (or --cluster mycluster.toml)
keys after the file: nodes, fabric (rail-optimized, fat-tree, single-switch, ...), gpu (a GPU catalog key, where
the dump's sm and PCI id do not say it), transport (rdma, socket), sharp (true, false), nics and nic_Gbps (where
the dump lists no NIC), and any argument of the node or fabric builder (radix, link_Gbps, latency_us, ...)
"""


def _parser() -> Parser:
    p = Parser(prog="topologies", description="Clusters as graphs: GPU nodes, fabrics, tiers. "
               "Every catalog number cites its source; 'show --json' prints them.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    sub.add_parser("list", help="the clusters of the catalog").add_argument("--json", action="store_true")
    for name, text in (("show", "describe a cluster: GPUs, node shape, tiers, bisection"),
                       ("export", "write the cluster graph as GraphML or JSON"),
                       ("draw", "draw the cluster to a PNG")):
        s = sub.add_parser(name, help=text, description=text)
        s.add_argument("cluster", help=CLUSTER_HELP)
        s.add_argument("--nodes", type=int, help="number of nodes, i.e. hosts (an NVL72 compute tray is one; past one "
                       "NVLink domain, whole domains); default: the catalog's")
        if name == "show":
            s.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if name == "export":
            s.add_argument("--format", choices=FORMATS, default="graphml")
            s.add_argument("-o", "--output", required=True, help="file to write (atomically)")
        if name == "draw":
            s.add_argument("-o", "--output", required=True, help="PNG file to write")
    _add_import(sub)
    return p


def _add_import(sub) -> None:
    text = ("read an NCCL topology dump (NCCL_TOPO_DUMP_FILE) and a fabric description: print how each key maps "
            "(or why it is ignored or refused) and the cluster; -o writes it as a cluster TOML")
    s = sub.add_parser("import", help="a cluster from an NCCL topology dump", description=text,
                       epilog=IMPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("source", metavar="nccl-topo:FILE[:key=value,...]",
                   help="the dump NCCL wrote, then the fabric description (keys below)")
    s.add_argument("--nodes", type=int, help="number of nodes the cluster has (the dump is one); default 1")
    s.add_argument("--fabric", help="the network between the nodes: a fabric builder (rail-optimized, fat-tree, "
                   "single-switch, ...); default rail-optimized with a NIC per GPU, else fat-tree")
    s.add_argument("-o", "--output", help="write the cluster TOML there (for --cluster FILE.toml)")
    s.add_argument("--json", action="store_true", help="the cluster spec and the lines as JSON")


def _list(args) -> None:
    rows = []
    for name in catalog_names():
        spec, _ = load_spec(name)
        rows.append((name, spec["gpu"], spec["node"]["builder"], spec["fabric"]["builder"],
                     spec["description"]))
    if args.json:
        print(dump_json([dict(zip(("name", "gpu", "node", "fabric", "description"), r)) for r in rows]))
    else:
        print(table(("name", "gpu", "node", "fabric", "description"), rows))


def _cluster(args):
    """The cluster of the arguments, its GPU one the model knows (``clikit.check_gpu``, as perfmodel checks it)."""
    check_gpu(load_spec(args.cluster)[0]["gpu"])      # before the graph is built
    return build_cluster(args.cluster, nodes=args.nodes)


def _show(args) -> None:
    info = describe(_cluster(args))
    if args.json:
        print(dump_json(info))
        return
    print(f"{info['name']}: {info['description']}")
    print(f"  {info['nodes']} nodes x {info['gpus_per_node']} {info['gpu']} = {info['gpus']} GPUs; "
          f"node: {info['node_builder']}, fabric: {info['fabric_builder']}, "
          f"NICs {Bps_to_GBps(info['nic_bandwidth_per_node_Bps']):.1f} GB/s per node"
          + (", NVLS" if info["nvls"] else "") + (", SHARP" if info["sharp"] else ""))
    if info["nodes_per_nvlink_domain"] > 1:
        print(f"  NVLink domain: {info['gpus_per_nvlink_domain']} GPUs = {info['nodes_per_nvlink_domain']} nodes x "
              f"{info['gpus_per_node']} (each node its own NICs); domains: {info['nvlink_domains']}")
    rows = [(t, v["links"], Bps_to_GBps(v["min_bandwidth_Bps"]), Bps_to_GBps(v["max_bandwidth_Bps"]),
             v["latency_s"] * 1e6) for t, v in info["tiers"].items()]
    print(table(("tier", "links", "min GB/s", "max GB/s", "latency us"), rows))
    if info["bisection_bandwidth_Bps"]:
        measured = info["oversubscription_measured"]
        print(f"bisection bandwidth: {Bps_to_GBps(info['bisection_bandwidth_Bps']):.1f} GB/s per direction; "
              f"oversubscription: configured {info['oversubscription_configured']:g}, "
              + (f"measured {measured:.2f}" if measured is not None
                 else "not measured (the cut is inside one NVLink domain)"))


def _import(args) -> None:
    """``topologies import nccl-topo:FILE``: the lines, the cluster, and its TOML where -o names a file."""
    if not args.source.startswith(f"{nccl_topo.PREFIX}:"):
        raise InputError("source", args.source, f"{nccl_topo.PREFIX}:FILE[:key=value,...] (an NCCL topology dump)")
    if args.output:
        check_writable(args.output)
    path, options = nccl_topo.split_name(args.source)
    for key, value in (("nodes", args.nodes), ("fabric", args.fabric)):
        if value is not None:
            if key in options:
                raise InputError(key, value, f"given once: {key}={options[key]} is in {args.source}")
            options[key] = str(value)
    result = nccl_topo.import_dump(path, options)     # every refusal at once, in one line
    spec = validate_spec(dict(result.spec))
    check_gpu(spec["gpu"])
    if args.output:
        atomic_write(args.output, lambda h: h.write(result.toml(Path(args.output).stem).encode()))
    if args.json:
        print(dump_json({"spec": spec, "lines": result.lines}))
        return
    print("\n".join(result.lines))
    node = spec["node"]
    print(f"cluster: {spec['default_nodes']} nodes x {node['gpus']} {spec['gpu']}, node {node['builder']}, "
          f"{node['nics']} x {node['nic_Gbps']:g} Gb/s NICs, fabric {spec['fabric']['builder']}"
          + (f"; written to {args.output}" if args.output else " (-o FILE.toml writes it)"))


PICTURES = (".png", ".svg", ".pdf")


def check_picture(path: str) -> None:
    """A drawing's file name ends with a picture format matplotlib writes."""
    if not path.lower().endswith(PICTURES):
        raise InputError("output", path, "a picture file ending in " + ", ".join(PICTURES))


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "list":
        _list(args)
    elif args.command == "show":
        _show(args)
    elif args.command == "export":
        check_writable(args.output)
        print(export(_cluster(args), args.output, args.format))
    elif args.command == "import":
        _import(args)
    elif args.command == "draw":
        from topologies.draw import draw  # matplotlib loads only when drawing

        check_writable(args.output)
        check_picture(args.output)
        print(draw(_cluster(args), args.output))
    return 0


def entry() -> None:
    raise SystemExit(run(main))
