"""Compression policy: which compressor spec applies to which axis, above which size.

    policy := item ("," item)*
    item   := preset | axis "=" spec | axis ".min=" size | recipe_item "=" number
    preset := none | hybrid | mzhybrid | zhybrid | zeropp | deepseek | fp8-param-gather
            | powersgd | loco | onebit-adam | zero-one-adam | sdp4bit | naive:SPEC

Items apply left to right, so ``hybrid,dp=topk(0.01)+int8`` starts from the hybrid preset
and overrides DP. Axes name the kind of tensor at every ZeRO stage: ``dp`` (gradient
reduction: the all-reduce, or the reduce-scatter under ZeRO), ``zero`` (ZeRO's parameter
all-gather), ``tp`` (activations and their gradients inside a layer), ``pp`` (activations
between stages).

Presets (``PRESETS``; each axis's spec and minimum message size):

* ``hybrid`` follows the seed idea (Xu et al. 2024, arXiv 2409.02423: lossy ZFP on
  data-parallel gradients, lossless on tensor- and pipeline-parallel traffic): gradients
  tolerate aggressive lossy compression because error feedback returns what is dropped at
  the next step; activations and their gradients feed the very next layer with no such
  correction, so they get a lossless byte codec (zstd), from 1 MiB where a codec has a chance
  to pay for its kernels; ZeRO's parameter gathers get blockwise int8 (ZeRO++'s qwZ).
* ``mzhybrid`` and ``zhybrid`` are that paper's two schemes: MZHybrid puts MPC, the lossless
  floating-point codec of its MPI library, on TP and PP and ZFP on DP; ZHybrid uses ZFP on
  every axis at different rates: 8 bits per value (4x on fp32 gradients) with error feedback
  on gradients, a milder 12 on activations, whose error no later step corrects (1.33x on
  fp16 activations, 2.67x on fp32; the rates are commpress's choice, the scheme the paper's).
* ``zeropp`` is ZeRO++'s recipe (Wang et al. 2023): blockwise int4 gradients (qgZ), int8
  weights for the gathers (qwZ); its third part, hpZ, is a plan option.
* ``deepseek`` is DeepSeek-V3's (DeepSeek-AI 2024, section 3.3.2, run by DeepEP): the MoE
  dispatch in FP8 in both passes, the combine kept in BF16, the compute dtype, so uncompressed
  (``ep_combine=none``; a ``bf16`` spec on bf16 activations would only add cast kernels).
  DeepSeek's FP8 carries one scale per 128 values; commpress's ``fp8`` is the plain e4m3 cast,
  3% fewer bytes than that.
* ``fp8-param-gather`` is Megatron-Core's ``--fp8-param-gather`` (and torchao's float8 all-gather
  under FSDP2, ``enable_fsdp_float8_all_gather``): ZeRO's parameter gathers move e4m3 weights, half
  the bytes of bf16. Under a plan whose precision is an 8-bit recipe (``fp8-*``, ``mxfp8``) the
  gathered weights are what the GEMMs consume and the recipe casts them anyway, so the gather adds
  no kernel (``CompressionPolicy.under`` makes its spec ``fp8(gemm=true)``) and the plan keeps fp8
  primary weights instead of bf16 ones (``perfmodel.plan.memory``); under bf16 (or nvfp4, whose
  GEMMs take 4-bit weights) it is the plain cast, with its kernels. The wire carries no scales: a
  per-tensor scale is 4 bytes a tensor; MXFP8's e8m0 scale per 32 values (3% more) is not counted.
  The once-a-step amax all-reduce over dp that current scaling's shards need is not charged
  (one small collective, tens of microseconds a step).

* ``powersgd``, ``loco``, ``onebit-adam`` and ``zero-one-adam`` are recipes: their dp spec, and what
  their reference implementations do beyond it (a ``Recipe``: uncompressed warm-up steps, Adam's
  momentum compressed instead of the gradient, the variance frozen, 0/1 Adam's local steps),
  ``perfmodel.compression.recipes``, which names the file and defaults of each. ``powersgd`` is PyTorch's
  PowerSGD hook (Vogels et al. 2019): ``dp=ef(powersgd(rank=1))``, warm start, 10% of the steps
  uncompressed first. ``loco`` is LoCo (Xie et al. 2024): ``dp=ef(int4,beta=0.8,state=int8,reset=1024)``,
  4-bit gradients whose error is fed back as a moving average kept in 8 bits. ``onebit-adam`` (Tang et
  al. 2021) and ``zero-one-adam`` (Lu et al. 2022) are DeepSpeed's: ``dp=ef(sign(block=2048))``, a sign
  and a scale per chunk whose error is fed back on the worker and on the server of the two-phase
  all-reduce (realrun's ``two_phase``: an all-to-all, then an all-gather), applied to the momentum
  after 15% of the steps of ordinary Adam (1-bit Adam), or from the start with variance updates on
  exponentially spaced steps and, after ``var_freeze``, local steps (0/1 Adam). A recipe's items tune
  it after its name: ``onebit-adam,warmup=0.2`` (``recipes.ITEMS``); each needs a recipe before it.

* ``sdp4bit`` is SDP4Bit (Jia et al., NeurIPS 2024, arXiv 2410.15526; its Megatron-LM fork's
  ``megatron/quantization_helper.py``): ``zero=qwd`` (qWD: the parameter all-gather sends 4-bit groups of 2048
  of the step's weight *difference*, added by every rank to the weights it holds, so its error is the
  difference's: ``perfmodel.compression.quantizers.WeightDifference``) and ``dp=tlq`` (TLq-HS: a 32-point
  Hadamard transform, then the reduce-scatter's all-to-all in 8-bit groups of 128 inside the node and
  4-bit ones across nodes: ``TwoLevel``, priced by the hierarchical reduce-scatter). Its reference runs
  Megatron's distributed optimizer, so it is a recipe whose ZeRO stages are 1 and 2 (``recipes.RECIPES``).

``PRESET_SOURCES`` says where each preset comes from (``perfmodel catalog policies``).

The MoE axes: ``ep=`` compresses the dispatch (tokens towards their experts), ``ep_combine=`` the
combine (expert outputs back). ``ep_combine`` follows ``ep`` unless the policy sets it itself (an
``ep_combine=`` item, or a preset naming it), so ``ep=fp8`` compresses both directions, as a
user who asks to compress the expert all-to-all expects, and ``ep=fp8,ep_combine=none`` (or
the ``deepseek`` preset) is the production recipe. Presets leave axes they do not name
uncompressed.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from perfmodel.axes import AXES
from perfmodel.axes import NAMES as POLICY_AXES
from perfmodel.compression import Codec, compile_spec, split_top_level
from perfmodel.compression.recipes import ITEMS as RECIPE_ITEMS
from perfmodel.compression.recipes import Recipe, recipe_of
from topologies.errors import InputError
from topologies.units import parse_size

MIB = 2**20
PRESETS = {
    "hybrid": {"dp": ("ef(zfp(rate=8))", 0), "zero": ("int8", 0),
               "tp": ("lossless(codec=zstd)", MIB), "pp": ("lossless(codec=zstd)", MIB)},
    "mzhybrid": {"dp": ("ef(zfp(rate=8))", 0), "zero": ("int8", 0), "tp": ("mpc", MIB), "pp": ("mpc", MIB)},
    "zhybrid": {"dp": ("ef(zfp(rate=8))", 0), "zero": ("int8", 0), "tp": ("zfp(rate=12)", MIB),
                "pp": ("zfp(rate=12)", MIB)},
    "zeropp": {"dp": ("int4", 0), "zero": ("int8", 0), "tp": ("none", 0), "pp": ("none", 0)},
    "deepseek": {"ep": ("fp8", 0), "ep_combine": ("none", 0)},
    "fp8-param-gather": {"zero": ("fp8", 0)},
    "powersgd": {"dp": ("ef(powersgd(rank=1))", 0)},
    "loco": {"dp": ("ef(int4,beta=0.8,state=int8,reset=1024)", 0)},
    "onebit-adam": {"dp": ("ef(sign(block=2048))", 0)},
    "zero-one-adam": {"dp": ("ef(sign(block=2048))", 0)},
    "sdp4bit": {"dp": ("tlq(intra=8,inter=4,block=128,hadamard=32)", 0), "zero": ("qwd(bits=4,block=2048)", 0)},
}
PRESET_SOURCES = {
    "hybrid": "Xu et al. 2024, arXiv 2409.02423 (lossy gradients, lossless activations); zero: ZeRO++ qwZ",
    "mzhybrid": "Xu et al. 2024, arXiv 2409.02423: MZHybrid (MPC on tp and pp, ZFP on dp)",
    "zhybrid": "Xu et al. 2024, arXiv 2409.02423: ZHybrid (ZFP on every axis; the rates are commpress's)",
    "zeropp": "Wang et al. 2023, ZeRO++ (arXiv 2306.10209): qgZ int4 gradients, qwZ int8 weights",
    "deepseek": "DeepSeek-AI 2024, DeepSeek-V3 (arXiv 2412.19437) section 3.3.2: FP8 dispatch, BF16 combine",
    "fp8-param-gather": "Megatron-Core --fp8-param-gather (megatron/core/fp8_utils.py, distributed optimizer); "
                        "torchao float8 FSDP2 all-gather (Float8LinearConfig enable_fsdp_float8_all_gather)",
    "powersgd": "Vogels et al. 2019, PowerSGD (NeurIPS; arXiv 1905.13727); PyTorch torch/distributed/algorithms/"
                "ddp_comm_hooks/powerSGD_hook.py: rank 1, error feedback, warm start, start_powerSGD_iter",
    "loco": "Xie et al. 2024, LoCo (arXiv 2407.04480): 4-bit gradients, moving-average error kept in 8 bits; "
            "DeepSpeed deepspeed/runtime/comm/coalesced_collectives.py all_to_all_loco_quant_reduce",
    "onebit-adam": "Tang et al. 2021, 1-bit Adam (arXiv 2102.02888); DeepSpeed deepspeed/runtime/fp16/onebit/"
                   "adam.py (freeze_step) and deepspeed/runtime/comm/nccl.py compressed_allreduce",
    "zero-one-adam": "Lu et al. 2022, 0/1 Adam (arXiv 2202.06009); DeepSpeed deepspeed/runtime/fp16/onebit/"
                     "zoadam.py (var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper)",
    "sdp4bit": "Jia et al. 2024, SDP4Bit (NeurIPS; arXiv 2410.15526): qWD 4-bit weight differences (group 2048), "
               "TLq-HS 8-bit intra-node / 4-bit inter-node gradients (group 128) after a 32-point Hadamard; "
               "github.com/jindajia/SDP4Bit README and megatron/quantization_helper.py",
}


_NONE = compile_spec("none")


@dataclass(frozen=True)
class AxisPolicy:
    """One axis's spec and the smallest message it compresses; the spec is compiled once, here
    (``codec``), and the compiled object is what the model and the runtime use."""

    spec: str = "none"
    min_bytes: int = 0
    codec: Codec = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "codec", compile_spec(self.spec))

    def spec_for(self, nbytes: float) -> str:
        return self.spec if nbytes >= self.min_bytes else "none"

    def codec_for(self, nbytes: float) -> Codec:
        """The compiled spec for a message of ``nbytes`` (below ``min_bytes``: uncompressed)."""
        return self.codec if nbytes >= self.min_bytes else _NONE


@dataclass(frozen=True, kw_only=True)
class CompressionPolicy:
    text: str
    axes: dict
    named: frozenset = frozenset()    # axes an ``axis=`` item names (not only a preset)
    recipe: Recipe | None = None      # a recipe preset's mechanisms beyond its specs (module doc)

    def axis(self, name: str) -> AxisPolicy:
        return self.axes[name]

    def asks_for(self, name: str) -> bool:
        """Whether the policy means to compress axis ``name``: its spec is lossy or a cast, and an
        optional axis (ep, ep_combine, cp: ``perfmodel.axes``) is named by an item, not only set by
        a preset such as ``naive:SPEC`` (so a dense plan is not told about axes it never has)."""
        return not self.axes[name].codec.is_none and (not AXES[name].optional or name in self.named)

    @property
    def is_none(self) -> bool:
        return all(a.codec.is_none for a in self.axes.values())

    def describe(self) -> dict:
        return {a: {"spec": p.spec, "min_bytes": p.min_bytes} for a, p in self.axes.items()}

    @property
    def gathers_fp8_params(self) -> bool:
        """ZeRO's gathers carry e4m3 parameters (``fp8-param-gather``, ``zero=fp8``)."""
        return _fp8_cast(self.axes["zero"].codec)

    def under(self, eight_bit: bool) -> CompressionPolicy:
        """This policy for a plan whose GEMMs do (``eight_bit``: an fp8 recipe or mxfp8) or do not
        consume 8-bit weights: an e4m3 cast of the parameter gathers becomes ``fp8(gemm=true)``
        (no kernel: module doc) or stays the plain cast."""
        if not self.gathers_fp8_params or bool(self.axes["zero"].codec.families[0].params.get("gemm")) == eight_bit:
            return self
        zero = self.axes["zero"]
        spec = "fp8(gemm=true)" if eight_bit else "fp8"
        return replace(self, axes={**self.axes, "zero": AxisPolicy(spec, zero.min_bytes)})


def _fp8_cast(codec: Codec) -> bool:
    """``codec`` is one e4m3 cast (what an FP8 GEMM consumes)."""
    fams = codec.families
    return len(fams) == 1 and fams[0].NAME == "fp8" and fams[0].format == "e4m3"


def _preset(item: str) -> dict | None:
    if item == "none":
        return {a: AxisPolicy() for a in POLICY_AXES}
    if item in PRESETS:
        named = {a: AxisPolicy(spec, m) for a, (spec, m) in PRESETS[item].items()}
        return {a: named.get(a, AxisPolicy()) for a in POLICY_AXES}
    if item.startswith("naive:"):
        spec = item[len("naive:"):]
        return {a: AxisPolicy(spec) for a in POLICY_AXES}
    return None


def parse_policy(text: str) -> CompressionPolicy:
    """Parse a policy string (see module doc); every error names the item."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("policy", text, f"none, {', '.join(PRESETS)}, naive:SPEC, or axis=SPEC items")
    axes = {a: AxisPolicy() for a in POLICY_AXES}
    named: set = set()
    combine_set = False         # ep_combine set by an item or a preset that names it (module doc)
    recipe, tuned = None, {}
    for item in split_top_level(text):
        preset = _preset(item)
        if preset is not None:
            axes, named = preset, set()
            combine_set = item.startswith("naive:") or "ep_combine" in PRESETS.get(item, {})
            recipe, tuned = recipe_of(item), {}
            continue
        key, sep, value = item.partition("=")
        if sep and key.strip() in RECIPE_ITEMS:
            if recipe is None:
                raise InputError("policy", item, f"{key.strip()}= after a recipe preset: "
                                 "powersgd, loco, onebit-adam, zero-one-adam or sdp4bit")
            tuned[key.strip()] = value.strip()
            continue
        axis, _, attr = key.strip().partition(".")
        if not sep or axis not in POLICY_AXES or attr not in ("", "min"):
            raise InputError("policy", item, f"none, {', '.join(PRESETS)}, naive:SPEC, AXIS=SPEC or AXIS.min=SIZE "
                             f"with AXIS in {', '.join(POLICY_AXES)}")
        if attr == "min":
            axes[axis] = replace(axes[axis], min_bytes=parse_size(value, f"policy.{axis}.min"))
        else:
            axes[axis] = replace(axes[axis], spec=value.strip())
        named.add(axis)
        combine_set = combine_set or axis == "ep_combine"
    if not combine_set:
        axes["ep_combine"] = axes["ep"]
        if "ep" in named:
            named.add("ep_combine")
    if recipe is not None and tuned:
        recipe = recipe.with_items(tuned)
    return CompressionPolicy(text=text, axes=axes, named=frozenset(named), recipe=recipe)


def as_policy(text) -> CompressionPolicy:
    """A policy string, or a bare compressor spec read as ``dp=SPEC`` (the gradient reduction):
    what realrun's DDP hook and FSDP2 collectives take. A policy is told by its first item: a
    preset (``none``, ``hybrid``, ``zeropp``, ``naive:SPEC`` ...) or an ``axis=SPEC`` item."""
    if isinstance(text, CompressionPolicy):
        return text
    if not isinstance(text, str) or not text.strip():
        raise InputError("policy", text, f"a compressor spec, or a policy: none, {', '.join(PRESETS)}, naive:SPEC, "
                         "or axis=SPEC items")
    first = split_top_level(text)[0]
    if _preset(first) is not None or "=" in first.split("(")[0]:
        return parse_policy(text)
    compile_spec(text)   # validates the spec (one clear error)
    return parse_policy(f"dp={text}")


def split_policies(text: str) -> list[str]:
    """'none,naive:int8,hybrid,dp=int8' -> ['none', 'naive:int8', 'hybrid,dp=int8']: an
    ``axis=...`` item belongs to the policy before it (or starts one from none). With a ';'
    anywhere, policies are split on ';' only: 'none;dp=int8;hybrid'."""
    if ";" in (text or ""):
        out = [p.strip() for p in split_top_level(text, ";")]
        if not out:
            raise InputError("policies", text, "one or more policies separated by semicolons")
        for p in out:
            parse_policy(p)
        return out
    out: list[str] = []
    for item in split_top_level(text or ""):
        axis = item.partition("=")[0].partition(".")[0].strip()
        if "=" in item and (axis in POLICY_AXES or axis in RECIPE_ITEMS) and out:
            out[-1] += "," + item
        else:
            out.append(item)
    if not out:
        raise InputError("policies", text, "one or more policies separated by commas")
    for p in out:
        parse_policy(p)
    return out
