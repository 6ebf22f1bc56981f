"""realrun's compute benchmark: the shapes perfmodel prices, timed with ranks sharing the
cores, fit into a profile the model loads."""
import json

import pytest

pytest.importorskip("torch", reason="torch is not installed (the real extra)")

from perfmodel.calibration import load_calibration  # noqa: E402
from perfmodel.catalogs import device  # noqa: E402
from perfmodel.compute import layer_gemms  # noqa: E402
from perfmodel.fit import fit_profile  # noqa: E402
from perfmodel.plan import make_plan  # noqa: E402
from perfmodel.workload import load_model  # noqa: E402
from realrun.bench.compute import cases, run_compute  # noqa: E402


def test_cases_are_the_shapes_perfmodel_prices():
    arch = load_model("gpt-tiny")
    got = cases("gpt-tiny", 4, tps=(1, 2), mbs=4)
    gemms = {(c["m"], c["n"], c["k"]) for c in got if c["op"] == "gemm"}
    for tp in (1, 2):
        plan = make_plan(arch, 4, tp=tp, mbs=4, compute_dtype="fp32")
        assert {tuple(int(x) for x in s) for s in layer_gemms(arch, plan)} <= gemms
    assert [c["op"] for c in got].count("attention") == 2 and [c["op"] for c in got].count("elementwise") == 2
    assert len(gemms) == len([c for c in got if c["op"] == "gemm"])   # each shape once


@pytest.mark.distributed
def test_two_ranks_time_a_small_model_and_the_profile_loads(tmp_path):
    records = run_compute("gpt-tiny", world=2, ranks=2, tps=(1,), mbs=1, seq=16)
    assert records and all(r["time_s"] > 0 and r["concurrent"] == 2 for r in records)
    # the CPU each helper got in its wall time: at most its wall time (one thread each)
    assert all(0 < r["cpu_s"] <= 1.05 * r["time_s"] for r in records)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(fit_profile(records, "emulated:hosts=2,bandwidth=1gbit")))
    cpu = load_calibration(str(path)).device(device("host-cpu"))
    assert cpu.stream_Bps > 0 and len(cpu.gemm_efficiency) >= 2
