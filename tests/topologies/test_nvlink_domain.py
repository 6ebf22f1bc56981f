"""The NVLink domain that spans hosts (GB200/GB300 NVL72): its facts, its placement, its routes."""
import pytest

from topologies import build_cluster, catalog_names, cluster_for, fabric_view, place
from topologies.attrs import DOMAIN, KIND
from topologies.describe import describe
from topologies.errors import InputError
from topologies.fabricview import _pattern, inter_flows, intra_flows, pattern_by_flow, ring_flows
from topologies.routing import template_parts

NVL72 = ("gb200-nvl72", "gb300-nvl72")


@pytest.mark.parametrize("name", NVL72)
def test_a_rack_is_one_domain_of_72_gpus_on_18_hosts_of_4(name):
    c = build_cluster(name)
    assert (c.hosts, c.gpus_per_host, c.hosts_per_domain, c.gpus_per_domain, c.domains) == (18, 4, 18, 72, 1)
    assert {c.locate(c.gpu(g))[0] for g in range(c.gpus)} == {0} and set(c.host_of.values()) == set(range(18))
    two = build_cluster(name, nodes=36)
    assert (two.domains, two.gpus_per_domain) == (2, 72)
    assert two.locate(two.gpu(71))[0] == 0 and two.locate(two.gpu(72))[0] == 1
    assert two.host_of[two.gpu(72)] == 18


def test_every_host_keeps_its_own_nics_and_cpus():
    c = build_cluster("gb200-nvl72")
    for h in range(c.hosts):
        kinds = [d[KIND] for n, d in c.graph.nodes(data=True) if d.get("host") == h]
        assert kinds.count("gpu") == 4 and kinds.count("nic") == 4 and kinds.count("cpu") == 2
    switches = [n for n, d in c.graph.nodes(data=True) if d[KIND] == "nvswitch"]
    assert switches == ["d0.nvsw"] and c.graph.nodes["d0.nvsw"][DOMAIN] == 0
    assert c.nic_rate_per_host_Bps == pytest.approx(4 * 400e9 / 8)


def test_the_domain_switch_reaches_every_gpu_of_the_rack_in_one_hop():
    c = build_cluster("gb200-nvl72")
    assert all(c.graph.has_edge(c.gpu(g), "d0.nvsw") for g in range(c.gpus))
    assert c.graph.edges[c.gpu(0), "d0.nvsw"]["tier"] == "nvlink"


@pytest.mark.parametrize("name", [n for n in catalog_names() if n not in NVL72])
def test_every_other_cluster_s_domain_is_its_host(name):
    c = build_cluster(name, nodes=2)
    assert (c.hosts_per_domain, c.gpus_per_domain, c.domains) == (1, c.gpus_per_host, c.hosts)
    v = fabric_view(c)
    assert (v.domains, v.ranks_per_domain) == (v.hosts, v.ranks_per_host)


def test_locate_and_name_in_are_inverse():
    c = build_cluster("gb200-nvl72", nodes=36)
    for name in ("h0.gpu0", "h17.nic3", "h18.gpu0", "h35.cpu1", "d1.nvsw"):
        domain, template = c.locate(name)
        assert c.name_in(template, domain) == name
    assert c.locate("h20.gpu2") == (1, "h2.gpu2") and c.locate("d1.nvsw") == (1, "d0.nvsw")


def test_a_job_fills_a_domain_before_the_next():
    built, ranks = cluster_for("gb200-nvl72", gpus=64)
    assert (built.hosts, built.domains, ranks) == (16, 1, 64)        # 16 trays of one rack
    built, ranks = cluster_for("gb200-nvl72", gpus=256)
    assert (built.hosts, built.domains, ranks) == (72, 4, 256)       # 3 full racks and 40 GPUs of a 4th
    gpus = place(built, ranks)
    assert [sum(1 for g in gpus if g // built.gpus_per_domain == d) for d in range(4)] == [72, 72, 72, 40]
    assert cluster_for("gb200-nvl72", gpus=72)[0].hosts == 18


def test_a_host_count_past_one_domain_is_whole_domains():
    assert build_cluster("gb200-nvl72", nodes=54).domains == 3
    with pytest.raises(InputError, match="whole NVLink domains") as err:
        build_cluster("gb200-nvl72", nodes=20)
    assert err.value.field == "nodes"
    with pytest.raises(InputError, match="whole NVLink domains"):
        build_cluster("gb200-nvl72", gpus=80)


def test_the_domain_s_ranks_are_one_level_for_the_patterns():
    """64 GPUs on 16 trays: one domain, so no inter-domain pattern and a flat ring on NVLink."""
    c = build_cluster("gb200-nvl72", nodes=16)
    v = fabric_view(c)
    assert (v.domains, v.ranks_per_domain, v.hosts, v.ranks_per_host) == (1, 64, 16, 4)
    assert v.inter is None and v.ring.bottleneck_tier == "nvlink"
    assert dict(v.ring.traversals) == pytest.approx({"nvlink": 2.0})     # GPU, switch, GPU: no NIC, no CPU


def test_two_racks_cross_the_fabric_between_domains_only():
    c = build_cluster("gb200-nvl72", nodes=36)
    v = fabric_view(c)
    assert (v.domains, v.ranks_per_domain, v.hosts) == (2, 72, 36)
    assert v.intra.bottleneck_tier == "nvlink"
    assert v.inter.bottleneck_tier.startswith("ib")
    assert "ib-leaf" in dict(v.ring.traversals) and "c2c" not in dict(v.ring.traversals)


def test_grace_cpus_are_shown_but_never_routed():
    c = build_cluster("gb200-nvl72")
    assert "c2c" in c.tiers
    assert not any(n.split(".")[1].startswith("cpu") for n in template_parts(c))


@pytest.mark.parametrize("nodes", [16, 36])
def test_domain_symmetric_loads_equal_flow_by_flow_routing(nodes):
    c = build_cluster("gb200-nvl72", nodes=nodes)
    gpus = c.gpus
    layouts = ([tuple(range(gpus))], [tuple(range(k * 8, k * 8 + 8)) for k in range(gpus // 8)],
               [tuple(range(j, gpus, 8)) for j in range(8)])
    for groups in layouts:
        for make in (ring_flows, intra_flows, inter_flows):
            a, b = _pattern(c, groups, make), pattern_by_flow(c, groups, make)
            assert a.bottleneck_tier == b.bottleneck_tier
            assert a.bandwidth_Bps == pytest.approx(b.bandwidth_Bps, rel=1e-9)
            assert dict(a.traversals) == pytest.approx(dict(b.traversals), rel=1e-9)


def test_show_reports_the_domain():
    info = describe(build_cluster("gb300-nvl72", nodes=36))
    assert (info["nodes_per_nvlink_domain"], info["gpus_per_nvlink_domain"], info["nvlink_domains"]) == (18, 72, 2)
    assert info["nvls"] and not info["sharp"]
    assert info["oversubscription_measured"] == pytest.approx(1.0)    # the cut crosses the fabric, not NVLink
    assert describe(build_cluster("gb300-nvl72"))["oversubscription_measured"] is None


def test_nvls_is_a_fact_of_the_domain_switch():
    assert build_cluster("gb200-nvl72").supports_nvls
    assert build_cluster("dgx-b200").supports_nvls and not build_cluster("dgx-a100").supports_nvls


def test_sharp_is_declared_by_the_cluster_file(tmp_path):
    with open(_catalog_path("dgx-b200")) as f:
        spec_text = f.read()
    good, bad = tmp_path / "sharp.toml", tmp_path / "bad.toml"     # two paths: specs are cached by path
    good.write_text(spec_text.replace("sharp = false", "sharp = true"))
    assert build_cluster(str(good)).supports_sharp and not build_cluster("dgx-b200").supports_sharp
    bad.write_text(spec_text.replace("sharp = false", 'sharp = "yes"'))
    with pytest.raises(InputError) as err:
        build_cluster(str(bad))
    assert err.value.field == "fabric.sharp"


def _catalog_path(name: str) -> str:
    from importlib import resources

    return str(resources.files("topologies") / "catalog" / f"{name}.toml")
