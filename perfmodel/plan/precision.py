"""A plan's precision: the recipe its GEMMs run in, as Megatron-Core and Transformer Engine name them.

``bf16``, ``fp16`` and ``fp32`` run every GEMM in that dtype (the plan's ``compute_dtype``). The
low-precision recipes run the layers' GEMMs in 8 or 4 bits with bf16 activations between them
(``compute_dtype`` stays bf16): ``fp8-delayed`` (per-tensor scales from an amax history),
``fp8-tensorwise`` (per-tensor current scaling, Megatron's ``--fp8-recipe tensorwise``),
``fp8-blockwise`` (1 x 128 and 128 x 128 block scales, DeepSeek-V3's recipe), ``mxfp8`` (OCP
microscaling, an 8-bit scale per 32 elements, Blackwell) and ``nvfp4`` (4-bit elements, an fp8
scale per 16 and a per-tensor scale, Blackwell).
"""
from __future__ import annotations

from topologies.errors import InputError

HIGH_PRECISIONS = ("bf16", "fp16", "fp32")
LOW_PRECISIONS = ("fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8", "nvfp4")
PRECISION_NAMES = HIGH_PRECISIONS + LOW_PRECISIONS


def resolve(precision: str | None, compute_dtype: str | None) -> tuple[str, str | None]:
    """(precision, compute_dtype) of a request: an open precision is the compute dtype's (``None``
    while that is open too: the device's choice); a high precision sets the compute dtype; a low one
    keeps bf16 activations (its GEMMs' inputs are cast from them)."""
    if precision is None:
        return (compute_dtype or "bf16"), compute_dtype
    if precision not in PRECISION_NAMES:
        raise InputError("precision", precision, "one of " + ", ".join(PRECISION_NAMES))
    if precision in HIGH_PRECISIONS:
        if compute_dtype not in (None, precision):
            raise InputError("precision", precision, f"{compute_dtype} (the compute dtype asked for) or one of "
                             + ", ".join(LOW_PRECISIONS))
        return precision, precision
    if compute_dtype not in (None, "bf16"):
        raise InputError("precision", precision, f"a high precision with compute dtype {compute_dtype} "
                         "(low-precision recipes keep bf16 activations)")
    return precision, "bf16"
