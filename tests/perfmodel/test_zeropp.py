"""ZeRO++ (Wang et al. 2023) as the model sees it: qgZ's hierarchical compressed reduce-scatter,
qwZ's compressed gathers, hpZ, and the ``zeropp`` preset on a bandwidth-poor V100 cluster.
Directions and trends only: no published number is fitted."""
import math
from pathlib import Path

import pytest

import topologies

from perfmodel import predict
from perfmodel.collectives.predict import ERROR_BUDGET, _best, candidates, resolve_context
from perfmodel.collectives.compressed import Msg
from perfmodel.compression import compile_spec
from topologies import InputError, build_cluster

LASSEN = (Path(topologies.__file__).parent / "catalog" / "lassen.toml").read_text()


def _v100_cluster(tmp_path, node_gbps: int) -> str:
    """Lassen's nodes (4 V100) with ``node_gbps`` of network per node (two rails)."""
    rail = node_gbps / 2
    text = LASSEN.replace('name = "lassen"', f'name = "v100-{node_gbps}g"')
    text = text.replace("nic_Gbps = 100.0", f"nic_Gbps = {rail}").replace("link_Gbps = 100.0", f"link_Gbps = {rail}")
    path = tmp_path / f"v100-{node_gbps}g.toml"
    path.write_text(text)
    return str(path)


def _speedup(cluster: str, mbs: int) -> float:
    kw = dict(model="gpt3-2.7b", cluster=cluster, gpus=64, tp=1, pp=1, zero=3, mbs=mbs, gbs=64 * mbs,
              recompute="full", allow_oom=True)
    return predict(**kw).step_time_s / predict(**kw, policy="zeropp").step_time_s


def test_zeropp_speeds_up_zero3_more_where_bandwidth_is_poorer(tmp_path):
    speedups = {gbps: _speedup(_v100_cluster(tmp_path, gbps), 1) for gbps in (100, 200, 400)}
    assert speedups[100] > 1.0
    assert speedups[100] > speedups[200] > speedups[400]


def test_zeropp_gains_more_as_the_per_gpu_batch_shrinks(tmp_path):
    cluster = _v100_cluster(tmp_path, 100)
    by_mbs = [_speedup(cluster, mbs) for mbs in (1, 2, 4)]
    assert by_mbs[0] > by_mbs[1] > by_mbs[2]


def test_zero3_int4_gradients_take_the_hierarchical_reduce_scatter():
    r = predict("gpt3-2.7b", "lassen", gpus=64, tp=1, pp=1, zero=3, mbs=1, gbs=64, policy="zeropp",
                recompute="full", allow_oom=True)
    assert r.collectives["dp.reduce_scatter.bwd"] == "reduce_scatter:hierarchical:int4"
    assert r.collectives["zero.allgather.fwd"].endswith(":int8")


@pytest.mark.parametrize("spec", ["int8", "int4", "ef(topk(0.01))+int8", "zfp(rate=8)"])
@pytest.mark.parametrize("cluster, nodes", [("lassen", 16), ("dgx-a100", 4), ("commodity-25g", 8)])
def test_auto_never_picks_a_slower_valid_compressed_algorithm(spec, cluster, nodes):
    """Among the algorithms its error rule admits, ``auto`` takes the fastest (reduce-scatter and
    all-reduce, small and large messages)."""
    built = build_cluster(cluster, nodes=nodes)
    ctx = resolve_context(built, built.gpus, "packed", (), None)
    codec = compile_spec(spec)
    for op in ("reduce_scatter", "allreduce"):
        for size in (2**16, 2**22, 2**28):
            name, _, timed, _ = _best(op, size, "fp32", codec, ctx, "auto", 1)
            msg = Msg(size_bytes=size, dtype_bytes=4, codec=codec)
            costs = {a: build(ctx, msg) for a, build in candidates(op, codec, ctx, library_only=False).items()}
            fewest = min(c.hops for c in costs.values())
            for other, cost in costs.items():
                if cost.hops <= fewest * ERROR_BUDGET ** 2:
                    t = _best(op, size, "fp32", codec, ctx, other, 1)[2].time_s
                    assert timed.time_s <= t * (1 + 1e-9), (op, size, name, other)


def test_hpz_keeps_backward_gathers_in_the_node_and_costs_memory():
    kw = dict(model="gpt3-2.7b", cluster="lassen", gpus=64, tp=1, pp=1, zero=3, mbs=1, gbs=64,
              recompute="full", allow_oom=True, policy="zeropp")
    plain, hpz = predict(**kw), predict(**kw, hpz=True)

    def ib(r):
        return sum(v for k, v in r.wire_bytes["zero"].items() if k.startswith("ib"))
    assert ib(hpz) < 0.6 * ib(plain)     # forward gathers still cross nodes, backward ones do not
    params = 2.7e9 * 2                   # fp16 weights, secondary copy over the 4 GPUs of a node
    extra = hpz.memory_per_gpu_bytes - plain.memory_per_gpu_bytes
    assert extra == pytest.approx(hpz.memory_breakdown["hpz_secondary"])
    assert math.isclose(extra, params / 4, rel_tol=0.1)


def test_hpz_needs_zero3():
    with pytest.raises(InputError) as err:
        predict("gpt3-2.7b", "lassen", gpus=64, zero=1, mbs=1, gbs=64, hpz=True, allow_oom=True)
    assert err.value.field == "hpz"
