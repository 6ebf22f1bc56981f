import pytest

from topologies import build_cluster, load_spec
from topologies.errors import InputError

GOOD = """
name = "tiny"
description = "two PCIe GPUs per node on one Ethernet switch"
gpu = "v100-pcie-16gb"
default_nodes = 2
[node]
builder = "pcie"
gpus = 2
gpus_per_switch = 2
pcie_GBps = 15.75
pcie_latency_us = 1.0
uplink_GBps = 15.75
nics = 1
nic_Gbps = 10
[fabric]
builder = "single_switch"
latency_us = 5
"""


def _write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return str(path)


def test_user_toml_builds(tmp_path):
    c = build_cluster(_write(tmp_path, GOOD), nodes=3)
    assert (c.name, c.gpus, c.hosts) == ("tiny", 6, 3)


def test_unknown_key_in_section_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"node.nic_speed.*allowed: .*nic_Gbps"):
        load_spec(_write(tmp_path, GOOD.replace("nic_Gbps = 10", "nic_speed = 10")))


def test_missing_key_is_refused(tmp_path):
    with pytest.raises(InputError, match="node.pcie_GBps"):
        load_spec(_write(tmp_path, GOOD.replace("pcie_GBps = 15.75\n", "")))


def test_unknown_top_level_key_is_refused(tmp_path):
    with pytest.raises(InputError, match="colour"):
        load_spec(_write(tmp_path, GOOD + 'colour = "red"\n'))


def test_unknown_builder_is_refused(tmp_path):
    with pytest.raises(InputError, match="fabric.builder"):
        load_spec(_write(tmp_path, GOOD.replace('"single_switch"', '"hypercube"')))


def test_invalid_toml_is_refused(tmp_path):
    with pytest.raises(InputError, match="valid TOML"):
        load_spec(_write(tmp_path, "name = "))


def test_unknown_catalog_name_lists_choices():
    with pytest.raises(InputError, match="dgx-a100"):
        build_cluster("dgx-z900")
