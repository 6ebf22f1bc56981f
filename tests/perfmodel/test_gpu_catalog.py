"""The GPU catalog's Blackwell, Blackwell Ultra and AMD entries: every number with its source, and
the dtype keys other code reads (``fp8``, ``fp4``)."""
import re

import pytest

from perfmodel.devices import device, read_catalog

NEW = ("b200", "b300", "gb200", "gb300", "mi300x", "mi325x")
BLACKWELL = ("b200", "b300", "gb200", "gb300")


def _plain(text: str) -> str:
    return text.replace(",", "")


def _cites(text: str, value: float) -> bool:
    """Whether ``value`` stands in ``text`` as a number of its own ("8" in "8 TB/s" or "8.0", not in
    "180" or "8.5"): a bare substring test passes for almost any one-digit value."""
    return re.search(r"(?<![\d.])" + re.escape(f"{value:g}") + r"(?:\.0+)?(?!\d|\.\d)", text) is not None


@pytest.mark.parametrize("key", NEW)
def test_every_number_of_a_new_gpu_is_in_its_source(key):
    entry = read_catalog("gpus")[key]
    source, power = _plain(entry["source"]), _plain(entry["power_source"])
    for dtype, tflops in entry["peak_tflops"].items():
        assert _cites(source, tflops), (key, dtype, tflops)
    for field in ("hbm_GiB", "hbm_TBps"):
        assert _cites(source, entry[field]), (key, field)
    assert _cites(power, entry["board_power_W"])
    assert "MAMF" in source and "stream" in source                    # efficiency and streaming: said where from
    assert "assumption" in source                                       # what is scaled from another GPU says so


@pytest.mark.parametrize("key", BLACKWELL)
def test_blackwell_has_fp4_above_fp8(key):
    peaks = device(key).peak_flops_per_s
    assert peaks["fp4"] == pytest.approx(2 * peaks["fp8"]) or peaks["fp4"] > 2 * peaks["fp8"]
    assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"])


def test_blackwell_ultra_trades_int8_for_dense_fp4():
    for ultra, base in (("b300", "b200"), ("gb300", "gb200")):
        u, b = device(ultra).peak_flops_per_s, device(base).peak_flops_per_s
        assert u["fp4"] > 1.4 * b["fp4"] and u["int8"] < b["int8"] / 10
        assert device(ultra).hbm_bytes > device(base).hbm_bytes


def test_gpus_of_the_new_clusters_are_in_the_catalog():
    from topologies import load_spec

    for cluster, gpu in (("dgx-b200", "b200"), ("dgx-b300", "b300"), ("gb200-nvl72", "gb200"),
                         ("gb300-nvl72", "gb300"), ("mi300x", "mi300x")):
        assert load_spec(cluster)[0]["gpu"] == gpu and device(gpu).arch


def test_amd_is_at_datasheet_level_and_said_so():
    for key in ("mi300x", "mi325x"):
        assert "datasheet level" in read_catalog("gpus")[key]["source"] and "fp4" not in device(key).peak_flops_per_s
