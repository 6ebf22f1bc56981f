"""Jobs that are not a whole number of nodes: as few nodes as hold them, ranks packed."""
import pytest

from perfmodel import predict
from perfmodel.collectives.predict import collective_time
from perfmodel.explore.sweep import candidate_plans
from topologies import InputError, cluster_for


@pytest.mark.parametrize("gpus, nodes", [(1, 1), (2, 1), (4, 1), (8, 1), (12, 2), (17, 3)])
def test_cluster_for_uses_as_few_nodes_as_hold_the_job(gpus, nodes):
    built, ranks = cluster_for("dgx-a100", gpus=gpus)
    assert (built.hosts, ranks) == (nodes, gpus)


def test_cluster_for_refuses_what_is_not_a_gpu_count():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(InputError) as err:
            cluster_for("dgx-a100", gpus=bad)
        assert err.value.field == "gpus"


def test_a_partial_node_is_predicted_on_its_own_gpus():
    """1, 2 and 4 GPUs of an 8-GPU node: the plan has that many ranks, TP stays on NVLink, and
    half a node is no faster than a whole one at the same plan per GPU."""
    kw = dict(model="gpt2-medium", cluster="dgx-a100", mbs=2, gbs=16)
    steps = {g: predict(**kw, gpus=g, tp=1) for g in (1, 2, 4, 8)}
    assert [steps[g].gpus for g in (1, 2, 4, 8)] == [1, 2, 4, 8]
    assert [steps[g].plan["dp"] for g in (1, 2, 4, 8)] == [1, 2, 4, 8]
    assert steps[1].step_time_s > steps[2].step_time_s > steps[4].step_time_s > steps[8].step_time_s
    tp4 = predict(**kw, gpus=4, tp=4)
    assert set(tp4.wire_bytes["tp"]) == {"nvlink"}


def test_twelve_gpus_span_a_node_and_a_half():
    r = predict("gpt2-medium", "dgx-a100", gpus=12, tp=4, mbs=2, gbs=48)
    assert r.gpus == 12 and r.plan["dp"] == 3
    assert set(r.wire_bytes["tp"]) == {"nvlink"}                  # TP groups never straddle nodes
    assert r.wire_bytes["dp"].get("ib-leaf", 0) > 0                  # dp crosses to the second node
    whole = predict("gpt2-medium", "dgx-a100", gpus=8, tp=4, mbs=2, gbs=48)
    assert "ib-leaf" not in whole.wire_bytes["dp"]


def test_collectives_and_sweeps_take_partial_nodes():
    assert collective_time("allreduce", 2**24, cluster="dgx-a100", gpus=4).gpus == 4
    plans = candidate_plans("gpt2-medium", "dgx-a100", gpus=4, nodes=None, gbs=16)
    assert plans and all(p["tp"] * p["pp"] * p["dp"] == 4 for p in plans)
