"""``topologies``: list, show, export and draw the clusters of the catalog (or a TOML file)."""
from __future__ import annotations

from topologies.catalog import catalog_names, load_spec
from topologies.clikit import Parser, check_gpu, check_writable, dump_json, run, table
from topologies.cluster import build_cluster
from topologies.describe import describe
from topologies.errors import InputError
from topologies.export import FORMATS, export
from topologies.units import Bps_to_GBps

CLUSTER_HELP = "a catalog name (see 'topologies list') or the path of a cluster TOML file"


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
    return p


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
    elif args.command == "draw":
        from topologies.draw import draw  # matplotlib loads only when drawing

        check_writable(args.output)
        check_picture(args.output)
        print(draw(_cluster(args), args.output))
    return 0


def entry() -> None:
    raise SystemExit(run(main))
