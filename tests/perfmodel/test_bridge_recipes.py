"""The Megatron-Bridge recipes' MoE settings (validation/published/megatron_bridge_recipes.csv) and how the
table's rows take them (perfmodel.calibration.bridge: load_recipes, recipe, recipe_plan)."""
from __future__ import annotations

import csv

import pytest

from perfmodel.calibration import bridge
from perfmodel.calibration.published import PUBLISHED_DIR, row_plan
from topologies.errors import InputError

with open(PUBLISHED_DIR / "megatron_bridge_training_throughput.csv", newline="") as _table:
    RAW = list(csv.DictReader(_table))
with open(bridge.RECIPES, newline="") as _recipes:
    LINES = list(csv.DictReader(_recipes))
HEADER = list(LINES[0])


def _mapped(container: str, model: str, system: str, precision: str | None = None) -> list[dict]:
    """The table's rows (and alternatives) of one container, model and system as bridge.py maps them."""
    raw = [r for r in RAW if (r["nemo_container"], r["model"], r["system"]) == (container, model, system)
           and (precision is None or r["precision"] == precision)]
    assert raw, (container, model, system, precision)
    return bridge.bridge_rows(raw)


def _write(tmp_path, lines: list[dict]):
    path = tmp_path / "recipes.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, HEADER, lineterminator="\n")
        writer.writeheader()
        writer.writerows(lines)
    return path


def test_the_file_has_the_columns_and_every_line_reads():
    assert tuple(HEADER) == bridge.RECIPE_COLUMNS
    loaded = bridge.load_recipes()
    assert len(loaded) == len(LINES) >= 130
    assert all(line["source"].startswith("v0.") for line in LINES)


def test_every_predicted_moe_row_of_the_table_has_its_recipe():
    """DeepSeek-V3, Qwen3, GPT-OSS and Kimi-K2 (DeepSeek-V4 is not predicted): a line for every table row and
    for each parenthesised MX alternative; Nemotron 3's rows up to 26.06.01 have theirs too (26.08's keep the
    defaults, as ASSUMPTIONS says)."""
    missing = []
    for i, raw in enumerate(RAW, 2):
        if raw["model"] not in bridge.MODELS or raw["model"] in bridge.DENSE:
            continue
        for row in bridge.bridge_row(raw, f"row {i}"):
            if not row["recipe"]:
                missing.append(row["model_label"])
    assert missing and all(m.startswith("Nemotron_3_") and "26.08" in m for m in missing)
    nemotron = [r for r in bridge.bridge_rows([r for r in RAW if r["model"].startswith("Nemotron_3_")
                                               and r["nemo_container"] != "26.08"])]
    assert len(nemotron) >= 40 and all(r["recipe"] and r["ep_kernels"] == "hybridep" for r in nemotron)


def test_a_row_takes_its_lines_settings():
    loaded = bridge.load_recipes()
    for i, raw in enumerate(RAW, 2):
        key = (raw["nemo_container"], raw["model"], raw["system"], raw["precision"] or bridge.UNSTATED_PRECISION)
        if key not in loaded:
            continue
        line = loaded[key]
        row = bridge.bridge_row(raw, f"row {i}")[0]
        assert row["ep_overlap"] == ("batch" if line["moe_a2a_overlap"] == "True" else "none"), key
        assert row["ep_kernels"] == bridge.DISPATCHERS.get(line["dispatcher"], "nccl"), key
        assert row["fp8_attention"] == line["fp8_dot_product_attention"], key
        assert row["recipe"] == f"{line['release']} {line['config']}", key
        named = line["recompute_granularity"] == "selective" and line["recompute_modules"] != "none"
        assert row["recompute"] == ("selective" if named else "none" if line["recompute_granularity"] in (
            "selective", "none") else line["recompute_granularity"]), key
        assert row["recompute_modules"] == (line["recompute_modules"].replace(";", ",") if named else ""), key


def test_qwen3_mxfp8_recipes_overlap_from_container_26_06():
    """v0.5.0's qwen3_workload_base_configs.py: Qwen3-30B-A3B and 235B-A22B MXFP8 on GB200/GB300 set
    moe_a2a_overlap, the hybridep flex dispatcher and fp8_dot_product_attention; v0.4.0's did not."""
    (new,) = _mapped("26.06", "Qwen3_30B_a3B", "DGX-GB200")
    assert (new["ep_overlap"], new["ep_kernels"], new["fp8_attention"]) == ("batch", "hybridep", "True")
    plan = row_plan(new)
    assert plan["ep_overlap"] == "batch" and plan["ep_kernels"] == "hybridep" and plan["fp8_attention"] is True
    (old,) = _mapped("26.04", "Qwen3_30B_a3B", "DGX-GB200")
    assert (old["ep_overlap"], old["fp8_attention"]) == ("none", "False")
    assert "ep_overlap" not in row_plan(old) and "fp8_attention" not in row_plan(old)
    for container in ("26.06", "26.06.01", "26.08"):
        for system in ("DGX-GB200", "DGX-GB300"):
            (row,) = _mapped(container, "Qwen3_235B_a22B", system)
            assert (row["ep_overlap"], row["ep_kernels"], row["fp8_attention"]) == ("batch", "hybridep", "True")


def test_hopper_recipes_overlap_with_their_dispatchers():
    """v0.3.0's Qwen3-30B H100 config: overlap with DeepEP; the 235B H100 configs overlap over NCCL's all-to-all
    (no backend); 25.09's DeepSeek-V3 H100 run (run_script.py A2A_1F1B) with DeepEP."""
    (row,) = _mapped("26.02", "Qwen3_30B_a3B", "DGX-H100")
    assert (row["ep_overlap"], row["ep_kernels"]) == ("batch", "deepep")
    (row,) = _mapped("26.04", "Qwen3_235B_a22B", "DGX-H100")
    assert (row["ep_overlap"], row["ep_kernels"]) == ("batch", "nccl")
    (row,) = _mapped("25.09", "DeepSeekV3 (dropless)", "DGX-H100")
    assert (row["ep_overlap"], row["ep_kernels"], row["fp8_attention"]) == ("batch", "deepep", "False")


def test_deepseek_full_iteration_recipes_and_the_alternative_rows():
    """DeepSeek-V3 MXFP8 from 26.06: overlap with hybridep, FP8 attention on GB300 only (v0.6.0's
    _enable_deepseek_full_iteration_mxfp8 default False, the GB300 recipe True); a 25.09 row's MX alternative
    takes the FP8-MX line."""
    (gb200,) = _mapped("26.08", "DeepSeekV3", "DGX-GB200")
    (gb300,) = _mapped("26.08", "DeepSeekV3", "DGX-GB300")
    assert (gb200["ep_overlap"], gb200["fp8_attention"], gb300["fp8_attention"]) == ("batch", "False", "True")
    main, alt = _mapped("25.09", "Qwen3_30B_a3B (tokendrop)", "DGX-GB200")
    assert alt["precision"] == "mxfp8" and alt["recipe"] == bridge.recipe_plan(
        bridge.recipe("25.09", "Qwen3_30B_a3B (tokendrop)", "DGX-GB200", "FP8-MX"))["recipe"] != ""
    assert (main["ep_overlap"], alt["ep_overlap"]) == ("none", "none")


def test_the_recipes_recompute_reaches_the_plan():
    """GPT-OSS 120B BF16 on GB200 (v0.4.0's config: recompute_modules layernorm, moe_act, selective through
    _set_recompute_overrides); DeepSeek-V3 MXFP8 on GB300 in 26.06 names none (recompute_modules [])."""
    (gpt,) = _mapped("26.04", "GPT OSS 120B", "DGX-GB200")
    plan = row_plan(gpt)
    assert (plan["recompute"], plan["recompute_modules"]) == ("selective", "layernorm,moe_act")
    dsv3 = _mapped("26.06", "DeepSeekV3", "DGX-GB300")
    assert all(r["recompute"] == "none" and "recompute_modules" not in row_plan(r) for r in dsv3)


def test_a_row_without_a_line_keeps_the_defaults():
    (row,) = _mapped("26.08", "DeepSeekV4 Flash", "DGX-GB200")
    assert (row["ep_overlap"], row["ep_kernels"], row["fp8_attention"], row["recipe"]) == ("none", "nccl", "False", "")
    assert bridge.recipe("26.04", "LLAMA3_70B", "DGX-H100", "FP8") is None
    assert bridge.recipe_plan(None) == dict(ep_overlap="none", ep_kernels="nccl", fp8_attention="False",
                                            recompute="none", recompute_modules="", recipe="")


@pytest.mark.parametrize("column, value, match", [
    ("moe_a2a_overlap", "yes", "moe_a2a_overlap"),
    ("dispatcher", "nvshmem", "dispatcher"),
    ("cuda_graph_impl", "everything", "cuda_graph_impl"),
    ("cuda_graph_scope", "attn;everything", "cuda_graph_scope"),
    ("recompute_modules", "mla_up_proj;brain", "recompute_modules"),
    ("recompute_granularity", "some", "recompute_granularity"),
    ("cpu_offloading_num_layers", "-1", "cpu_offloading_num_layers"),
    ("precision", "FP6", "precision"),
    ("model", "Qwen4", "model"),
    ("system", "DGX-A100", "system"),
    ("container", "24.01", "container"),
    ("plan_as_config", "", "plan_as_config"),
    ("source", "", "source"),
])
def test_a_bad_cell_is_refused_naming_its_line_and_column(tmp_path, column, value, match):
    lines = [dict(line) for line in LINES[:3]]
    lines[1][column] = value
    with pytest.raises(InputError, match=match) as err:
        bridge.load_recipes(_write(tmp_path, lines))
    assert f"recipes.csv:3.{column}" in str(err.value) and "\n" not in str(err.value)


def test_an_empty_setting_needs_a_note_and_a_key_appears_once(tmp_path):
    lines = [dict(line) for line in LINES[:2]]
    lines[0]["dispatcher"], lines[0]["notes"] = "", ""
    with pytest.raises(InputError, match=r"recipes.csv:2\.notes"):
        bridge.load_recipes(_write(tmp_path, lines))
    lines[0]["notes"] = "the flex backend is not named: cannot be determined"
    assert bridge.recipe_plan(bridge.load_recipes(_write(tmp_path, lines))[
        tuple(lines[0][k] for k in ("container", "model", "system", "precision"))])["ep_kernels"] == "nccl"
    with pytest.raises(InputError, match=r"recipes.csv:3\.model.*one line per"):
        bridge.load_recipes(_write(tmp_path, [lines[0], dict(lines[0])]))


def test_a_table_without_a_column_is_refused(tmp_path):
    path = tmp_path / "recipes.csv"
    path.write_text("container,model\n26.06,DeepSeekV3\n")
    with pytest.raises(InputError, match="no column system"):
        bridge.load_recipes(path)
