"""nccl-tests beyond all_reduce_perf: reduce_scatter_perf, alltoall_perf, all_gather_perf and sendrecv_perf read
and fitted into the profile (the last two priced uncompressed as NCCL runs them: perfmodel.collectives.runtime
PLAIN_ONLY); broadcast_perf read and refused in one line.

The files are written here in nccl-tests v2.19.6's stdout format (src/util.cu; the size column as common.cu
writes it, max(sendBytes, expectedBytes); redop and root as each test's RunTest passes them, src/*.cu): an
alpha-beta line with a 1% wobble, not a measurement."""
from __future__ import annotations

import pytest

from perfmodel.calibration import userfiles as u
from perfmodel.calibration.fit import fit_profile
from topologies.errors import InputError

RANKS = 8
BUSBW_GBPS = 180.0        # the line's bus bandwidth at large sizes
ALPHA_US = 12.0
# test -> (redop it prints, busbw factor: src/<test>.cu GetBw)
TESTS = {"reduce_scatter_perf": ("sum", (RANKS - 1) / RANKS), "alltoall_perf": ("none", (RANKS - 1) / RANKS),
         "all_gather_perf": ("none", (RANKS - 1) / RANKS), "sendrecv_perf": ("sum", 1.0)}


def nccl_tests_stdout(test: str) -> str:
    redop, factor = TESTS[test]
    lines = ["# nccl-tests version 2.19.6 nccl-headers=22807 nccl-library=22807",
             f"# Collective test starting: {test}",
             "# nThread 1 nGpus 8 minBytes 1024 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0 unalign: 0", "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid  41872 on    node001 device {r:2d} [0000:{18 + r:02x}:00] NVIDIA H100 80GB "
              "HBM3" for r in range(RANKS)]
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   "
              "algbw   busbw  #wrong", "#        (B)    (elements)                               (us)  (GB/s)  "
              "(GB/s)             (us)  (GB/s)  (GB/s)"]
    for k in range(11):
        size = 1024 * 4 ** k
        t = (ALPHA_US + size * factor / (BUSBW_GBPS * 1e3)) * (1 + 0.01 * (-1) ** k)
        algbw = size / t / 1e3
        half = f"{t:8.2f} {algbw:7.2f} {algbw * factor:7.2f}       0"
        lines.append(f"{size:12d}  {size // 4:12d}     float  {redop:>6}      -1 {half} {half}")
    lines += ["# Out of bounds values : 0 OK", "#", f"# Collective test concluded: {test}", "#"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("test, op", [("reduce_scatter_perf", "reduce_scatter"), ("alltoall_perf", "alltoall"),
                                      ("all_gather_perf", "allgather"), ("sendrecv_perf", "sendrecv")])
def test_read_and_fitted(tmp_path, test, op):
    path = tmp_path / f"{test}.txt"
    path.write_text(nccl_tests_stdout(test))
    user = u.read_nccl_tests(str(path), cluster="dgx-h100")
    assert user.about["op"] == op and user.about["world"] == RANKS and len(user.records) == 11
    assert user.records[-1]["size_bytes"] == 1024 * 4 ** 10 and user.records[-1]["busbw_factor"] == TESTS[test][1]
    profile = fit_profile(user.records, "dgx-h100", sources=[str(path)])
    assert op in profile["primitives"]["nvlink"]             # its own primitive, fitted
    errors = u.tier_errors(user.records, "dgx-h100", profile)
    checked = u.busbw_check(user, "dgx-h100", profile, errors)
    assert len(checked) == 11 and all(r["within"] for r in checked)
    # the largest row's busbw as nccl-tests computes it (GetBw: size / time x factor) is the profile's
    time_s = user.records[-1]["time_s"]
    assert checked[-1]["fitted_busbw_GBps"] == pytest.approx(1024 * 4 ** 10 * TESTS[test][1] / time_s / 1e9,
                                                             rel=0.03)


def test_broadcast_is_read_and_refused_in_one_line(tmp_path):
    path = tmp_path / "broadcast_perf.txt"
    path.write_text(nccl_tests_stdout("reduce_scatter_perf").replace("reduce_scatter_perf", "broadcast_perf"))
    with pytest.raises(InputError) as err:
        u.read_nccl_tests(str(path), cluster="dgx-h100")
    assert err.value.value == "broadcast" and "\n" not in str(err.value)
    assert "allgather or sendrecv" in err.value.allowed


def test_a_file_faster_than_the_cluster_is_said(tmp_path):
    """180 GB/s of all-to-all busbw across two DGX H100s (one 400 Gb/s NIC a GPU: at most 50 GB/s a rank
    leaves the node) is more than the cluster's links give: the fit's bandwidth fraction sits at 1."""
    text = nccl_tests_stdout("alltoall_perf").replace("nGpus 8", "nGpus 16")
    ranks = [f"#  Rank {r:2d} Group  0 Pid  41872 on    node00{1 + r // 8} device {r % 8:2d} [0000:18:00] NVIDIA "
             "H100 80GB HBM3" for r in range(16)]
    lines = [line for line in text.splitlines() if not line.startswith("#  Rank")]
    path = tmp_path / "alltoall_perf.txt"
    path.write_text("\n".join(lines[:5] + ranks + lines[5:]) + "\n")
    profile, users, _ = u.calibrate([], "dgx-h100", [f"nccl-tests:{path}"])
    assert any(line.startswith("net alltoall: bw_fraction at its bound 1.0") for line in users[0].missing)
    fine = tmp_path / "reduce_scatter_perf.txt"
    fine.write_text(nccl_tests_stdout("reduce_scatter_perf"))
    _, users, _ = u.calibrate([], "dgx-h100", [f"nccl-tests:{fine}"])
    assert not any("bound" in line for line in users[0].missing)
