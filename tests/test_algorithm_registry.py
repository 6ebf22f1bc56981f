"""One collective-algorithm registry for the model and the runtime (perfmodel.collectives.registry)."""
import inspect

import pytest

from perfmodel.collectives.registry import ALGORITHMS, COMPRESSED, OPS, PLAIN, RUNTIME_ALGORITHMS, implementations


def test_every_runtime_algorithm_has_a_model_entry_and_the_reverse():
    pytest.importorskip("torch", reason="realrun's implementations need torch")
    from realrun.comm.algorithms import IMPLEMENTATIONS
    from realrun.comm.names import ALGORITHMS as NAMED

    declared = {a.name for a in ALGORITHMS.values() if a.runtime}
    assert set(IMPLEMENTATIONS) == declared
    assert set(NAMED) == {n for n in declared if ALGORITHMS[n].selectable}
    for name, fn in IMPLEMENTATIONS.items():   # the arguments each declares are the ones it takes
        extra = [p for p in inspect.signature(fn).parameters if p not in ("x", "c", "group")]
        assert tuple(extra) == ALGORITHMS[name].runtime_args, name


def test_runtime_algorithms_the_model_prices():
    """A selectable runtime algorithm has a compressed cost for every op it runs (perfmodel.runtime
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
    declared = {a.name: (lambda x, c, group=None: x) for a in ALGORITHMS.values() if a.runtime}
    assert set(implementations(**declared)) == set(declared)
    with pytest.raises(ValueError, match="differ"):
        implementations(**declared, butterfly=lambda x, c, group=None: x)
    with pytest.raises(ValueError, match="differ"):
        implementations(**{k: v for k, v in declared.items() if k != "ring"})


def test_calibration_times_declared_runtime_algorithms():
    pytest.importorskip("torch", reason="realrun needs torch")
    from realrun.calibrate import CALIBRATED_ALGORITHMS

    assert set(CALIBRATED_ALGORITHMS) - {"auto"} <= set(RUNTIME_ALGORITHMS)
