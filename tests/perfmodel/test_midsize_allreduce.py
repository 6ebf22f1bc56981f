"""Mid-size all-reduce on Hopper (1-64 MiB), as NCCL's tuning model and its NVLS pipeline price it
(catalog/nccl_arch.toml, perfmodel/collectives/nvls.py), held against the published 8x H200
nccl-tests sweep (validation/published/allreduce_busbw_h200_8gpu.csv); A100 keeps its fit."""
import csv
from pathlib import Path

import pytest

from perfmodel.collectives import nvls
from perfmodel.collectives.predict import collective_time
from perfmodel.devices import NvlsPipeline, nvls_pipeline

SWEEP = Path(__file__).resolve().parents[2] / "validation" / "published" / "allreduce_busbw_h200_8gpu.csv"
MIB = 2**20
TOLERANCE = 0.15   # the target of issue 38: all-reduce on 8 H100/H200 within 15% from 1 MiB


def sweep_rows(min_bytes: int = MIB) -> list[tuple[int, float]]:
    with open(SWEEP, newline="") as f:
        rows = [(int(r["message_size_bytes"]), float(r["busbw_GBps"])) for r in csv.DictReader(f)]
    return [(size, busbw) for size, busbw in rows if size >= min_bytes]


@pytest.mark.parametrize("cluster", ["dgx-h100", "dgx-h200"])
def test_allreduce_on_8_hopper_gpus_within_15_percent_from_1_mib(cluster):
    """H100 and H200 share NVLink 4, NVSwitch and NCCL's Hopper constants: the same prediction."""
    for size, measured in sweep_rows():
        predicted = collective_time("allreduce", size, cluster=cluster, nodes=1).busbw_GBps
        assert predicted == pytest.approx(measured, rel=TOLERANCE), (cluster, size)


def test_mid_sizes_are_not_priced_at_nvls_full_bandwidth():
    """The regression issue 38 reported: 2-64 MiB came out 20-47% optimistic when NVLS got NCCL's
    tuning bandwidth at every size; its pipeline keeps 8 MiB well under half the large-size busbw."""
    big = collective_time("allreduce", 8 * 2**30, cluster="dgx-h200", nodes=1, algorithm="nvls").busbw_GBps
    mid = collective_time("allreduce", 8 * MIB, cluster="dgx-h200", nodes=1, algorithm="nvls").busbw_GBps
    assert mid < 0.45 * big
    busbw = [collective_time("allreduce", size, cluster="dgx-h200", nodes=1).busbw_GBps for size, _ in sweep_rows()]
    assert busbw == sorted(busbw)


@pytest.mark.parametrize("size, chunk_kib", [(2 * MIB, 16), (4 * MIB, 16), (8 * MIB, 32), (32 * MIB, 32),
                                             (64 * MIB, 64), (512 * MIB, 64), (2**30, 128), (8 * 2**30, 128)])
def test_nvls_chunks_follow_nccls_schedule(size, chunk_kib):
    """src/enqueue.cc calcCollChunking on 16 channels x 8 ranks: 64 KiB below 1 GiB, 32 KiB below
    64 MiB, 16 KiB below 8 MiB."""
    pipe = nvls_pipeline("hopper")
    assert (pipe.channels, pipe.max_chunk_bytes) == (16, 128 * 1024)
    assert nvls.chunk_bytes(size, pipe, heads=8) == chunk_kib * 1024
    loops, loop_bytes = nvls.loops(size, pipe, heads=8)
    assert loop_bytes == 16 * 8 * chunk_kib * 1024 and loops == max(1, -(-size // loop_bytes))


def test_nvls_chunk_schedule_scales_with_concurrent_operations():
    """Fewer heads (ranks) or channels shrink the chunk at proportionally smaller sizes."""
    pipe = NvlsPipeline(channels=24, max_chunk_bytes=128 * 1024, fill_loops=1)
    assert nvls.chunk_bytes(8 * MIB, pipe, heads=8) == 16 * 1024      # below 2 x 192 x 32 KiB = 12 MiB
    assert nvls.chunk_bytes(8 * MIB, pipe, heads=2) == 32 * 1024      # 2 x 48 x 32 KiB = 3 MiB


def test_hopper_ring_protocol_goes_ll_ll128_simple_with_size():
    """NCCL's tuning on Hopper: LL below ~3.6 MB, LL128 to ~36 MB, Simple beyond."""
    def proto(size):
        return collective_time("allreduce", size, cluster="dgx-h100", nodes=1, algorithm="ring").protocol
    assert [proto(s) for s in (64 * 1024, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 2**30)] == \
        ["LL", "LL", "LL128", "LL128", "Simple", "Simple"]


def test_small_allreduce_takes_nccls_hopper_latency():
    """6.6 us + 14 steps x 0.6 us (tuning.cc baseLat and hwLat, Ring LL); the H200 sweep's node
    measures 14.9 us for 8 B (nccl-tests -I 1)."""
    r = collective_time("allreduce", 8, cluster="dgx-h200", nodes=1)
    assert (r.algorithm, r.protocol) == ("ring", "LL")
    assert r.time_s == pytest.approx(15.0e-6, rel=1e-3)


@pytest.mark.parametrize("gpus, algorithm", [(4, "ring"), (5, "nvls"), (8, "nvls")])
def test_auto_chooses_as_nccl_did_on_part_of_an_h200_node(gpus, algorithm):
    """At 8 GiB NCCL ran Ring on 4 of the node's GPUs and NVLS from 5 (collectives_h200_b200_8gpu.csv)."""
    assert collective_time("allreduce", 8 * 2**30, cluster="dgx-h200", gpus=gpus).algorithm == algorithm


@pytest.mark.parametrize("size, busbw", [(MIB, 33.02), (8 * MIB, 92.50), (64 * MIB, 165.56), (2**30, 224.95)])
def test_a100_all_reduce_is_unchanged(size, busbw):
    """The A100 fit (protocols.toml [nvlink]) as it predicted before the Hopper terms came in."""
    assert collective_time("allreduce", size, cluster="dgx-a100", nodes=1).busbw_GBps == pytest.approx(busbw, rel=1e-3)
