#!/usr/bin/env python3
"""Compressed FSDP2 collectives (``realrun.fsdp``) on an unmodified Hugging Face GPT-2.

The ``GPT2LMHeadModel`` of ``bench_hook_threads.py`` (4.2 M parameters, batch 8 x 64), each
block and then the root sharded with ``fully_shard`` on two gloo ranks on loopback, bf16
parameters and gradients (``MixedPrecisionPolicy``). One model per policy from the same
initial weights, trained on the same batches, their timed blocks interleaved so that every case
sees the same load on a shared host (``--warmup`` steps each, then ``--repeats`` rounds of
``--steps`` steps); a block's step time is the median of rank 0's steps (each ends at a
barrier). The table gives the median of the blocks, their spread (min-max), the ratio to plain
FSDP2, the bytes each direction put on the wire per step and their ratio to the bytes in, and
the last loss against plain FSDP2's. No thread variable is set: realrun's defaults apply.

Usage: python benchmarks/bench_fsdp.py [--steps 4] [--repeats 3] [--warmup 1]
       [--policies zeropp,fp8-param-gather,dp=ef(int4)] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from bench_hook_threads import BATCH, CONFIG, SEQ, spawn_ranks, time_cases, timed_step

from perfmodel.compression import split_top_level


def rank_main(rank: int, world: int, port: int, policies: list, steps: int, repeats: int, warmup: int,
              out: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import GPT2Config, GPT2LMHeadModel

    from realrun.fsdp import compress_fsdp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    mesh = init_device_mesh("cpu", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    cases = []
    for policy in policies:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(**CONFIG, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        cases.append({"policy": policy, "model": model, "state": compress_fsdp(model, policy), "times": [],
                      "opt": torch.optim.AdamW(model.parameters(), lr=1e-4),
                      "gen": torch.Generator().manual_seed(1 + rank)})

    def mark(case) -> None:
        case["mark"] = {d: dict(s) for d, s in case["state"].stats.items()}

    time_cases(cases, lambda case: timed_step(case["model"], case), steps, repeats, warmup, mark)
    rows = []
    for case in cases:
        timed = steps * repeats
        wire = {d: {k: (s[k] - case["mark"][d][k]) / timed for k in ("calls", "bytes_in", "bytes_out", "plain_bytes")}
                for d, s in case["state"].stats.items()}
        rows.append({"policy": case["policy"], "blocks": case["times"], "wire": wire,
                     "loss": float(case["loss"].detach().float())})
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(rows, handle)
    del cases
    dist.barrier()
    dist.destroy_process_group()


def run(policies: list, args) -> list:
    """Every policy in one pair of fresh ranks, bounded by ``--timeout``."""
    return spawn_ranks(rank_main, (policies, args.steps, args.repeats, args.warmup), args.timeout, "FSDP2")


def _wire(w: dict) -> str:
    """Bytes on the wire per step, and their ratio to the bytes in (compressed calls only);
    ``plain`` where realrun installed nothing for the direction (FSDP2's own collective)."""
    if not w["calls"]:
        return "plain"
    sent = w["bytes_out"] + w["plain_bytes"]
    ratio = f" ({w['bytes_out'] / w['bytes_in']:.2f})" if w["bytes_in"] else ""
    return f"{sent / 2**20:6.2f} MiB{ratio}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4, help="steps per timed block")
    p.add_argument("--repeats", type=int, default=3, help="timed blocks per policy")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--policies", default="zeropp;fp8-param-gather;dp=ef(int4)",
                   help="policies against plain FSDP2, separated by ';' (a policy may hold commas)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before the ranks are killed")
    p.add_argument("--json", help="write the rows as JSON")
    args = p.parse_args(argv)
    policies = ["none"] + [q.strip() for q in split_top_level(args.policies, ";") if q.strip() not in ("", "none")]
    print(f"# HF GPT2LMHeadModel {CONFIG}, batch {BATCH}x{SEQ}, bf16 FSDP2 on 2 gloo ranks, {os.cpu_count()} cores; "
          f"{args.repeats} blocks of {args.steps} steps after {args.warmup}")
    print(f"{'policy':22} {'step_ms':>8} {'spread_ms':>15} {'ratio':>6}  {'all-gather/step':>22}  "
          f"{'reduce-scatter/step':>22}  loss (plain)")
    rows, base = [], None
    for res in run(policies, args):
        blocks = [b * 1e3 for b in res["blocks"]]
        med = statistics.median(blocks)
        base = med if res["policy"] == "none" else base
        plain_loss = rows[0]["loss"] if rows else res["loss"]
        rows.append({**res, "step_ms": med, "min_ms": min(blocks), "max_ms": max(blocks), "ratio": med / base})
        print(f"{res['policy']:22} {med:8.1f} {min(blocks):7.1f}-{max(blocks):<7.1f} {med / base:6.2f}  "
              f"{_wire(res['wire']['all_gather']):>22}  {_wire(res['wire']['reduce_scatter']):>22}  "
              f"{res['loss']:.4f} ({plain_loss:.4f})", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
