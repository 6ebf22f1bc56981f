"""Host (framework) time per eager PyTorch op, the order of magnitude behind ``host_op_us`` in
perfmodel/catalog/gpus.toml: an op with no autograd, and a chain of elementwise ops run forward
and backward through autograd (each forward op then costs two issued ops: itself and its
gradient). CPU tensors of 8 elements, one thread, so the time is dispatch and bookkeeping, not
arithmetic; a CUDA op adds its launch call on top.

    python benchmarks/bench_host_op.py
"""
from __future__ import annotations

import time

import torch


def per_call_us(fn, calls: int) -> float:
    for _ in range(calls // 10):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    torch.set_num_threads(1)
    x = torch.ones(8)
    w = torch.ones(8, requires_grad=True)

    def chain():
        y = w
        for _ in range(10):
            y = y * 1.0001 + 0.5
        y.sum().backward()
    plain = per_call_us(lambda: x + 1, 20000)
    autograd = per_call_us(chain, 2000) / 21       # 21 forward ops, each with its backward
    print(f"torch {torch.__version__}: x + 1 {plain:.2f} us; per forward op with its backward {autograd:.2f} us "
          f"({autograd / 2:.2f} us per issued op)")


if __name__ == "__main__":
    main()
