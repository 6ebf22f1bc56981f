"""Cluster variants BASE:key=value,... and grids of them (topologies.variants)."""
import pytest

from topologies import build_cluster, load_spec
from topologies.errors import InputError
from topologies.catalog import grid_names


def test_a_variant_changes_the_builder_arguments_and_keeps_the_node_shape():
    spec, origin = load_spec("dgx-a100:gpus_per_node=4,nic_gbps=400,oversubscription=2")
    assert origin == "catalog:dgx-a100 (variant)" and spec["name"].startswith("dgx-a100:")
    assert (spec["node"]["gpus"], spec["node"]["nics"], spec["node"]["nic_Gbps"]) == (4, 4, 400.0)
    assert spec["fabric"]["link_Gbps"] == 400.0 and spec["fabric"]["oversubscription"] == 2.0   # followers
    assert "variant of dgx-a100" in spec["sources"]["node.gpus"]
    base, varied = build_cluster("dgx-a100", nodes=2), build_cluster("dgx-a100:gpus_per_node=4", nodes=2)
    assert (base.gpus, varied.gpus) == (16, 8)
    assert varied.nic_rate_per_host_Bps == pytest.approx(base.nic_rate_per_host_Bps / 2)   # one NIC per GPU kept
    assert load_spec("dgx-a100")[0]["node"]["gpus"] == 8                                      # the base untouched


def test_a_follower_that_differed_stays():
    spec = load_spec("commodity-25g:nic_Gbps=50")[0]          # 25 Gb/s NICs on a 100 Gb/s fabric
    assert spec["node"]["nic_Gbps"] == 50.0 and spec["fabric"]["link_Gbps"] == 100.0
    assert load_spec("commodity-25g:gpus_per_node=4")[0]["node"]["nics"] == 1


def test_a_grid_is_the_product_of_its_values():
    names = grid_names("dgx-h100", "gpus_per_node=4,8 nic_Gbps=100,200,400 oversubscription=1,2")
    assert len(names) == 12 and len(set(names)) == 12
    assert names[0] == "dgx-h100:gpus_per_node=4,nic_Gbps=100,oversubscription=1"
    assert {load_spec(n)[0]["fabric"]["oversubscription"] for n in names} == {1.0, 2.0}
    assert grid_names("lassen", {"oversubscription": [1, 4]})[1] == "lassen:oversubscription=4"


@pytest.mark.parametrize("base, grid, field, allowed", [
    ("dgx-a100", "colour=red", "cluster_grid", "nic_Gbps"),           # unknown key: the allowed ones listed
    ("lassen", "gpus_per_node=2,4", "cluster_grid", "gpus_per_socket"),  # no gpus on an nvlink_mesh node
    ("frontier", "oversubscription=2", "cluster_grid", "global_Gbps"),   # a dragonfly has none
    ("dgx-a100", "oversubscription=0.5", "fabric.oversubscription", "1 to 1024"),
    ("dgx-a100", "gpus_per_node=2.5", "cluster.gpus_per_node", "whole number"),
    ("dgx-a100", "nic_Gbps=fast", "cluster.nic_Gbps", "a number"),
    ("dgx-a100", "nic_Gbps", "cluster_grid", "key=value"),
    ("dgx-a100", "nic_Gbps=1 nic_Gbps=2", "cluster_grid", "once"),
    ("commodity-25g", "gpus_per_node=6", "node.gpus_per_switch", "divisor"),
    ("dgx-a100:nic_Gbps=100", "radix=8", "cluster", "not a variant"),
    ("dgx-a100", " ".join(f"{k}={','.join(map(str, range(2, 9)))}" for k in ("radix", "nics", "gpus")),
     "cluster_grid", "at most 256"),
])
def test_a_bad_grid_is_refused_in_one_line(base, grid, field, allowed):
    with pytest.raises(InputError) as err:
        grid_names(base, grid)
    assert err.value.field == field and allowed in str(err.value) and "\n" not in str(err.value)
