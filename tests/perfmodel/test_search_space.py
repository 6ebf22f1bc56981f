"""search(space, options): a PlanSpace (what plans) and SearchOptions (how), as predict takes a
PlanRequest and PredictOptions; the keyword form maps onto them in one place."""
import sys

import pytest

import perfmodel
from perfmodel.explore.search import PlanSpace, SearchOptions, space_and_options
from topologies import InputError

CASE = dict(gpus=8, gbs=32, schedules=("1f1b",), max_mbs=1)
HOW = dict(candidates="dp=none|int8;tp=none|fp16", workers=1)


def test_objects_and_keywords_give_the_same_search():
    by_objects = perfmodel.search(PlanSpace(model="gpt2-medium", cluster="dgx-a100", **CASE, fixed={"seq": 512}),
                                  SearchOptions(**HOW, predict={"library": "mpi"}))
    by_keywords = perfmodel.search("gpt2-medium", "dgx-a100", **CASE, **HOW, seq=512, library="mpi")
    assert by_objects.rows == by_keywords.rows and by_objects.plans == by_keywords.plans > 0


def test_keywords_map_onto_their_fields():
    space, options = space_and_options("gpt2-medium", "dgx-a100", **CASE, **HOW, seq=512, calibration="p.json",
                                       tokens=1e9, resume=False)
    assert (space.model, space.gpus, space.gbs, space.max_mbs, space.seq) == ("gpt2-medium", 8, 32, 1, 512)
    assert space.fixed == {"seq": 512} and options.predict == {"calibration": "p.json"}
    assert options.workers == 1 and options.tokens == 1e9 and options.candidates == HOW["candidates"]


def test_unknown_keywords_and_fields_are_refused():
    with pytest.raises(TypeError, match="tensor_parallel"):
        perfmodel.search("gpt2-medium", "dgx-a100", **CASE, tensor_parallel=2)
    with pytest.raises(TypeError, match="workers"):
        perfmodel.search(PlanSpace(model="gpt2-medium", cluster="dgx-a100", **CASE), None, workers=2)
    with pytest.raises(InputError) as err:
        PlanSpace(model="gpt2-medium", cluster="dgx-a100", **CASE, fixed={"tp": 2})   # what the search varies
    assert err.value.field == "fixed" and err.value.value == "tp"
    with pytest.raises(InputError) as err:
        SearchOptions(predict={"policy": "hybrid"})          # the search builds the policies
    assert err.value.field == "predict" and err.value.value == "policy"


def test_the_objects_are_frozen_and_keep_their_own_dicts():
    fixed = {"seq": 512}
    space = PlanSpace(model="gpt2-medium", cluster="dgx-a100", **CASE, fixed=fixed)
    fixed["seq"] = 1024
    assert space.seq == 512
    with pytest.raises(AttributeError):
        space.gbs = 64


def test_the_cli_builds_the_objects(monkeypatch):
    from perfmodel.cli import _parser
    from perfmodel.cli.search import _search

    seen = []
    module = sys.modules["perfmodel.explore.search"]       # the module (perfmodel.explore.search is also the function)
    monkeypatch.setattr(module, "search", lambda space, options: seen.append((space, options)))
    args = _parser().parse_args(["search", "--model", "gpt2-medium", "--cluster", "dgx-a100", "--gpus", "8", "--gbs",
                                 "32", "--schedules", "1f1b, gpipe", "--library", "mpi", "--workers", "3"])
    _search(args)
    (space, options), = seen
    assert isinstance(space, PlanSpace) and isinstance(options, SearchOptions)
    assert space.schedules == ("1f1b", "gpipe") and space.fixed == {"seq": None} and space.gpus == 8
    assert options.predict == {"calibration": None, "library": "mpi"} and options.workers == 3


def test_a_stream_written_before_a_degree_existed_resumes(tmp_path, monkeypatch):
    """A stream whose header lacks degrees' columns (written before ep and cp) reads them as 1."""
    import csv

    path = tmp_path / "rows.csv"
    first = perfmodel.search("gpt2-medium", "dgx-a100", **CASE, **HOW, stream=str(path))
    lines = list(csv.reader(path.read_text().splitlines()))
    keep = [i for i, column in enumerate(lines[0]) if column not in ("ep", "cp")]
    with open(path, "w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows([[row[i] for i in keep] for row in lines])

    def evaluate(job):
        raise AssertionError("every family's rows are in the stream")

    monkeypatch.setattr(sys.modules["perfmodel.explore.resume"], "evaluate", evaluate)   # run_families calls it
    again = perfmodel.search("gpt2-medium", "dgx-a100", **CASE, **HOW, stream=str(path), resume=True)
    assert again.rows == first.rows and again.resumed == first.plans
    assert {"ep", "cp"} <= set(next(csv.reader(path.read_text().splitlines())))     # written back in full
