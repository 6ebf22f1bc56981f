#!/usr/bin/env python3
"""The DDP compression hook on an unmodified Hugging Face GPT-2, as a new user runs it.

A ``GPT2LMHeadModel`` of a small random config (no download) under torch DDP on two gloo ranks
on loopback (``torch.multiprocessing`` spawn, bounded), with and without
``realrun.hooks.compression_hook(SPEC)``, in fp32 and in bf16 (the whole model in
``torch.bfloat16``, as LLMs train). No environment variable is set: the codecs' threads are
realrun's default (the host's cores over the ranks on it, ``realrun.threads``). Each
dtype runs in two fresh ranks, one DDP model per case (the same initial weights): ``--warmup``
steps each, then ``--repeats`` rounds of one block of ``--steps`` steps per case, interleaved so
that every case sees the same load on a shared host; a block's step time is the median of rank
0's steps (each step ends at a barrier), and the table gives the median of the blocks and their
spread (min-max). The ratio is the hook's step over the plain DDP step of the same dtype.
Target (issue 37): int8 at most 1.5x plain in fp32.

``--isolate`` runs every case in its own pair of ranks instead (plain DDP as a user runs it,
in a process that never loads numba).

Usage: python benchmarks/bench_hook_threads.py [--steps 8] [--repeats 3] [--warmup 2]
       [--specs int8] [--dtypes fp32,bf16] [--threads N] [--isolate] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
CONFIG = dict(vocab_size=4096, n_positions=128, n_embd=256, n_layer=4, n_head=4, bos_token_id=0,
              eos_token_id=0)   # 4.2 M parameters
BATCH, SEQ = 8, 64


def rank_main(rank: int, world: int, port: int, dtype: str, specs: list, steps: int, repeats: int, warmup: int,
              threads: int | None, out: str) -> None:
    """One rank: a DDP model per case (the same initial weights), their timed blocks interleaved
    (case 1, case 2, ..., then again) so that every case sees the same load on a shared host."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import GPT2Config, GPT2LMHeadModel

    from realrun.hooks import compression_hook

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    cases = []
    for spec in specs:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(**CONFIG)).to(getattr(torch, DTYPES[dtype]))
        ddp = DDP(model)
        state = None
        if spec != "none":
            state, hook = compression_hook(spec, threads=threads)   # None: realrun's default, as a user's call
            ddp.register_comm_hook(state, hook)
        cases.append({"spec": spec, "model": model, "ddp": ddp, "state": state, "times": [],
                      "opt": torch.optim.AdamW(ddp.parameters(), lr=1e-4),
                      "gen": torch.Generator().manual_seed(1 + rank)})

    def mark(case) -> None:
        if case["state"] is not None:
            case["mark"] = len(case["state"].per_step)

    time_cases(cases, lambda case: timed_step(case["ddp"], case), steps, repeats, warmup, mark)
    torch_threads = torch.get_num_threads()   # before numba's import below can touch OpenMP
    import numba

    rows = []
    for case in cases:
        probe = torch.cat([p.detach().float().reshape(-1)[:64] for p in case["model"].parameters()])
        gathered = [torch.zeros_like(probe) for _ in range(world)]
        dist.all_gather(gathered, probe)
        timed = case["state"].per_step[case["mark"]:] if case["state"] is not None else []
        hook = {k: statistics.mean(s[k] for s in timed) * 1e3 for k in ("compress_s", "decompress_s", "comm_s")} \
            if timed else {}
        rows.append({"spec": case["spec"], "blocks": case["times"], "loss": float(case["loss"].detach().float()),
                     "ranks_agree": all(torch.equal(gathered[0], g) for g in gathered[1:]), "hook_ms": hook,
                     "numba_threads": numba.get_num_threads(), "torch_threads": torch_threads})
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(rows, handle)
    del cases
    dist.barrier()
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_step(model, case: dict) -> float:
    """One optimizer step of ``model`` on the case's next batch (``case["gen"]``, ``case["opt"]``)
    between barriers: its seconds; the loss is kept as ``case["loss"]``."""
    import torch
    import torch.distributed as dist

    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=case["gen"])
    dist.barrier()
    start = time.perf_counter()
    case["loss"] = loss = model(input_ids=ids, labels=ids).loss
    case["opt"].zero_grad(set_to_none=True)
    loss.backward()
    case["opt"].step()
    dist.barrier()
    return time.perf_counter() - start


def time_cases(cases: list, step, steps: int, repeats: int, warmup: int, mark) -> None:
    """``warmup`` untimed ``step(case)`` of each case, then ``mark(case)`` (the counters the timed
    steps start from); then ``repeats`` rounds of one block of ``steps`` steps per case, interleaved
    (case 1, case 2, ..., then again) so that every case sees the same load on a shared host: each
    block's median step seconds appended to ``case["times"]``."""
    for case in cases:
        for _ in range(warmup):
            step(case)
        mark(case)
    for _ in range(repeats):
        for case in cases:
            case["times"].append(statistics.median(step(case) for _ in range(steps)))


def spawn_ranks(target, args: tuple, timeout_s: float, what: str) -> list:
    """``target(rank, 2, port, *args, out)`` in two fresh ranks, bounded by ``timeout_s`` (ranks
    still running are killed); the JSON rank 0 wrote to ``out``."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        ctx = mp.spawn(target, args=(2, _port(), *args, out), nprocs=2, join=False)
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: ranks still running after {timeout_s:g} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        with open(out) as handle:
            return json.load(handle)


def run_case(dtype: str, specs: list, args, timeout_s: float) -> list:
    """One dtype's cases in two fresh ranks, bounded by ``timeout_s``."""
    return spawn_ranks(rank_main, (dtype, specs, args.steps, args.repeats, args.warmup, args.threads), timeout_s,
                       dtype)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8, help="steps per timed block")
    p.add_argument("--repeats", type=int, default=3, help="timed blocks per case")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--specs", default="int8", help="compressor specs against plain DDP, comma separated")
    p.add_argument("--dtypes", default="fp32,bf16", help="model dtypes: fp32, bf16, fp16")
    p.add_argument("--threads", type=int, default=None, help="codec threads per rank (default: realrun's)")
    p.add_argument("--isolate", action="store_true", help="each case in its own pair of ranks (plain DDP then never "
                   "loads numba, whose OpenMP start can set torch's threads too), not interleaved")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per case before its ranks are killed")
    p.add_argument("--json", help="write the rows as JSON")
    args = p.parse_args(argv)
    set_vars = [v for v in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "COMMPRESS_CODEC_THREADS") if v in os.environ]
    print(f"# HF GPT2LMHeadModel {CONFIG}, batch {BATCH}x{SEQ}, DDP on 2 gloo ranks, {os.cpu_count()} cores; "
          f"{args.repeats} blocks of {args.steps} steps after {args.warmup}; thread variables set: "
          f"{', '.join(set_vars) or 'none'}; --threads {args.threads or 'default'}; "
          f"{'isolated' if args.isolate else 'interleaved'} cases")
    print(f"{'dtype':6} {'spec':16} {'step_ms':>9} {'spread_ms':>15} {'ratio':>6}  ranks_agree  threads  loss  "
          "hook ms/step (rank 0)")
    rows = []
    specs = ["none"] + [s.strip() for s in args.specs.split(",") if s.strip() and s.strip() != "none"]
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        base = None
        results = [r for spec in specs for r in run_case(dtype, [spec], args, args.timeout)] if args.isolate \
            else run_case(dtype, specs, args, args.timeout)
        for res in results:
            blocks = [b * 1e3 for b in res["blocks"]]
            med = statistics.median(blocks)
            base = med if res["spec"] == "none" else base
            row = {"dtype": dtype, **{k: res[k] for k in ("spec", "ranks_agree", "loss", "numba_threads",
                                                           "torch_threads", "hook_ms")},
                   "step_ms": med, "min_ms": min(blocks), "max_ms": max(blocks), "ratio": med / base}
            rows.append(row)
            threads = f"{res['numba_threads']}/{res['torch_threads']}"
            print(f"{dtype:6} {res['spec']:16} {med:9.1f} {min(blocks):7.1f}-{max(blocks):<7.1f} {row['ratio']:6.2f}  "
                  f"{str(res['ranks_agree']):11}  {threads:7}  {res['loss']:.3f}  "
                  + " ".join(f"{k.removesuffix('_s')} {v:.0f}" for k, v in res["hook_ms"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
