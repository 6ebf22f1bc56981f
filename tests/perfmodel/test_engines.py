"""Engines behind one interface, looked up by name; predict's objects and its keyword form agree."""
import pytest

from perfmodel import predict
from perfmodel.engines import ENGINES, engine_for, register
from perfmodel.engines.analytical import ANALYTICAL
from perfmodel.plan.parallel import PlanRequest
from perfmodel.prediction import PredictOptions, request_and_options
from topologies import InputError

PLAN = dict(gpus=16, tp=2, pp=2, mbs=1, gbs=32)


def test_engines_are_found_by_name_and_unknown_ones_refused():
    assert engine_for("analytical").name == "analytical" and engine_for("des").name == "des"
    with pytest.raises(InputError) as err:
        engine_for("fluid")
    assert err.value.field == "engine" and "analytical or des" in str(err.value)


def test_a_registered_engine_times_predict():
    class Doubled:
        name = "doubled"

        def time_step(self, step):
            timing = ANALYTICAL.time_step(step)
            timing.breakdown.bubble_s += timing.breakdown.total
            return timing

    register(Doubled())
    try:
        base = predict("gpt3-1.3b", "dgx-a100", **PLAN)
        twice = predict("gpt3-1.3b", "dgx-a100", engine="doubled", **PLAN)
        assert twice.engine == "doubled" and twice.step_time_s == pytest.approx(2 * base.step_time_s)
    finally:
        del ENGINES["doubled"]


def test_objects_and_keywords_give_the_same_record():
    plan = PlanRequest.of(**PLAN, sequence_parallel=True)
    opts = PredictOptions(policy="dp=int8,tp=fp16", engine="des")
    by_objects = predict("gpt3-1.3b", "dgx-a100", plan, opts)
    by_keywords = predict("gpt3-1.3b", "dgx-a100", **PLAN, sequence_parallel=True, policy="dp=int8,tp=fp16",
                          engine="des")
    assert by_objects == by_keywords


def test_keywords_map_onto_their_objects_and_unknown_ones_are_refused():
    plan, opts = request_and_options(tp=4, policy="hybrid", engine="des")
    assert plan.tp == 4 and opts.policy == "hybrid" and opts.engine == "des"
    with pytest.raises(TypeError, match="tensor_parallel"):
        request_and_options(tensor_parallel=4)


def test_engine_choices_are_the_registry_and_a_registered_engine_is_one(monkeypatch):
    """perfmodel's --engine offers the registered engines: one registered more is a valid choice."""
    from perfmodel.cli import _parser
    from perfmodel.engines import engine_names

    assert engine_names() == tuple(ENGINES) and engine_names()[0] == "analytical" and "des" in engine_names()
    base = ["--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--engine"]
    with pytest.raises(SystemExit):
        _parser().parse_args(["predict", *base, "fluid"])
    monkeypatch.setitem(ENGINES, "fluid", ANALYTICAL)
    assert "fluid" in engine_names()
    parser = _parser()
    for command in ("predict", "compare", "breakeven", "sweep"):
        extra = ["--target", "1.1"] if command == "breakeven" else ["--gbs", "32"] if command == "sweep" else []
        assert parser.parse_args([command, *base, "fluid", *extra]).engine == "fluid"
