"""perfmodel: predict the step time of LLM training with compressed communication.

This layer: collectives. ``collective_time('allreduce', 1 << 30, cluster='dgx-h100',
nodes=4, compressor='int8')`` returns a CollectiveRecord.
"""
from perfmodel.collective import DTYPES, OPS, collective_time
from perfmodel.compression import Codec, compile_spec, parse_spec
from perfmodel.record import CollectiveRecord, busbw_factor

__all__ = ["DTYPES", "OPS", "Codec", "CollectiveRecord", "busbw_factor", "collective_time",
           "compile_spec", "parse_spec"]
__version__ = "0.1.0"
