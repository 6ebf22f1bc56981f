"""Kernel time inside a collective priced from the CPU the kernels take (issue 40, item 4): on
hosts with a fixed CPU share, calibration's in-run kernel factor is the codec's CPU over the share
and the runtime's per-call term the calling thread's CPU beyond its kernels over the share, so
the machine's other load (wall seconds a rank waited for a core) is never fitted as a cost; the
benchmark worker records those CPU seconds, and a quick calibration times the compressed runs.
No test here asserts on wall time: every record is synthetic."""
import json
import math

import numpy as np
import pytest

from perfmodel.calibration.fit import call_seconds, fit_profile, kernel_seconds
from perfmodel.calibration.measurements import make_record
from perfmodel.collectives.runtime import runtime_time
from realrun.bench.worker import cpu_fields, kernel_cpu

SHARE = 0.45
QUOTA = f"emulated:hosts=4,bandwidth=500mbit,cpu_share={SHARE}"
PLAIN = "emulated:hosts=4,bandwidth=500mbit,cores=2"
SIZES = (2**18, 2**20, 2**22, 2**24)
LOAD = 3.0            # how much longer the wall seconds are on a busy machine than the quota gives
IN_RUN = 1.3          # the codec's CPU inside a run over what the benchmark's CPU predicts
CALL_US, NS_PER_BYTE = 700.0, 0.25   # the runtime's own work per call, at the share


def _kernels(cluster: str) -> list[dict]:
    """int8 alone (a whole core) and with 4 ranks at once, each granted exactly its share."""
    quota = "cpu_share" in cluster
    out = []
    for size in SIZES:
        for conc, (tc, td) in ((1, (2e9, 3e9)), (4, (0.9e9, 1.35e9))):
            comp, decomp = size / tc, size / td
            extra = {"cpu_share": 1.0 if conc == 1 else SHARE,
                     "cpu_s": (comp + decomp) * (1.0 if conc == 1 else SHARE)} if quota else {}
            out.append(make_record("kernel", compressor="int8", device="cpu", size_bytes=size,
                                   wire_bytes=size // 4 + 40, compress_s=comp, decompress_s=decomp,
                                   max_rel_error=0.0, concurrent=conc, **extra))
    return out


def _benchmark(tmp_path, cluster: str):
    """(records of the kernels, path of the profile they fit)."""
    records = _kernels(cluster)
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(fit_profile(records, cluster)))
    return records, str(path)


def _compressed(cluster: str, path: str, size: int, **cpu) -> dict:
    """A two-phase int8 all-reduce whose wall seconds, kernels' too, are LOAD times what the
    benchmark's kernels and the call term predict; ``cpu``: its CPU fields."""
    t = runtime_time("allreduce", size, cluster=cluster, compressor="int8", algorithm="two_phase",
                     calibration=path)
    call = CALL_US * 1e-6 + NS_PER_BYTE * 1e-9 * size
    return make_record("collective", op="allreduce", compressor="int8", algorithm="two_phase", world=4,
                       backend="gloo", size_bytes=size, wire_bytes=0, time_s=LOAD * (t.time_s + call),
                       compress_s=LOAD * t.timed.kernel_s / 2, decompress_s=LOAD * t.timed.kernel_s / 2,
                       max_rel_error=0, cluster=cluster, cpu_share=SHARE if "cpu_share" in cluster else None,
                       **cpu)


def _cpu(path: str, size: int) -> dict:
    """The CPU fields of a run granted its quota: the codec IN_RUN times the benchmark's CPU, the
    calling thread that plus the runtime's own work."""
    t = runtime_time("allreduce", size, cluster=QUOTA, compressor="int8", algorithm="two_phase",
                     calibration=path)
    kernel = IN_RUN * t.timed.kernel_s * SHARE
    return {"kernel_cpu_s": kernel, "thread_cpu_s": kernel + (CALL_US * 1e-6 + NS_PER_BYTE * 1e-9 * size) * SHARE}


def test_the_in_run_factor_is_the_codecs_cpu_over_the_share_not_the_wall(tmp_path):
    records, path = _benchmark(tmp_path, QUOTA)
    runs = [_compressed(QUOTA, path, size, **_cpu(path, size)) for size in SIZES]
    profile = fit_profile(records + runs, QUOTA)
    for size in SIZES:
        assert profile["kernels"]["int8"]["in_run"][str(size)] == pytest.approx(IN_RUN, rel=0.01)
    for r in runs:   # the priced kernel seconds: the codec's CPU over the share, never the wall seconds
        assert kernel_seconds(r) == pytest.approx(r["kernel_cpu_s"] / SHARE)
        assert kernel_seconds(r) < (r["compress_s"] + r["decompress_s"]) / 2


def test_the_call_term_is_the_calling_threads_cpu_beyond_its_kernels(tmp_path):
    records, path = _benchmark(tmp_path, QUOTA)
    runs = [_compressed(QUOTA, path, size, **_cpu(path, size)) for size in SIZES]
    call = fit_profile(records + runs, QUOTA)["runtime"]["calls"]["allreduce:two_phase"]
    assert call["call_us"] == pytest.approx(CALL_US, rel=0.02)
    assert call["ns_per_byte"] == pytest.approx(NS_PER_BYTE, rel=0.02)
    assert call["records"] == len(SIZES)


def test_a_quota_run_without_the_codecs_cpu_gives_no_in_run_factor(tmp_path):
    """Its wall seconds would price the machine's load as the kernels' cost: the benchmark's CPU
    per byte holds (no factor); the call term takes the kernels as priced from the thread's CPU."""
    records, path = _benchmark(tmp_path, QUOTA)
    runs = []
    for size in SIZES:
        cpu = _cpu(path, size)
        cpu["thread_cpu_s"] -= cpu.pop("kernel_cpu_s") * (1 - 1 / IN_RUN)   # the codec at the benchmark's CPU
        runs.append(_compressed(QUOTA, path, size, **cpu))
    profile = fit_profile(records + runs, QUOTA)
    assert "in_run" not in profile["kernels"]["int8"] and profile["fits"]["in_run"] == {}
    assert all(kernel_seconds(r) is None for r in runs)
    call = profile["runtime"]["calls"]["allreduce:two_phase"]
    assert call["call_us"] == pytest.approx(CALL_US, rel=0.02)
    assert call["ns_per_byte"] == pytest.approx(NS_PER_BYTE, rel=0.02)


def test_a_quota_run_without_any_cpu_fits_no_call_term(tmp_path):
    records, path = _benchmark(tmp_path, QUOTA)
    runs = [_compressed(QUOTA, path, size) for size in SIZES]
    profile = fit_profile(records + runs, QUOTA)
    assert "calls" not in profile.get("runtime", {})
    assert call_seconds(runs[0], None) is None


def test_without_a_quota_the_wall_seconds_still_count(tmp_path):
    """A host that time-shares the cores (no cpu_share) or a real cluster has no quota to price
    CPU at: the wall seconds are the kernels' and the call's cost, as before."""
    records, path = _benchmark(tmp_path, PLAIN)
    runs = [_compressed(PLAIN, path, size) for size in SIZES]
    profile = fit_profile(records + runs, PLAIN)
    for size in SIZES:
        assert profile["kernels"]["int8"]["in_run"][str(size)] == pytest.approx(LOAD, rel=0.01)
    assert kernel_seconds(runs[0]) == runs[0]["compress_s"] + runs[0]["decompress_s"]


class _Stats:
    compress_s, decompress_s = 0.5, 0.5


def test_the_worker_records_the_busiest_ranks_cpu_and_the_codecs_where_counted():
    class Counted(_Stats):
        compress_cpu_s, decompress_cpu_s = 0.1, 0.2

    assert kernel_cpu(Counted()) == pytest.approx(0.3)
    assert math.isnan(kernel_cpu(_Stats()))   # a wire that does not count its codec's CPU
    # columns: wall, compress, decompress, bytes out, process CPU, thread CPU, codec CPU
    worst = np.array([[1.0, 0, 0, 0, 0.5, 0.2, 0.1], [2.0, 0, 0, 0, 0.6, 0.4, 0.3], [3.0, 0, 0, 0, 0.7, 0.9, 0.2]])
    assert cpu_fields(worst) == {"thread_cpu_s": pytest.approx(0.4), "kernel_cpu_s": pytest.approx(0.2)}
    worst[:, 6] = math.nan
    assert cpu_fields(worst) == {"thread_cpu_s": pytest.approx(0.4)}


class _Runner:
    """A runner that runs nothing and remembers what it was asked to time."""

    emulated, hosts = True, 4

    def __init__(self):
        self.configs = []

    def topology(self, hosts=None, bandwidth=None):
        return QUOTA

    def set_bandwidth(self, bits_per_s):
        pass

    def restore(self):
        pass

    def kernels(self, sizes, specs, iters):
        return []

    def compute(self, model, mbs, cps=(1,)):
        return []

    def collectives(self, config, hosts=None):
        self.configs.append(config)
        return []


def test_a_quick_calibration_times_the_compressed_runs_too():
    """Priced from CPU, the in-run factor and call term no longer need a quiet machine: --quick
    measures them (the compressed all-reduces of IN_RUN) as the full calibration does."""
    from realrun.calibrate import IN_RUN, IN_RUN_SIZES, measure

    runner = _Runner()
    measure(runner, quick=True, iters=1)
    compressed = {(c.compressor, c.algorithm, c.size_bytes) for cfg in runner.configs for c in cfg.cases
                  if c.compressor != "none"}
    assert compressed == {(spec, alg, size) for spec, alg in IN_RUN for size in IN_RUN_SIZES}


@pytest.mark.distributed
def test_a_benchmark_records_the_calling_threads_cpu():
    """Two local ranks: every record has the calling thread's CPU (codecs and the runtime's
    Python), at most the process's (gloo's threads too); the codec's CPU where the wire counts it,
    never more than that thread's."""
    pytest.importorskip("torch", reason="torch is not installed (the real extra)")
    from realrun.bench import BenchConfig
    from realrun.bench.launch import run_collectives

    config = BenchConfig.grid(op="allreduce", sizes=[2**18], compressors=["none", "int8"],
                              algorithms=["two_phase"], iters=2, warmup=1, world=2)
    records = run_collectives(config)
    assert len(records) == 2
    for r in records:
        assert 0 < r["thread_cpu_s"] <= r["cpu_s"] * 1.05   # the busiest rank's of each, medians
        if "kernel_cpu_s" in r:
            assert 0 <= r["kernel_cpu_s"] <= r["thread_cpu_s"] * 1.05
