"""One collective-algorithm registry for the model and the runtime (perfmodel.collectives.registry)."""
import inspect

import pytest

from perfmodel.collectives.registry import (ALGORITHMS, COMPRESSED, OPS, PLAIN, RUNTIME_ALGORITHMS, RUNTIME_OPS,
                                           implementations, runtime_algorithms)


def test_every_runtime_algorithm_has_a_model_entry_and_the_reverse():
    pytest.importorskip("torch", reason="realrun's implementations need torch")
    from realrun.comm.algorithms import ALLTOALL_IMPLEMENTATIONS, IMPLEMENTATIONS
    from realrun.comm.names import RUNTIME_ALGORITHMS as NAMED

    by_op = {"allreduce": IMPLEMENTATIONS, "alltoall": ALLTOALL_IMPLEMENTATIONS}
    assert set(RUNTIME_OPS) == set(by_op)
    for op, impls in by_op.items():
        declared = {a.name for a in ALGORITHMS.values() if op in a.runtime}
        assert set(impls) == declared, op
        assert set(runtime_algorithms(op)) == {n for n in declared if ALGORITHMS[n].selectable}
        for name, fn in impls.items():   # the arguments each declares are the ones it takes
            extra = [p for p in inspect.signature(fn).parameters if p not in ("x", "c", "group")]
            assert tuple(extra) == ALGORITHMS[name].runtime_args, name
    assert NAMED == RUNTIME_ALGORITHMS == runtime_algorithms("allreduce")
    assert "direct" not in NAMED and runtime_algorithms("alltoall") == ("direct",)
    assert "hierarchical" not in runtime_algorithms("alltoall")   # DeepEP's all-to-all: model-only


def test_runtime_algorithms_the_model_prices():
    """A selectable runtime algorithm has a compressed cost for every op it runs (perfmodel.collectives.runtime
    predicts it from there); pipelined is priced as allgather with chunks."""
    for name in RUNTIME_ALGORITHMS:
        for op in ALGORITHMS[name].runtime:
            assert name in COMPRESSED[op], (name, op)


def test_views_hold_every_declaration_by_op():
    assert set(PLAIN) <= set(OPS) and set(COMPRESSED) <= set(OPS)
    for a in ALGORITHMS.values():
        for op, fn in a.plain.items():
            assert PLAIN[op][a.name] is fn
        for op, fn in a.compressed.items():
            assert COMPRESSED[op][a.name] is fn
    assert ALGORITHMS["nvls"].needs_reducible and not ALGORITHMS["two_phase"].needs_reducible


def test_an_undeclared_or_missing_runtime_algorithm_is_refused():
    declared = {a.name: (lambda x, c, group=None: x) for a in ALGORITHMS.values() if "allreduce" in a.runtime}
    assert set(implementations("allreduce", **declared)) == set(declared)
    with pytest.raises(ValueError, match="differ"):
        implementations("allreduce", **declared, butterfly=lambda x, c, group=None: x)
    with pytest.raises(ValueError, match="differ"):
        implementations("allreduce", **{k: v for k, v in declared.items() if k != "ring"})
    with pytest.raises(ValueError, match="alltoall"):   # the all-to-all's are declared apart
        implementations("alltoall", **declared)


def test_calibration_times_declared_runtime_algorithms():
    pytest.importorskip("torch", reason="realrun needs torch")
    from realrun.calibrate import CALIBRATED_ALGORITHMS

    assert set(CALIBRATED_ALGORITHMS) - {"auto"} <= set(RUNTIME_ALGORITHMS)
