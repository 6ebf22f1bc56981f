"""1-bit Adam and 0/1 Adam as DeepSpeed runs them (``perfmodel.compression.recipes``): the optimizer
reduces over the replicas itself, because what it compresses is Adam's momentum (or the update
accumulated over local steps), not the gradient a DDP hook sees.

* ``onebit-adam`` (DeepSpeed ``deepspeed/runtime/fp16/onebit/adam.py``): for the warm-up share of the
  run (``freeze_step``) the gradients are all-reduced uncompressed and Adam updates both moments;
  then the variance is frozen, each replica folds its own gradient into its momentum and the momenta
  are averaged under the dp spec (``ef(sign(...))``: realrun's two-phase all-reduce, an all-to-all then
  an all-gather, the error fed back per chunk on the worker and on the reduced chunk on the server,
  DeepSpeed's ``compressed_allreduce``).
* ``zero-one-adam`` (``zoadam.py``): the variance is updated, from an uncompressed gradient
  all-reduce, on the steps of ``recipes.variance_steps`` (its interval doubling every
  ``var_update_scaler`` updates); the other steps reduce the gradient under the dp spec and update
  only the momentum. After ``var_freeze`` (a share of the run; 1: never) each replica takes local
  steps and every ``recipes.sync_steps`` step averages the update it accumulated (scaled by the
  frozen ``sqrt(v) + eps``) under the dp spec, replaces its local ones with the average and sets the
  momentum from it, as ``zoadam.py`` does.

Adam's bias correction is kept as torch's AdamW has it (DeepSpeed's 1-bit optimizers leave it out),
so a run compares with ``none`` by the recipe alone; no weight decay (``realrun.train.trainer.ADAM``).
The moments live per bucket as flat float32 vectors; ``state_dict`` makes them checkpointable.
"""
from __future__ import annotations

import torch

from perfmodel.compression.recipes import Recipe
from realrun.comm import Comm, CommStats
from realrun.train.clock import now

EPS = 1e-8   # torch's AdamW default


class CompressedAdam:
    """1-bit or 0/1 Adam over ``groups`` (buckets of parameters) on ``comm`` (the ``world`` replicas)
    under ``axis`` (the dp spec) for a run of ``steps`` steps (module doc)."""

    reduces = True   # DataParallel leaves the gradient reduction to it

    def __init__(self, groups: list, comm: Comm, axis, recipe: Recipe, world: int, steps: int, lr: float,
                 betas=(0.9, 0.95), device=None, **_):
        self.groups, self.comm, self.axis, self.recipe, self.world = groups, comm, axis, recipe, world
        self.lr, (self.b1, self.b2), self.device = lr, betas, device
        sizes = [sum(p.numel() for p in params) for params in groups]
        zeros = [torch.zeros(n, dtype=torch.float32, device=device) for n in sizes]
        self.m, self.v, self.buf = zeros, [z.clone() for z in zeros], [z.clone() for z in zeros]
        self.t, self.tv, self.lrs = 0, 0, 0.0
        self.modes = recipe.modes(steps)   # what each step does (perfmodel prices the same list)
        self.uncompressed_steps = self.compressed_steps = self.local_steps = 0   # what it ran (tests, reports)

    def mode(self, t: int) -> str:
        """What step ``t`` (1-based) does (``perfmodel.compression.recipes.Recipe.modes``): ``exact``
        (uncompressed gradient, both moments), ``gradient`` (compressed gradient, momentum only),
        ``momentum`` (1-bit Adam's compressed momentum), ``local`` (a 0/1 Adam local step) or ``sync``
        (a local step, then the average)."""
        return self.modes[min(t, len(self.modes)) - 1]

    def step(self, stats: CommStats, error=None) -> float:
        """One step (module doc): its reductions counted in ``stats``; returns the seconds of the
        update itself (the reductions are the dp phase's)."""
        self.t += 1
        mode = self.mode(self.t)
        counter = {"exact": "uncompressed_steps", "local": "local_steps"}.get(mode, "compressed_steps")
        setattr(self, counter, getattr(self, counter) + 1)
        if mode == "exact":
            self.tv += 1
        update_s = 0.0
        for i, params in enumerate(self.groups):
            update_s += self._bucket(i, params, mode, stats, error)
        if mode == "sync":
            self.lrs = 0.0
        return update_s

    def _bucket(self, i: int, params: list, mode: str, stats: CommStats, error) -> float:
        g = torch.cat([p.grad.reshape(-1) for p in params]).float()
        m, v, buf = self.m[i], self.v[i], self.buf[i]
        if mode in ("exact", "gradient"):
            g = self._average(g, mode == "gradient", f"grad{i}", stats, error)
        t = now(self.device)
        if mode == "momentum":   # 1-bit Adam: the local momentum, then its compressed average
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            spent = now(self.device) - t
            m.copy_(self._average(m, True, f"momentum{i}", stats, error))
            t = now(self.device)
        else:
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
        if mode == "exact":
            v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
        denom = (v / (1 - self.b2 ** max(self.tv, 1))).sqrt_().add_(EPS)
        update = m / (1 - self.b1 ** self.t) / denom
        delta = -self.lr * update
        spent = (spent if mode == "momentum" else 0.0) + now(self.device) - t
        if mode in ("local", "sync"):
            buf.add_(delta)
            self.lrs += self.lr if i == 0 else 0.0
        if mode == "sync":   # undo the local steps, average what they did, apply the average
            delta = delta - buf
            scaled = buf * denom
            avg = self._average(scaled, True, f"sync{i}", stats, error)
            m.copy_(-avg / (self.lrs if self.lrs else self.lr) * (1 - self.b1 ** self.t))
            delta = delta + avg / denom
            buf.zero_()
        t = now(self.device)
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                p.add_(delta[offset:offset + n].view_as(p).to(p.dtype))
                offset += n
        return spent + now(self.device) - t

    def _average(self, x: torch.Tensor, compressed: bool, key: str, stats: CommStats, error) -> torch.Tensor:
        """The mean of ``x`` over the replicas: under the dp spec where ``compressed`` (error
        feedback per ``key``), else the plain all-reduce; with an ``error`` meter, measured."""
        codec = self.axis.codec if compressed else None
        if codec is None or codec.is_none:
            return self.comm.allreduce(x.contiguous(), "none", stats=stats) / self.world
        exact = None
        if error is not None:
            exact = x.clone()
            torch.distributed.all_reduce(exact, group=self.comm.group)
        summed = self.comm.allreduce(x.contiguous(), codec, key=key, stats=stats)
        if exact is not None:
            error.add(summed, exact)
        return summed / self.world

    def state_dict(self) -> dict:
        return {"m": self.m, "v": self.v, "buf": self.buf, "t": self.t, "tv": self.tv, "lrs": self.lrs}

    def load_state_dict(self, saved: dict) -> None:
        for name in ("m", "v", "buf"):
            for mine, theirs in zip(getattr(self, name), saved[name]):
                mine.copy_(theirs)
        self.t, self.tv, self.lrs = int(saved["t"]), int(saved["tv"]), float(saved["lrs"])
