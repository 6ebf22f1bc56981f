"""A plan's precision: the recipe its GEMMs run in, as Megatron-Core and Transformer Engine name them.

``bf16``, ``fp16`` and ``fp32`` run every GEMM in that dtype (the plan's ``compute_dtype``). The
low-precision recipes run the layers' GEMMs in 8 or 4 bits with bf16 activations between them
(``compute_dtype`` stays bf16): ``fp8-delayed`` (per-tensor scales from an amax history),
``fp8-tensorwise`` (per-tensor current scaling, Megatron's ``--fp8-recipe tensorwise``),
``fp8-blockwise`` (1 x 128 and 128 x 128 block scales, DeepSeek-V3's recipe), ``mxfp8`` (OCP
microscaling, an 8-bit scale per 32 elements, Blackwell) and ``nvfp4`` (4-bit elements, an fp8
scale per 16 and a per-tensor scale, Blackwell).

Each recipe is a ``Recipe`` read from ``catalog/precisions.toml`` (every number's source is there):
which GEMMs run low (``low_gemms``: fprop, dgrad, wgrad), in which kernel (its peak and efficiency
table, ``perfmodel.devices``), how its operands are quantized (element and scale bytes, scale
blocks, a transposed or column-wise second copy, an amax pass, the Hadamard transform of the wgrad
inputs) and so the bytes a quantize moves per element (``quantize_bytes``), which amax reductions
it adds, and which layers stay bf16 (attention's score and value products, the embedding and the
LM head always; ``bf16_layers_start`` / ``bf16_layers_end`` transformer layers at the ends).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from topologies.errors import InputError

HIGH_PRECISIONS = ("bf16", "fp16", "fp32")
LOW_PRECISIONS = ("fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8", "nvfp4")
PRECISION_NAMES = HIGH_PRECISIONS + LOW_PRECISIONS
BF16_BYTES = 2.0                 # a quantize reads bf16 activations, gradients and weights


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


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """One precision's effect on a step (module doc; ``catalog/precisions.toml`` field by field)."""

    name: str
    gemm: str = ""                  # the low GEMMs' kernel (a [gemm.*] key); "" for a high precision
    peak: str = ""                  # that kernel's peak (a peak_tflops key: fp8, fp4); a high precision's own name
    low_gemms: tuple = ()           # of fprop, dgrad, wgrad
    element_bytes: float = 2.0
    activation_block: int = 0       # elements per scale (0: one per tensor)
    weight_block: int = 0
    scale_bytes: float = 0.0
    copies: str = "tn"              # "tn": a transposed copy where FP8 GEMMs take only TN; "both": always two
    amax_pass: bool = False
    wgrad_hadamard: bool = False
    amax_reduction: str = "none"    # none, sequence-parallel, autocast
    quantize_efficiency: float = 1.0
    bf16_layers_start: int = 0
    bf16_layers_end: int = 0
    archs: tuple = ()
    tn_only_archs: tuple = ()
    source: str = ""

    @property
    def is_low(self) -> bool:
        return bool(self.low_gemms)

    @property
    def eight_bit(self) -> bool:
        """Its GEMMs consume 8-bit weights (what an fp8 parameter gather delivers)."""
        return self.is_low and self.element_bytes == 1.0

    def gemm_dtype(self, gemm: str, compute_dtype: str) -> str:
        """The dtype (a peak key or a [gemm.*] kernel, ``Device.gemm_time_s``) of one of a low
        layer's GEMMs (fprop, dgrad or wgrad)."""
        return self.gemm if gemm in self.low_gemms else compute_dtype

    def copies_on(self, arch: str) -> int:
        """Quantized copies of one tensor: two (row-wise and column-wise, or the transpose TN-only
        FP8 GEMMs need) or one (per-tensor FP8 where the GEMMs take any layout)."""
        return 2 if self.copies == "both" or arch in self.tn_only_archs else 1

    def stored_bytes(self, operand: str) -> float:
        """Bytes per element of one quantized copy of ``operand`` (``activation``: a GEMM's input,
        ``gradient``: its output gradient, ``weight``), its scales included."""
        block = self.weight_block if operand == "weight" else self.activation_block
        return self.element_bytes + (self.scale_bytes / block if block else 0.0)

    def quantize_bytes(self, operand: str, arch: str) -> float:
        """HBM bytes read and written per element to quantize one operand for every GEMM that
        takes it: the bf16 read (and the amax pass's), and a second kernel's for the Hadamard
        transformed column-wise copy of the wgrad inputs; the copies written with their scales."""
        if not self.is_low:
            return 0.0
        read = BF16_BYTES * (1 + self.amax_pass)
        if self.wgrad_hadamard and operand != "weight":
            read *= 2
        return read + self.copies_on(arch) * self.stored_bytes(operand)

    def quantize_kernels(self, operand: str) -> int:
        """Kernels that quantize one operand: the cast (or quantize), its amax pass, and the Hadamard
        transform's quantize and amax for the wgrad inputs."""
        if not self.is_low:
            return 0
        one = 1 + self.amax_pass
        return 2 * one if self.wgrad_hadamard and operand != "weight" else one

    def high_layers(self, layers: int, first: bool, last: bool) -> int:
        """Of a stage's ``layers`` transformer layers, those kept in bf16 (the stage that holds the
        model's first layer keeps ``bf16_layers_start``, the last one ``bf16_layers_end``)."""
        if not self.is_low:
            return layers
        return min(layers, first * self.bf16_layers_start + last * self.bf16_layers_end)

    def allowed_on(self, dev) -> bool:
        """Whether ``dev`` runs this recipe: its GEMMs' peak (a high precision's own), and the
        architecture it needs."""
        return self.peak in dev.peak_flops_per_s and (not self.archs or dev.arch in self.archs)

    def check(self, dev) -> None:
        """Refuse a low precision the GPU cannot run, naming what it allows (a high one is the compute
        dtype, whose peak the plan's setup checks)."""
        if self.is_low and not self.allowed_on(dev):
            raise InputError("precision", self.name, "one of " + ", ".join(allowed_precisions(dev))
                             + f" on {dev.key} ({dev.arch or 'no architecture'})")


@cache
def recipes() -> dict[str, Recipe]:
    """Every precision's Recipe: the high ones plain, the low ones from ``catalog/precisions.toml``."""
    from perfmodel.devices import read_catalog

    body = read_catalog("precisions")
    tn_only = tuple(body["layout"]["tn_only_archs"])
    out = {name: Recipe(name=name, peak=name, element_bytes=4.0 if name == "fp32" else 2.0)
           for name in HIGH_PRECISIONS}
    for name in LOW_PRECISIONS:
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in body["recipe"][name].items()}
        out[name] = Recipe(name=name, peak=body["gemm"][d["gemm"]]["peak"], tn_only_archs=tn_only, **d)
    return out


def recipe(name: str) -> Recipe:
    """The Recipe of precision ``name`` (InputError naming ``precision`` for an unknown one)."""
    table = recipes()
    if name not in table:
        raise InputError("precision", name, "one of " + ", ".join(PRECISION_NAMES))
    return table[name]


def allowed_precisions(dev) -> tuple:
    """The precisions ``dev`` runs."""
    return tuple(name for name, r in recipes().items() if r.allowed_on(dev))


def peak_dtype(precision: str, compute_dtype: str) -> str:
    """The peak key of a plan's GEMMs: the low recipe's kernel's (fp8, fp4), else the compute dtype."""
    r = recipe(precision)
    return r.peak if r.is_low else compute_dtype
