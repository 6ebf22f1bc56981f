"""Compressor specs for the model: grammar, families, compiled codecs."""
from perfmodel.compression.codec import Codec, compile_spec
from perfmodel.compression.families import FAMILIES, data_dependent
from perfmodel.compression.grammar import parse_spec, split_top_level

__all__ = ["FAMILIES", "Codec", "compile_spec", "data_dependent", "parse_spec", "split_top_level"]
