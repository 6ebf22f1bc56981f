"""A rank of ``torchrun --max-restarts 2`` run by test_train.py: every attempt's ranks meet
through ``realrun.train.rendezvous`` and sum a tensor; rank 1 fails in attempts 0 and 1. The
restarted ranks come up at different times, as they do after a failure: in attempt 1 rank 0 is
late (rank 1 first finds the failed attempt's announcement), in attempt 2 rank 1 is (rank 0
would first find the failed attempt's gloo addresses in torchrun's store). Prints one line per
rank and attempt."""
import os
import time

import torch
import torch.distributed as dist

from realrun.train import rendezvous

LATE_S = 1.0

attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
if (attempt, rank) in ((1, 0), (2, 1)):
    time.sleep(LATE_S)
rendezvous.init_process_group("gloo", rank, int(os.environ["WORLD_SIZE"]), timeout_s=30)
x = torch.full((4,), float(rank + 1))
dist.all_reduce(x)
os.write(1, f"attempt {attempt} rank {rank} sum {x[0].item():g}\n".encode())   # one write: lines never interleave
if attempt < 2:
    if rank == 1:
        os._exit(1)
    time.sleep(60)   # torchrun stops this rank when rank 1 has failed
dist.barrier()
dist.destroy_process_group()
