"""The software stack a plan runs under: what it fuses, overlaps and spends on the host.

``megatron-core`` (Megatron-Core with Transformer Engine, the default), ``nemo`` (NeMo and
Megatron-Bridge, on Megatron-Core), ``torchtitan`` (PyTorch FSDP2 and DTensor),
``megatron-deepspeed`` (the Megatron-LM fork driven by DeepSpeed) and ``deepspeed`` (DeepSpeed's
ZeRO engine around a model's own layers).
"""
from __future__ import annotations

from topologies.errors import InputError

FRAMEWORK_NAMES = ("megatron-core", "nemo", "torchtitan", "megatron-deepspeed", "deepspeed")
DEFAULT_FRAMEWORK = "megatron-core"


def check_framework(name: str) -> str:
    """``name`` if it is a known stack; else the one-line error."""
    if name not in FRAMEWORK_NAMES:
        raise InputError("framework", name, "one of " + ", ".join(FRAMEWORK_NAMES))
    return name
