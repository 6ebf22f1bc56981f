"""perfmodel: predict the step time of LLM training with compressed communication.

    predict("gpt-neox-20b", "lassen", gpus=192, tp=4, pp=4, mbs=4, gbs=1056, zero=1,
            recompute="full", policy="hybrid")            -> StepRecord
    compare(model, cluster, ["none", "hybrid"], **plan)  -> [StepRecord]
    sweep_plans(model, cluster, gpus=..., gbs=..., policies="none;hybrid") -> SweepResult
    search(model, cluster, gpus=..., gbs=..., candidates="dp=none|int8;tp=none|fp16",
           max_error="tp=0.01")                          -> SearchResult (ranked, pareto, rows)
    search(PlanSpace(model=..., cluster=..., gpus=..., gbs=...), SearchOptions(candidates=..., max_error=...))
                                                          -> the same, from the two objects
    collective_time("allreduce", 1 << 30, cluster="dgx-h100", nodes=4, compressor="int8")
                                                          -> CollectiveRecord
    breakeven(model, cluster, "+12.7%", policy="hybrid", library="mpi", **plan)
                                                          -> BreakEven (kernel GB/s for a target speedup)
"""
from perfmodel.collectives.predict import DTYPES, collective_time
from perfmodel.collectives.registry import OPS
from perfmodel.compression import Codec, compile_spec, parse_spec
from perfmodel.prediction import StepRecord, compare, predict
from perfmodel.collectives.record import CollectiveRecord, busbw_factor
from perfmodel.explore.sweep import SweepResult
from perfmodel.explore.sweep import sweep_plans
from perfmodel.explore.search import (  # noqa: E402  (the function shadows its module's name)
    PlanSpace, SearchOptions, SearchResult, search)
from perfmodel.explore.breakeven import BreakEven, breakeven  # noqa: E402  (the function shadows its module's name)

__all__ = ["DTYPES", "OPS", "BreakEven", "Codec", "CollectiveRecord", "PlanSpace", "SearchOptions", "SearchResult",
           "StepRecord", "SweepResult", "busbw_factor", "breakeven", "collective_time", "compare", "compile_spec",
           "parse_spec", "predict", "search", "sweep_plans"]
__version__ = "0.1.0"
