"""``realrun calibrate``: run the microbenchmarks the model needs and fit a profile.

1. Compressors alone (one process, one thread: what one rank gets), every spec at
   ``KERNEL_SIZES`` -> kernel throughput, launch cost, ratios of data-dependent specs.
2. A training step's compute (``realrun.bench.compute``: the GEMMs, attention and memory-bound
   work of ``model``, by default validate's two models, at ``TRAIN_MBS`` sequences per
   microbatch, TP 1 and 2, CP 1 and 2 (ring blocks), the MoE model's expert GEMMs at ep 1 and 2,
   every host's rank computing at once) -> the device's GEMM efficiency table and streaming rate.
3. Uncompressed all-reduce across the cluster's hosts at ``SIZES`` and, on an emulated
   cluster, at ``BANDWIDTHS``, also on 2 of its hosts -> base, alpha and beta of the tier per
   primitive, and of each primitive between a pair of hosts (``NAME@pair``; perfmodel.calibration.fit),
   and the CPU each call took (the transport's term). The uncompressed all-to-all (torch's
   ``all_to_all_single``, what realrun's all-to-all moves) at the same sizes, so the
   ``alltoall`` primitive is fitted on runs of its own, not only as the part of two-phase's
   time that its all-gather leaves (on 4 emulated hosts a quick profile fitted 0.78 of the
   link that way and 0.62 with the all-to-all's own runs; validation's all-to-alls at
   100 Mbit/s were predicted 14-24% short with the first, -5% to +7% with the second).
4. On an emulated cluster (``--quick`` too), compressed all-reduces of ``IN_RUN`` at
   ``IN_RUN_SIZES``: their kernels timed inside the run (the in-run factor) and the seconds
   beyond wire and kernels (the runtime's per-call term, ``runtime.calls``), both priced from
   the CPU they took over the host's share (``perfmodel.calibration.fit.kernel_seconds`` and
   ``call_seconds``), as compute and the kernels alone are: the wall seconds of a run on this
   shared machine also hold the time other work kept the ranks off their cores.

The bandwidths and sizes are deliberately not those ``realrun validate`` uses (100 Mbit/s,
1 Gbit/s; 2, 8, 32 MiB), so validation predicts runs the model was not fitted on.
"""
from __future__ import annotations

import sys

from perfmodel.calibration.fit import fit_profile
from realrun.bench import BenchConfig
from realrun.bench.compute import cases as compute_cases
from realrun.bench.config import BenchCase

KIB, MIB = 2**10, 2**20
# uncompressed runs of each primitive realrun's algorithms use: torch's all-reduce (auto),
# send/recv (ring), all-gather (allgather), all-to-all + all-gather (two_phase)
CALIBRATED_ALGORITHMS = ("auto", "ring", "allgather", "two_phase")   # realrun algorithms calibration times
SIZES = (64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB)
QUICK_SIZES = (64 * KIB, 1 * MIB, 4 * MIB)
BANDWIDTHS = (200 * 10**6, 500 * 10**6)
KERNEL_SIZES = (256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB)
TRAIN_MODEL, TRAIN_MBS = "gpt-tiny", 4   # what realrun validate --training trains (one place)
TRAIN_MOE_MODEL = "gpt-tiny-moe"          # its expert-parallel plans' model: gpt-tiny, MoE MLPs (4 experts, top-2)
COMPUTE_MODELS = f"{TRAIN_MODEL},{TRAIN_MOE_MODEL}"   # what calibration times the compute of (its shapes)
COMPUTE_CPS = (1, 2)                      # and its context-parallel plans' (validate's cp2 plans)
# compressed all-reduces whose kernels are timed inside the run (the in-run factor of each spec):
# the algorithms realrun picks for them, at sizes and a bandwidth validation does not use
IN_RUN = (("int8", "two_phase"), ("ef(topk(0.01))", "allgather"), ("powersgd(4)", "allgather"),
          ("zfp(rate=8)", "two_phase"))
IN_RUN_SIZES = (256 * KIB, 1 * MIB, 16 * MIB)
COMPRESSORS = ("fp16", "fp8", "int8", "sign", "topk(0.01)", "ef(topk(0.01))", "powersgd(4)", "zfp(rate=8)",
               "sz3(abs=1e-3)")


def _say(text: str) -> None:
    print(f"calibrate: {text}", file=sys.stderr, flush=True)


def measure(runner, compressors=COMPRESSORS, quick: bool = False, iters: int = 3,
            model: str = COMPUTE_MODELS) -> list[dict]:
    """Every record calibration fits, measured on ``runner`` (realrun.measure); a model whose
    compute cannot be planned on its ranks is refused before anything runs."""
    compute_cases(model, runner.hosts, mbs=TRAIN_MBS, cps=COMPUTE_CPS)
    _say(f"compressors alone: {len(compressors)} specs x {len(KERNEL_SIZES)} sizes")
    records = runner.kernels(KERNEL_SIZES[:3] if quick else KERNEL_SIZES, list(compressors), iters)
    _say(f"compute of {model} (GEMMs, attention, memory-bound work; ranks sharing the cores)")
    records += runner.compute(model, TRAIN_MBS, COMPUTE_CPS)
    sizes = QUICK_SIZES if quick else SIZES
    try:
        for bw in BANDWIDTHS if runner.emulated else (0,):
            runner.set_bandwidth(bw)
            _say(f"uncompressed all-reduce on {runner.topology()}: {len(sizes)} sizes x "
                 f"{len(CALIBRATED_ALGORITHMS)} algorithms")
            config = BenchConfig.grid(op="allreduce", sizes=list(sizes), compressors=["none"],
                                      algorithms=list(CALIBRATED_ALGORITHMS), iters=iters, warmup=1)
            records += runner.collectives(config)
            _say(f"uncompressed all-to-all on {runner.topology()}: {len(sizes)} sizes")
            records += runner.collectives(BenchConfig.grid(op="alltoall", sizes=list(sizes), compressors=["none"],
                                                           iters=iters, warmup=1))
            if runner.emulated and runner.hosts > 2 and not quick:   # a pair of hosts: both ways at once
                _say(f"uncompressed all-reduce on 2 of its hosts: {len(sizes)} sizes x "
                     f"{len(CALIBRATED_ALGORITHMS)} algorithms")
                records += runner.collectives(config, 2)
        if runner.emulated:   # the emulated hosts' shared cores are what it measures
            records += _in_run(runner, compressors, iters)
    finally:
        runner.restore()
    return records


def _in_run(runner, compressors, iters: int) -> list[dict]:
    """Compressed all-reduces of the calibrated specs (at the last calibration bandwidth): their
    kernel seconds inside a run, against what the kernels alone predict (perfmodel.calibration.fit)."""
    cases = tuple(BenchCase(size_bytes=size, compressor=spec, algorithm=alg) for spec, alg in IN_RUN
                  if spec in compressors for size in IN_RUN_SIZES)
    if not cases:
        return []
    _say(f"compressed all-reduce on {runner.topology()}: {len(cases)} cases (kernels inside a run)")
    return runner.collectives(BenchConfig(op="allreduce", cases=cases, iters=iters, warmup=1))


def calibrate(runner, compressors=COMPRESSORS, quick: bool = False, iters: int = 3, sources=(),
              model: str = COMPUTE_MODELS) -> tuple:
    """(profile, records): measured on ``runner`` and fitted for its cluster."""
    records = measure(runner, compressors, quick, iters, model)
    return fit_profile(records, runner.topology(), sources=list(sources) or ["realrun calibrate"]), records
