"""NCCL's per-architecture NVLink constants (catalog/nccl_arch.toml, from its tuning.cc): the
A100 fit stays Ampere's; other generations get their caps and NVLS its own protocol."""
import math

import pytest

from perfmodel.devices import device, nccl_arch, nvlink_for_arch, nvls_protocols, protocol_table
from perfmodel.collectives.predict import collective_time


def test_every_gpu_names_its_architecture():
    for key in ("a100-sxm-80gb", "h100-sxm", "h200-sxm", "b200", "v100-sxm2-16gb", "host-cpu"):
        assert device(key).arch


def test_ampere_keeps_the_a100_fit():
    table = protocol_table()["nvlink"]
    assert nvlink_for_arch(table, "ampere") is table
    assert all(math.isinf(p.max_Bps) for p in table.values())


@pytest.mark.parametrize("arch, ll, ll128", [("volta", 39.0 / 87.7, 1.0), ("hopper", 141.0 / 87.7, 36.7 / 20.0),
                                             ("blackwell", 282.0 / 87.7, 40.0 / 20.0)])
def test_other_generations_scale_the_caps_by_nccl_ratios(arch, ll, ll128):
    table = protocol_table()["nvlink"]
    capped = nvlink_for_arch(table, arch)
    assert capped["LL"].max_Bps == pytest.approx(table["LL"].bw_fraction * 300e9 * ll)
    assert capped["LL128"].max_Bps == pytest.approx(table["LL128"].bw_fraction * 300e9 * ll128)
    consts = nccl_arch()
    simple = (consts[arch]["nccl_link_GBps"] / consts[arch]["spec_link_GBps"]) / (20.0 / 25.0)
    assert math.isinf(capped["Simple"].max_Bps)
    assert capped["Simple"].bw_fraction == pytest.approx(table["Simple"].bw_fraction * simple)


def test_nvls_runs_simple_at_the_architecture_efficiency():
    assert nvls_protocols("ampere") is None and nvls_protocols("volta") is None
    hopper = nvls_protocols("hopper")
    assert set(hopper) == {"Simple"}
    assert hopper["Simple"].bw_fraction == pytest.approx(nccl_arch()["hopper"]["nvls_efficiency"] * 20.6 / 25.0)
    r = collective_time("allreduce", 2**30, cluster="dgx-h100", nodes=1)
    assert (r.algorithm, r.protocol) == ("nvls", "Simple")
    p = 8   # busbw of NVLS: S (1 + 1/p) per direction at 0.85 of NCCL's 18 x 20.6 GB/s, plus the 25 us
    expected = 0.85 * 18 * 20.6e9 / (1 + 1 / p) * 2 * (p - 1) / p / 1e9
    assert r.busbw_GBps == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("arch, link, spec", [("hopper", 20.6, 25.0), ("blackwell", 40.1, 50.0)])
def test_nvls_efficiency_multiplies_nccls_nvlink_bandwidth_not_the_line_rate(arch, link, spec):
    """tuning.cc: bwIntra * nvlsEfficiency, bwIntra from NCCL's per-link NVLink rate (topo.h)."""
    consts = nccl_arch()[arch]
    assert (consts["nccl_link_GBps"], consts["spec_link_GBps"]) == (link, spec)
    assert nvls_protocols(arch)["Simple"].bw_fraction == pytest.approx(consts["nvls_efficiency"] * link / spec)


def test_a100_has_no_nvls_and_its_curve_is_unchanged():
    r = collective_time("allreduce", 2**28, cluster="dgx-a100", nodes=1)
    assert r.algorithm != "nvls" and r.protocol == "Simple"
