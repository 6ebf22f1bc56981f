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


def test_volta_scales_the_caps_by_nccl_ratios():
    table = protocol_table()["nvlink"]
    capped = nvlink_for_arch(table, "volta")
    assert capped["LL"].max_Bps == pytest.approx(table["LL"].bw_fraction * 300e9 * 39.0 / 87.7)
    assert capped["LL128"].max_Bps == pytest.approx(table["LL128"].bw_fraction * 300e9 * 1.0)
    assert math.isinf(capped["Simple"].max_Bps)
    assert capped["Simple"].bw_fraction == pytest.approx(table["Simple"].bw_fraction)   # 20/25 as Ampere's


@pytest.mark.parametrize("arch, link, spec, ll_max, ll128_cap", [("hopper", 20.6, 25.0, 141e9, 12 * 36.7e9),
                                                                ("blackwell", 40.1, 50.0, 282e9, 16 * 40.0e9)])
def test_hopper_and_later_take_nccls_ring_tuning(arch, link, spec, ll_max, ll128_cap):
    """tuning.cc: baseLat + nsteps x hwLat (hwLat covering the NVSwitch path), LL at half the ring's
    bandwidth capped at llMaxBw, LL128 at 0.92 of it capped at nChannels x perChMaxRingLL128Bw; Simple
    at the A100 fit's fraction of NCCL's per-link rate."""
    table = protocol_table()["nvlink"]
    ring = nvlink_for_arch(table, arch)
    simple = table["Simple"].bw_fraction * (link / spec) / (20.0 / 25.0)
    expected = {"LL": (6.6, 0.6, 0.5, ll_max), "LL128": (14.0, 1.9, 0.92, ll128_cap),
                "Simple": (8.4, 3.4, 1.0, math.inf)}
    for name, (base_us, step_us, factor, cap) in expected.items():
        p = ring[name]
        assert (p.base_s, p.step_s) == pytest.approx((base_us * 1e-6, step_us * 1e-6))
        assert p.bw_fraction == pytest.approx(simple * factor) and p.max_Bps == pytest.approx(cap)
        assert p.step_includes_path


def test_nvls_runs_simple_at_the_architecture_efficiency():
    assert nvls_protocols("ampere") is None and nvls_protocols("volta") is None
    hopper = nvls_protocols("hopper")
    assert set(hopper) == {"Simple"}
    assert hopper["Simple"].bw_fraction == pytest.approx(nccl_arch()["hopper"]["nvls_efficiency"] * 20.6 / 25.0)
    size, p = 2**30, 8
    r = collective_time("allreduce", size, cluster="dgx-h100", nodes=1)
    assert (r.algorithm, r.protocol) == ("nvls", "Simple")
    # S (1 + 1/p) per direction at 0.85 of NCCL's 18 x 20.6 GB/s, plus the 25 us, plus NCCL's pipeline:
    # 1 GiB in 128 KiB chunks is 64 loops of 16 channels x 8 ranks x 128 KiB, each with its
    # synchronization, and the fill loop again
    consts = nccl_arch()["hopper"]
    loop, loops = 16 * 8 * 128 * 1024, 64
    bw = 0.85 * 18 * 20.6e9
    expected_s = 25e-6 + (size + loop) * (1 + 1 / p) / bw + (loops + 1) * consts["nvls_loop_sync_us"] * 1e-6
    assert r.time_s == pytest.approx(expected_s, rel=1e-6)


@pytest.mark.parametrize("arch, link, spec", [("hopper", 20.6, 25.0), ("blackwell", 40.1, 50.0)])
def test_nvls_efficiency_multiplies_nccls_nvlink_bandwidth_not_the_line_rate(arch, link, spec):
    """tuning.cc: bwIntra * nvlsEfficiency, bwIntra from NCCL's per-link NVLink rate (topo.h)."""
    consts = nccl_arch()[arch]
    assert (consts["nccl_link_GBps"], consts["spec_link_GBps"]) == (link, spec)
    assert nvls_protocols(arch)["Simple"].bw_fraction == pytest.approx(consts["nvls_efficiency"] * link / spec)


def test_a100_has_no_nvls_and_its_curve_is_unchanged():
    r = collective_time("allreduce", 2**28, cluster="dgx-a100", nodes=1)
    assert r.algorithm != "nvls" and r.protocol == "Simple"
