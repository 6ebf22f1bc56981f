"""Compressed collectives inside FSDP2 (``torch.distributed.fsdp.fully_shard``).

    model = ...; fully_shard(layer) for each layer; fully_shard(model)
    fsdp = compress_fsdp(model, "zeropp")     # int8 parameter gathers, int4 gradient reduce-scatters
    ...train as before...; fsdp.stats           # bytes and kernel seconds per direction

FSDP2 moves two things per parameter group (one ``fully_shard`` call): the parameter
all-gather before a layer runs (forward, and again in backward when it resharded) and the
gradient reduce-scatter after its backward. ``compress_fsdp`` installs realrun's compressed
versions of both through FSDP2's own extension points, ``FSDPModule.set_custom_all_gather`` and
``set_custom_reduce_scatter``, on every FSDP module under ``model``; the training script is not
otherwise changed. What each direction carries comes from a perfmodel policy
(``perfmodel.compression.policy``): its ``zero`` axis is the parameter all-gather (ZeRO++'s qwZ
``int8``, ``fp8`` as torchao's float8 all-gather and Megatron's ``--fp8-param-gather``), its
``dp`` axis the gradient reduce-scatter (qgZ's ``int4``, ``ef(...)`` error feedback). A bare
compressor spec means ``dp=SPEC``: gradients only, as for the DDP hook (``realrun.hooks``).
Each axis's ``.min=`` size applies per message; a smaller one runs the plain collective.

How they run (``realrun.comm.Comm``): the all-gather compresses this rank's shard once and
every rank decodes every shard, its own too, so all ranks compute with the same gathered
weights; the reduce-scatter is the first phase of the two-phase all-reduce (one compression
per value, this rank's part summed in float32 or wider). Error-feedback residuals and other
compressor state are kept per parameter group (the FSDP module's name) and direction, and
``state_dict`` / ``load_state_dict`` carry them in checkpoints. Gradients are summed: the
FSDP modules are set to ``set_force_sum_reduction_for_comms(True)``, so FSDP2 divides before
and after (fp16) or after (fp32, bf16) the reduce-scatter itself, never through a reduction
op realrun would have to imitate. ``none`` on both axes installs nothing and trains as plain
FSDP2 (the same losses). Collectives run synchronously on the calling stream (on CUDA, after
the stream's pending work): compression trades FSDP2's communication overlap for bytes, which
is what ``perfmodel`` predicts as exposed communication.

Served: a one-dimensional shard mesh per module (FSDP2 refuses custom collectives with several
parameter groups); HSDP's replicate all-reduce is FSDP2's own (it has no custom all-reduce);
an all-gather whose input is raw bytes (parameters of mixed dtypes, a tensor subclass's
custom all-gather) runs plain, counted under ``stats["all_gather"]["plain_bytes"]``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from perfmodel.compression.policy import AxisPolicy, CompressionPolicy, as_policy
from realrun.comm import Comm, CommStats
from realrun.threads import codec_threads
from topologies.errors import InputError

__all__ = ["FSDPCompression", "compress_fsdp"]
DIRECTIONS = {"all_gather": "zero", "reduce_scatter": "dp"}   # FSDP2's collective -> the policy's axis


@dataclass
class FSDPCompression:
    """What ``compress_fsdp`` installed: the policy, one ``Comm`` per process group (its wires
    hold the compressor state), the modules served, and running ``stats`` per direction
    (``bytes_in``/``bytes_out`` of compressed calls, ``plain_bytes`` of plain ones, kernel and
    wall seconds, ``calls``)."""

    policy: CompressionPolicy
    threads: int | None = None
    modules: list = field(default_factory=list)
    stats: dict = field(default_factory=lambda: {d: _zero_stats() for d in DIRECTIONS})
    _comms: dict = field(default_factory=dict, repr=False)     # id(group) -> (group, Comm), in first-use order
    _pending: list = field(default_factory=list, repr=False)   # restored states for groups not used yet

    def comm(self, group) -> Comm:
        """The ``Comm`` of ``group`` (made on first use, with a restored state if one waits)."""
        key = id(group)
        if key not in self._comms:
            comm = Comm(group, threads=self.threads)
            if self._pending:
                comm.load_state_dict(self._pending.pop(0))
            self._comms[key] = (group, comm)
        return self._comms[key][1]

    def account(self, direction: str, call: CommStats | None, plain_bytes: int, elapsed: float) -> None:
        s = self.stats[direction]
        s["calls"] += 1
        s["wall_s"] += elapsed
        s["plain_bytes"] += plain_bytes
        if call is not None:
            for k, v in call.to_dict().items():
                s[k] += v

    def state_dict(self) -> dict:
        """Every group's compressor state (error-feedback residuals ...), in group order."""
        return {"comms": [comm.state_dict() for _, comm in self._comms.values()]}

    def load_state_dict(self, saved: dict) -> None:
        """Restore what ``state_dict`` gave, before the first step or after it: the states go to
        the groups in the order they are first used (the same order in the same script)."""
        states = list(saved.get("comms", []))
        comms = [comm for _, comm in self._comms.values()]
        for comm, state in zip(comms, states):
            comm.load_state_dict(state)
        self._pending = states[len(comms):]


def _zero_stats() -> dict:
    return {"calls": 0, "bytes_in": 0, "bytes_out": 0, "plain_bytes": 0, "compress_s": 0.0, "decompress_s": 0.0,
            "compress_cpu_s": 0.0, "decompress_cpu_s": 0.0, "wall_s": 0.0}


class _Collective:
    """What both directions share: the owner, the axis policy, the parameter group's key."""

    direction = ""

    def __init__(self, owner: FSDPCompression, axis: AxisPolicy, key: str):
        self.owner, self.axis, self.key = owner, axis, f"{key}/{self.direction}"

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def spec_for(self, tensor: torch.Tensor) -> str:
        """The spec for this message: ``none`` for a small one or for raw bytes."""
        if not tensor.is_floating_point():
            return "none"
        return self.axis.spec_for(tensor.numel() * tensor.element_size())


class _AllGather(_Collective, AllGather):
    direction = "all_gather"

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        spec, start = self.spec_for(input_tensor), time.perf_counter()
        if spec == "none":
            work = dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
            self.owner.account(self.direction, None, input_tensor.numel() * input_tensor.element_size(), 0.0)
            return work
        _settle(input_tensor)
        call = CommStats()
        output_tensor.copy_(self.owner.comm(group).allgather(input_tensor, spec, key=self.key, stats=call))
        self.owner.account(self.direction, call, 0, time.perf_counter() - start)
        return None


class _ReduceScatter(_Collective, ReduceScatter):
    direction = "reduce_scatter"

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        spec, start = self.spec_for(input_tensor), time.perf_counter()
        if spec == "none" or op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            work = dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
            self.owner.account(self.direction, None, input_tensor.numel() * input_tensor.element_size(), 0.0)
            return work
        _settle(input_tensor)
        call = CommStats()
        part = self.owner.comm(group).reduce_scatter(input_tensor, spec, key=self.key, stats=call)
        if op == dist.ReduceOp.AVG:
            part = part / dist.get_world_size(group)
        output_tensor.copy_(part)
        self.owner.account(self.direction, call, 0, time.perf_counter() - start)
        return None


def _settle(tensor: torch.Tensor) -> None:
    """On CUDA the codecs run on their own stream: the tensor's pending work finishes first."""
    if tensor.is_cuda:
        torch.cuda.current_stream(tensor.device).synchronize()


def compress_fsdp(model: torch.nn.Module, spec_or_policy="none", threads: int | None = None) -> FSDPCompression:
    """Install compressed all-gather and reduce-scatter (module doc) on every FSDP2 module under
    ``model`` (``model`` itself included); returns their ``FSDPCompression``. ``spec_or_policy``:
    a perfmodel policy (its ``zero`` and ``dp`` axes) or a compressor spec (``dp=SPEC``).
    ``threads``: the codec threads of this rank (default: the host's cores over the ranks on
    it, ``realrun.threads``)."""
    policy = as_policy(spec_or_policy)
    if policy.recipe is not None:
        policy.recipe.check_zero(3)      # FSDP2 shards like ZeRO-3: refused where the recipe's reference is not
    from perfmodel.compression.quantizers import sends_differences
    if sends_differences(policy.axis("zero").codec):
        raise InputError("policy", spec_or_policy, "a zero spec FSDP2 gathers: qwd sends weight differences, "
                         "which need the whole previous weights on every rank (ZeRO-1/2: realrun train --zero 1)")
    owner = FSDPCompression(policy, None if threads is None else codec_threads(threads))
    served = [(name or "root", m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    if not served:
        raise InputError("model", type(model).__name__, "a module sharded with torch's fully_shard (FSDP2) "
                         "or holding such modules")
    axes = {d: policy.axis(a) for d, a in DIRECTIONS.items()}
    if all(a.spec == "none" for a in axes.values()):
        return owner
    for name, module in served:
        if not module._get_fsdp_state()._fsdp_param_groups:
            continue
        try:
            if axes["all_gather"].spec != "none":
                module.set_custom_all_gather(_AllGather(owner, axes["all_gather"], name))
            if axes["reduce_scatter"].spec != "none":
                module.set_custom_reduce_scatter(_ReduceScatter(owner, axes["reduce_scatter"], name))
                module.set_force_sum_reduction_for_comms(True)
        except ValueError as exc:   # FSDP2: several parameter groups (per-parameter meshes)
            raise InputError(f"model.{name}", "several parameter groups",
                             "one shard mesh per FSDP module") from exc
        owner.modules.append(name)
    return owner
