"""perfmodel.collectives.runtime predicts realrun's all-to-all (Comm.alltoall): the pairwise exchange of
p - 1 chunks per rank, each compressed once at its source and decoded once at its destination."""
import pytest

from perfmodel.collectives.predict import resolve_context
from perfmodel.collectives.compressed import Msg, movement
from perfmodel.collectives.registry import PLAIN
from perfmodel.compression import compile_spec
from perfmodel.collectives.runtime import alltoall_cost, runtime_algorithm, runtime_cost, runtime_time
from topologies import build_cluster
from topologies.errors import InputError

CLUSTER = "emulated:hosts=4,bandwidth=100mbit"
S = 8 * 2**20


def test_auto_is_the_pairwise_all_to_all_for_every_spec():
    for spec in ("none", "fp16", "int8", "topk(0.01)"):
        assert runtime_algorithm("alltoall", spec, "auto") == "direct"
        assert runtime_time("alltoall", S, cluster=CLUSTER, compressor=spec).algorithm == "direct"


def test_uncompressed_all_to_all_moves_three_quarters_of_the_array_over_each_link():
    t = runtime_time("alltoall", S, cluster=CLUSTER).time_s
    wire_s = 0.75 * S * 8 / 1e8            # what leaves a rank, at the host link's rate
    assert wire_s <= t < 1.1 * wire_s


def test_compressed_all_to_all_runs_p_minus_1_compressions_and_decodes():
    built = build_cluster(CLUSTER)
    ctx = resolve_context(built, built.gpus, "packed", (), None)
    msg = Msg(size_bytes=S, dtype_bytes=4, codec=compile_spec("int8"))
    cost = alltoall_cost("direct", ctx, msg)
    n = S / 4
    assert cost.kernel_bytes == pytest.approx(3 * (msg.c(n) + msg.d(n)))
    moved = movement("alltoall", PLAIN["alltoall"]["direct"], ctx, msg)
    assert cost.kernel_bytes < moved.kernel_bytes   # the own chunk: none
    assert cost.launches == 6 and cost.rounds == moved.rounds
    alg, via = runtime_cost("alltoall", S, "int8", "auto", ctx)
    assert alg == "direct" and via.kernel_bytes == cost.kernel_bytes
    none = runtime_time("alltoall", S, cluster=CLUSTER).time_s
    int8 = runtime_time("alltoall", S, cluster=CLUSTER, compressor="int8").time_s
    assert none / 5 < int8 < none / 2       # about a quarter of the bytes, plus kernels


def test_model_only_all_to_all_algorithms_are_refused():
    for alg in ("hierarchical", "ring", "two_phase"):
        with pytest.raises(InputError, match="direct"):
            runtime_time("alltoall", S, cluster=CLUSTER, compressor="int8", algorithm=alg)


def test_torch_is_not_an_alltoall_algorithm_of_the_runtime():
    """algorithm='torch' names torch's own reduction: for the all-to-all it is one line, not a KeyError."""
    with pytest.raises(InputError) as err:
        runtime_time("alltoall", 1 << 20, cluster="dgx-h100", ranks=16, compressor="int8", algorithm="torch")
    assert err.value.field == "algorithm"
