"""Microbenchmarks, nccl-tests style: compressed collectives across ranks, and kernels alone.

* ``config``: ``BenchConfig`` / ``BenchCase``, the typed configuration every rank receives;
* ``launch``: local ranks (``run_collectives``) or a launcher's (``run_here``);
* ``worker``: what each rank runs and the records rank 0 writes;
* ``kernels``: compressor throughput alone and with ranks sharing the cores;
* ``presets``: a policy preset's name in ``--compressors`` as the specs it applies on the op's axes.

Each collective case also records compress and decompress time per iteration (slowest rank),
payload bytes a rank produces (``wire_bytes``), and the relative error ||y - exact|| / ||exact||
(worst rank) against the uncompressed result. Records follow ``perfmodel.calibration.measurements`` (JSON Lines).
"""
from realrun.bench.config import BENCH_OPS, BenchCase, BenchConfig
from realrun.bench.kernels import cold_inputs, run_kernels, run_kernels_shared
from realrun.bench.launch import run_collectives, run_here, under_torchrun

__all__ = ["BENCH_OPS", "BenchCase", "BenchConfig", "cold_inputs", "run_collectives", "run_here", "run_kernels",
           "run_kernels_shared", "under_torchrun"]
