"""The emulated cluster (marker netns: root and iproute2). Every test removes what it made,
also when it fails, and checks that nothing of ours is left."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from realrun.cluster import EmulatedSpec, cpu, down, emulated, netns, run, shape, status, up
from topologies.errors import InputError

NAME = f"t{os.getpid() % 100000}"
HAVE_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
netns_only = pytest.mark.skipif(not HAVE_NETNS, reason="needs root and iproute2 (ip, tc)")


def _leftovers(name: str) -> list[str]:
    """Our namespaces, and any interface of the machine's own namespace named after ours."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return netns.ours(name) + [line for line in links.splitlines() if f"{netns.PREFIX}{name}" in line]


@pytest.fixture
def cluster_name(tmp_path, monkeypatch):
    monkeypatch.setattr(emulated, "STATE_DIR", str(tmp_path / "state"))
    try:
        yield NAME
    finally:
        down(NAME)
        assert _leftovers(NAME) == [] and cpu.ours(f"{netns.PREFIX}{NAME}-") == []


WORKER = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from realrun.comm import allreduce
    dist.init_process_group("gloo")
    r = dist.get_rank()
    x = torch.arange(4096, dtype=torch.float32) * (r + 1)
    y = allreduce(x, "int8", "two_phase")
    exact = torch.arange(4096, dtype=torch.float32) * 3
    assert float((y - exact).norm() / exact.norm()) < 0.02, "int8 all-reduce across hosts is off"
    if r == 0:
        print("OK", os.environ["MASTER_ADDR"], os.environ["GLOO_SOCKET_IFNAME"], flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.netns
@netns_only
def test_two_hosts_at_100mbit_run_a_compressed_allreduce_and_tear_down(cluster_name, tmp_path, capfd):
    state = up(EmulatedSpec(hosts=2, bandwidth="100mbit", cpus_per_host="none"), cluster_name)[cluster_name]
    assert state["up"] and state["topology"] == "emulated:hosts=2,bandwidth=100mbit"
    assert state["qdiscs"][f"cmp-{cluster_name}-h0"] == {"eth0": "100Mbit"}
    assert state["qdiscs"][f"cmp-{cluster_name}-sw"] == {"h0": "100Mbit", "h1": "100Mbit"}
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run(cluster_name, [sys.executable, str(script)], timeout_s=120)
    assert "OK 10.231.0.1 eth0" in capfd.readouterr().out
    assert shape(cluster_name, "1gbit").bandwidth == 10**9
    assert status(cluster_name)[cluster_name]["qdiscs"][f"cmp-{cluster_name}-h1"] == {"eth0": "1Gbit"}
    assert len(down(cluster_name)) == 3
    assert _leftovers(cluster_name) == [] and down(cluster_name) == []   # idempotent


@pytest.mark.netns
@netns_only
def test_a_failing_rank_ends_the_run_and_down_still_cleans_up(cluster_name, tmp_path):
    up(EmulatedSpec(hosts=2, bandwidth="100mbit", groups=2, trunk_bandwidth="50mbit"), cluster_name)
    assert status(cluster_name)[cluster_name]["qdiscs"][f"cmp-{cluster_name}-sw"]["t0"] == "50Mbit"
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n")
    with pytest.raises(InputError, match="rank 1 of"):
        run(cluster_name, [sys.executable, str(script)], timeout_s=30)
    os.remove(emulated._state_path(cluster_name))   # as if a crash lost the state
    assert len(down(cluster_name)) == 3


@pytest.mark.netns
@netns_only
def test_a_failure_while_building_removes_everything(cluster_name, monkeypatch):
    def broken(*args, **kwargs):
        raise InputError("cluster", "tc", "a command that succeeds (forced failure)")

    monkeypatch.setattr(netns, "limit", broken)
    with pytest.raises(InputError, match="forced failure"):
        up(EmulatedSpec(hosts=3, bandwidth="1gbit"), cluster_name)
    assert _leftovers(cluster_name) == []


@pytest.mark.netns
@netns_only
def test_two_clusters_coexist_and_a_second_up_is_refused(cluster_name):
    other = cluster_name + "b"
    try:
        up(EmulatedSpec(hosts=2), cluster_name)
        up(EmulatedSpec(hosts=2), other)
        with pytest.raises(InputError, match="not up already"):
            up(EmulatedSpec(hosts=2), cluster_name)
        assert set(status()) >= {cluster_name, other}
    finally:
        down(other)
        assert _leftovers(other) == []


def test_without_root_up_refuses_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(InputError, match="root"):
        up(EmulatedSpec(hosts=2), "nobody")


@pytest.mark.parametrize("kwargs, field", [
    (dict(hosts=9), "hosts"), (dict(hosts=1), "hosts"), (dict(bandwidth="fast"), "bandwidth"),
    (dict(hosts=4, groups=3), "groups"), (dict(groups=2), "trunk_bandwidth"),
    (dict(slow_host=1), "slow_host"), (dict(slow_host=7, slow_bandwidth="1mbit"), "slow_host"),
    (dict(bandwidth="1bit"), "bandwidth='1bit': a link rate from 1mbit to 100gbit"),
    (dict(bandwidth="100000gbit"), "bandwidth='100000gbit'"), (dict(bandwidth=10**12), "bandwidth"),
    (dict(groups=2, trunk_bandwidth="10kbit"), "trunk_bandwidth"),
])
def test_bad_specs_name_the_field(kwargs, field):
    with pytest.raises(InputError, match=field):
        EmulatedSpec(**kwargs)


def test_spec_names_the_topology_perfmodel_predicts():
    spec = EmulatedSpec(hosts=4, bandwidth="1gbit", groups=2, trunk_bandwidth="200mbit", slow_host=3,
                        slow_bandwidth="100mbit", cpus_per_host="none")
    assert spec.topology() == ("emulated:hosts=4,bandwidth=1gbit,groups=2,trunk=200mbit,slow_host=3,"
                               "slow_bandwidth=100mbit")
    assert EmulatedSpec(hosts=4, cpus_per_host="none").topology(hosts=2) == "emulated:hosts=2,bandwidth=1gbit"
    shared = EmulatedSpec(hosts=4, cpus_per_host=0.3)
    assert shared.topology(hosts=2) == "emulated:hosts=2,bandwidth=1gbit,cpu_share=0.3"
    with pytest.raises(InputError, match="name"):
        down("Bad-Name")


def test_one_up_or_down_of_a_name_at_a_time(tmp_path, monkeypatch):
    """The per-name lock: a second command on the same name is refused while the first holds it."""
    monkeypatch.setattr(emulated, "STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(netns, "require_root", lambda: None)
    with emulated._locked("lk1"):
        with pytest.raises(InputError, match="no other command"):
            up(EmulatedSpec(hosts=2), "lk1")
        with pytest.raises(InputError, match="no other command"):
            down("lk1")
        with emulated._locked("lk2"):   # another name is independent
            pass


@pytest.mark.netns
@netns_only
def test_a_cluster_without_its_state_is_half_built_and_down_removes_it(cluster_name):
    up(EmulatedSpec(hosts=2), cluster_name)
    os.remove(emulated._state_path(cluster_name))   # as if `up` was killed before its last step
    info = status(cluster_name)[cluster_name]
    assert info["state"] == "half-built" and not info["up"] and info["namespaces"]
    with pytest.raises(InputError, match="half-built"):
        up(EmulatedSpec(hosts=2), cluster_name)
    assert down(cluster_name) and _leftovers(cluster_name) == []


@pytest.mark.netns
@netns_only
def test_sigterm_during_up_rolls_the_cluster_back(cluster_name, monkeypatch):
    from topologies import clikit

    real_limit = netns.limit

    def terminated(*args, **kwargs):
        real_limit(*args, **kwargs)
        raise clikit.Terminated()   # what SIGTERM raises inside `realrun cluster up`

    monkeypatch.setattr(netns, "limit", terminated)
    with pytest.raises(clikit.Terminated):
        up(EmulatedSpec(hosts=2), cluster_name)
    assert _leftovers(cluster_name) == []


# Fixed compute per host: a cgroup per host, one core and a quota.

def test_the_default_share_leaves_each_core_room_for_the_runner(monkeypatch):
    assert cpu.max_share(4, [0, 1]) == 0.45 and cpu.max_share(8, [0, 1]) == 0.225
    assert cpu.max_share(2, [0, 1]) == 0.9 and cpu.max_share(3, [0, 1, 2, 3]) == 0.9
    monkeypatch.setattr(cpu, "machine_cores", lambda: [0, 1])
    monkeypatch.setattr(cpu, "hierarchy", lambda: {"version": 1, "cpu": "/x", "cpuset": "/y"})
    spec = EmulatedSpec(hosts=4)
    assert spec.cpus_per_host == 0.45 and spec.cores() == {0: 0, 1: 1, 2: 0, 3: 1}
    assert spec.topology().endswith(",cpu_share=0.45")
    monkeypatch.setattr(cpu, "hierarchy", lambda: None)   # no cgroup cpu controller: no fixed share
    assert EmulatedSpec(hosts=4).cpus_per_host is None and EmulatedSpec(hosts=4).cores() == {}


@pytest.mark.parametrize("share", [0.6, 0.01, "lots", True, -1])
def test_a_share_the_cores_cannot_give_is_refused(monkeypatch, share):
    monkeypatch.setattr(cpu, "machine_cores", lambda: [0, 1])
    with pytest.raises(InputError, match="cpus_per_host"):
        EmulatedSpec(hosts=4, cpus_per_host=share)


def test_the_model_gives_each_host_its_fixed_share():
    from perfmodel.collectives.fabric import cpu_share
    from topologies import build_cluster

    assert cpu_share(build_cluster("emulated:hosts=4,cpu_share=0.45"), 4) == 0.45
    assert cpu_share(build_cluster("emulated:hosts=4,cores=2"), 4) == 0.5
    with pytest.raises(InputError, match="cpu_share"):
        build_cluster("emulated:hosts=4,cpu_share=2")


def test_a_cluster_built_before_fixed_shares_loads_without_one(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(emulated, "STATE_DIR", str(tmp_path))
    monkeypatch.setattr(netns, "ours", lambda name=None: ["cmp-old-h0"])
    (tmp_path / "old.json").write_text(json.dumps({"hosts": 2, "bandwidth": 10**9}))
    assert emulated.load("old").cpus_per_host is None


def _cgroup_of(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as handle:
        return handle.read()


HAVE_CGROUPS = HAVE_NETNS and cpu.hierarchy() is not None
cgroups_only = pytest.mark.skipif(not HAVE_CGROUPS, reason="needs root, iproute2 and a cgroup cpu controller")

AFFINITY = textwrap.dedent("""
    import os, sys
    with open(sys.argv[1] + os.environ["RANK"], "w") as h:
        h.write(repr(sorted(os.sched_getaffinity(0))) + "\\n" + open("/proc/self/cgroup").read())
""")


@pytest.mark.netns
@cgroups_only
def test_each_host_computes_on_its_own_core_and_quota_and_down_removes_the_groups(cluster_name, tmp_path):
    state = up(EmulatedSpec(hosts=2, cpus_per_host=0.3), cluster_name)[cluster_name]
    assert state["topology"].endswith("cpu_share=0.3")
    hosts = [emulated.host_ns(cluster_name, h) for h in range(2)]
    assert state["cgroups"] == hosts
    where = cpu.hierarchy()
    for ns in hosts:
        group = os.path.join(where["cpu"], cpu.group_name(ns))
        if where["version"] == 2:
            assert cpu._read(os.path.join(group, "cpu.max")).split() == ["3000", str(cpu.PERIOD_US)]
        else:
            assert cpu._read(os.path.join(group, "cpu.cfs_quota_us")) == "3000"
            assert cpu._read(os.path.join(group, "cpu.cfs_period_us")) == str(cpu.PERIOD_US)
    script = tmp_path / "where.py"
    script.write_text(AFFINITY)
    run(cluster_name, [sys.executable, str(script), str(tmp_path / "rank")], timeout_s=60)
    cores = state["cores"]
    for h, ns in enumerate(hosts):
        affinity, groups = (tmp_path / f"rank{h}").read_text().split("\n", 1)
        assert ns in groups
        if where["cpuset"]:
            assert affinity == repr([cores[h]])
    down(cluster_name)
    assert cpu.ours(f"cmp-{cluster_name}-") == []


@pytest.mark.netns
@cgroups_only
def test_a_failure_while_building_removes_the_cgroups_too(cluster_name, monkeypatch):
    def broken(*args, **kwargs):
        raise InputError("cluster", "tc", "a command that succeeds (forced failure)")

    monkeypatch.setattr(netns, "limit", broken)   # after every host's cgroup exists
    with pytest.raises(InputError, match="forced failure"):
        up(EmulatedSpec(hosts=2, cpus_per_host=0.3), cluster_name)
    assert _leftovers(cluster_name) == [] and cpu.ours(f"cmp-{cluster_name}-") == []
