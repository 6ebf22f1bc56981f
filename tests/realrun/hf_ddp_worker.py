"""Unmodified Hugging Face causal LMs (``hf_models``: GPT-2, Llama) under DDP on gloo, one case
after another in the same ranks (CASES: a JSON list of [arch, dtype, spec]): plain DDP and DDP
with realrun's compression hook (``compression_hook(SPEC)``) in DTYPE, the same initial weights
and batches, a few steps each; then every all-reduce algorithm of ``Comm`` on a DTYPE tensor.
Rank 0 writes a JSON list of summaries, one a case, to OUT.
Run: python hf_ddp_worker.py RANK WORLD PORT CASES STEPS OUT."""
import gc
import sys

import torch
import torch.distributed as dist
from hf_models import DTYPES, build, run_worker, train
from torch.nn.parallel import DistributedDataParallel as DDP

from realrun.comm import Comm
from realrun.hooks import compression_hook


def agree(tensor: torch.Tensor, world: int) -> bool:
    """Every rank holds the same bits."""
    every = [torch.zeros_like(tensor) for _ in range(world)]
    dist.all_gather(every, tensor)
    return all(torch.equal(every[0], t) for t in every[1:])


def case(rank: int, world: int, arch: str, dtype: str, spec: str, steps: int) -> dict:
    dt = DTYPES[dtype]
    plain = DDP(build(arch).to(dt), bucket_cap_mb=0.1)
    model = build(arch).to(dt)
    ddp = DDP(model, bucket_cap_mb=0.1)   # several buckets
    state, hook = compression_hook(spec)
    ddp.register_comm_hook(state, hook)
    summary = {"plain": train(plain, rank, steps, 0.1), "losses": train(ddp, rank, steps, 0.1)}
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    comm, sums = Comm(), {}
    x = torch.randn(5000, generator=torch.Generator().manual_seed(9 + rank)).to(dt)
    for alg in ("ring", "recursive_doubling", "allgather", "two_phase"):
        y = comm.allreduce(x, spec, alg, key=alg)
        sums[alg] = {"dtype": str(y.dtype), "agree": agree(y, world)}
    summary.update(ranks_agree=agree(flat, world), param_dtype=str(flat.dtype), allreduce=sums,
                   grad_dtypes=sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None}),
                   **{k: state.stats[k] for k in ("buckets", "bytes_in", "bytes_out")})
    del ddp, plain, state
    gc.collect()
    return summary


if __name__ == "__main__":
    run_worker(case, sys.argv)
