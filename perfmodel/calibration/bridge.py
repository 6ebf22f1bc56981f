"""NVIDIA's Megatron-Bridge performance summary as published training rows.

``validation/published/megatron_bridge_training_throughput.csv`` is the table as NVIDIA published it
(NVIDIA-NeMo/Megatron-Bridge ``docs/performance-summary.md`` and its archive @ 067f987df0, containers
25.09-26.08), one row per table line, never edited. ``bridge_rows`` reads it as the rows
``perfmodel.calibration.published`` predicts: the table's names mapped to commpress's (model, system,
precision), the plan the table states, and what it does not state taken from Megatron-Bridge's
performance recipes (``ASSUMPTIONS``). A cell with an alternative value in parentheses (another
quantization granularity, sometimes with another plan) becomes a second row.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

from perfmodel.calibration import tables
from topologies.errors import InputError

# the table's columns this module reads (every row's cells checked as they are read: perfmodel.calibration.tables)
COLUMNS = ("nemo_container", "task", "model", "system", "num_gpus", "precision", "global_batch_size",
           "micro_batch_size", "seq_len", "fsdp", "tp", "pp", "cp", "vp", "ep", "tokens_per_s_per_gpu",
           "alt_values_in_parentheses", "footnote_refs", "source")
NOT_STATED = ("", "n/a")   # a degree the table leaves empty or marks n/a: 1 (fsdp: 0)
# DeepSeek-V3 as the recipes train it: with its multi-token-prediction module (Megatron-Bridge's DeepSeek-V3
# recipe sets mtp_num_layers = 1: src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py @ 067f987df0),
# as the table's own FLOPs per token say: 260 GFLOP a token in every DeepSeekV3 row (model TFLOP/s over
# tokens/s), Megatron-LM's num_floating_point_operations with one MTP layer, 250 without it, as the four
# '(w/o MTP)' rows count (megatron/training/training.py)
MTP = "mtp_layers=1"
# token drop as the 25.09 performance scripts ran it (scripts/performance/run_script.py @ cac49dcd7, --use_tokendrop):
# apply_moe_token_drop's defaults (src/megatron/bridge/training/utils/moe_token_drop.py): capacity factor 1,
# every expert's input padded to its capacity, the router not forced to balance
TOKENDROP = "moe_capacity_factor=1,moe_pad_to_capacity=true"
# Nemotron 3 Super's, Ultra's (and 3.5 Lightning's, in its catalog model) recipes train two multi-token-prediction depths
# on one module's weights (mtp_num_layers 2, mtp_use_repeated_layer True: recipes/nemotronh/nemotron_3_super.py @ v0.4.0
# lines 93-98, h100/nemotron_3_ultra.py @ 067f987df0 lines 61-64), as the table's FLOPs a token count them
NEMOTRON_MTP = "mtp_layers=2,mtp_use_repeated_layer=true"
# the table's model names -> commpress catalog models (perfmodel/catalog/models.toml), with changed keys
# (perfmodel.workload: NAME:key=value,...); a name not here is kept and reported as not predicted
MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b",
          "DeepSeekV3": f"deepseek-v3:{MTP}", "DeepSeekV3 (w/ MTP)": f"deepseek-v3:{MTP}",
          "DeepSeekV3 (w/o MTP)": "deepseek-v3", "DeepSeekV3 (dropless)": f"deepseek-v3:{MTP}",
          "DeepSeekV3 (tokendrop)": f"deepseek-v3:{MTP},{TOKENDROP}",
          "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_30B_a3B (tokendrop)": f"qwen3-30b-a3b:{TOKENDROP}",
          "Qwen3_235B_a22B": "qwen3-235b-a22b", "Qwen3_235B_a22B (tokendrop)": f"qwen3-235b-a22b:{TOKENDROP}",
          "GPT OSS 120B": "gpt-oss-120b", "Kimi_K2": "kimi-k2",
          "Nemotron_3_Nano": "nemotron-3-nano", "Nemotron_3_5_Lightning": "nemotron-3.5-lightning",
          "Nemotron_3_Super": f"nemotron-3-super:{NEMOTRON_MTP}", "Nemotron_3_Ultra": f"nemotron-3-ultra:{NEMOTRON_MTP}"}
DENSE = ("LLAMA3_8B", "LLAMA3_70B", "LLAMA3.1_405B")
# Nemotron 3's recipes reduce gradients in bf16 (grad_reduce_in_fp32 False: perf_recipes/nemotronh/common.py
# _apply_nemotron_3_{nano,super,ultra}_perf_defaults @ 067f987df0; scripts/performance/configs/nemotronh/
# nemotron_3_llm_pretrain.py set_nemotron_3_*_common_configs @ v0.4.0)
BF16_GRADS = DENSE + ("Nemotron",)
# Nemotron 3 Ultra's recipes run Megatron-FSDP (HSDP inside a 64-GPU NVLink domain: _apply_nemotron_3_ultra_fsdp_hsdp,
# perf_recipes/nemotronh/common.py @ 067f987df0, called by its GB200 and GB300 recipes) with fine-grained offloading of
# the experts' MLP activations, though the table leaves fsdp empty
FSDP_RECIPES = ("Nemotron_3_Ultra",)
# the experts' tensor parallelism the table does not state: 1 in every MoE recipe (expert_tensor_parallel_size
# = 1: src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py, recipes/deepseek/h100/deepseek_v3.py, perf_recipes/*/
# @ 067f987df0), where Megatron-Core's default would be tp
EXPERT_TP = 1
# why a model of the table is not predicted
UNMODELLED = {"DeepSeekV4": "DeepSeek-V4's compressed sparse attention (its DSA indexer), hyper-connections and "
                            "hash-routed MoE layers are not modelled (Megatron-Bridge docs/models/deepseek/deepseek-v4.md)"}
# the table's hybrid Mamba-Transformer MoE models: their own source (bridge-hybrid), apart from the MoE rows
HYBRID = ("Nemotron",)
SYSTEMS = {"DGX-H100": "dgx-h100", "DGX-B200": "dgx-b200", "DGX-B300": "dgx-b300", "DGX-GB200": "gb200-nvl72",
           "DGX-GB300": "gb300-nvl72"}
# the table's precision names -> perfmodel.plan.precision's. 'FP8' (containers 26.02 on) is the same
# current-scaling recipe as 25.11's 'FP8-CS' (the same plans reach the same throughput); 25.09's table has
# no precision column: its values are FP8-CS with FP8-MX in parentheses, as 25.11's are
PRECISIONS = {"BF16": "bf16", "FP8-CS": "fp8-tensorwise", "FP8": "fp8-tensorwise", "": "fp8-tensorwise",
              "FP8-MX": "mxfp8", "MXFP8": "mxfp8", "NVFP4": "nvfp4"}
# a parenthesised value is another quantization granularity (the table's footnote): 32-element MX blocks
# on Blackwell, DeepSeek-V3's 1x128 / 128x128 blocks on H100
ALTERNATIVE = {"DGX-H100": "fp8-blockwise"}
# an alternative's precision as the table names it (its recipes line's key): MX blocks are FP8-MX (25.09 - 25.11's
# name); the table names no blockwise recipe, so an H100 alternative has no recipes line
ALTERNATIVE_NAMES = {"mxfp8": "FP8-MX"}
# Megatron-Bridge's mixed-precision recipes (src/megatron/bridge/training/mixed_precision.py): the delayed,
# current-scaling and MXFP8 recipes set fp8_param_gather=True (fp8 primary weights, gathered in fp8: the
# fp8-param-gather policy); the blockwise ('subchannel') recipe sets it False; fp4 parameters are refused there
PARAM_GATHER_POLICY = {"fp8-delayed": "fp8-param-gather", "fp8-tensorwise": "fp8-param-gather",
                       "mxfp8": "fp8-param-gather"}
# Megatron-FSDP plans on Blackwell offload some layers' activations to the CPU (the recipes'
# cpu_offloading_num_layers, 5 - 92 layers): the memory model does not hold that, so their fit is not checked
OFFLOADED = ("the recipe offloads some layers' activations to the CPU (cpu_offloading_num_layers), which "
             "perfmodel.plan.memory does not model: memory not checked")
# GPT-OSS 120B's recipes on B200, GB200 and H100 recompute the layernorms and the experts' activation function
# (src/megatron/bridge/perf_recipes/gpt_oss/{b200,gb200,h100}/gpt_oss.py @ 067f987df0, recompute_modules
# ["layernorm", "moe_act"], every precision; megatron_bridge_recipes.csv gives each container's); the memory model,
# with that recompute, still puts the B200 ep 8 rows at 190.7 GiB of a B200's and the 25.11 rows (whose config names
# no recompute) at 209.6 and 130.2 GiB: what else the runs hold down is not identified, so their fit is not checked
RECOMPUTED = {("GPT OSS 120B", system) for system in ("DGX-B200", "DGX-GB200", "DGX-H100")}
RECOMPUTED_WHY = ("the recipe recomputes the layernorms and the experts' activation (recompute_modules layernorm, "
                  "moe_act); with that the memory model still over-counts these runs (B200 ep 8: 190.7 GiB), for a "
                  "reason not identified: memory not checked")
# DeepSeek-V3's and Kimi-K2's perf recipes hold memory the model does not: the experts' paged stash, fine-grained
# activation offloading and a precision-aware optimizer with bf16 moments (src/megatron/bridge/perf_recipes/deepseek/
# common.py @ 267f756: _enable_deepseek_full_iteration_mxfp8 moe_paged_stash; _enable_deepseek_precision_aware_
# optimizer; their selective recompute, _deepseek_v3_common, the plan takes from megatron_bridge_recipes.csv)
STASHED = ("DeepSeekV3", "Kimi_K2")
STASHED_WHY = ("the recipe stashes the experts' activations in paged buffers and keeps bf16 optimizer moments, which "
               "perfmodel.plan.memory does not model (its recompute of modules it does): memory not checked")
# rows whose stated plan differs from the recipe of its container in the way memory depends on: container
# 26.02.01's GB300 Llama 3 70B rows state micro-batch 2 with no FSDP, virtual stages or offloading, where every
# GB300 70B recipe (llama3_workload_base_configs.py, V1 and V2) runs MXFP8 and NVFP4 at micro-batch 1 with
# pp 4 x vp 5, and FP8-CS with Megatron-FSDP and CPU offloading
STATED_ELSEWHERE = {("26.02.01", "DGX-GB300", "LLAMA3_70B"): (
    "the row's stated plan (micro-batch 2, no FSDP, no virtual stages) is not its container's GB300 recipe, which "
    "runs micro-batch 1 with pp 4 x vp 5 or Megatron-FSDP with CPU offloading: memory not checked")}
RELEASES = {"25.09": "2025-09", "25.11": "2025-11", "26.02": "2026-02", "26.04": "2026-04", "26.06": "2026-06",
            "26.08": "2026-08"}
ASSUMPTIONS = ("framework nemo (Megatron-Bridge on Megatron-Core); FSDP > 0 -> Megatron-FSDP, predicted as zero 3; "
               "else the distributed optimizer, zero 1 with overlapped gradient reduce-scatter and parameter "
               "all-gather; FP8-CS, FP8 and MXFP8 gather fp8 parameters (policy fp8-param-gather, the recipes' "
               "fp8_param_gather); Llama gradients reduced in bf16 (the Llama 3 performance configs set "
               "grad_reduce_in_fp32 False) and so Nemotron 3's (its recipes set it False too), other models' in fp32; "
               "Nemotron 3 Super and Ultra (and 3.5 Lightning) with two repeated MTP depths, Nemotron 3 Ultra as "
               "zero 3 (its recipes run Megatron-FSDP HSDP and offload activations: memory unchecked); tp > 1 -> sequence parallel and TP communication "
               "overlap (not under NVFP4: the recipes turn it off); dense rows without recompute (the recipes "
               "recompute a few layers or offload activations to the CPU on some GB200/GB300 FSDP and H100 "
               "plans: not modelled), MoE rows with their recipe's (RECIPES); VP > 1 -> interleaved 1F1B with VP "
               "virtual stages; DeepSeek-V3 but the "
               "'(w/o MTP)' rows with its multi-token-prediction module (the recipe's mtp_num_layers 1, and the "
               "table's 260 GFLOP a token); '(tokendrop)' rows capacity factor 1 padded to capacity "
               "(apply_moe_token_drop's defaults), "
               "the others balanced (the table's note: forced balance, dropless); MoE rows' experts without tensor "
               "parallelism (etp 1, the recipes' expert_tensor_parallel_size); DeepSeek-V3 and Kimi-K2 on pp > 1 "
               "with their recipes' pipeline layout for pp x vp virtual stages (PIPELINE_LAYOUTS); "
               "MoE rows with their container's recipe settings (validation/published/megatron_bridge_recipes.csv, "
               "RECIPES): the expert all-to-alls overlapped with another micro-batch's compute (ep_overlap batch) "
               "where the recipe sets moe_a2a_overlap, the dispatcher's kernels (alltoall: NCCL, deepep, hybridep) "
               "and attention in FP8 where it sets fp8_dot_product_attention, selective recompute of the modules it "
               "names (none where it names none); a row without a line there (26.08's "
               "Nemotron, DeepSeek-V4) or a setting left empty keeps no overlap, NCCL's all-to-all and attention "
               "outside FP8")

# DeepSeek-V3's and Kimi-K2's 61 layers over the pipeline as Megatron-Bridge's recipes lay them (Megatron's
# pipeline_model_parallel_layout), by the number of virtual stages pp x vp: the layout map of
# src/megatron/bridge/recipes/deepseek/deepseek_v3.py @ cac49dcd7 (lines 121-131: (4, 1); (8, 1) = (4, 2);
# (16, 1) = (8, 2) = (4, 4)) and _get_deepseek_v3_pipeline_layout in recipes/deepseek/h100/deepseek_v3.py
# @ 067f987df0; 16 stages also the pp_layout 'Et*4|(t*4|)*14tmL' of the GB300 and B200 configs
# (scripts/performance/configs/deepseek/deepseek_workload_base_configs.py @ c8327cfc2^) and of
# perf_recipes/deepseek/gb300/deepseek_v3.py @ 067f987df0; 32 stages H100's 'Et|(tt|)*30mL'
# (scripts/performance/run_script.py @ cac49dcd7 line 72, the H100 pp_layout @ c8327cfc2^,
# perf_recipes/deepseek/h100/deepseek_v3.py). 'm': DeepSeek-V3's MTP layer where the row has it (the recipes'
# last_layer = ['mtp'] * mtp_num_layers + ['loss']); the account-for flags off, the first/last stage counts
# unset (recipes/deepseek/deepseek_v3.py @ cac49dcd7 lines 102-106). Kimi-K2 the same without MTP
# (_get_kimi_k2_pipeline_layout, src/megatron/bridge/recipes/kimi/h100/kimi_k2.py @ 067f987df0: (4, 1);
# (8, 1) = (4, 2); (16, 1) = (8, 2) = (4, 4) = (2, 8))
PIPELINE_LAYOUTS = {4: "Et*16|t*16|t*16|t*13{m}L", 8: "Et*8|(t*8|)*6t*5{m}L", 16: "Et*4|(t*4|)*14t{m}L",
                    32: "Et|(tt|)*30{m}L"}


# The recipes' MoE settings (``RECIPES``: validation/published/megatron_bridge_recipes.csv), one line per container,
# model, system and precision as the table names them, each cited by the Megatron-Bridge release of that container
# (25.09: v0.1.0rc3's scripts/performance, the same files as cac49dcd7; 25.11 v0.2.0, 26.02 v0.3.0, 26.02.01 v0.3.1,
# 26.04 v0.4.0, 26.04.01 v0.4.2, 26.06 v0.5.0, 26.06.01 v0.5.1, 26.08 v0.6.0's perf_recipes), its file and line.
# A patch container is its release's patch: 26.02.01's Kimi-K2 and Nemotron-3-Nano rows have configs in v0.3.1's
# scripts, not v0.3.0's; 26.04.01's DeepSeek-V3 B200/B300 plans (pp 8) are v0.4.2's, v0.4.0's (and v0.4.1's,
# the same scripts) pp 16. A line whose plan is not its config's says so (plan_as_config False, notes).
# A row takes from its line what the plan expresses: the all-to-alls overlapped with another micro-batch's compute
# (moe_a2a_overlap: Megatron-Core's overlap_moe_expert_parallel_comm with delay_wgrad_compute, the plan's ep_overlap
# 'batch', perfmodel.step.expert_overlap), the dispatcher's kernels behind it (the plan's ep_kernels, their SMs a tax
# on the compute they hide behind: DISPATCHERS), attention in FP8 (fp8_dot_product_attention, the plan's
# fp8_attention) and the recompute (recompute_granularity and recompute_modules: the plan's recompute and
# recompute_modules, perfmodel.plan.recompute). The line's other settings (CUDA graphs, the fused grouped MLP,
# offloading, forced balance) are the record; a row without a line, or a setting left empty, keeps the defaults
# (no overlap, NCCL's all-to-all, attention in the GEMMs' precision outside FP8, no recompute). Nemotron 3's lines
# (26.02.01 - 26.06.01) are there for when its layers are modelled (UNMODELLED); 26.08's Nemotron and DeepSeek-V4
# rows have none.
RECIPES = Path(__file__).resolve().parents[2] / "validation" / "published" / "megatron_bridge_recipes.csv"
# the dispatcher -> the plan's ep_kernels (perfmodel.plan.parallel EP_KERNELS): Megatron-Core's alltoall dispatcher
# runs NCCL's all-to-all; flex with the deepep or hybridep backend their kernels
DISPATCHERS = {"alltoall": "nccl", "deepep": "deepep", "hybridep": "hybridep"}
CUDA_GRAPHS = ("none", "local", "transformer_engine", "full_iteration")   # Megatron-Core's cuda_graph_impl
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
RECOMPUTE_GRANULARITIES = ("none", "selective", "full")
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe", "moe_act", "layernorm", "shared_experts")
RECIPE_FLAGS = ("plan_as_config", "moe_a2a_overlap", "fp8_dot_product_attention", "cutedsl_fused_grouped_mlp",
                "moe_router_force_load_balancing")
RECIPE_COLUMNS = ("container", "model", "system", "precision", "release", "config", *RECIPE_FLAGS[:2], "dispatcher",
                  "cuda_graph_impl", "cuda_graph_scope", *RECIPE_FLAGS[2:4], "recompute_granularity",
                  "recompute_modules", "cpu_offloading_num_layers", RECIPE_FLAGS[4], "source", "notes")
# 25.09's table states no precision: its values are FP8-CS (PRECISIONS)
UNSTATED_PRECISION = "FP8-CS"


def load_recipes(path=RECIPES) -> dict[tuple[str, str, str, str], dict]:
    """{(container, model, system, precision): its line} of the recipes table at ``path``, every cell checked
    (a cell that is no such value, or a key twice, refused in one line naming the line and column)."""
    rows = tables.read_table(path, "recipes", "the Megatron-Bridge recipes' MoE settings")
    tables.require(path, rows, RECIPE_COLUMNS, "recipes", "the Megatron-Bridge recipes' MoE settings")
    out = {}
    for where, row in rows:
        key = _recipe_key(where, row)
        if key in out:
            raise InputError(f"{where}.model", row["model"], "one line per container, model, system and precision "
                             f"(another line has {' '.join(key)})")
        out[key] = _recipe(where, row)
    return out


def _recipe_key(where: str, row: dict) -> tuple[str, str, str, str]:
    container = tables.text(where, row, "container").strip()
    if container[:5] not in RELEASES or container[5:] not in ("", ".01"):
        raise InputError(f"{where}.container", container, "a container of the table: "
                         + ", ".join(RELEASES) + " (or its .01 patch)")
    if row["model"] not in MODELS and not row["model"].startswith(tuple(UNMODELLED)):
        raise InputError(f"{where}.model", row["model"], "a model of the table: " + ", ".join(MODELS)
                         + " or a name starting " + ", ".join(UNMODELLED))
    tables.choice(where, row, "system", tuple(SYSTEMS))
    tables.choice(where, row, "precision", tuple(p for p in PRECISIONS if p))
    return container, row["model"], row["system"], row["precision"]


def _recipe(where: str, row: dict) -> dict:
    """The line's settings checked: flags True or False, names from their lists (a setting may be empty: not
    determined, its notes say why)."""
    for column in ("release", "config", "source"):
        tables.text(where, row, column)
    for column in RECIPE_FLAGS:
        tables.flag(where, row, column, required=column == "plan_as_config")
    tables.choice(where, row, "dispatcher", tuple(DISPATCHERS), required=False)
    tables.choice(where, row, "cuda_graph_impl", CUDA_GRAPHS, required=False)
    tables.choice(where, row, "recompute_granularity", RECOMPUTE_GRANULARITIES, required=False)
    for column, names in (("cuda_graph_scope", CUDA_GRAPH_SCOPES), ("recompute_modules", RECOMPUTE_MODULES)):
        cell = tables.text(where, row, column, required=False).strip()
        if cell and cell != "none" and not set(cell.split(";")) <= set(names):
            raise InputError(f"{where}.{column}", cell, "none or ;-separated names of " + ", ".join(names))
    tables.integer(where, row, "cpu_offloading_num_layers", required=False)
    if not tables.text(where, row, "notes", required=False).strip() and not all(
            row[c].strip() for c in RECIPE_COLUMNS if c != "notes"):
        raise InputError(f"{where}.notes", "", "why a setting left empty cannot be determined")
    return dict(row)


@cache
def recipes() -> dict[tuple[str, str, str, str], dict]:
    """``load_recipes`` of ``RECIPES``, read once."""
    return load_recipes()


def recipe(container: str, name: str, system: str, precision: str) -> dict | None:
    """The recipes table's line of a row (the table's names; 25.09's unstated precision is FP8-CS), None where
    it has none."""
    return recipes().get((container, name, system, precision or UNSTATED_PRECISION))


def recipe_plan(line: dict | None) -> dict:
    """What the plan takes from a recipes line (the module's RECIPES comment): ep_overlap, ep_kernels,
    fp8_attention ('True'/'False') and the recompute (selective with its named modules, 'none' where selective
    names none, full); the defaults where there is no line or the setting is empty."""
    line = line or {}
    overlap = line.get("moe_a2a_overlap") == "True"
    recompute, modules = line.get("recompute_granularity") or "none", line.get("recompute_modules") or "none"
    if recompute == "selective" and modules == "none":
        recompute = "none"          # selective with an empty list: nothing recomputed
    return dict(ep_overlap="batch" if overlap else "none", ep_kernels=DISPATCHERS.get(line.get("dispatcher"), "nccl"),
                fp8_attention=str(line.get("fp8_dot_product_attention") == "True"), recompute=recompute,
                recompute_modules=modules.replace(";", ",") if recompute == "selective" else "",
                recipe=f"{line['release']} {line['config']}" if line else "")


def _layout(name: str, pp: int, vp: int) -> str | None:
    """A DeepSeek-V3 or Kimi-K2 row's pipeline layout (``PIPELINE_LAYOUTS``); None for other models, pp 1,
    or a pp x vp no recipe lays out (the plan then refuses it, naming why)."""
    if pp == 1 or not name.startswith(("DeepSeekV3", "Kimi_K2")) or pp * vp not in PIPELINE_LAYOUTS:
        return None
    mtp = "m" if name.startswith("DeepSeekV3") and "w/o MTP" not in name else ""
    return PIPELINE_LAYOUTS[pp * vp].format(m=mtp)


def bridge_rows(raw: list[dict]) -> list[dict]:
    """Every row of the table (and its parenthesised alternative) as a published training row."""
    return [mapped for i, row in enumerate(raw, 2) for mapped in bridge_row(row, f"row {i}")]


def bridge_row(row: dict, where: str) -> list[dict]:
    """The row (a line of the table, ``where`` it stands) as a published training row, and its
    parenthesised alternative where it has one; a cell this reads that is no such value is refused
    naming ``where`` and the column."""
    out = [_row(row, where)]
    alt = _alternative(row, where)
    if alt is not None:
        out.append(alt)
    return out


def _alternative(row: dict, where: str) -> dict | None:
    """The row's parenthesised values as a row of their own (None where it has none or only a FLOP count)."""
    cells = dict(kv.split("=", 1) for kv in row["alt_values_in_parentheses"].split(";") if "=" in kv)
    if "tokens_per_s_per_gpu" not in cells:
        return None
    inside = f"{where}.alt_values_in_parentheses"
    precision = tables.choice(inside, cells, "precision", [p for p in PRECISIONS if p], required=False)
    cells.pop("precision", None)
    alt = {**row, **{k: v for k, v in cells.items() if k in row}}
    if "grad_accum" in cells:     # another plan: its micro-batch from gbs = mbs x dp x accumulation
        dp = _dp(alt, inside)
        accum = tables.integer(inside, cells, "grad_accum", positive=True)
        gbs = tables.integer(where, alt, "global_batch_size", "gbs")
        if gbs % (dp * accum):
            raise InputError(f"{inside}.grad_accum", accum, f"a divisor of global_batch_size {gbs} / dp {dp}")
        alt["micro_batch_size"] = str(gbs // (dp * accum))
    mapped = _row(alt, inside)
    mapped["precision"] = PRECISIONS[precision] if precision else ALTERNATIVE.get(row["system"], "mxfp8")
    mapped["policy"] = PARAM_GATHER_POLICY.get(mapped["precision"], "none")
    mapped["tp_overlap"] = str(mapped["tp"] > 1 and mapped["precision"] != "nvfp4")
    named = precision or ALTERNATIVE_NAMES.get(mapped["precision"])
    mapped.update(recipe_plan(recipe(row["nemo_container"], row["model"], row["system"], named) if named else None))
    mapped["model_label"] += " (alt)"
    return mapped


def _int(where: str, row: dict, column: str, default: int = 1) -> int:
    """A degree of the row: ``default`` where the table does not state it (empty, n/a), else an
    integer (at least 1; fsdp, a size, at least 0)."""
    if str(row[column]).strip() in NOT_STATED:
        return default
    return tables.integer(where, row, column, None if column == "fsdp" else "world")


def _dp(row: dict, where: str) -> int:
    """The data-parallel degree of the row's GPUs over tp x pp x cp (refused where those do not divide them)."""
    gpus, split = tables.integer(where, row, "num_gpus", "world"), 1
    for column in ("tp", "pp", "cp"):
        split *= _int(where, row, column)
    if gpus % split:
        raise InputError(f"{where}.num_gpus", gpus, f"a multiple of tp x pp x cp = {split}")
    return gpus // split


def _row(row: dict, where: str) -> dict:
    tp, pp, cp, ep, vp = (_int(where, row, k) for k in ("tp", "pp", "cp", "ep", "vp"))
    gpus = tables.integer(where, row, "num_gpus", "world")
    name = row["model"]
    container = row["nemo_container"]
    precision = PRECISIONS.get(row["precision"], row["precision"])
    return dict(
        system=row["system"], model=MODELS.get(name, ""), model_label=f"{name} {row['task']} {container}",
        family="dense" if name in DENSE else "hybrid" if name.startswith(HYBRID) else "moe", cluster=SYSTEMS.get(row["system"], row["system"]), gpus=gpus,
        tp=tp, pp=pp, cp=cp, ep=ep, vp=vp, dp=_dp(row, where),
        mbs=tables.integer(where, row, "micro_batch_size", "mbs"),
        gbs=tables.integer(where, row, "global_batch_size", "gbs"),
        seq_len=tables.integer(where, row, "seq_len", "seq_len"),
        zero=3 if _int(where, row, "fsdp", 0) or name.startswith(FSDP_RECIPES) else 1,
        etp=None if name in DENSE else EXPERT_TP,
        pipeline_layout=_layout(name, pp, vp),
        **recipe_plan(recipe(container, name, row["system"], row["precision"])),
        sequence_parallel=str(tp > 1), tp_overlap=str(tp > 1 and precision != "nvfp4"),
        grad_dtype="bf16" if name.startswith(BF16_GRADS) else "fp32",
        precision=precision, framework="nemo", policy=PARAM_GATHER_POLICY.get(precision, "none"),
        memory_unchecked=_unchecked(row, where),
        measured_tokens_per_s_per_gpu=row["tokens_per_s_per_gpu"], task=row["task"],
        skip=_skip(row), source=row["source"],
        source_date=RELEASES.get(container[:5], container) + f" (container {container})",
        assumptions=ASSUMPTIONS, notes=row["footnote_refs"])


def _unchecked(row: dict, where: str) -> str:
    """Why a row's fit in memory is not checked ('' where it is)."""
    if (_int(where, row, "fsdp", 0) and row["system"] != "DGX-H100") or row["model"].startswith(FSDP_RECIPES):
        return OFFLOADED
    if (row["nemo_container"], row["system"], row["model"]) in STATED_ELSEWHERE:
        return STATED_ELSEWHERE[(row["nemo_container"], row["system"], row["model"])]
    if (row["model"], row["system"]) in RECOMPUTED:
        return RECOMPUTED_WHY
    if row["model"].startswith(STASHED):
        return STASHED_WHY
    return ""


def _skip(row: dict) -> str:
    """Why a row is not predicted ('' where it is)."""
    name = row["model"]
    for prefix, why in UNMODELLED.items():
        if name.startswith(prefix):
            return why
    if row["task"] == "LoRA":
        return "LoRA fine-tuning (frozen weights, adapters trained) is not modelled"
    if name not in MODELS:
        return f"model {name} not in the catalog"
    return ""
