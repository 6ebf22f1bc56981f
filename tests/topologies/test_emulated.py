"""emulated:... clusters: realrun's namespaces as topologies sees them, and the core share."""
import pytest

from perfmodel import collective_time
from perfmodel.collectives.fabric import cpu_share
from topologies import build_cluster
from topologies.errors import InputError
from topologies.units import format_rate, parse_rate


def test_flat_cluster_has_one_rank_per_host_on_the_tbf_rate():
    c = build_cluster("emulated:hosts=4,bandwidth=100mbit,cores=2")
    assert (c.hosts, c.gpus_per_host, c.gpus, c.gpu_model) == (4, 1, 4, "host-cpu")
    assert c.tiers["tcp-leaf"]["max_bandwidth_Bps"] == pytest.approx(12.5e6)


def test_groups_add_a_trunk_tier_and_a_slow_host_its_own_rate():
    c = build_cluster("emulated:hosts=4,bandwidth=1gbit,groups=2,trunk=200mbit")
    assert c.tiers["tcp-trunk"]["links"] == 2 and c.tiers["tcp-trunk"]["max_bandwidth_Bps"] == pytest.approx(25e6)
    slow = build_cluster("emulated:hosts=4,bandwidth=1gbit,slow_host=3,slow_bandwidth=100mbit")
    assert slow.tiers["tcp-leaf"]["min_bandwidth_Bps"] == pytest.approx(12.5e6)
    fast = collective_time("allreduce", 2**24, cluster="emulated:hosts=4,bandwidth=1gbit", algorithm="ring").time_s
    trunk = collective_time("allreduce", 2**24, cluster="emulated:hosts=4,bandwidth=1gbit,groups=2,trunk=200mbit",
                            algorithm="ring").time_s
    slowed = collective_time("allreduce", 2**24, cluster="emulated:hosts=4,bandwidth=1gbit,slow_host=3,"
                             "slow_bandwidth=100mbit", algorithm="ring").time_s
    assert trunk > 3 * fast and slowed > 5 * fast


def test_ranks_share_the_cores_explicitly():
    c = build_cluster("emulated:hosts=4,cores=2")
    assert cpu_share(c, 4) == 0.5 and cpu_share(c, 2) == 1.0 and cpu_share(build_cluster("dgx-a100"), 64) == 1.0
    one = collective_time("allreduce", 2**24, cluster="emulated:hosts=4,cores=4", compressor="int8",
                          algorithm="two_phase").kernel_time_s
    half = collective_time("allreduce", 2**24, cluster="emulated:hosts=4,cores=2", compressor="int8",
                           algorithm="two_phase").kernel_time_s
    assert half == pytest.approx(2 * one)


@pytest.mark.parametrize("name, field", [("emulated:hosts=0", "hosts"), ("emulated:hosts=x", "hosts"),
                                         ("emulated:speed=1gbit", "cluster"), ("emulated:bandwidth=1gb", "bandwidth"),
                                         ("emulated:hosts=4,groups=9", "groups"),
                                         ("emulated:latency_us=abc", "latency_us")])
def test_bad_emulated_names_name_the_field(name, field):
    with pytest.raises(InputError, match=field):
        build_cluster(name)


def test_rates_parse_and_print_as_tc_writes_them():
    assert parse_rate("100mbit") == 10**8 and parse_rate("2.5gbit") == 25 * 10**8
    assert format_rate(10**9) == "1gbit" and format_rate(2.5e8) == "250mbit"
    with pytest.raises(InputError, match="bandwidth"):
        parse_rate("-1gbit")
