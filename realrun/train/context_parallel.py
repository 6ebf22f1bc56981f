"""Context parallelism on realrun.comm: ring attention as perfmodel models it
(``perfmodel.events.context_events``; Megatron-Core's context parallelism, Transformer Engine's
``p2p`` mode; Liu et al. 2023, Ring Attention).

Every sequence is cut into ``2 cp`` equal chunks; cp rank i keeps chunks i and ``2 cp - 1 - i``
(the load-balanced causal split: every rank's queries see the same number of keys in all), and
runs every layer on those tokens alone except attention. Positions are global: RoPE rotates
each kept token by its position in the whole sequence, and the causal mask compares global
positions. Attention (``ring_attention``, one autograd Function per layer):

* forward: the rank's own K/V block first, then ``cp - 1`` ring steps (``Comm.shift``: to the
  next rank, from the previous, under the policy's ``cp`` spec), each block folded into the
  output by the online softmax (running max and sum, as FlashAttention); only the local K, V,
  output and log-sum-exp are kept.
* backward: the K/V blocks go round the ring again (``cp - 1`` steps) and each rank adds its
  share of every block's dK/dV to an accumulator that travels behind its block (``cp - 1``
  steps: it starts at the rank after the block's owner, the owner's own share stays at home,
  and the last step brings it to the owner), so backward moves twice forward's bytes, as
  perfmodel counts it.

K and V travel at their own head count (grouped-query models repeat them per query head only
where attention computes). The loss of a rank is the mean over its tokens; every rank holds as
many, so the mean over the cp group is the whole sequence's (the trainer reduces it so), and the
dense gradients, summed over dp x cp and divided by dp x cp, are the single-rank ones.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from realrun.comm import Comm, CommStats
from realrun.train.accuracy import RelativeError
from realrun.train.clock import now
from realrun.train.runtime import AxisTiming, meter, value


def kept_chunks(rank: int, size: int) -> tuple[int, int]:
    """The two chunks (of ``2 size``) cp rank ``rank`` keeps: ``rank`` and ``2 size - 1 - rank``."""
    return rank, 2 * size - 1 - rank


def positions(rank: int, size: int, seq: int) -> np.ndarray:
    """Global positions of the tokens cp rank ``rank`` keeps of a ``seq``-token sequence, in order."""
    c = seq // (2 * size)
    return np.concatenate([np.arange(i * c, (i + 1) * c) for i in kept_chunks(rank, size)])


class ContextParallel:
    """One rank's view of its cp group: size, index, the ring's Comm and the policy's ``cp`` axis,
    what the ring cost since the last ``take`` and (measured steps) its error (the cp axis's
    ``realrun.train.runtime.AxisRuntime``)."""

    axis_names = ("cp",)

    def __init__(self, size: int, rank: int, comm: Comm | None, axis=None):
        self.size, self.rank, self.comm, self.axis = size, rank, comm, axis
        self.error: RelativeError | None = None   # set on measured steps
        self._positions: dict = {}
        self._reset()

    def _reset(self) -> None:
        self.stats = CommStats()
        self.seconds = {"fwd": 0.0, "bwd": 0.0}

    def positions(self, seq: int, rank: int | None = None, device=None) -> torch.Tensor:
        """Global positions (int64) of the tokens rank ``rank`` (default this one) keeps of a
        sequence whose kept part is ``seq`` tokens per rank."""
        r = self.rank if rank is None else rank
        key = (seq, r, str(device))
        if key not in self._positions:
            self._positions[key] = torch.from_numpy(positions(r, self.size, seq * self.size)).to(device)
        return self._positions[key]

    def local(self, batch: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """This rank's tokens of a (inputs, targets) batch of whole sequences."""
        if self.size == 1:
            return batch
        keep = positions(self.rank, self.size, batch[0].shape[1])
        return batch[0][:, keep], batch[1][:, keep]

    def shift(self, x: torch.Tensor, key: str, phase: str) -> torch.Tensor:
        """One ring step of ``x`` under the cp spec (timed under ``phase``: fwd or bwd); on a
        measured step also the exact step (uncounted, before the clock) to measure against."""
        x = x.detach().contiguous()
        exact = self.comm.shift(x, "none") if self.error is not None else None
        start = now(x.device)
        out = self.comm.shift(x, self.axis.codec_for(x.numel() * x.element_size()), key=key, stats=self.stats)
        self.seconds[phase] += now(x.device) - start
        if exact is not None:
            self.error.add(out, exact)
        return out

    def start_step(self, measure: bool) -> None:
        self.error = meter(measure, self.size)

    def take(self) -> AxisTiming:
        """What the ring cost since the last call (and its error on a measured step), then reset."""
        out = AxisTiming(forward_s=self.seconds["fwd"], backward_s=self.seconds["bwd"], stats={"cp": self.stats},
                         errors={"cp": value(self.error)})
        self._reset()
        self.error = None
        return out


def _heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """K or V (batch, kv heads, tokens, dim) repeated for each query head of its group."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _kv_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """A gradient per query head summed back onto its K/V head (the adjoint of ``_heads``)."""
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x.view(b, h // groups, groups, t, d).sum(2)


def _scores(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Scaled dot products of queries and keys, -inf where the key is after the query (causal,
    by global position)."""
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    return s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))


class _RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over the whole sequence's K/V (module doc)."""

    @staticmethod
    def forward(ctx, q, k, v, cp: ContextParallel, key: str):
        groups, t = q.shape[1] // k.shape[1], q.shape[2]
        q_pos = cp.positions(t, device=q.device)
        kv = torch.cat([k, v], dim=1)                     # one block per ring step
        top = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
        total, acc = torch.zeros_like(top), torch.zeros_like(q)
        for s in range(cp.size):
            if s:
                kv = cp.shift(kv, f"{key}.kv.fwd{s}", "fwd")
            kb, vb = (_heads(part, groups) for part in kv.chunk(2, dim=1))
            scores = _scores(q, kb, q_pos, cp.positions(t, (cp.rank - s) % cp.size, q.device))
            new_top = torch.maximum(top, scores.amax(-1, keepdim=True))   # finite from step 0 on (own block)
            scale, p = torch.exp(top - new_top), torch.exp(scores - new_top)
            total = total * scale + p.sum(-1, keepdim=True)
            acc = acc * scale + p @ vb
            top = new_top
        out = acc / total
        ctx.save_for_backward(q, k, v, out, top + torch.log(total))
        ctx.cp, ctx.key = cp, key
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        cp, key = ctx.cp, ctx.key
        groups, t = q.shape[1] // k.shape[1], q.shape[2]
        q_pos = cp.positions(t, device=q.device)
        delta = (dout * out).sum(-1, keepdim=True)
        dq, kv, own, travelling = torch.zeros_like(q), torch.cat([k, v], dim=1), None, None
        for s in range(cp.size):
            if s:
                kv = cp.shift(kv, f"{key}.kv.bwd{s}", "bwd")
            if s > 1:   # the block's accumulator, from the rank that held it last step
                travelling = cp.shift(travelling, f"{key}.dkv.bwd{s}", "bwd")
            kh, vh = kv.chunk(2, dim=1)
            kb, vb = _heads(kh, groups), _heads(vh, groups)
            p = torch.exp(_scores(q, kb, q_pos, cp.positions(t, (cp.rank - s) % cp.size, q.device)) - lse)
            ds = p * (dout @ vb.transpose(-1, -2) - delta) * (1.0 / math.sqrt(q.shape[-1]))
            dq += ds @ kb
            share = torch.cat([_kv_heads(ds.transpose(-1, -2) @ q, groups),
                               _kv_heads(p.transpose(-1, -2) @ dout, groups)], dim=1)
            if s == 0:
                own = share
            else:
                travelling = share if travelling is None else travelling + share
        dkv = own if cp.size == 1 else own + cp.shift(travelling, f"{key}.dkv.bwd{cp.size}", "bwd")
        dk, dv = dkv.chunk(2, dim=1)
        return dq, dk, dv, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: ContextParallel, key: str) -> torch.Tensor:
    """Causal attention of ``q`` (batch, heads, tokens, dim) over the K/V of the whole sequence,
    ``k`` and ``v`` (batch, kv heads, tokens, dim) this rank's part (positions already rotated)."""
    return _RingAttention.apply(q, k, v, cp, key)
