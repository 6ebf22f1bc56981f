"""Unmodified Hugging Face causal LMs (``hf_models``: GPT-2, Llama) under FSDP2 (``fully_shard``
per block, then the root) on gloo, one case after another in the same ranks (CASES: a JSON list
of [arch, dtype, policy]): plain FSDP2 and FSDP2 with realrun's compressed collectives
(``realrun.fsdp.compress_fsdp(model, POLICY)``), the same initial weights and batches, a few
steps each. Then both evaluate one batch that is the same on every rank (every rank's loss is
gathered). Rank 0 writes a JSON list of summaries, one a case, to OUT.
Run: python hf_fsdp_worker.py RANK WORLD PORT CASES STEPS OUT."""
import sys

import torch
import torch.distributed as dist
from hf_models import DTYPES, batch, blocks, build, run_worker, train
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from realrun.fsdp import compress_fsdp

LR = 0.05


def shard(arch: str, dtype: torch.dtype, mesh, policy: str | None):
    model = build(arch)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model, compress_fsdp(model, policy) if policy is not None else None


def evaluate(model, world: int) -> list:
    """The loss of one batch, the same on every rank, as each rank computes it."""
    ids = batch(torch.Generator().manual_seed(99), rows=2)
    model.eval()   # no dropout
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.detach().float().reshape(1)
    every = [torch.zeros_like(loss) for _ in range(world)]
    dist.all_gather(every, loss)
    return [float(v) for v in every]


def case(rank: int, world: int, mesh, arch: str, dtype: str, policy: str, steps: int) -> dict:
    plain, _ = shard(arch, DTYPES[dtype], mesh, None)
    comp, state = shard(arch, DTYPES[dtype], mesh, policy)
    return {"blocks": len(blocks(comp)), "plain": train(plain, rank, steps, LR),
            "compressed": train(comp, rank, steps, LR),
            "eval_plain": evaluate(plain, world), "eval_compressed": evaluate(comp, world),
            "modules": state.modules, "stats": state.stats,
            # the tensor key of every error-feedback residual kept ("ef", spec, key, shape, dtype)
            "residuals": sorted(k[2] for comm in state.state_dict()["comms"] for specs in comm.values()
                                for saved in specs.values() for k in saved["state"] if k[0] == "ef")}


if __name__ == "__main__":
    run_worker(case, sys.argv, setup=lambda world: (init_device_mesh("cpu", (world,)),))
