"""The training run's configuration: typed, validated, serialised in one place (it crosses the
process boundary to every rank as JSON)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields

from perfmodel.axes import active_axes
from perfmodel.plan.degrees import Degrees, read_through, split_degrees
from perfmodel.plan.parallel import DEFAULT_BUCKET_BYTES, ParallelPlan, make_plan
from perfmodel.compression.policy import POLICY_AXES, parse_policy
from perfmodel.workload import load_model
from realrun.comm.names import OP_TIMEOUT_S
from topologies import bounds
from topologies.errors import InputError

MAX_STEPS = 1_000_000
RUN_SCHEDULES = ("1f1b", "gpipe")   # the pipeline schedules realrun runs (perfmodel models interleaved too)
DEVICES = ("auto", "cpu", "cuda")   # auto: a GPU (NCCL, CuPy compressors) where CUDA is available


def _int(field: str, value, low: int, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(field, value, f"an integer from {low} to {high:g}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run on ``tp x cp x pp x dp`` ranks (laid out as perfmodel.plan.mesh lays them: tp
    innermost, then cp, then pp, then dp): each data-parallel replica runs ``microbatches`` of ``mbs``
    sequences per step (``gbs = mbs x dp x microbatches``) through its pipeline under
    ``schedule``; ``policy`` compresses the dp axis (gradients), the tp axis (activations and
    their gradients inside a layer), the pp axis (activations and their gradients between
    stages) and the zero axis (parameters gathered after a ZeRO-1 step). A mixture-of-experts
    model's routed experts shard over ``ep`` ranks of each dp group (Megatron-Core's expert
    parallelism: ep divides dp and num_experts), dispatched and combined under the ep and
    ep_combine specs. Context parallelism (``cp`` ranks per replica, ring attention as perfmodel
    models it, see ``realrun.train.context_parallel``) splits every sequence over cp ranks, its
    K/V ring under the cp spec; dense gradients reduce over dp x cp. ``checkpoint``: a
    folder written every ``checkpoint_every`` steps and at the end; ``resume`` continues from it.
    ``routing_out``: a MoE model's measured routing histogram, written at the end (perfmodel's format),
    over the last ``routing_steps`` steps (0: every step this run trains).

    The degrees are one record (``perfmodel.plan.degrees.Degrees``, in perfmodel's default order),
    read as ``cfg.tp`` ... too; ``TrainConfig.of(model=..., dp=2, tp=2)`` takes them as keywords,
    and the JSON form (``to_json``) keeps them flat, as every rank and older files read them."""

    model: str
    degrees: Degrees = Degrees()
    schedule: str = "1f1b"
    zero: int = 0
    mbs: int = 4
    gbs: int | None = None
    seq: int | None = None
    steps: int = 50
    policy: str = "none"
    lr: float = 3e-3
    seed: int = 0
    eval_every: int = 10
    error_every: int = 10
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    metrics: str | None = None
    routing_out: str | None = None   # a MoE model's measured routing histogram (JSON, perfmodel's --routing FILE)
    routing_steps: int = 0           # the histogram sums the last this many steps (0: every step the run trains)
    op_timeout_s: float = OP_TIMEOUT_S
    threads: int | None = None   # CPU threads per rank; None: the host's cores over its local ranks (realrun.threads)
    device: str = "auto"
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    profile: str | None = None   # a folder: PyTorch profiler traces of the steady steps (realrun.train.profiling)

    def __getattr__(self, name: str):
        return read_through(self, name)

    @classmethod
    def of(cls, **kw) -> TrainConfig:
        """A config from keywords, the degrees (``tp``, ``cp``, ``ep``, ``pp``, ``dp``) among them
        (each one not given: 1, or ``degrees``'s where that is given)."""
        return cls(**split_degrees(kw.get("degrees", Degrees()), kw))

    def __post_init__(self):
        arch = load_model(self.model)
        if not isinstance(self.degrees, Degrees) or self.degrees.order != Degrees().order:
            raise InputError("degrees", self.degrees, "a perfmodel.plan.degrees.Degrees in its default order")
        for name in Degrees.names():
            _int(name, getattr(self.degrees, name), 1, 64)
        _int("zero", self.zero, 0, 1)
        self._check_cp()
        if self.device not in DEVICES:
            raise InputError("device", self.device, " or ".join(DEVICES))
        if self.schedule not in RUN_SCHEDULES:
            raise InputError("schedule", self.schedule, " or ".join(RUN_SCHEDULES))
        for key in ("num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size"):
            if getattr(arch, key) % self.tp:
                raise InputError("tp", self.tp, f"a divisor of the model's {key} ({getattr(arch, key)})")
        _int("mbs", self.mbs, 1, 4096)
        _int("steps", self.steps, 1, MAX_STEPS)
        _int("seed", self.seed, 0, 2**63 - 1)
        _int("eval_every", self.eval_every, 0, MAX_STEPS)
        _int("error_every", self.error_every, 0, MAX_STEPS)
        _int("bucket_bytes", self.bucket_bytes, 1024, 2**32)
        if self.threads is not None:
            object.__setattr__(self, "threads", bounds.check("threads", self.threads))
        _int("checkpoint_every", self.checkpoint_every, 0, MAX_STEPS)
        if self.resume and not self.checkpoint:
            raise InputError("resume", self.resume, "a run with a checkpoint folder to resume from")
        _int("seq", self.seq_len, 2, arch.seq_len)
        if self.gbs is not None:
            _int("gbs", self.gbs, 1, 2**31)
            if self.gbs % (self.mbs * self.dp):
                raise InputError("gbs", self.gbs, f"a multiple of mbs x dp = {self.mbs * self.dp}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 < self.lr < 10:
            raise InputError("lr", self.lr, "a learning rate in (0, 10)")
        if not 1 <= self.op_timeout_s <= 86400:
            raise InputError("op_timeout_s", self.op_timeout_s, "seconds from 1 to 86400")
        if self.routing_out is not None and (not arch.is_moe or not str(self.routing_out).endswith(".json")):
            raise InputError("routing_out", self.routing_out, "a .json file (perfmodel's --routing reads a JSON "
                             "histogram by its name) for a mixture-of-experts model" +
                             ("" if arch.is_moe else f"; {arch.name} is dense: it routes nothing"))
        _int("routing_steps", self.routing_steps, 0, MAX_STEPS)
        if self.degrees.etp != self.degrees.tp:
            raise InputError("etp", self.degrees.etp, f"{self.degrees.tp}, as tp (perfmodel models other expert "
                             "tensor parallelism; realrun trains its experts at etp = tp)")
        if not arch.plain_attention:
            raise InputError("model", self.model, "multi-head or grouped-query attention of hidden_size / num_heads-"
                             "wide heads, no sliding window, no multi-token prediction, no hybrid layer pattern, a "
                             "gelu or swiglu MLP and experts of hidden_size input (what realrun.train.model builds); "
                             "perfmodel predicts the others")
        if arch.vocab_size < 256:
            raise InputError("model.vocab_size", arch.vocab_size, "at least 256 (the corpus is bytes)")
        self._check_recipe(parse_policy(self.policy).recipe)
        self.plan()   # pp within the layers, gbs in whole microbatches: perfmodel's own checks

    def plan(self) -> ParallelPlan:
        """perfmodel's plan of this run (the stage split and what a prediction of it assumes):
        fp32 compute and gradients, as the CPU run computes, and realrun's eager kernels."""
        return make_plan(load_model(self.model), self.world, **self.degrees.as_dict(), zero=self.zero, mbs=self.mbs,
                         gbs=self.global_batch, seq=self.seq_len, schedule=self.schedule, compute_dtype="fp32",
                         grad_dtype="fp32", bucket_bytes=self.bucket_bytes, dp_overlap=False, kernels="eager")

    def _check_recipe(self, recipe) -> None:
        """A recipe policy (``perfmodel.compression.recipes``) under what its reference runs: its ZeRO
        stages; 1-bit and 0/1 Adam's optimizer (``realrun.train.onebit``) on the dense replicas only."""
        if recipe is None:
            return
        recipe.check_zero(self.zero)
        if recipe.compresses == "momentum" and self.ep > 1:
            raise InputError("ep", self.ep, f"1 with policy {recipe.name} (its optimizer averages the dense "
                             "replicas' momentum; the experts reduce over their own group)")

    def _check_cp(self) -> None:
        """What context parallelism runs with here (the rest is refused in one line)."""
        if self.cp == 1:
            return
        for field, why in (("tp", "tensor parallelism"), ("pp", "pipeline parallelism"),
                           ("ep", "expert parallelism (routing capacity and balance loss would see a rank's "
                                  "chunks, not the sequence)"), ("zero", "ZeRO-1")):
            if getattr(self, field) != (0 if field == "zero" else 1):
                raise InputError("cp", self.cp, f"1 with {field}={getattr(self, field)} (realrun runs context "
                                 f"parallelism without {why})")

    @property
    def seq_len(self) -> int:
        return self.seq if self.seq is not None else load_model(self.model).seq_len

    @property
    def microbatches(self) -> int:
        return (self.gbs // (self.mbs * self.dp)) if self.gbs is not None else 1

    @property
    def global_batch(self) -> int:
        return self.mbs * self.dp * self.microbatches

    @property
    def world(self) -> int:
        """Ranks of the run: tp x cp x pp x dp (ep is carved from dp)."""
        return self.degrees.gpus

    def idle_axes(self) -> list[str]:
        """Policy axes that compress something no collective of this plan carries (reported)."""
        pol, active = parse_policy(self.policy), active_axes(self, load_model(self.model))
        return [a for a in POLICY_AXES if a not in active and pol.asks_for(a)]

    def as_dict(self) -> dict:
        """The fields, the degrees flat among them (``{"model": ..., "tp": 1, ..., "dp": 2, ...}``):
        the one serialised form (``to_json``)."""
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "degrees"}
        return {"model": rest.pop("model"), **self.degrees.as_dict(), **rest}

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        """The config ``to_json`` wrote; a degree an older file lacks reads its default (1)."""
        return cls.of(**json.loads(text))
