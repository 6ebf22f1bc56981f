"""Mixture-of-experts MLP layers and expert parallelism, on realrun.comm.

A MoE layer (perfmodel's ``ModelSpec`` MoE keys) replaces the dense MLP: a linear router (no
bias) scores the ``num_experts`` routed experts per token; each token takes its ``moe_top_k``
highest logits and their softmax as weights (Mixtral's convention: the softmax over the top-k
logits, which equals the softmax over all experts renormalised over the chosen ones). Each
expert is an MLP of ``moe_ffn_hidden_size`` in the model's activation, without biases, as
perfmodel counts them; ``moe_shared_experts`` more of the same size see every token. A biased
(layernorm) model keeps one output bias on the layer, which perfmodel counts with the
attention's.

Capacity (GShard, Switch): an expert takes at most ``ceil(moe_capacity_factor x tokens x k /
experts)`` of a micro-batch's tokens on one rank (``tokens`` of that micro-batch on that rank;
factor 0: dropless, capacity = tokens). Assignments queue first choices of every token before
any second choice, tokens in order; those past the capacity are dropped: their expert output is
zero and the residual carries the token. The layer counts routed and dropped assignments
(``ExpertParallel.routed`` / ``dropped``: the step record's ``moe_dropped`` fraction).

Load balance: Switch Transformer's auxiliary loss (Fedus et al. 2021), ``AUX_LOSS_COEF x
experts x sum_i f_i P_i`` per layer and micro-batch (``f_i`` the fraction of assignments the
router gave expert i before capacity, ``P_i`` its mean softmax probability over all experts),
enters the backward as Megatron-Core's ``MoEAuxLossAutoScaler`` does: the layer's output is
unchanged forward and the auxiliary loss gets the gradient ``aux_scale`` (1 / micro-batches,
as the pipeline scales each micro-batch's loss) backward, so the reported loss is the language
model's alone.

Expert parallelism (``ep`` ranks, carved from dp as Megatron-Core does): a rank holds
``experts / ep`` consecutive experts. Two dispatches, as the model file says:

* padded (``moe_pad_to_capacity``): each expert's queue is packed into a fixed ``capacity``-row
  slot (zero rows where it is short, as perfmodel prices the padded rows), so every rank sends
  ``experts / ep x capacity`` rows to every rank of its ep group in one ``Comm.alltoall`` of equal
  blocks;
* unpadded (dropless with no capacity factor, or token drop without padding): each rank sends each
  expert its kept rows only. The rows are sorted by expert (so by the rank that holds it); one
  uncompressed all-to-all of the counts (rows for each expert of each rank, as Megatron-Core's
  dispatcher exchanges them before a dropless dispatch) tells every rank what arrives, then
  ``Comm.alltoall`` with uneven ``splits`` / ``out_splits`` moves the rows, each chunk compressed
  at its source (the spec chosen for the dropless size, ``tokens x top_k`` rows, which every rank
  of the group agrees on). A rank regroups what arrives by expert and runs each of its experts on
  its rows.

Each rank runs its experts on the rows from every source, and the combine all-to-all sends the
outputs back the same way (uneven: the splits swapped). Both are autograd operators: the backward
of the dispatch is the reverse all-to-all of the gradients (shaped as a combine) and vice versa.
As perfmodel's axes say, the dispatch runs under the policy's ``ep`` spec forward and backward,
the combine under ``ep_combine`` (which follows ``ep`` unless the policy sets it).

Routing histogram: every training pass adds the router's assignments per expert (before
capacity: what the router asked for, which dropless routing delivers) to the layer's ``load``;
``realrun train`` sums them over its ranks and steps and writes them in perfmodel's histogram
format (``realrun.train.trainer.routing_histogram``; ``perfmodel.plan.routing.read_histogram``).
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from perfmodel.workload import ModelSpec
from realrun.comm import Comm, CommStats
from realrun.train.accuracy import RelativeError
from realrun.train.runtime import RoutingTiming, meter, value

AUX_LOSS_COEF = 0.01   # Switch Transformer's alpha


def capacity(factor: float, tokens: int, k: int, experts: int) -> int:
    """Rows an expert takes from ``tokens`` tokens: ``ceil(factor x tokens x k / experts)``, at
    most ``tokens`` (a token visits an expert once); ``factor`` 0: dropless (``tokens``)."""
    if factor <= 0:
        return tokens
    return min(tokens, math.ceil(factor * tokens * k / experts))


class ExpertParallel:
    """One rank's view of its ep group: size, index, the collectives, the dispatch and combine
    axes of the policy, what they cost and the routing counts since the last ``take`` (the ep and
    ep_combine axes' ``realrun.train.runtime.AxisRuntime``)."""

    axis_names = ("ep", "ep_combine")

    def __init__(self, size: int, rank: int, comm: Comm | None, dispatch=None, combine=None):
        self.size, self.rank, self.comm = size, rank, comm
        self.axes = {"ep": dispatch, "ep_combine": combine}
        self.error: dict[str, RelativeError] | None = None   # set on measured steps, per axis
        self.aux_scale = 1.0   # the gradient of each auxiliary loss: 1 / micro-batches (module doc)
        self._reset()

    def _reset(self) -> None:
        self.stats = {"ep": CommStats(), "ep_combine": CommStats()}
        self.seconds = {"fwd": 0.0, "bwd": 0.0}
        self.routed = self.dropped = 0

    def alltoall(self, x: torch.Tensor, axis: str, key: str, phase: str, splits: list[int] | None = None,
                 out_splits: list[int] | None = None, nominal_bytes: int | None = None) -> torch.Tensor:
        """Row blocks of ``x`` to every rank of the group under ``axis``'s spec: equal blocks, or
        ``splits[j]`` rows to rank j and ``out_splits[j]`` from it (dropless). The spec is chosen
        for ``nominal_bytes`` (default: ``x``'s), a size every rank of the group agrees on."""
        x = x.contiguous()
        exact = None
        if self.error is not None:   # uncounted, before the clock starts
            exact = x.new_empty((sum(out_splits), *x.shape[1:])) if splits is not None else torch.empty_like(x)
            dist.all_to_all_single(exact, x.detach(), out_splits, splits, group=self.comm.group)
        start = time.perf_counter()
        codec = self.axes[axis].codec_for(nominal_bytes if nominal_bytes is not None else x.numel() * x.element_size())
        out = self.comm.alltoall(x, codec, splits=splits, out_splits=out_splits, key=key, stats=self.stats[axis])
        self.seconds[phase] += time.perf_counter() - start
        if exact is not None:
            self.error[axis].add(out, exact)
        return out.view(-1, *x.shape[1:])

    def counts(self, sent: torch.Tensor) -> torch.Tensor:
        """The row counts every rank of the group sends this one: ``sent`` (ep, n) is what this
        rank sends each rank (n counts each), the answer (ep, n) what each rank sends here
        (one uncompressed all-to-all of the counts, as Megatron-Core's dispatcher exchanges them
        before a dropless dispatch; its seconds are the ep phase's)."""
        got = torch.empty_like(sent)
        start = time.perf_counter()
        dist.all_to_all_single(got, sent.contiguous(), group=self.comm.group)
        self.seconds["fwd"] += time.perf_counter() - start
        return got

    def start_step(self, measure: bool) -> None:
        self.error = {axis: meter(measure, self.size) for axis in self.axis_names} if measure and self.size > 1 \
            else None

    def take(self) -> RoutingTiming:
        """What the all-to-alls cost since the last call (their errors on a measured step) and the
        routing counts, then reset."""
        errors = self.error or {}
        out = RoutingTiming(forward_s=self.seconds["fwd"], backward_s=self.seconds["bwd"], stats=self.stats,
                            errors={axis: value(errors.get(axis)) for axis in self.axis_names},
                            routed=self.routed, dropped=self.dropped)
        self._reset()
        self.error = None
        return out


class _AllToAll(torch.autograd.Function):
    """The all-to-all of ``axis`` forward; the reverse exchange of the gradients backward (equal
    blocks: an all-to-all again; uneven: the splits swapped), under the same axis's spec."""

    @staticmethod
    def forward(ctx, x, ep, axis, key, splits, out_splits, nominal):
        ctx.ep, ctx.axis, ctx.key, ctx.splits, ctx.out_splits, ctx.nominal = ep, axis, key, splits, out_splits, nominal
        return ep.alltoall(x, axis, f"{key}.fwd", "fwd", splits, out_splits, nominal)

    @staticmethod
    def backward(ctx, grad):
        back = ctx.ep.alltoall(grad, ctx.axis, f"{ctx.key}.bwd", "bwd", ctx.out_splits, ctx.splits, ctx.nominal)
        return back, None, None, None, None, None, None


class _AuxLoss(torch.autograd.Function):
    """Megatron-Core's MoEAuxLossAutoScaler: ``y`` unchanged forward; backward, ``aux`` also
    gets the gradient ``scale``."""

    @staticmethod
    def forward(ctx, y, aux, scale):
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad):
        aux, = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


def balance_loss(logits: torch.Tensor, chosen: torch.Tensor, experts: int) -> torch.Tensor:
    """Switch's auxiliary loss of one layer: ``AUX_LOSS_COEF x experts x sum_i f_i P_i``."""
    share = F.one_hot(chosen.reshape(-1), experts).float().mean(0)
    return AUX_LOSS_COEF * experts * (share * logits.softmax(dim=-1).mean(0)).sum()


def _exchange(x, ep: ExpertParallel, axis: str, key: str, splits=None, out_splits=None, nominal=None):
    return x if ep.size == 1 else _AllToAll.apply(x, ep, axis, key, splits, out_splits, nominal)


def _activation(spec: ModelSpec, up: torch.Tensor) -> torch.Tensor:
    if spec.activation == "swiglu":
        gate, up = up.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(up)


class MoE(nn.Module):
    """One MoE MLP: router, routed experts (this rank's ``experts / ep`` of them after
    ``shard``), shared experts; ``forward`` maps (batch, seq, hidden) to the same shape."""

    def __init__(self, spec: ModelSpec, index: int):
        super().__init__()
        h, e = spec.hidden_size, spec.num_experts
        self.spec, self.index, self.ep = spec, index, ExpertParallel(1, 0, None)
        self.router = nn.Linear(h, e, bias=False)
        self.w_up = nn.Parameter(torch.empty(e, spec.expert_up_width, h))       # per expert: h -> up
        self.w_down = nn.Parameter(torch.empty(e, h, spec.moe_ffn_hidden_size))  # per expert: f -> h
        shared = spec.moe_shared_experts
        self.shared_up = nn.Parameter(torch.empty(shared, spec.expert_up_width, h)) if shared else None
        self.shared_down = nn.Parameter(torch.empty(shared, h, spec.moe_ffn_hidden_size)) if shared else None
        self.bias = nn.Parameter(torch.zeros(h)) if spec.biased else None
        self.load: torch.Tensor | None = None   # the router's assignments per expert, training passes (route)

    def shard(self, ep: ExpertParallel) -> None:
        """Keep this rank's consecutive ``experts / ep`` routed experts."""
        n = self.spec.num_experts // ep.size
        mine = slice(ep.rank * n, (ep.rank + 1) * n)
        self.w_up = nn.Parameter(self.w_up.data[mine].clone())
        self.w_down = nn.Parameter(self.w_down.data[mine].clone())
        self.ep = ep

    def expert_parameters(self) -> list[nn.Parameter]:
        """The routed experts' weights (sharded over ep; the rest is replicated)."""
        return [self.w_up, self.w_down]

    def _experts(self, x: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        """Expert i's MLP on rows ``x[i]`` (experts, rows, h) -> (experts, rows, h)."""
        return torch.bmm(_activation(self.spec, torch.bmm(x, up.transpose(1, 2))), down.transpose(1, 2))

    def _expert(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """This rank's routed expert ``i``'s MLP on the rows ``x`` (rows, h) -> (rows, h)."""
        return _activation(self.spec, x @ self.w_up[i].t()) @ self.w_down[i].t()

    def route(self, x: torch.Tensor):
        """(token, expert, position in the expert's queue, weight) of every kept assignment of the
        rows ``x`` (tokens, h), the capacity (rows per expert) and the auxiliary loss (None without
        gradients). Training passes add the router's assignments per expert, before capacity, to
        ``load`` (the measured routing histogram)."""
        s, n = self.spec, x.shape[0]
        k, e = s.moe_top_k, s.num_experts
        logits = self.router(x)
        top, chosen = logits.topk(k, dim=-1)
        weights = top.softmax(dim=-1)
        expert = chosen.t().reshape(-1)                       # first choices of every token, then second ...
        position = (F.one_hot(expert, e).cumsum(0) - 1).gather(1, expert[:, None])[:, 0]
        cap = capacity(s.moe_capacity_factor, n, k, e)
        keep = position < cap
        self.ep.routed += n * k
        self.ep.dropped += int((~keep).sum())
        token = torch.arange(n, device=x.device).repeat(k)[keep]
        aux = None
        if torch.is_grad_enabled():
            aux = balance_loss(logits, chosen, e)
            counts = torch.bincount(expert.detach(), minlength=e).double()
            self.load = counts if self.load is None else self.load + counts
        return token, expert[keep], position[keep], weights.t().reshape(-1)[keep], cap, aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, h = x.shape, self.spec.hidden_size
        x = x.reshape(-1, h)
        token, expert, position, weight, cap, aux = self.route(x)
        if self.spec.moe_pad_to_capacity:
            y = self._padded(x, token, expert * cap + position, weight, cap)
        else:
            y = self._dropless(x, token, expert, weight)
        if self.shared_up is not None:
            y = y + self._experts(x.expand(self.shared_up.shape[0], *x.shape), self.shared_up,
                                  self.shared_down).sum(0)
        if self.bias is not None:
            y = y + self.bias
        if aux is not None:
            y = _AuxLoss.apply(y, aux, self.ep.aux_scale)
        return y.view(shape)

    def _padded(self, x, token, slot, weight, cap: int) -> torch.Tensor:
        """Every expert's queue padded to ``cap`` rows, equal all-to-all blocks (module doc)."""
        e, ep, h = self.spec.num_experts, self.ep, self.spec.hidden_size
        mine = e // ep.size
        queues = x.new_zeros(e * cap, h).index_copy(0, slot, x[token])          # (experts x capacity, h)
        got = _exchange(queues, ep, "ep", f"l{self.index}.dispatch")             # rows from every source
        rows = got.view(ep.size, mine, cap, h).transpose(0, 1).reshape(mine, ep.size * cap, h)
        out = self._experts(rows, self.w_up, self.w_down)
        out = out.view(mine, ep.size, cap, h).transpose(0, 1).reshape(e * cap, h)
        back = _exchange(out, ep, "ep_combine", f"l{self.index}.combine")
        return x.new_zeros(x.shape).index_add(0, token, back[slot] * weight[:, None])

    def _dropless(self, x, token, expert, weight) -> torch.Tensor:
        """Each expert's kept rows only, uneven all-to-all blocks after the counts (module doc)."""
        e, ep = self.spec.num_experts, self.ep
        mine = e // ep.size
        order = torch.argsort(expert, stable=True)             # by expert, so by the rank that holds it
        token, expert, weight = token[order], expert[order], weight[order]
        sent = torch.bincount(expert, minlength=e).view(ep.size, mine)   # rows to each rank's each expert
        rows = x[token]
        if ep.size == 1:
            got_counts, got, splits, out_splits = sent, rows, None, None
        else:
            got_counts = ep.counts(sent)                       # (source, local expert) rows arriving here
            splits, out_splits = sent.sum(1).tolist(), got_counts.sum(1).tolist()
            nominal = x.shape[0] * self.spec.moe_top_k * x.shape[1] * x.element_size()   # the same on every rank
            got = _exchange(rows, ep, "ep", f"l{self.index}.dispatch", splits, out_splits, nominal)
        local = torch.repeat_interleave(torch.arange(mine, device=x.device).repeat(ep.size), got_counts.reshape(-1))
        by_expert = torch.argsort(local, stable=True)          # source-major rows regrouped expert-major
        sizes = got_counts.sum(0).tolist()
        done = torch.cat([self._expert(chunk, i) for i, chunk in enumerate(got[by_expert].split(sizes))])
        out = torch.empty_like(done).index_copy(0, by_expert, done)   # back in source-major order
        if ep.size > 1:
            out = _exchange(out, ep, "ep_combine", f"l{self.index}.combine", out_splits, splits, nominal)
        return x.new_zeros(x.shape).index_add(0, token, out * weight[:, None])
