"""Trains a small MLP with DDP on gloo, optionally through the compression hook; rank 0
writes the loss curve and hook statistics to OUT. Run: python ddp_worker.py RANK WORLD PORT SPEC OUT."""
import gc
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from realrun.hooks import compression_hook

STEPS = 150


def main(rank: int, world: int, port: int, spec: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=90))
    torch.manual_seed(0)
    teacher = torch.nn.Linear(32, 4)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 4))
    ddp = DDP(model, bucket_cap_mb=0.01)   # several buckets
    state = None
    if spec != "none":
        state, hook = compression_hook(spec, warmup_steps=5)
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(64, 32, generator=gen)
        with torch.no_grad():
            y = torch.sin(teacher(x))
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        losses.append(float(avg) / world)
    if rank == 0:
        with open(out, "w") as handle:
            json.dump({"losses": losses, "stats": state.stats if state else None,
                       "steps": len(state.per_step) if state else 0}, handle)
    # explicit teardown: the reducer and the hook's Comm hold the process group; release them
    # before the group is destroyed, not in interpreter shutdown (where gloo's threads may still run)
    del ddp, state, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
