"""``realrun validate --training --policies presets`` (every preset on its plan, none beside it; refused
pairs skipped with their reason; the Presets table) and ``realrun bench --compressors PRESET`` (a preset's
specs on the axes an op carries). Synthetic runs only: no cluster."""
import json

import pytest

pytest.importorskip("torch", reason="torch is not installed (the real extra)")

from perfmodel.calibration.measurements import make_record, validate_record  # noqa: E402
from perfmodel.compression.policy import PRESETS  # noqa: E402
from perfmodel.plan.degrees import Degrees  # noqa: E402
from realrun.bench.presets import OP_AXES, annotate, expand, preset_specs  # noqa: E402
from realrun.cli import main  # noqa: E402
from realrun.report import summary_json  # noqa: E402
from realrun.validate_training import (PRESETS_WORD, StoredCluster, TrainCase, cases_for, preset_of,  # noqa: E402
                                       preset_policies, summary_lines, validate_training)
from topologies import InputError  # noqa: E402


class FakeTrainer:
    """Emulated hosts answering each run of a policy with its next scripted (step s, dp s, losses)."""

    emulated, hosts = True, 4

    def __init__(self, runs: dict):
        self.runs = {k: list(v) for k, v in runs.items()}

    def topology(self, hosts=None, bandwidth=None):
        return StoredCluster().topology(hosts or self.hosts, bandwidth)

    def set_bandwidth(self, bits_per_s):
        pass

    def restore(self):
        pass

    def train(self, cfg):
        step_s, dp_s, losses = self.runs[cfg.policy].pop(0)
        base = dict(forward_s=0.05, backward_s=0.1, compute_s=0.15, tp_comm_s=0.0, pp_comm_s=0.0,
                    dp_comm_exposed_s=dp_s, compression_s=0.0, optimizer_s=0.01, tp_kernel_s=0.0, pp_kernel_s=0.0,
                    dp_kernel_s=0.0, zero_kernel_s=0.0, dp_rel_error=None, tp_rel_error=None, pp_rel_error=None)
        return [dict(base, step=i, step_s=step_s, loss=loss, val_loss=loss if i == len(losses) - 1 else None)
                for i, loss in enumerate(losses)]


def _homes(cases):
    return {c.policy: c.name for c in cases if c.policy != "none"}


def test_presets_expand_to_every_preset_each_on_the_plan_it_needs():
    cases, skipped = cases_for(4, quick=True, policies=[PRESETS_WORD])
    assert skipped == []
    homes = _homes(cases)
    assert sorted(preset_of(p) for p in homes) == sorted(PRESETS)
    assert homes["sdp4bit"] == "dp4xzero1"          # its reference's distributed optimizer: ZeRO-1
    for recipe in ("powersgd", "loco", "onebit-adam", "zero-one-adam,var_update_scaler=1"):
        assert homes[recipe] == "dp4"               # DDP recipes: ZeRO-0
    assert homes["deepseek"] == "ep2xdp4" and homes["zeropp"] == "dp4xzero1"
    # hybrid's tp and pp specs start at 1 MiB (more than gpt-tiny's activations): its every-size axes,
    # dp and zero, pick the plan, not tp2xpp2's four axes
    assert homes["hybrid"] == homes["mzhybrid"] == homes["zhybrid"] == "dp4xzero1"
    # none beside every plan a preset runs on, at the one quick bandwidth
    assert {c.name for c in cases if c.policy == "none"} == set(homes.values())
    assert {c.bandwidth for c in cases} == {10**8}
    assert len(cases_for(4, quick=False, policies=[PRESETS_WORD])[0]) == 2 * len(cases)
    # the 0/1 Adam case times its 1-bit steps: most steady steps of a 7-step run are compressed
    from perfmodel.compression.policy import parse_policy
    modes = parse_policy("zero-one-adam,var_update_scaler=1").recipe.modes(7)[2:]
    assert modes.count("gradient") > len(modes) / 2


def test_presets_on_named_plans_skip_what_realrun_train_refuses_with_its_reason():
    cases, skipped = cases_for(4, quick=True, plan_names=["dp4xzero1"], policies=[PRESETS_WORD])
    assert {c.name for c in cases} == {"dp4xzero1"} and "sdp4bit" in _homes(cases)
    why = {s["policy"]: s["reason"] for s in skipped}
    assert set(why) == {"powersgd", "onebit-adam", "zero-one-adam,var_update_scaler=1"}
    assert "ZeRO" in why["onebit-adam"] and all(s["plan"] == "dp4xzero1" for s in skipped)
    _, skipped = cases_for(4, quick=True, plan_names=["dp4"], policies=[PRESETS_WORD, "naive:int8"])
    assert {s["policy"] for s in skipped} == {"sdp4bit"}
    with pytest.raises(InputError, match="plans"):
        cases_for(4, quick=True, plan_names=["dp9"], policies=[PRESETS_WORD])


def test_a_preset_no_plan_carries_is_skipped_not_an_error():
    cases, skipped = cases_for(3, quick=True, policies=[PRESETS_WORD])   # 3 hosts: no expert-parallel plan
    assert "deepseek" not in _homes(cases)
    assert skipped == [{"plan": "-", "policy": "deepseek", "reason": skipped[0]["reason"]}]
    assert "carries an axis it compresses" in skipped[0]["reason"]
    assert preset_policies()[list(PRESETS).index("zero-one-adam")] == "zero-one-adam,var_update_scaler=1"
    assert preset_of("none") is None and preset_of("dp=int8") is None and preset_of("loco") == "loco"


RUNS = {"none": [(0.50, 0.30, [5.0, 4.0, 3.5, 3.2])] * 3,
        "loco": [(0.40, 0.20, [5.0, 4.0, 3.5, 3.2]), (0.45, 0.22, [5.0, 4.0, 3.5, 3.2]),
                 (0.42, 0.21, [5.0, 4.0, 3.5, 3.2])],
        "powersgd": [(0.49, 0.30, [5.0, 4.0, 3.5, 3.2])] * 3}


def test_the_report_gives_each_preset_its_speedups_sign_and_mape(tmp_path):
    dp4 = Degrees(dp=4)
    cases = [TrainCase(dp4, 0, p, 10**8) for p in ("none", "loco", "powersgd")]
    cases.append(TrainCase(dp4, 1, "onebit-adam", 10**8))      # refused (ZeRO-1): skipped, not an error
    summary = validate_training(FakeTrainer(RUNS), None, str(tmp_path), cases=cases, steps=4, repeats=3)
    presets = {p["preset"]: p for p in summary["presets"]}
    assert set(presets) == {"loco", "powersgd"}
    loco = presets["loco"]
    assert loco["measured_speedup"] == pytest.approx(0.50 / 0.42)
    assert (loco["measured_speedup_min"], loco["measured_speedup_max"]) == pytest.approx((0.50 / 0.45, 0.50 / 0.40))
    assert loco["sign_right"] is ((loco["predicted_speedup"] - 1) > 0)
    assert loco["preset_mape"] == pytest.approx(abs(loco["error"]))
    assert presets["powersgd"]["sign_right"] is None         # measured 1.02: within 5%, not judged
    assert [s["policy"] for s in summary["skipped"]] == ["onebit-adam"]
    report = (tmp_path / "report.md").read_text()
    assert "## Presets" in report and "| loco | `loco` | tp1-pp1-dp4 | 100 |" in report
    assert "## Skipped" in report and "1bit-Adam is not compatible with ZeRO" in report
    lines = summary_lines(summary)
    assert any(line.startswith("presets: step MAPE") for line in lines)
    assert any(line.startswith("skipped: onebit-adam on dp4xzero1") for line in lines)
    got = json.loads(summary_json(summary))
    assert got["presets"][0]["preset"] == "loco" and got["skipped"][0]["plan"] == "dp4xzero1"


def test_nothing_left_to_run_is_one_line(tmp_path):
    with pytest.raises(InputError, match="skipped"):
        validate_training(FakeTrainer(RUNS), None, str(tmp_path / "out"),
                          cases=[TrainCase(Degrees(dp=4), 1, "onebit-adam", 10**8)], steps=4)
    assert not (tmp_path / "out").exists()


def test_the_cli_takes_presets_as_a_policy_list(capsys):
    with pytest.raises(InputError, match="only with --training"):
        main(["validate", "--out", "x", "--policies", "presets"])
    with pytest.raises(InputError, match="policy"):
        main(["validate", "--training", "--out", "x", "--policies", "presets;nosuch"])


def test_a_bench_preset_is_the_specs_it_applies_on_the_ops_axes():
    assert preset_specs("loco", "allreduce") == [("dp", "ef(int4,beta=0.8,state=int8,reset=1024)")]
    assert preset_specs("loco", "allgather") == []
    assert preset_specs("sdp4bit", "reduce_scatter") == [("dp", "tlq(intra=8,inter=4,block=128,hadamard=32)")]
    assert preset_specs("sdp4bit", "allgather") == [("zero", "qwd(bits=4,block=2048)")]
    assert preset_specs("deepseek", "alltoall") == [("ep", "fp8")]         # its combine stays bf16: none
    assert [a for a, _ in preset_specs("hybrid", "allreduce")] == ["dp", "tp"]
    assert preset_specs("onebit-adam", "kernels") == [("dp", "ef(sign(block=2048))")]
    specs, origin = expand("allreduce", ["none", "loco", "int8", "onebit-adam", "zero-one-adam"])
    assert specs == ["none", "ef(int4,beta=0.8,state=int8,reset=1024)", "int8", "ef(sign(block=2048))"]
    assert origin["ef(sign(block=2048))"] == ("onebit-adam", "dp")       # the first preset that gave it
    with pytest.raises(InputError, match="deepseek") as err:
        expand("alltoall", ["loco"])
    assert err.value.field == "compressors"
    with pytest.raises(InputError, match="no axis"):
        expand("broadcast", ["sdp4bit"])
    assert set(OP_AXES) >= {"allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast"}


def test_preset_records_are_still_what_perfmodel_calibrate_reads():
    rec = make_record("collective", op="allreduce", compressor="ef(int4,beta=0.8,state=int8,reset=1024)",
                      algorithm="two_phase", world=4, backend="gloo", size_bytes=2**20, wire_bytes=2**18, time_s=0.01,
                      time_min_s=0.01, time_max_s=0.012, compress_s=0.001, decompress_s=0.001, max_rel_error=0.1,
                      iters=3, cpu_s=0.01, busbw_factor=1.5)
    _, origin = expand("allreduce", ["loco"])
    (out,) = annotate([rec], origin)
    assert (out["preset"], out["axis"]) == ("loco", "dp") and validate_record(out) == out
    assert annotate([dict(rec, compressor="int8")], origin)[0].get("preset") is None


@pytest.mark.distributed
def test_bench_runs_a_presets_specs_and_perfmodel_reads_the_records(cli, tmp_path):
    from perfmodel.calibration.measurements import read_records

    out = tmp_path / "r.jsonl"
    proc = cli("realrun", "bench", "reduce_scatter", "--world", "2", "--sizes", "64KiB", "--compressors",
               "none,sdp4bit,loco", "--iters", "1", "--json", str(out), check_rc=0)
    assert "# sdp4bit -> dp=tlq(intra=8,inter=4,block=128,hadamard=32) on reduce_scatter" in proc.stdout
    records = read_records(str(out))
    assert [(r["compressor"], r.get("preset"), r.get("axis")) for r in records] == [
        ("none", None, None), ("tlq(intra=8,inter=4,block=128,hadamard=32)", "sdp4bit", "dp"),
        ("ef(int4,beta=0.8,state=int8,reset=1024)", "loco", "dp")]
    assert all(r["wire_bytes"] < records[0]["wire_bytes"] / 2 for r in records[1:])
