"""DDP communication hooks that compress gradient buckets, in the shape of PyTorch's own.

    state, hook = compression_hook("ef(topk(0.01))+int8", warmup_steps=10)
    model.register_comm_hook(state, hook)          # model: DistributedDataParallel

The hook averages each bucket over the ranks. During ``warmup_steps`` and for buckets under
``min_bucket_bytes`` it runs the plain asynchronous all-reduce; otherwise the compressed
all-reduce of ``realrun.comm`` (error-feedback residuals are kept per bucket index).
``spec_or_policy`` is a compressor spec or a perfmodel policy (its ``dp`` axis is used). A recipe
preset (``perfmodel.compression.recipes``) that compresses gradients (``powersgd``, ``loco``) brings its
warm-up: ``total_steps`` (the run's) sets ``warmup_steps`` to its share (PowerSGD's 10%:
``start_powerSGD_iter``); one that compresses Adam's momentum (``onebit-adam``, ``zero-one-adam``) is
refused in one line: a gradient hook never sees the momentum (``realrun train --policy`` runs them); so is
one whose reference does not run under DDP (``sdp4bit``: Megatron's distributed optimizer, ZeRO-1; ``realrun
train --zero 1 --policy sdp4bit`` runs it).
``state.stats`` holds totals (bytes in and out, compress, decompress and communication
seconds) and ``state.per_step`` one entry per optimizer step.

Buckets of every floating dtype are served (fp32, bf16, fp16, fp64; ``realrun.compressors.dtypes``
says how: arithmetic codecs run on the exact float32 values of a narrower bucket, values carried
as they are keep its dtype, error-feedback residuals of a bf16 or fp16 bucket are kept in
float32); the averaged bucket comes back in its own dtype. The codecs run on ``threads`` threads
(default: the host's cores over the ranks on it, ``LOCAL_WORLD_SIZE``; ``realrun.threads``),
so ranks sharing a host do not oversubscribe it.
"""
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from perfmodel.compression.policy import as_policy
from realrun.comm import Comm, CommStats
from realrun.threads import codec_threads
from topologies.errors import InputError


@dataclass
class CompressionState:
    spec: str
    algorithm: str = "auto"
    warmup_steps: int = 0
    min_bucket_bytes: int = 0
    process_group: object = None
    threads: int | None = None   # codec threads (None: realrun.threads' default)
    step: int = 0
    stats: dict = field(default_factory=lambda: {"bytes_in": 0, "bytes_out": 0, "compress_s": 0.0,
                                                 "decompress_s": 0.0, "comm_s": 0.0, "buckets": 0})
    per_step: list = field(default_factory=list)
    comm: Comm = None   # the collectives and their state (residuals per bucket); made for the group
    _mark: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.comm is None:
            self.comm = Comm(self.process_group, threads=self.threads)


def _spec(spec_or_policy: str) -> str:
    """A compressor spec, or the dp spec of a policy (``perfmodel.compression.policy.as_policy``).
    (No ``from __future__ import annotations`` here: DDP checks the hook's annotation.)"""
    policy = as_policy(spec_or_policy)
    if policy.recipe is not None and policy.recipe.compresses != "gradient":
        raise InputError("spec_or_policy", spec_or_policy, "a policy that compresses gradients: "
                         f"{policy.recipe.name} compresses Adam's momentum inside its optimizer (DeepSpeed's), which "
                         "a DDP gradient hook never sees; run it with realrun train --policy")
    if policy.recipe is not None and 0 not in policy.recipe.zero_stages:
        raise InputError("spec_or_policy", spec_or_policy, "a policy a DDP hook runs (ZeRO-0): "
                         f"{policy.recipe.name} runs under ZeRO {' or '.join(map(str, policy.recipe.zero_stages))} "
                         f"(its reference's sharded optimizer); run it with realrun train --zero 1 --policy")
    spec = policy.axis("dp").spec
    if spec == "none" and str(spec_or_policy).strip() != "none":   # e.g. fp8-param-gather: nothing for DDP to do
        raise InputError("spec_or_policy", spec_or_policy, "a compressor spec, or a policy that compresses the dp "
                         "axis (this one leaves gradients uncompressed; pass 'none' for plain DDP)")
    return spec


def compression_hook(spec_or_policy: str, algorithm: str = "auto", warmup_steps: int = 0,
                     min_bucket_bytes: int = 0, process_group=None, threads: int | None = None,
                     total_steps: int | None = None):
    """(state, hook) for ``DistributedDataParallel.register_comm_hook``. ``threads``: the codec
    threads of this rank (default: the host's cores over the ranks on it, or
    ``COMMPRESS_CODEC_THREADS``; ``realrun.threads``). ``total_steps``: the run's steps, which a
    recipe's warm-up share is of (module doc); a recipe with a warm-up needs it or ``warmup_steps``."""
    if warmup_steps < 0 or min_bucket_bytes < 0:
        raise InputError("warmup_steps", warmup_steps, "non-negative warmup_steps and min_bucket_bytes")
    spec = _spec(spec_or_policy)
    warmup_steps = _recipe_warmup(spec_or_policy, warmup_steps, total_steps)
    state = CompressionState(spec=spec, algorithm=algorithm, warmup_steps=warmup_steps,
                             min_bucket_bytes=min_bucket_bytes, process_group=process_group,
                             threads=None if threads is None else codec_threads(threads))
    return state, _hook


def _recipe_warmup(spec_or_policy, warmup_steps: int, total_steps: int | None) -> int:
    """The uncompressed steps: ``warmup_steps`` where given (> 0), else a recipe's share of
    ``total_steps``; a recipe with a warm-up and neither is refused (its share of what run?)."""
    recipe = as_policy(spec_or_policy).recipe
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                    or total_steps < 1):
        raise InputError("total_steps", total_steps, "the run's steps: an integer >= 1")
    if warmup_steps or recipe is None or not recipe.warmup:
        return warmup_steps
    if total_steps is None:
        raise InputError("total_steps", None, f"the run's steps (policy {recipe.name} runs its first "
                         f"{recipe.warmup:.0%} uncompressed), or warmup_steps")
    return recipe.warmup_steps(total_steps)


def _hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    tensor = bucket.buffer()
    world = dist.get_world_size(state.process_group)
    if bucket.is_last():
        state.step += 1
    if state.step < state.warmup_steps or tensor.numel() * tensor.element_size() < state.min_bucket_bytes:
        fut = dist.all_reduce(tensor, group=state.process_group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].div_(world))
    call = CommStats()
    start = time.perf_counter()
    result = state.comm.allreduce(tensor, state.spec, state.algorithm, key=f"bucket{bucket.index()}", stats=call)
    _account(state, call, time.perf_counter() - start, bucket.is_last())
    fut = torch.futures.Future()
    fut.set_result(result.to(tensor.dtype).div_(world))
    return fut


def _account(state: CompressionState, call: CommStats, elapsed: float, last: bool) -> None:
    delta = call.to_dict()
    s = state.stats
    for k in ("bytes_in", "bytes_out", "compress_s", "decompress_s"):
        s[k] += delta[k]
    s["comm_s"] += max(0.0, elapsed - delta["compress_s"] - delta["decompress_s"])
    s["buckets"] += 1
    if last:   # one entry per optimizer step: what this step added
        state.per_step.append({k: v - state._mark.get(k, 0) for k, v in s.items()})
        state._mark = dict(s)
