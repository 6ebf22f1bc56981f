"""A cluster from an NCCL topology dump (topologies.nccl_topo): the dumps under data/nccl_topo are written in
the format of NVIDIA/nccl src/graph/xml.cc (DGX A100-like, DGX H100-like, a PCIe-only box)."""
import json
from pathlib import Path

import pytest

from topologies.catalog import load_spec
from topologies.cluster import build_cluster
from topologies.errors import InputError
from topologies.nccl_topo import import_dump, split_name

DATA = Path(__file__).parent / "data" / "nccl_topo"
A100, H100, PCIE = (str(DATA / f) for f in ("dgx_a100_like.xml", "dgx_h100_like.xml", "pcie_4gpu.xml"))


def _variant(tmp_path, source: str, *edits) -> str:
    """A copy of ``source`` with each (old, new, count) text replaced (count -1: every one)."""
    text = Path(source).read_text()
    for old, new, count in edits:
        assert old in text, old
        text = text.replace(old, new, count)
    path = tmp_path / "dump.xml"
    path.write_text(text)
    return str(path)


def _refusal(path: str, options=None) -> InputError:
    with pytest.raises(InputError) as info:
        import_dump(path, options)
    assert "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize("dump, catalog", [(A100, "dgx-a100"), (H100, "dgx-h100")])
def test_dgx_dumps_map_to_the_catalog_clusters_parameters(dump, catalog):
    spec = import_dump(dump, {"nodes": "2"}).spec
    expected = load_spec(catalog)[0]
    assert spec["gpu"] == expected["gpu"]
    assert spec["node"] == expected["node"]
    assert spec["fabric"] == expected["fabric"]


def test_a_vm_dump_of_b200_reads_as_dgx_b200(tmp_path):
    """In a VM NVML hides the NVSwitches: NCCL writes one row per GPU to ``fffffff:ff:ff.0``, assumed an NVSwitch
    (xml.cc ncclTopoGetXmlFromGpu)."""
    text = Path(H100).read_text().replace('sm="90"', 'sm="100"').replace('device="0x2330"', 'device="0x2901"')
    rows = [line for line in text.splitlines(keepends=True) if "<nvlink" in line]
    for row in rows:
        text = text.replace(row, row.replace('target="0000:0a:00.0" count="5"', 'target="fffffff:ff:ff.0" count="18"')
                            if "0000:0a:00.0" in row else "", 1)
    path = tmp_path / "b200.xml"
    path.write_text(text)
    spec = import_dump(str(path)).spec
    expected = load_spec("dgx-b200")[0]
    assert spec["gpu"] == "b200" and spec["node"] == expected["node"]
    assert {k: v for k, v in expected["fabric"].items() if k != "sharp"} == spec["fabric"]


def test_dgx_a100_lines_say_every_key():
    lines = "\n".join(import_dump(A100).lines)
    assert "gpu a100-sxm-80gb (PCI ID 10de:20b2" in lines
    assert "count 12 per GPU -> node nvswitch, nvlink_GBps 300 (12 x 25 GB/s NVLink 3), nvls false" in lines
    assert "speed 200000 x8 -> nics 8, nic_Gbps 200" in lines
    assert "(4 PCIe switches) mlx5_0: GPU 0,1; mlx5_1: GPU 0,1; mlx5_2: GPU 2,3" in lines
    assert "-> rails 0-7" in lines and "pcie_GBps 31 (PCIe 4 x16)" in lines
    assert "cpu x2 numaid affinity arch x86_64 vendor familyid modelid ignored" in lines
    assert all(line.startswith("nccl-topo: ") for line in lines.splitlines())


def test_pcie_box_is_a_pcie_node_on_sockets():
    result = import_dump(PCIE, {"nodes": "4"})
    node, fabric = result.spec["node"], result.spec["fabric"]
    assert result.spec["gpu"] == "v100-pcie-16gb" and result.spec["default_nodes"] == 4
    assert node == {"builder": "pcie", "gpus": 4, "gpus_per_switch": 2, "pcie_GBps": 15.75, "pcie_latency_us": 1.0,
                    "uplink_GBps": 15.75, "nics": 1, "nic_Gbps": 25.0}
    assert fabric["builder"] == "fat_tree" and fabric["transport"] == "socket" and fabric["tier_prefix"] == "eth"
    cluster = build_cluster(f"nccl-topo:{PCIE}:nodes=4")
    assert cluster.gpus == 16 and cluster.node_builder == "pcie" and cluster.spec["fabric"]["transport"] == "socket"


def test_a_cluster_name_goes_wherever_a_cluster_does():
    cluster = build_cluster(f"nccl-topo:{H100}:nodes=4,fabric=fat-tree,oversubscription=2")
    assert cluster.gpus == 32 and cluster.fabric_builder == "fat_tree"
    assert cluster.spec["fabric"]["oversubscription"] == 2.0
    assert build_cluster(f"nccl-topo:{H100}", nodes=3).gpus == 24          # --nodes over the default (1)
    assert split_name(f"nccl-topo:{A100}:nodes=2") == (A100, {"nodes": "2"})
    assert split_name(f"nccl-topo:{A100}") == (A100, {})
    with pytest.raises(InputError, match="a key of nccl-topo"):
        build_cluster(f"nccl-topo:{H100}:racks=2")


def test_imported_dgx_h100_predicts_as_the_catalogs():
    from perfmodel.prediction import predict

    kw = {"gpus": 16, "tp": 8, "gbs": 16}
    catalog = predict("gpt3-1.3b", "dgx-h100", **kw).step_time_s
    imported = predict("gpt3-1.3b", f"nccl-topo:{H100}:nodes=2", **kw).step_time_s
    assert imported == pytest.approx(catalog, rel=0.02)


def test_malformed_xml_and_other_files_are_one_line(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text('<system version="1">\n  <cpu numaid="0">\n')
    assert "well-formed XML" in str(_refusal(str(bad)))
    bad.write_text('<graphs version="1"><graph id="0"/></graphs>')
    assert "NCCL_GRAPH_DUMP_FILE" in str(_refusal(str(bad)))
    bad.write_text('<!DOCTYPE x [<!ENTITY a "aaaa">]><system>&a;</system>')
    assert "no DTD" in str(_refusal(str(bad)))
    assert "readable" in str(_refusal(str(tmp_path / "missing.xml")))
    bad.write_text('<system version="1"><cpu numaid="0"/></system>')
    assert "no <gpu>" in str(_refusal(str(bad)))


def test_unknown_or_ambiguous_gpu_asks_for_gpu_key(tmp_path):
    err = _refusal(_variant(tmp_path, H100, ('sm="90"', 'sm="75"', -1)))
    assert "sm 75 is no GPU of the catalog" in str(err) and "gpu=KEY" in str(err)
    path = _variant(tmp_path, A100, ('device="0x20b2"', 'device="0x20b1"', -1))
    assert "give gpu=a100-sxm-80gb or a100-sxm-40gb" in str(_refusal(path))
    assert import_dump(path, {"gpu": "a100-sxm-40gb"}).spec["gpu"] == "a100-sxm-40gb"
    with pytest.raises(InputError, match="gpu='nope'"):
        import_dump(path, {"gpu": "nope"})


def test_every_refusal_at_once(tmp_path):
    path = _variant(tmp_path, H100, ('speed="400000"', 'speed="200000"', 1),
                    ('count="5" tclass="0x068000"/>', 'count="3" tclass="0x068000"/>', 1),
                    ('<gpu dev="7" sm="90" rank="7" gdr="1">', '<gpu dev="7" sm="90" rank="7" gdr="1">\n'
                     '          <c2c bw="40000" count="10"/>', 1))
    err = _refusal(path)
    assert len(err.refused) == 3
    assert any("net speed 200000,400000" in r for r in err.refused)
    assert any("nvlink count per GPU 16,18" in r for r in err.refused)
    assert any("c2c" in r and "gb200-nvl72" in r for r in err.refused)
    assert "a whole number of Mb/s" in str(_refusal(_variant(tmp_path, A100, ('speed="200000"', 'speed="fast"', 1))))


def _mesh_dump(count_of) -> str:
    """A 4-GPU A100 SXM4 80GB board whose GPUs link to each other directly (``count_of(i, j)`` NVLinks),
    one 200 Gb/s InfiniBand NIC per pair of GPUs."""
    buses = [f"0000:{0x21 + i:02x}:00.0" for i in range(4)]
    pcis = []
    for i, bus in enumerate(buses):
        links = "".join(f'<nvlink target="{t}" count="{count_of(i, j)}" tclass="0x030200"/>'
                        for j, t in enumerate(buses) if j != i)
        pcis.append(f'<pci busid="{bus}" class="0x030200" vendor="0x10de" device="0x20b2" link_speed="16.0 GT/s PCIe" '
                    f'link_width="16"><gpu dev="{i}" sm="80" rank="{i}" gdr="1">{links}</gpu></pci>')
        if i % 2:
            pcis.append(f'<pci busid="0000:{0x31 + i:02x}:00.0" class="0x020700" vendor="0x15b3" device="0x101b" '
                        f'link_speed="16.0 GT/s PCIe" link_width="16"><nic><net name="mlx5_{i // 2}" dev="{i // 2}" '
                        'speed="200000" port="1" latency="0.000000" guid="0x1" maxconn="131072" gdr="1"/></nic></pci>')
    return ('<system version="1"><cpu numaid="0" affinity="ff" arch="x86_64" vendor="AuthenticAMD" familyid="23" '
            'modelid="49"><pci busid="0000:20:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">'
            + "".join(pcis) + "</pci></cpu></system>")


def test_full_nvlink_mesh_and_partial_mesh(tmp_path):
    path = tmp_path / "mesh.xml"
    path.write_text(_mesh_dump(lambda i, j: 4))
    result = import_dump(str(path))
    node = result.spec["node"]
    assert node["builder"] == "full_mesh" and node["gpus"] == 4 and node["gpu_gpu_GBps"] == 100.0
    assert node["intra_tier"] == "nvlink" and node["nics"] == 2 and result.spec["fabric"]["builder"] == "fat_tree"
    assert build_cluster(f"nccl-topo:{path}:nodes=2").gpus == 8
    path.write_text(_mesh_dump(lambda i, j: 4 if i // 2 == j // 2 else 0))     # two NVLink-bridged pairs
    assert "partial mesh" in str(_refusal(str(path)))


def test_cli_import_writes_a_cluster_toml(cli, tmp_path):
    out = tmp_path / "mine.toml"
    proc = cli("topologies", "import", f"nccl-topo:{H100}", "--nodes", "16", "-o", str(out), check_rc=0)
    assert "nccl-topo: nvlink tclass 0x068000 count 18 per GPU" in proc.stdout
    assert "cluster: 16 nodes x 8 h100-sxm" in proc.stdout
    spec, _ = load_spec(str(out))
    assert spec["name"] == "mine" and spec["default_nodes"] == 16
    assert spec["node"] == load_spec("dgx-h100")[0]["node"]
    data = json.loads(cli("topologies", "import", f"nccl-topo:{PCIE}:fabric=single-switch", "--json",
                          check_rc=0).stdout)
    assert data["spec"]["fabric"]["builder"] == "single_switch" and data["lines"]
    out = cli("perfmodel", "predict", "--model", "gpt3-1.3b", "--cluster", f"nccl-topo:{H100}:nodes=2", "--gpus", "16",
              "--tp", "8", check_rc=0).stdout
    assert "16 x h100-sxm" in out
    for args in ((f"nccl-topo:{tmp_path / 'none.xml'}",), (f"nccl-topo:{H100}:gpu=nope",), (H100,),
                 (f"nccl-topo:{H100}:nodes=2", "--nodes", "3")):
        proc = cli("topologies", "import", *args)
        assert proc.returncode == 2, args
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
