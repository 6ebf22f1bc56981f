"""ParallelPlan: how one training step is laid out on the GPUs, validated.

Defaults and why: ``bucket_bytes`` 25 MiB is PyTorch DDP's ``bucket_cap_mb=25``; ``dp_overlap``
(buckets reduced while backward runs) is what DDP and Megatron's ``--overlap-grad-reduce`` do
(a loop that reduces after backward, as ``realrun train``, sets it False); gradients
are reduced in fp32 (``grad_dtype``) as Megatron-LM's main_grad buffers and DDP with fp32
master weights do; compute in bf16 (fp16 on GPUs without bf16). Placement order ``tp,pp,dp``
puts TP innermost (inside a node), then PP, then DP.

Context parallelism (``cp``) splits every sequence over cp more GPUs (gpus = tp x cp x pp x dp).
Expert parallelism (``ep``) and expert tensor parallelism (``etp``, default tp) add no GPUs: as
Megatron-Core's MoE parallel folding, the expert layers lay etp x ep x edp over each stage's
tp x cp x dp ranks (``perfmodel.plan.degrees``, ``perfmodel.plan.mesh``), so ep x etp divides tp x cp
x dp, ep divides the experts and etp the expert FFN width. ``order`` may name cp and ep to place
them (``perfmodel.plan.mesh``: otherwise right outside tp, as Megatron-Core). cp needs the sequence
to split into 2 cp chunks (the load-balanced causal ring, ``perfmodel.events``). Every ZeRO stage
runs with ep (torchtitan trains MoE with FSDP2 over the expert-data-parallel ranks): the experts'
states shard over edp, the dense ones over dp x cp. Pipeline stages split the layers evenly
(earlier stages take the remainder) unless the request fixes the split as Megatron does
(``perfmodel.plan.stages``: first and last stage layers, the embedding and loss counted as layers,
or Megatron's layout string).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from perfmodel.dtypes import DTYPE_BYTES  # noqa: F401  (re-exported: the plan's dtypes are its keys)
from perfmodel.plan.degrees import DEFAULT_ORDER, Degrees, read_through, split_degrees
from perfmodel.plan.framework import DEFAULT_FRAMEWORK, framework_profile
from perfmodel.plan import stages
from perfmodel.plan.recompute import resolve as resolve_recompute
from perfmodel.plan.mesh import GROUP_KINDS as MESH_GROUP_KINDS
from perfmodel.plan.precision import HIGH_PRECISIONS, LOW_PRECISIONS, resolve as resolve_precision
from perfmodel.plan.routing import resolve as resolve_routing
from perfmodel.step import mamba
from perfmodel.step.schedule import SCHEDULES
from perfmodel.workload import ModelSpec
from topologies import bounds
from topologies.errors import InputError

RECOMPUTE = ("none", "selective", "full")
# whose kernels compute the layers (perfmodel.step.compute): fused, Megatron-Core with Transformer Engine
# (flash attention, ring blocks included; fused MoE permutation); eager, PyTorch eager as realrun's
# layers run (its ring attention materialises every score block, its MoE layer permutes through
# zeroed capacity queues and layout copies; whole-sequence attention is PyTorch's fused kernel)
KERNELS = ("fused", "eager")
MESH_AXES = DEFAULT_ORDER         # the mesh's dimensions; ``order`` permutes them, innermost first
ORDER_OPTIONAL = tuple(Degrees.placed_after())   # dimensions ``order`` may also name (the mesh places them otherwise)
GROUP_KINDS = MESH_GROUP_KINDS    # the group kinds a mesh has: the dense layers' and the expert layers' (etp, ep, edp)
DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """A validated plan (``make_plan``): its ``degrees`` (tp, cp, ep, etp, pp, dp and the placement
    order, ``perfmodel.plan.degrees``; read as ``plan.tp`` ... too) and how the step runs on them.
    ``layout``: layers per virtual stage in model order where the split is fixed
    (``perfmodel.plan.stages``); empty for the even split."""

    degrees: Degrees
    zero: int = 0
    mbs: int = 1
    gbs: int = 1
    seq: int
    sequence_parallel: bool = False
    recompute: str = "none"
    recompute_modules: tuple = ()   # selective's modules (perfmodel.plan.recompute): ("core_attn",) by default
    schedule: str = "1f1b"
    virtual_stages: int = 1
    compute_dtype: str = "bf16"
    grad_dtype: str = "fp32"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    dp_overlap: bool = True   # gradient buckets reduced during backward (DDP, Megatron); False: after it
    hpz: bool = False         # ZeRO++ hpZ: a secondary ZeRO-3 parameter partition inside each node
    tp_overlap: bool = False  # TP collectives overlapped with their GEMMs (Megatron --tp-comm-overlap)
    kernels: str = "fused"    # the layers' kernels: fused (Megatron-Core, TE) or eager (realrun's; KERNELS)
    precision: str = "bf16"   # the GEMMs' recipe (perfmodel.plan.precision): bf16 ... fp8-tensorwise, mxfp8, nvfp4
    framework: str = DEFAULT_FRAMEWORK   # the software stack (perfmodel.plan.framework)
    routing: str | None = None   # MoE routing: balanced, capacity:F or a histogram file (perfmodel.plan.routing)
    ep_overlap: str = "none"     # MoE all-to-alls behind another micro-batch: none, batch, dualpipe (EP_OVERLAPS)
    ep_kernels: str = "nccl"     # the all-to-alls' kernels (their SMs a tax on compute): EP_KERNELS
    fp8_attention: bool = False  # attention's products in FP8 (Transformer Engine's fp8_dot_product_attention)
    layout: tuple = ()        # layers per virtual stage, model order (perfmodel.plan.stages); (): the even split

    def __getattr__(self, name: str):
        return read_through(self, name)

    def as_dict(self) -> dict:
        """The plan's fields, its degrees and order among them (what a StepRecord reports)."""
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "degrees"}
        return {**self.degrees.as_dict(), "order": self.order, **rest}

    @property
    def gpus(self) -> int:
        return self.degrees.gpus

    @property
    def edp(self) -> int:
        """Expert data parallel: ranks that hold the same experts (tp x cp x dp / (etp x ep))."""
        return self.degrees.edp

    @property
    def experts_apart(self) -> bool:
        """Whether the routed experts are laid out apart from the dense weights (ep > 1 or etp
        other than tp): their gradients then reduce, and ZeRO shards them, over edp."""
        return self.ep > 1 or self.etp != self.tp

    @property
    def local_seq(self) -> int:
        """Tokens of a sequence one GPU holds (seq / cp)."""
        return self.seq // self.cp

    @property
    def routed_tokens(self) -> int:
        """Tokens of one microbatch a GPU routes in a MoE layer: seq / cp x mbs (with sequence
        parallelism its 1 / tp of them; without, every TP rank dispatches the whole microbatch, as
        Megatron-Core's all-to-all dispatcher with expert tensor parallelism equal to tp)."""
        tokens = self.local_seq * self.mbs
        return tokens // self.tp if self.sequence_parallel else tokens

    @property
    def expert_tokens(self) -> float:
        """Tokens of one microbatch whose top-k copies one GPU's experts compute, per tp x cp share
        of them (the expert model-parallel group's tokens spread over its etp x ep ranks, each
        expert's rows gathered over etp: Megatron-Core's all-to-all dispatcher, all-to-all over ep
        then all-gather over etp): seq / cp x mbs x etp / tp, seq / cp x mbs where etp = tp."""
        return self.local_seq * self.mbs * self.etp / self.tp

    @property
    def microbatches(self) -> int:
        """Microbatches per pipeline per step: gbs / (mbs x dp)."""
        return self.gbs // (self.mbs * self.dp)

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers per stage: the plan's fixed split (``layout``, its chunks summed per stage), else
        even with earlier stages taking the remainder."""
        if self.layout:
            return stages.stage_sums(self.layout, self.pp)
        base, extra = divmod(num_layers, self.pp)
        return tuple(base + (1 if s < extra else 0) for s in range(self.pp))

    def stage_first_layer(self, stage: int, num_layers: int) -> int:
        """The index of a stage's first layer (stages hold contiguous layers; with interleaving
        the MoE layers are counted as if they did)."""
        if self.layout:
            return sum(self.stage_layers(num_layers)[:stage])
        base, extra = divmod(num_layers, self.pp)
        return base * stage + min(stage, extra)      # the sum of stage_layers before it


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """A plan as a user asks for it, before ``make_plan`` validates it against a model and the
    job's GPUs: the same fields and defaults as ``make_plan``'s keywords, with ``degrees.dp``
    possibly ``auto``, ``compute_dtype`` None (the device's: bf16 where it has it, else fp16,
    else fp32), ``precision`` None (the compute dtype's), ``dp_overlap`` and ``tp_overlap`` None
    (the framework's defaults), and the job's size on the cluster (``gpus`` or ``nodes``; default:
    the catalog's nodes). ``PlanRequest.of(tp=2, zero=1, ...)`` takes the degrees as keywords among
    the rest. The pipeline split (``perfmodel.plan.stages``): ``first_stage_layers`` and
    ``last_stage_layers``, or ``account_for_embedding`` and ``account_for_loss``, or
    ``pipeline_layout`` (Megatron's layout string); none set: even."""

    gpus: int | None = None
    nodes: int | None = None
    degrees: Degrees = Degrees(dp="auto")
    zero: int = 0
    mbs: int = 1
    gbs: int | None = None
    seq: int | None = None
    sequence_parallel: bool = False
    recompute: str = "none"
    recompute_modules: tuple | str | None = None   # Megatron --recompute-modules (with selective): names or "a,b"
    schedule: str = "1f1b"
    compute_dtype: str | None = None
    grad_dtype: str = "fp32"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    dp_overlap: bool | None = None    # None: the framework's default (perfmodel.plan.framework)
    hpz: bool = False
    tp_overlap: bool | None = None    # None: the framework's default where the plan can overlap
    kernels: str = "fused"
    precision: str | None = None
    framework: str = DEFAULT_FRAMEWORK
    routing: str | None = None        # None: the model file's (perfmodel.plan.routing)
    ep_overlap: str = "none"          # perfmodel.step.expert_overlap: none, batch (Megatron-Core), dualpipe (DeepSeek)
    ep_kernels: str = "nccl"          # nccl, deepep (24 SMs), deepep-ll (none), hybridep (32 SMs)
    fp8_attention: bool = False       # Megatron --fp8-dot-product-attention: needs an FP8 (or NVFP4) recipe
    first_stage_layers: int | None = None    # Megatron --decoder-first-pipeline-num-layers
    last_stage_layers: int | None = None     # Megatron --decoder-last-pipeline-num-layers
    account_for_embedding: bool = False      # Megatron --account-for-embedding-in-pipeline-split
    account_for_loss: bool = False           # Megatron --account-for-loss-in-pipeline-split
    pipeline_layout: str | None = None       # Megatron --pipeline-model-parallel-layout

    def __post_init__(self):
        """Sizes within their declared bounds (``topologies.bounds``: a batch sizes the pipeline schedule)."""
        for name, bound in (("mbs", "mbs"), ("gbs", "gbs"), ("seq", "seq_len"), ("bucket_bytes", "bucket_bytes")):
            value = getattr(self, name)
            if value is not None:
                _whole(name, value, bound)

    def __getattr__(self, name: str):
        return read_through(self, name)

    @classmethod
    def of(cls, **fields) -> PlanRequest:
        """A request from keywords, the degrees (``tp`` ... ``order``) among them."""
        return cls().with_(**fields)

    def with_(self, **fields) -> PlanRequest:
        """This request with ``fields`` replaced, degrees (``tp`` ... ``order``) among them."""
        return replace(self, **split_degrees(self.degrees, fields))

    def build(self, model: ModelSpec, gpus: int, compute_dtype: str) -> ParallelPlan:
        """The validated plan on ``gpus`` GPUs (``compute_dtype`` where neither the request's compute
        dtype nor a high precision sets it)."""
        own = self.precision if self.precision in HIGH_PRECISIONS else None
        return make_plan(model, gpus, self, compute_dtype=self.compute_dtype or own or compute_dtype)


DEGREE_NAMES = Degrees.names()
REQUEST_FIELDS = frozenset({f.name for f in fields(PlanRequest)} - {"degrees"} | set(DEGREE_NAMES) | {"order"})


def _whole(field: str, value, bound: str) -> int:
    """``value``, an int within the declared bound ``bound`` (else InputError naming ``field``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(field, value, bounds.describe(bound))
    return bounds.check(field, value, bound)


def parse_schedule(text: str) -> tuple[str, int]:
    name, _, v = str(text).partition(":")
    if name not in SCHEDULES or (v and name != "interleaved"):
        raise InputError("schedule", text, "gpipe, 1f1b or interleaved:V")
    if name != "interleaved":
        return name, 1
    if not v.isdigit() or int(v) < 2:
        raise InputError("schedule", text, "interleaved:V with V >= 2 virtual stages per GPU")
    return name, int(v)


def make_plan(model: ModelSpec, gpus: int, request: PlanRequest | None = None, **fields) -> ParallelPlan:
    """Validate a plan for ``model`` on ``gpus`` GPUs; every error names its field. The plan is
    ``request`` (a PlanRequest) or its fields as keywords (``make_plan(m, 8, tp=2, zero=1)``);
    an open ``compute_dtype`` means bf16."""
    r = PlanRequest.of(**fields) if request is None else request.with_(**fields) if fields else request
    r = framework_profile(r.framework).resolve(r)      # refuses an unknown stack; its overlap defaults
    degrees = r.degrees.check()
    mbs = r.mbs                                        # sizes checked by the request (PlanRequest.__post_init__)
    degrees = degrees.resolved(gpus)
    tp, pp, dp, cp = degrees.tp, degrees.pp, degrees.dp, degrees.cp
    zero = r.zero
    if model.num_heads % tp or model.num_kv_heads % tp:
        raise InputError("tp", tp, f"a divisor of num_heads {model.num_heads} and num_kv_heads "
                         f"{model.num_kv_heads}")
    if model.mamba_layers:
        mamba.check_tp(model, tp)      # whole Mamba heads and groups a rank (Megatron-Core's MambaMixer)
    if pp > model.num_layers:
        raise InputError("pp", pp, f"at most num_layers {model.num_layers}")
    gbs = mbs * dp if r.gbs is None else r.gbs
    if gbs > bounds.bound("gbs")[2]:       # the default: a given gbs is checked by the request
        raise InputError("gbs", gbs, f"{bounds.describe('gbs')} (the default gbs, mbs {mbs} x dp {dp}, is past it)")
    if gbs % (mbs * dp):
        step = mbs * dp
        near = sorted({max(step, gbs // step * step), (gbs // step + 1) * step})
        raise InputError("gbs", gbs, f"a multiple of mbs x dp = {step} (nearest: "
                         + " or ".join(map(str, near)) + ")")
    name, virtual = parse_schedule(r.schedule)
    layout = stages.resolve(r, model.num_layers, getattr(model, "mtp_layers", 0), pp, virtual)
    if virtual > 1 and ((not layout and not _chunks_even(model.num_layers, pp * virtual)) or (gbs // (mbs * dp)) % pp):
        raise InputError("schedule", r.schedule, "interleaving needs num_layers (or num_layers + 2, the embedding "
                         "and loss counted as layers) divisible by pp x V, or a fixed split (first and last stage "
                         f"layers, a pipeline layout), and microbatches ({gbs // (mbs * dp)}) divisible by pp {pp}")
    _check_options(r, tp)
    _check_ep_overlap(r, model, name, pp, gbs // (mbs * dp))
    precision, dtype = resolve_precision(r.precision, r.compute_dtype)
    _check_fp8_attention(r, precision)
    _check_order(degrees.order)
    seq = model.seq_len if r.seq is None else r.seq
    _check_experts(model, degrees)
    _check_cp(cp, seq)
    return ParallelPlan(degrees=degrees, zero=zero, mbs=mbs, gbs=gbs, seq=seq,
                        sequence_parallel=bool(r.sequence_parallel) and tp > 1, recompute=r.recompute,
                        recompute_modules=resolve_recompute(r.recompute, r.recompute_modules, r.framework),
                        schedule=name, virtual_stages=virtual, compute_dtype=dtype or "bf16",
                        grad_dtype=r.grad_dtype, bucket_bytes=r.bucket_bytes,
                        dp_overlap=bool(r.dp_overlap), hpz=bool(r.hpz) and dp > 1, tp_overlap=bool(r.tp_overlap),
                        kernels=r.kernels, precision=precision, framework=r.framework,
                        routing=resolve_routing(r.routing, model), ep_overlap=r.ep_overlap,
                        ep_kernels=r.ep_kernels, fp8_attention=bool(r.fp8_attention), layout=layout)


def _chunks_even(layers: int, chunks: int) -> bool:
    """Whether ``layers`` split into ``chunks`` equal model chunks: as they are, or with the embedding and
    the loss counted as one layer each (Megatron-Core's ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``, which Llama 3.1 405B's 126 layers on pp 8 x V 8 use)."""
    return layers % chunks == 0 or (layers + 2) % chunks == 0


def _check_order(order: tuple) -> None:
    core = [a for a in order if a not in ORDER_OPTIONAL]
    if sorted(core) != sorted(MESH_AXES) or len(set(order)) != len(order):
        raise InputError("order", ",".join(order), "a permutation of tp,pp,dp, optionally with "
                         + " and ".join(ORDER_OPTIONAL) + " (innermost first)")


def _check_experts(model: ModelSpec, d: Degrees) -> None:
    """Expert parallelism needs a MoE model whose experts it divides, expert tensor parallelism
    one whose expert FFN width it divides (both fold over tp x cp x dp: ``Degrees.check``)."""
    if not model.is_moe:
        for name, value, one in (("ep", d.ep, 1), ("etp", d.etp, d.tp)):
            if value != one:
                raise InputError(name, value, f"{one} for the dense model {model.name} (expert parallelism needs "
                                 "num_experts)")
        return
    if model.num_experts % d.ep:
        raise InputError("ep", d.ep, f"a divisor of num_experts {model.num_experts} (ep x etp = {d.ep * d.etp} "
                         f"folds over tp x cp x dp = {d.stage_ranks})")
    if model.moe_ffn_hidden_size % d.etp:
        raise InputError("etp", d.etp, f"a divisor of the experts' FFN width moe_ffn_hidden_size "
                         f"{model.moe_ffn_hidden_size}")


# perfmodel.step.expert_overlap prices them (sources there)
EP_OVERLAPS = ("none", "batch", "dualpipe")
EP_KERNELS = ("nccl", "deepep", "deepep-ll", "hybridep")


def _check_ep_overlap(r: PlanRequest, model: ModelSpec, schedule: str, pp: int, microbatches: int) -> None:
    """The expert overlap and kernels of a request: names of EP_OVERLAPS and EP_KERNELS; an overlap only
    for a MoE model; batch on pp 1 or interleaved 1F1B (Megatron-Core's combined_1f1b schedules); DualPipe on
    1F1B's order with an even pp >= 2 and an even number of micro-batches
    (DeepSeek-V3 report, section 3.2.1)."""
    if r.ep_overlap not in EP_OVERLAPS:
        raise InputError("ep_overlap", r.ep_overlap, ", ".join(EP_OVERLAPS))
    if r.ep_kernels not in EP_KERNELS:
        raise InputError("ep_kernels", r.ep_kernels, ", ".join(EP_KERNELS))
    if r.ep_overlap != "none" and not model.is_moe:
        raise InputError("ep_overlap", r.ep_overlap,
                         f"none for the dense model {model.name} (it hides MoE all-to-alls)")
    if r.ep_overlap == "batch" and (schedule == "gpipe" or (pp > 1 and schedule != "interleaved")):
        raise InputError("ep_overlap", r.ep_overlap, f"batch needs 1F1B's order with pp 1 or interleaved:V (not "
                         f"{schedule} on pp {pp}: Megatron-Core asserts virtual pipeline stages where pp > 1, "
                         "megatron/core/transformer/transformer_config.py)")
    if r.ep_overlap == "dualpipe" and (schedule != "1f1b" or pp < 2 or pp % 2 or microbatches % 2):
        raise InputError("ep_overlap", r.ep_overlap, f"dualpipe needs schedule 1f1b (not {schedule}), an even pp >= 2 "
                         f"(not {pp}) and an even number of micro-batches (not {microbatches})")


def _check_fp8_attention(r: PlanRequest, precision: str) -> None:
    """FP8 attention runs under a low-precision recipe's autocast in Transformer Engine's fused
    kernels (its DotProductAttention with fp8_dpa: megatron/core/extensions/transformer_engine.py)."""
    if not r.fp8_attention:
        return
    if precision not in LOW_PRECISIONS:
        raise InputError("fp8_attention", True, f"a low-precision recipe ({', '.join(LOW_PRECISIONS)}; not "
                         f"{precision}): Transformer Engine runs attention in FP8 inside an FP8 autocast")
    if r.kernels != "fused":
        raise InputError("fp8_attention", True, "fused kernels (Transformer Engine's attention; not realrun's eager)")


def _check_cp(cp: int, seq: int) -> None:
    """Context parallelism needs a sequence of 2 cp equal chunks."""
    if cp > 1 and seq % (2 * cp):
        raise InputError("cp", cp, f"a cp with seq {seq} divisible by 2 cp (the ring's load-balanced chunks)")


def _check_options(r: PlanRequest, tp: int) -> None:
    """ZeRO, hpZ, TP overlap, recompute and dtypes of a request (one field each)."""
    if r.kernels not in KERNELS:
        raise InputError("kernels", r.kernels, " or ".join(KERNELS) + " (Megatron-Core's, or realrun's eager layers)")
    if r.zero not in (0, 1, 2, 3):
        raise InputError("zero", r.zero, "0, 1, 2 or 3")
    if r.hpz and r.zero != 3:
        raise InputError("hpz", r.hpz, "only with zero 3 (a secondary partition of ZeRO-3's parameters)")
    if r.tp_overlap and (tp == 1 or not r.sequence_parallel):
        raise InputError("tp_overlap", r.tp_overlap, "only with tp > 1 and sequence parallelism (the overlap splits "
                         "its all-gathers and reduce-scatters against the GEMMs)")
    if r.recompute not in RECOMPUTE:
        raise InputError("recompute", r.recompute, " or ".join(RECOMPUTE))
    for field, value in (("compute_dtype", r.compute_dtype or "bf16"), ("grad_dtype", r.grad_dtype)):
        if value not in ("fp32", "bf16", "fp16"):
            raise InputError(field, value, "fp32, bf16 or fp16")


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
