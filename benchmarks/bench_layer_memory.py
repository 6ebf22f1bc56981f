"""Does calibration's compute cover a layer? realrun's ``Block`` forward and backward against
the cases ``realrun calibrate`` times for it (its GEMMs, attention, the memory-bound work), one
thread, one process: the Block's time less its GEMM and attention cases is the non-GEMM work,
which the ``elementwise`` case must match for the fitted streaming rate to price it. Median of
``--repeats`` timings of each; the spread is max/min - 1.

    python benchmarks/bench_layer_memory.py [--model gpt-tiny] [--mbs 4] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from perfmodel.step.compute import layer_gemms
from perfmodel.plan.parallel import make_plan
from perfmodel.workload import load_model
from realrun.bench.compute import _callable, cases
from realrun.train.model import Block


def per_call_ms(fn, calls: int = 40) -> float:
    for _ in range(5):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt-tiny")
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = load_model(args.model)
    block, x = Block(spec), torch.randn(args.mbs, spec.seq_len, spec.hidden_size, requires_grad=True)
    todo = cases(args.model, 1, tps=(1,), mbs=args.mbs)
    plan = make_plan(spec, 1, mbs=args.mbs, compute_dtype="fp32")
    shapes = {tuple(int(v) for v in s) for s in layer_gemms(spec, plan)}   # the Block's, not the LM head's
    layer = [c for c in todo if c["op"] == "attention" or (c["op"] == "gemm" and (c["m"], c["n"], c["k"]) in shapes)]
    memory = next(c for c in todo if c["op"] == "elementwise")
    fns = [_callable(c) for c in layer]
    rows = {"block": [], "gemm+attention": [], "non-GEMM (block less cases)": [], "elementwise case": []}
    for _ in range(args.repeats):
        b = per_call_ms(lambda: block(x).sum().backward())
        g = sum(per_call_ms(f) for f in fns)
        rows["block"].append(b)
        rows["gemm+attention"].append(g)
        rows["non-GEMM (block less cases)"].append(b - g)
        rows["elementwise case"].append(per_call_ms(_callable(memory)))
    print(f"{args.model}, mbs {args.mbs}, one thread, {args.repeats} repeats (ms per forward and backward)")
    for name, v in rows.items():
        print(f"  {name:30s} median {statistics.median(v):6.2f}  spread {max(v) / min(v) - 1:5.1%}")
    ratio = statistics.median(rows["elementwise case"]) / statistics.median(rows["non-GEMM (block less cases)"])
    print(f"  elementwise case / non-GEMM work: {ratio:.2f}")


if __name__ == "__main__":
    main()
