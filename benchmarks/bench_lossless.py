#!/usr/bin/env python3
"""Lossless codecs on what training sends: MPC and zstd/lz4 (byte and bit shuffle) on the
activations (TP/PP traffic) and gradients (DP traffic) of a small GPT after a few AdamW steps,
in float32 and float16. Prints the compression ratio of each (the model's DEFAULT_RATIO for
``mpc`` and ``lossless`` comes from here) and the numpy reference's throughput on this CPU.

Usage: python benchmarks/bench_lossless.py [--model gpt-tiny] [--steps 20] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from perfmodel.workload import load_model
from realrun.compressors import Compressor
from realrun.train.data import load_corpus, train_batch
from realrun.train.model import GPT

SPECS = ("mpc", "lossless(codec=zstd,shuffle=byte)", "lossless(codec=zstd,shuffle=bit)",
         "lossless(codec=lz4,shuffle=byte)")


def tensors(model: str, steps: int, rows: int = 8, seq: int = 128) -> dict:
    """{kind: float32 array}: the last block's output activations and the gradients of every
    parameter, after ``steps`` AdamW steps on the byte corpus."""
    torch.manual_seed(0)
    net = GPT(load_model(model), seed=0)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    corpus = load_corpus()
    for step in range(steps + 1):
        x, y = (torch.from_numpy(a) for a in train_batch(corpus, seed=0, step=step, index=0, rows=rows, seq=seq))
        acts: list = []
        hook = net.blocks[-1].register_forward_hook(lambda m, i, o, keep=acts: keep.append(o.detach()))
        opt.zero_grad()
        net(x, y).backward()
        hook.remove()
        if step < steps:
            opt.step()
    grads = torch.cat([p.grad.reshape(-1) for p in net.parameters() if p.grad is not None])
    return {"activations": acts[-1].reshape(-1).numpy(), "gradients": grads.numpy()}


def measure(arr: np.ndarray, spec: str, repeats: int = 3) -> dict:
    c = Compressor(spec)
    times, payload = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        payload = c.compress(arr)
        times.append(time.perf_counter() - start)
    back = c.decompress(payload)
    assert np.array_equal(back.view(np.uint8), arr.view(np.uint8)), spec
    t = statistics.median(times)
    return {"ratio": arr.nbytes / len(payload.data), "compress_GBps": arr.nbytes / t / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for kind, arr in tensors(args.model, args.steps).items():
        for dtype in (np.float32, np.float16):
            for spec in SPECS:
                rows.append({"tensor": kind, "dtype": np.dtype(dtype).name, "spec": spec, "values": arr.size,
                             **measure(arr.astype(dtype), spec)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'tensor':12s} {'dtype':8s} {'spec':36s} {'ratio':>6s} {'GB/s':>6s}")
    for r in rows:
        print(f"{r['tensor']:12s} {r['dtype']:8s} {r['spec']:36s} {r['ratio']:6.3f} {r['compress_GBps']:6.3f}")


if __name__ == "__main__":
    main()
