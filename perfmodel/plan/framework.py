"""The software stack a plan runs under: what it fuses, overlaps and spends on the host.

``megatron-core`` (Megatron-Core with Transformer Engine, the default), ``nemo`` (NeMo and
Megatron-Bridge, on Megatron-Core), ``torchtitan`` (PyTorch FSDP2 and DTensor),
``megatron-deepspeed`` (the Megatron-LM fork driven by DeepSpeed) and ``deepspeed`` (DeepSpeed's
ZeRO engine around a model's own layers).

Each stack is a ``FrameworkProfile`` read from ``perfmodel/catalog/frameworks.toml``: every constant
with its source, and where a constant was fitted on published runs of that stack
(``scripts/fit_framework_profiles.py``), its standard error, the sources it was fitted on and the
range the fit may place it in. ``megatron-core`` is the model as calibrated before profiles
existed: every constant neutral, so its predictions are unchanged. The profile acts where the
model already has a knob: the host seconds per kernel (``device``), the plan's overlap defaults
(``resolve``: a field the request leaves ``None`` takes the stack's default, a value the user
gave wins) and, in the engines, the stage's kernels, memory passes, recompute, host time and
ZeRO-3 prefetch (``perfmodel.step.framework``). docs/frameworks.md says what each assumes.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache

from topologies.errors import InputError

FRAMEWORK_NAMES = ("megatron-core", "nemo", "torchtitan", "megatron-deepspeed", "deepspeed")
DEFAULT_FRAMEWORK = "megatron-core"


def check_framework(name: str) -> str:
    """``name`` if it is a known stack; else the one-line error."""
    if name not in FRAMEWORK_NAMES:
        raise InputError("framework", name, "one of " + ", ".join(FRAMEWORK_NAMES))
    return name


@dataclass(frozen=True, kw_only=True)
class Constant:
    """One constant of a profile: its value, where it comes from and, if fitted, how well."""

    value: float | bool
    source: str
    stderr: float | None = None       # standard error of a fitted value (from the fit's Jacobian)
    fitted_on: tuple = ()             # the published sources (validation/published) it was fitted on
    range: tuple | None = None        # (low, high): where a fit may place it (the mechanism's bounds)


@dataclass(frozen=True, kw_only=True, eq=False)
class FrameworkProfile:
    """What a stack does per layer, microbatch and step beyond Megatron-Core's fused kernels.

    Host: ``host_op_scale`` times the device's ``host_op_s`` to issue a kernel; ``layer_host_us``
    more per layer and operation (module hooks: FSDP2's and ZeRO-3's gathers, DeepSpeed's
    submodule bookkeeping); ``microbatch_host_ms`` per microbatch during which the GPU waits (a
    synchronising call: the loss read back, an engine's bookkeeping); ``step_host_ms`` per step
    (optimizer launch, gradient-norm and overflow checks, logging). GPU: ``eager_kernels`` more
    kernels per layer forward than Megatron-Core's fused set, ``eager_traffic`` more passes over
    the layer's activation bytes (each unfused elementwise operation reads and writes its tensor),
    ``score_accesses_fwd`` / ``_bwd`` accesses per attention score where the scores are in memory
    (0: flash attention), ``zero3_copy_bytes_fwd`` / ``_bwd`` bytes per parameter copied around
    ZeRO-3's gathers and reduce-scatters, ``grad_accum_bytes`` bytes per parameter of the stage
    moved after every microbatch's backward to accumulate its gradients apart from the weight-gradient
    GEMMs (DeepSpeed's BF16 optimizer adds them into fp32 buffers). Recompute: the stack's ``selective`` reruns
    ``selective_gemm_fraction`` of a layer's forward GEMMs and its eager work (attention too where
    ``selective_attention``). ZeRO-3: ``zero3_prefetch_params`` parameters gathered ahead (0: one
    whole layer). Pipeline: ``pp_full_activation``, every TP rank sends the stage's whole activation
    (no scatter-gather). Defaults the request may override: ``tp_overlap`` (with tp > 1 and sequence
    parallelism), ``dp_overlap``; and ``param_gather_overlap`` (ZeRO-1/2's parameter all-gather
    behind the next step's forward)."""

    name: str
    description: str
    host_op_scale: float = 1.0
    layer_host_us: float = 0.0
    microbatch_host_ms: float = 0.0
    step_host_ms: float = 0.0
    eager_kernels: float = 0.0
    eager_traffic: float = 0.0
    score_accesses_fwd: float = 0.0
    score_accesses_bwd: float = 0.0
    zero3_copy_bytes_fwd: float = 0.0
    zero3_copy_bytes_bwd: float = 0.0
    grad_accum_bytes: float = 0.0
    selective_gemm_fraction: float = 0.0
    selective_attention: bool = True
    zero3_prefetch_params: float = 0.0
    pp_full_activation: bool = False
    tp_overlap: bool = False
    dp_overlap: bool = True
    param_gather_overlap: bool = False
    constants: tuple = ()             # ((field, Constant), ...): every value above with its source
    # eq=False: a profile is hashed by identity (the engines' caches key on it; the catalog's are
    # loaded once, a fit's trial profiles are new objects)

    @property
    def neutral(self) -> bool:
        """True where the profile changes nothing the model computes (megatron-core's)."""
        return all(getattr(self, f) == getattr(NEUTRAL, f) for f in CONSTANT_FIELDS)

    def constant(self, field: str) -> Constant:
        return dict(self.constants)[field]

    def with_values(self, **values) -> FrameworkProfile:
        """This profile with some constants replaced (a fit's trial point), sources kept."""
        unknown = set(values) - set(CONSTANT_FIELDS)
        if unknown:
            raise InputError("framework constant", ", ".join(sorted(unknown)), ", ".join(CONSTANT_FIELDS))
        consts = tuple((k, replace(c, value=values.get(k, c.value))) for k, c in self.constants)
        return replace(self, **values, constants=consts)

    def device(self, dev):
        """The device as this stack drives it: its host seconds per kernel scaled."""
        if self.host_op_scale == 1.0:
            return dev
        return replace(dev, host_op_s=dev.host_op_s * self.host_op_scale)

    def resolve(self, request):
        """The request with the overlaps it leaves open (``None``) set to this stack's defaults:
        TP overlap only where the plan can overlap (tp > 1 with sequence parallelism)."""
        open_fields = {}
        if request.tp_overlap is None:
            open_fields["tp_overlap"] = self.tp_overlap and request.degrees.tp > 1 and bool(request.sequence_parallel)
        if request.dp_overlap is None:
            open_fields["dp_overlap"] = self.dp_overlap
        return request.with_(**open_fields) if open_fields else request


NEUTRAL = FrameworkProfile(name="neutral", description="no change to the model")
CONSTANT_FIELDS = tuple(f.name for f in fields(FrameworkProfile) if f.name not in ("name", "description", "constants"))
FLAGS = tuple(f for f in CONSTANT_FIELDS if isinstance(getattr(NEUTRAL, f), bool))


@cache
def framework_profiles() -> dict[str, FrameworkProfile]:
    """{name: FrameworkProfile} of every stack, from ``perfmodel/catalog/frameworks.toml``."""
    from perfmodel.devices import read_catalog

    raw = read_catalog("frameworks")
    missing = [n for n in FRAMEWORK_NAMES if n not in raw]
    if missing:
        raise InputError("frameworks.toml", ", ".join(missing), "a section per stack of " + ", ".join(FRAMEWORK_NAMES))
    return {name: _profile(name, raw[name]) for name in FRAMEWORK_NAMES}


def framework_profile(name: str) -> FrameworkProfile:
    """The profile of stack ``name`` (refused in one line when unknown)."""
    return framework_profiles()[check_framework(name)]


def _profile(name: str, body: dict) -> FrameworkProfile:
    consts = tuple((field, _constant(name, field, body[field])) for field in CONSTANT_FIELDS if field in body)
    absent = [f for f in CONSTANT_FIELDS if f not in body]
    if absent:
        raise InputError(f"frameworks.{name}", ", ".join(absent), "every constant, each with its value and source")
    return FrameworkProfile(name=name, description=body.get("description", ""),
                            **{k: c.value for k, c in consts}, constants=consts)


def _constant(name: str, field: str, body: dict) -> Constant:
    where = f"frameworks.{name}.{field}"
    if not isinstance(body, dict) or "value" not in body or not body.get("source"):
        raise InputError(where, body, "a table with value and source")
    value = body["value"]
    flag = field in FLAGS
    if flag != isinstance(value, bool) or (not flag and (not isinstance(value, (int, float)) or value < 0)):
        raise InputError(where, value, "true or false" if flag else "a number >= 0")
    span = tuple(body["range"]) if "range" in body else None
    if span is not None and not span[0] <= value <= span[1]:
        raise InputError(where, value, f"within its range {span[0]} - {span[1]}")
    return Constant(value=value if flag else float(value), source=body["source"], stderr=body.get("stderr"),
                    fitted_on=tuple(body.get("fitted_on", ())), range=span)
