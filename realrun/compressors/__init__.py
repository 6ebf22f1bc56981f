"""Compressors for real arrays, built from perfmodel's spec grammar (numpy reference)."""
from realrun.compressors.compressor import Compressor, as_array
from realrun.compressors.payload import Payload

__all__ = ["Compressor", "Payload", "as_array"]
