"""realrun's compute benchmark: the shapes perfmodel prices, timed with ranks sharing the
cores, fit into a profile the model loads."""
import json

import pytest

pytest.importorskip("torch", reason="torch is not installed (the real extra)")

from perfmodel.calibration.profile import load_calibration  # noqa: E402
from perfmodel.devices import device  # noqa: E402
from perfmodel.step.compute import layer_gemms  # noqa: E402
from perfmodel.calibration.fit import fit_profile  # noqa: E402
from perfmodel.plan.parallel import make_plan  # noqa: E402
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


def test_cases_cover_validates_cp_and_ep_plans():
    """Calibration's default: both of validate's models, the ring's blocks (as GEMMs of one block,
    perfmodel's pricing) and the experts' rows at ep 2 (capacity-padded, perfmodel's moe_gemms)."""
    from perfmodel.step.compute import moe_gemms

    got = cases("gpt-tiny,gpt-tiny-moe", 4, tps=(1, 2), mbs=4, cps=(1, 2))
    blocks = [c for c in got if c["op"] == "attention" and c["blocks"]]
    assert {(c["m"], c["n"], c["k"]) for c in blocks} == {(64, 64, 32)}
    assert all(c["flops"] == 3 * 2 * c["heads"] * 2.0 * 64 * 64 * 32 for c in blocks)
    moe = load_model("gpt-tiny-moe")
    plan = make_plan(moe, 4, ep=2, mbs=4, compute_dtype="fp32")
    gemms = {(c["m"], c["n"], c["k"]) for c in got if c["op"] == "gemm"}
    assert {(int(m), int(n), int(k)) for m, n, k, _ in moe_gemms(moe, plan, moe.expert_load)} <= gemms
    assert (640, 256, 128) in gemms   # an expert: capacity 320 rows from each of the 2 ep ranks


def test_cases_on_two_ranks_leave_out_layouts_that_do_not_fit():
    """Two ranks hold tp 2 or cp 2, not both: calibrate's default grid on a two-rank run (a
    torchrun of two) times the layouts that fit and plans none that cannot."""
    got = cases("gpt-tiny,gpt-tiny-moe", 2, tps=(1, 2), mbs=4, cps=(1, 2))
    blocks = [c for c in got if c["op"] == "attention" and c["blocks"]]
    assert blocks and {(c["m"], c["n"]) for c in blocks} == {(64, 64)}   # cp 2 at tp 1
    assert {c["heads"] for c in blocks} == {4 * 4}   # all heads: tp 1 only (tp 2 would halve them)
    assert (640, 256, 128) in {(c["m"], c["n"], c["k"]) for c in got if c["op"] == "gemm"}   # ep 2 fits


def test_a_ring_block_case_runs_its_six_products():
    from realrun.bench.compute import _callable

    case = next(c for c in cases("gpt-tiny", 4, tps=(1,), mbs=1, seq=16, cps=(2,)) if c["op"] == "attention")
    shapes = [tuple(x.shape) for x in _callable(case)()]
    assert case["blocks"] and len(shapes) == 6 and shapes[0] == (1, 4, 8, 8) and shapes[1] == (1, 4, 8, 32)


TINY = """hidden_size = 128
num_layers = 2
num_heads = 4
num_kv_heads = {kv}
ffn_hidden_size = 512
vocab_size = 256
seq_len = {seq}
activation = "gelu"
norm = "layernorm"
tied_embeddings = true
"""


def _tiny(tmp_path, name: str, kv: int = 4, seq: int = 128) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(TINY.format(kv=kv, seq=seq))
    return str(path)


def test_cases_leave_out_only_the_layouts_a_model_refuses(tmp_path):
    """An odd sequence still has its cp 1 cases (only cp's chunks need 2*cp of it); a model with
    one KV head has no tp 2 (its plan is refused) and keeps tp 1; a grid with no layout left is
    one InputError before anything runs."""
    from topologies.errors import InputError

    odd = cases("gpt-tiny", 2, tps=(1,), mbs=1, seq=127, cps=(1, 2))
    assert odd and not [c for c in odd if c.get("blocks")] and "scores" not in {c["op"] for c in odd}
    one_kv = cases(_tiny(tmp_path, "mqa", kv=1), 4, tps=(1, 2), mbs=1)
    assert {c["heads"] for c in one_kv if c["op"] == "attention"} == {4}   # tp 1's heads only
    with pytest.raises(InputError) as err:
        cases("gpt-tiny", 3, tps=(2,))
    assert err.value.field == "tp"


def test_cases_keep_kernels_of_one_shape_that_differ(tmp_path):
    """gpt-tiny's cp 2 ring block and a 64-token model's whole-sequence attention have one shape
    (64 x 64 x 32) and are different kernels: both are timed."""
    got = cases("gpt-tiny," + _tiny(tmp_path, "short", seq=64), 4, tps=(1,), mbs=4, cps=(1, 2))
    at64 = [c for c in got if c["op"] == "attention" and (c["m"], c["n"]) == (64, 64)]
    assert sorted(c["blocks"] for c in at64) == [False, True]


def test_a_ring_block_as_realrun_runs_it_counts_its_seven_products():
    """The ``scores`` case is realrun's ring attention on one block, forward and backward (the
    backward recomputes the scores); its FLOPs are the seven products the fit subtracts."""
    from realrun.bench.compute import _callable

    case = next(c for c in cases("gpt-tiny", 4, tps=(1,), mbs=1, seq=16, cps=(2,)) if c["op"] == "scores")
    _callable(case)()
    assert case["flops"] == 7 * case["heads"] * 2.0 * 8 * 8 * 32 and case["scores"] == case["heads"] * 8 * 8


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


@pytest.mark.parametrize("norm,activation,kv,cp", [("layernorm", "gelu", 4, 1), ("rmsnorm", "swiglu", 2, 1),
                                                   ("rmsnorm", "swiglu", 2, 2)])
def test_a_layers_memory_bound_work_runs_as_realruns_block_does(tmp_path, norm, activation, kv, cp):
    """The ``elementwise`` case is a Block's non-GEMM work at the plan's shape (RoPE, the layout
    copies, grouped-query repeats outside cp, SwiGLU's halves): it runs forward and backward at
    tp 2's heads and KV heads, and its bytes are perfmodel's for the layer."""
    from perfmodel.step.compute import activation_bytes
    from realrun.bench.compute import _callable

    text = TINY.format(kv=kv, seq=64).replace('"gelu"', f'"{activation}"').replace('"layernorm"', f'"{norm}"')
    path = tmp_path / "m.toml"
    path.write_text(text)
    got = [c for c in cases(str(path), 4, tps=(2,), mbs=2, cps=(cp,)) if c["op"] == "elementwise"]
    assert len(got) == 1
    case, arch = got[0], load_model(str(path))
    plan = make_plan(arch, 4, tp=2, cp=cp, mbs=2, compute_dtype="fp32")
    assert (case["m"], case["heads"], case["kv_heads"]) == (2 * 64 // cp, 2 * 2, 2 * kv // 2)
    assert case["bytes"] == 6 * activation_bytes(arch, plan)
    _callable(case)()   # runs at these shapes: the heads split, RoPE's halves and SwiGLU's chunks


def test_memory_bound_work_of_one_shape_is_timed_per_norm(tmp_path):
    """gpt-tiny and a model of its shapes with rmsnorm run different memory-bound kernels: both
    are timed (as attention's ring block and whole-sequence kernels of one shape are)."""
    rms = tmp_path / "rms.toml"
    rms.write_text(TINY.format(kv=4, seq=128).replace('"layernorm"', '"rmsnorm"'))
    got = [c for c in cases(f"gpt-tiny,{rms}", 4, tps=(1,), mbs=4) if c["op"] == "elementwise"]
    assert sorted(c["norm"] for c in got) == ["layernorm", "rmsnorm"]
