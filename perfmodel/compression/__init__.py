"""Compressor specs for the model: grammar, families, compiled codecs."""
from perfmodel.compression.codec import Codec, compile_spec
from perfmodel.compression.families import DEFAULT_RATIO, FAMILIES
from perfmodel.compression.grammar import parse_spec, split_top_level

__all__ = ["DEFAULT_RATIO", "FAMILIES", "Codec", "compile_spec", "parse_spec", "split_top_level"]
