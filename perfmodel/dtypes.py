"""Element types: the one table of bytes per element (``DTYPE_BYTES``)."""
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
