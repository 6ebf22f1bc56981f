"""An unmodified Hugging Face GPT2LMHeadModel (small random config, no download) in bf16 under DDP
on gloo with realrun's compression hook, a few steps; then every all-reduce algorithm of ``Comm``
on a bf16 tensor. Rank 0 writes a JSON summary to OUT.
Run: python hf_ddp_worker.py RANK WORLD PORT SPEC STEPS OUT."""
import gc
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import GPT2Config, GPT2LMHeadModel

from realrun.comm import Comm
from realrun.hooks import compression_hook

CONFIG = dict(vocab_size=512, n_positions=32, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)


def main(rank: int, world: int, port: int, spec: str, steps: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=90))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**CONFIG)).to(torch.bfloat16)
    ddp = DDP(model, bucket_cap_mb=0.1)   # several buckets
    state, hook = compression_hook(spec)
    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, CONFIG["vocab_size"], (4, 16), generator=gen)
        loss = ddp(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().float()))
    grads = [p.grad.dtype for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])   # bf16 parameters
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    comm, sums = Comm(), {}
    x = torch.randn(5000, generator=torch.Generator().manual_seed(9 + rank)).bfloat16()
    for alg in ("ring", "recursive_doubling", "allgather", "two_phase"):
        y = comm.allreduce(x, spec, alg, key=alg)
        got = [torch.zeros_like(y) for _ in range(world)]
        dist.all_gather(got, y)
        sums[alg] = {"dtype": str(y.dtype), "agree": all(torch.equal(got[0], g) for g in got[1:])}
    if rank == 0:
        with open(out, "w") as handle:
            json.dump({"losses": losses, "ranks_agree": all(torch.equal(gathered[0], g) for g in gathered[1:]),
                       "param_dtype": str(flat.dtype), "grad_dtypes": sorted({str(g) for g in grads}),
                       "buckets": state.stats["buckets"], "bytes_out": state.stats["bytes_out"],
                       "bytes_in": state.stats["bytes_in"], "allreduce": sums}, handle)
    del ddp, state, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
