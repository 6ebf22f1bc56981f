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

# the table's model names -> commpress catalog models (perfmodel/catalog/models.toml); a name not here is
# kept and reported as not predicted
MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b",
          "DeepSeekV3": "deepseek-v3", "DeepSeekV3 (w/o MTP)": "deepseek-v3", "DeepSeekV3 (dropless)": "deepseek-v3",
          "DeepSeekV3 (tokendrop)": "deepseek-v3"}
DENSE = ("LLAMA3_8B", "LLAMA3_70B", "LLAMA3.1_405B")
# why a model of the table is not predicted
UNMODELLED = {"GPT OSS": "its attention (64-wide heads beside a 2880 hidden, sliding windows) is not modelled",
              "Qwen3": "its attention (128-wide heads beside a narrower hidden) is not modelled",
              "Kimi": "multi-head latent attention with 384 experts is not in the catalog",
              "Nemotron": "hybrid Mamba-Transformer layers are not modelled",
              "DeepSeekV4": "DeepSeek-V4's architecture is not published in a form the catalog can hold",
              "DeepSeekV3 (w/ MTP)": "the multi-token-prediction module is not modelled"}
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
RELEASES = {"25.09": "2025-09", "25.11": "2025-11", "26.02": "2026-02", "26.04": "2026-04", "26.06": "2026-06",
            "26.08": "2026-08"}
ASSUMPTIONS = ("framework nemo (Megatron-Bridge on Megatron-Core); FSDP > 0 -> Megatron-FSDP, predicted as zero 3; "
               "else the distributed optimizer, zero 1 with overlapped gradient reduce-scatter and parameter "
               "all-gather; tp > 1 -> sequence parallel and TP communication overlap; no recompute (the recipes "
               "recompute a few layers or offload activations to the CPU on some GB200/GB300 FSDP and H100 "
               "plans: not modelled); VP > 1 -> interleaved 1F1B with VP virtual stages")


def bridge_rows(raw: list[dict]) -> list[dict]:
    """Every row of the table (and its parenthesised alternative) as a published training row."""
    out = []
    for row in raw:
        out.append(_row(row))
        alt = _alternative(row)
        if alt is not None:
            out.append(alt)
    return out


def _alternative(row: dict) -> dict | None:
    """The row's parenthesised values as a row of their own (None where it has none or only a FLOP count)."""
    cells = dict(kv.split("=", 1) for kv in row["alt_values_in_parentheses"].split(";") if "=" in kv)
    if "tokens_per_s_per_gpu" not in cells:
        return None
    precision = cells.pop("precision", "")
    mapped = _row({**row, **{k: v for k, v in cells.items() if k in row}})
    mapped["precision"] = PRECISIONS[precision] if precision else ALTERNATIVE.get(row["system"], "mxfp8")
    mapped["model_label"] += " (alt)"
    return mapped


def _int(text: str, default: int = 1) -> int:
    return int(text) if text and text.strip().isdigit() else default


def _row(row: dict) -> dict:
    tp, pp, cp, ep, vp = (_int(row[k]) for k in ("tp", "pp", "cp", "ep", "vp"))
    gpus = int(row["num_gpus"])
    name = row["model"]
    container = row["nemo_container"]
    return dict(
        system=row["system"], model=MODELS.get(name, ""), model_label=f"{name} {row['task']} {container}",
        family="dense" if name in DENSE else "moe", cluster=SYSTEMS.get(row["system"], row["system"]), gpus=gpus,
        tp=tp, pp=pp, cp=cp, ep=ep, vp=vp, dp=gpus // (tp * pp * cp), mbs=int(row["micro_batch_size"]),
        gbs=int(row["global_batch_size"]), seq_len=int(row["seq_len"]), zero=3 if _int(row["fsdp"], 0) else 1,
        recompute="none", sequence_parallel=str(tp > 1), tp_overlap=str(tp > 1),
        precision=PRECISIONS.get(row["precision"], row["precision"]), framework="nemo",
        measured_tokens_per_s_per_gpu=row["tokens_per_s_per_gpu"], task=row["task"],
        skip=_skip(row), source=row["source"],
        source_date=RELEASES.get(container[:5], container) + f" (container {container})",
        assumptions=ASSUMPTIONS, notes=row["footnote_refs"])


def _skip(row: dict) -> str:
    """Why a row is not predicted ('' where it is)."""
    name = row["model"]
    for prefix, why in UNMODELLED.items():
        if name.startswith(prefix):
            return why
    if row["task"] == "LoRA":
        return "LoRA fine-tuning (frozen weights, adapters trained) is not modelled"
    if name not in MODELS:
        return f"model {name} not in the catalog (its attention's head width is not hidden / heads)"
    return ""
