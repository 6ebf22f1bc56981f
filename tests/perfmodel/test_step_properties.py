"""Property tests over random valid plans (hypothesis)."""
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from perfmodel.prediction import predict
from topologies.catalog import load_spec
from topologies.errors import InputError

POLICIES = ["none", "naive:int8", "hybrid", "hybrid,dp=ef(topk(0.01))+int8", "naive:fp16", "tp=fp8,pp=int8"]
PLANS = st.fixed_dictionaries({
    "model": st.sampled_from(["gpt2-medium", "llama2-7b", "gpt3-1.3b"]),
    "nodes": st.integers(1, 4), "tp": st.sampled_from([1, 2, 4, 8]), "pp": st.sampled_from([1, 2, 4]),
    "mbs": st.sampled_from([1, 2, 4]), "accum": st.integers(1, 8), "zero": st.integers(0, 3),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "schedule": st.sampled_from(["1f1b", "gpipe"]), "sp": st.booleans(), "policy": st.sampled_from(POLICIES),
})


def _run(p, cluster="dgx-a100"):
    dp = p["nodes"] * 8 // (p["tp"] * p["pp"])
    try:
        return predict(p["model"], cluster, nodes=p["nodes"], tp=p["tp"], pp=p["pp"], mbs=p["mbs"],
                       gbs=p["mbs"] * dp * p["accum"], zero=p["zero"], recompute=p["recompute"],
                       schedule=p["schedule"], sequence_parallel=p["sp"], policy=p["policy"], allow_oom=True)
    except InputError:
        assume(False)


@settings(max_examples=60, deadline=None)
@given(PLANS)
def test_times_are_non_negative_and_sum_to_the_step(p):
    r = _run(p)
    assert r.step_time_s > 0 and all(v >= 0 for v in r.breakdown.values())
    assert sum(r.breakdown.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert r.speedup_vs_uncompressed > 0 and 0 < r.mfu < 1


@pytest.fixture(scope="module")
def fast_cluster(tmp_path_factory):
    """dgx-a100 with twice the NVLink, PCIe and network bandwidth."""
    text = (__import__("importlib").resources.files("topologies") / "catalog" / "dgx-a100.toml").read_text()
    text = text.replace("nvlink_GBps = 300.0", "nvlink_GBps = 600.0").replace("nic_Gbps = 200.0", "nic_Gbps = 400.0")
    text = text.replace("link_Gbps = 200.0", "link_Gbps = 400.0").replace("pcie_GBps = 31.0", "pcie_GBps = 62.0")
    path = tmp_path_factory.mktemp("clusters") / "dgx-a100-2x.toml"
    path.write_text(text)
    load_spec(str(path))
    return str(path)


@settings(max_examples=40, deadline=None)
@given(PLANS)
def test_more_bandwidth_never_slows_a_step(fast_cluster, p):
    slow = _run(p)
    fast = _run(p, fast_cluster)
    assert fast.step_time_s <= slow.step_time_s * (1 + 1e-9)
