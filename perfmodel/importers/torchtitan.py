"""A torchtitan job config (TOML) as a model and a plan (``perfmodel --from torchtitan:job.toml``).

The keys are torchtitan's ``JobConfig`` at pytorch/torchtitan v0.2.0 (29624e37fa,
torchtitan/config/job_config.py; the v0.1 ``[float8]`` and ``[mx]`` sections are read as v0.2's
``[quantize.linear.float8]`` and ``[quantize.linear.mx]``, v0.1's ``training.compile`` as ``compile.enable``).
The TOML job configs ended at 9810191bbb (2026-02-23: torchtitan's configs are Python since, a
``config_registry.py`` a model, which this importer does not run). Mapped:

* the model: ``[model] name`` and ``flavor`` to the catalog's shape (``FLAVORS``: llama3 8B, 70B, 405B,
  the shapes of torchtitan/models/llama3/__init__.py @ v0.2.0; deepseek_v3 16B, 236B, 671B and qwen3
  30B-A3B, 235B-A22B @ v0.2.2), qwen3's dense flavors (0.6B to 32B, ``QWEN3_DENSE``) to their shapes;
  another model gives no model keys (a line says so: ``--from
  hf:config.json`` before this file, or ``--model``, gives it);
* ``[training]``: ``local_batch_size`` (the microbatch; under a pipeline,
  ``[parallelism] pipeline_parallel_microbatch_size``), ``global_batch_size`` (-1: the local batch times
  dp, no accumulation), ``seq_len`` (the plan's seq), ``mixed_precision_param`` (compute dtype),
  ``mixed_precision_reduce`` (gradient dtype); CPU offloading is refused;
* ``[parallelism]``: the degrees (``tensor_parallel_degree`` with torchtitan's sequence-parallel norms,
  ``pipeline_parallel_degree``, ``context_parallel_degree``, ``expert_parallel_degree``,
  ``expert_tensor_parallel_degree``); ``data_parallel_shard_degree`` (FSDP2: ZeRO-3, or ZeRO-2 where
  ``fsdp_reshard_after_forward`` keeps the parameters: "never", or "default" under a pipeline,
  parallelize.py line 289) and ``data_parallel_replicate_degree`` (DDP; both above 1, HSDP, is refused);
  ``pipeline_parallel_schedule`` 1F1B, GPipe, Interleaved1F1B (``pipeline_parallel_layers_per_stage`` or
  torchtitan's two stages a rank, pipeline_parallel.py line 112); ``enable_async_tensor_parallel``;
* ``[activation_checkpoint]``: ``mode`` none, full, selective (``selective_ac_option`` "op": torchtitan's
  op policy, the torchtitan profile's selective; "1": every layer, full); other layer intervals and
  ``memory_budget`` are refused;
* converters (``[model] converters``): float8 (``recipe_name`` tensorwise; ``enable_fsdp_float8_all_gather``:
  the ``fp8-param-gather`` policy) and mx (mxfp8); rowwise recipes and the grouped-GEMM converters are
  refused;
* the stack: ``framework torchtitan`` (eager layers, FSDP2: perfmodel/catalog/frameworks.toml).

Sections with no effect on a step's time (job, profiling, metrics, optimizer, lr_scheduler, checkpoint,
comm, validation, ...) are ignored with their reason; any other key is refused.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

from perfmodel.importers.common import NO_TIME, Imported, read_text
from topologies.errors import InputError

FRAMEWORK = "torchtitan"
# (model.name, model.flavor) -> the catalog's model (perfmodel/catalog/models.toml); torchtitan/models/llama3/
# __init__.py @ v0.2.0: 8B dim 4096 x 32 layers, 70B 8192 x 80, 405B 16384 x 126, 8 KV heads, vocab 128256;
# torchtitan/models/deepseek_v3/__init__.py @ v0.2.2: 16B (27 layers, dim 2048, 64 experts top 6, 2 shared,
# moe_inter_dim 1408, 1 dense layer, MLA kv_lora_rank 512 without q_lora) is DeepSeek-V2-Lite's shape, 236B
# DeepSeek-V2's, 671B DeepSeek-V3's (61 layers, 256 experts top 8, 1 shared, 3 dense; no MTP: the catalog's
# has none); torchtitan/models/qwen3/__init__.py @ v0.2.2: 30B-A3B and 235B-A22B are the catalog's Qwen3 MoEs
FLAVORS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b",
           ("deepseek_v3", "16B"): "deepseek-v2-lite", ("deepseek_v3", "236B"): "deepseek-v2",
           ("deepseek_v3", "671B"): "deepseek-v3", ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
           ("qwen3", "235B-A22B"): "qwen3-235b-a22b"}
# the dense Qwen3 flavors the catalog does not have: torchtitan/models/qwen3/__init__.py @ v0.2.2 (73a0e6979d),
# flavor -> (dim, n_layers, n_heads, hidden_dim, enable_weight_tying); every one head_dim 128, 8 KV heads, vocab
# 151936, max_seq_len 4096, SwiGLU and RMSNorm (qk_norm: elementwise)
QWEN3_DENSE = {"0.6B": (1024, 28, 16, 3072, True), "1.7B": (2048, 28, 16, 6144, True),
               "4B": (2560, 36, 32, 9728, True), "8B": (4096, 36, 32, 12288, False),
               "14B": (5120, 40, 40, 17408, False), "32B": (5120, 64, 64, 25600, False)}
IGNORED_SECTIONS = {
    **dict.fromkeys(("job", "profiling", "metrics", "comm", "memory_estimation", "experimental"),
                    "logging, tracing and the run's housekeeping: " + NO_TIME),
    **dict.fromkeys(("optimizer", "lr_scheduler"), "the optimizer's and learning rate's settings: " + NO_TIME),
    "checkpoint": "checkpointing: " + NO_TIME, "validation": "evaluation: " + NO_TIME,
    "fault_tolerance": "torchft's replica groups: " + NO_TIME + " while no replica fails"}
IGNORED = {
    "model.hf_assets_path": "the tokenizer's and weights' folder", "model.tokenizer_path": "the tokenizer's path",
    "model.print_after_conversion": "logging: " + NO_TIME,
    "hf_transformers.model": "a Hugging Face model id (the transformers_modeling_backend): its config.json, "
                             "--from hf:config.json before this file, gives the model",
    **dict.fromkeys(("training.dataset", "training.dataset_path", "training.steps", "training.seed",
                     "training.deterministic", "training.max_norm"), "data, the run's length and numerics: " + NO_TIME),
    **dict.fromkeys(("training.gc_freq", "training.gc_debug"), "the host's garbage collection"),
    "training.debug_moe_force_load_balance": "routing is balanced unless --routing says otherwise",
    "training.dtype": "the parameters' storage dtype (the optimizer's master copy); the GEMMs run in "
                      "mixed_precision_param",
    "parallelism.disable_loss_parallel": "the loss's layout: elementwise, " + NO_TIME,
    "parallelism.enable_compiled_autograd": "the backward's graph capture: the eager step is priced",
    "parallelism.context_parallel_rotate_method": "ring attention's key-value exchange: the model's ring",
    **dict.fromkeys(("parallelism.pipeline_parallel_first_stage_less_layers",
                     "parallelism.pipeline_parallel_last_stage_less_layers"),
                    "the stages' split weights: the plan splits the layers evenly"),
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": "the router's GEMM: under 0.1% of "
                                                                          "the FLOPs",
    "activation_checkpoint.early_stop": "recomputation's early stop: " + NO_TIME,
    **dict.fromkeys(("activation_checkpoint.memory_budget", "activation_checkpoint.visualize_memory_budget_pareto"),
                    "used only with mode memory_budget"),
    **dict.fromkeys(("compile.enable", "compile.components", "compile.backend", "training.compile"),
                    "torch.compile: the torchtitan profile prices PyTorch's eager layers (the step without "
                    "compile's fusion)"),
    **dict.fromkeys(("float8.filter_fqns", "float8.emulate", "float8.precompute_float8_dynamic_scale_for_fsdp",
                     "mx.filter_fqns", "mx.mxfp8_dim1_cast_kernel_choice"),
                    "the converter's kernels and the layers it skips (the output layer): the precision covers "
                    "the layers' GEMMs")}
# the keys the mapping reads (a line each from it)
USED = ("model.name", "model.flavor", "model.converters", "training.local_batch_size", "training.global_batch_size",
        "training.seq_len", "training.mixed_precision_param", "training.mixed_precision_reduce",
        "training.enable_cpu_offload", "parallelism.data_parallel_replicate_degree",
        "parallelism.data_parallel_shard_degree", "parallelism.fsdp_reshard_after_forward",
        "parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
        "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
        "parallelism.expert_tensor_parallel_degree", "parallelism.pipeline_parallel_schedule",
        "parallelism.pipeline_parallel_layers_per_stage", "parallelism.pipeline_parallel_microbatch_size",
        "parallelism.pipeline_parallel_schedule_csv", "parallelism.module_fqns_per_model_part",
        "parallelism.enable_async_tensor_parallel", "activation_checkpoint.mode",
        "activation_checkpoint.selective_ac_option", "float8.recipe_name", "float8.enable_fsdp_float8_all_gather",
        "mx.recipe_name")
DEGREES = {"tensor_parallel_degree": "tp", "pipeline_parallel_degree": "pp", "context_parallel_degree": "cp",
           "expert_parallel_degree": "ep"}
DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved"}
FLOAT8_RECIPES = {None: "fp8-tensorwise", "tensorwise": "fp8-tensorwise"}
MX_RECIPES = ("mxfp8", "mxfp8_cublas", "mxfp8_cutlass", "mxfp8_emulated")
CONVERTERS = {"float8": "float8", "quantize.linear.float8": "float8", "mx": "mx", "quantize.linear.mx": "mx"}


def load(path: str) -> Imported:
    """The model keys, plan keywords and lines of the torchtitan job config at ``path`` (module doc)."""
    if path.endswith(".py"):
        raise InputError("torchtitan", path, "a job config TOML (torchtitan to v0.2.2, 9810191bbb^): a "
                         "config_registry.py is Python, which this importer does not run")
    try:
        cfg = tomllib.loads(read_text("torchtitan", path))
    except tomllib.TOMLDecodeError as err:
        raise InputError("torchtitan", path, f"a torchtitan job config (valid TOML: {err})") from None
    return from_config(cfg, Path(path).stem).check(path)


def flatten(cfg: dict) -> dict:
    """{"section.key": value} of a job config, v0.2's ``quantize.linear.float8`` / ``.mx`` read as v0.1's
    ``float8`` / ``mx`` sections."""
    quantize = cfg.get("quantize", {})
    linear = quantize.get("linear", {}) if isinstance(quantize, dict) else {}
    sections = {k: v for k, v in cfg.items() if k != "quantize"}
    for name in ("float8", "mx"):
        if name in linear:
            sections[name] = {**sections.get(name, {}), **linear[name]}
    flat = {}
    for section, keys in sections.items():
        if not isinstance(keys, dict):
            flat[section] = keys
            continue
        flat.update({f"{section}.{k}": v for k, v in keys.items()})
    if isinstance(quantize, dict):
        for kind, value in quantize.items():
            for name, keys in (value.items() if kind == "grouped_mm" and isinstance(value, dict) else ()):
                flat[f"quantize.grouped_mm.{name}"] = keys
            if kind not in ("linear", "grouped_mm"):
                flat[f"quantize.{kind}"] = value
    return flat


def from_config(cfg: dict, name: str = "torchtitan-model") -> Imported:
    """An Imported of a job config dict (refusals collected, not raised: ``Imported.check``)."""
    out, flat = Imported("torchtitan", name=name), flatten(cfg)
    for key, value in flat.items():
        section = key.split(".")[0]
        if section in IGNORED_SECTIONS:
            out.ignored(key, value, IGNORED_SECTIONS[section])
        elif key in IGNORED:
            out.ignored(key, value, IGNORED[key])
        elif key.startswith("quantize.grouped_mm.") and key in flat.get("model.converters", []):
            out.refuse(key, value, "no grouped-GEMM converter (the experts' GEMMs in low precision alone are not "
                       "modelled: a precision covers every GEMM)")
        elif key.startswith("quantize.grouped_mm."):
            out.ignored(key, value, "its converter is not in model.converters")
        elif key not in USED:
            out.refuse(key, value, "a key of torchtitan's JobConfig @ v0.2.0 that this importer maps or ignores "
                       "(perfmodel.importers.torchtitan lists them)")
    if not out.refused:
        _model(out, flat)
        _training(out, flat)
        _parallelism(out, flat)
        _recompute(out, flat)
        _converters(out, flat)
        out.plan["framework"] = FRAMEWORK
        out.lines.append("torchtitan: the job -> framework torchtitan (eager layers, FSDP2, DTensor TP)")
    return out


def _get(out: Imported, flat: dict, key: str, default, kind=int):
    """``flat[key]`` (``default`` where absent) as ``kind``; a value of another type is refused."""
    value = flat.get(key, default)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        out.refuse(key, value, "an integer")
        return default
    if kind is str and value is not None and not isinstance(value, str):
        out.refuse(key, value, "text")
        return default
    return value


def _model(out: Imported, flat: dict) -> None:
    from perfmodel.devices import read_catalog

    model = (flat.get("model.name", "llama3"), flat.get("model.flavor", "debugmodel"))
    shown = f"{model[0]} {model[1]}"
    if model[0] == "qwen3" and model[1] in QWEN3_DENSE:
        dim, layers, heads, ffn, tied = QWEN3_DENSE[model[1]]
        out.model.update(hidden_size=dim, num_layers=layers, num_heads=heads, num_kv_heads=8, head_dim=128,
                         ffn_hidden_size=ffn, vocab_size=151936, seq_len=4096, activation="swiglu", norm="rmsnorm",
                         tied_embeddings=tied)
        out.name = f"qwen3-{model[1].lower()}"
        out.mapped("model.name/flavor", shown, f"torchtitan's shape: {layers} layers, hidden {dim}, {heads} heads "
                   f"(8 KV), ffn {ffn}, tied_embeddings {str(tied).lower()}")
        return
    if model not in FLAVORS:
        supported = ", ".join(f"{n} {f}" for n, f in FLAVORS)
        out.lines.append(f"torchtitan: model.name/flavor {shown} gives no model keys (the catalog has the shapes "
                         f"of {supported}): --from hf:config.json before this file or --model gives it")
        return
    keys = {k: v for k, v in read_catalog("models")[FLAVORS[model]].items() if k != "source"}
    out.model.update(keys)
    out.name = FLAVORS[model]
    out.mapped("model.name/flavor", shown, f"the catalog's {FLAVORS[model]} (its shape: "
               f"{keys['num_layers']} layers, hidden {keys['hidden_size']})")


def _training(out: Imported, flat: dict) -> None:
    p = out.plan
    seq = _get(out, flat, "training.seq_len", 2048)
    p["seq"] = seq
    out.mapped("training.seq_len", seq, f"seq {seq}")
    if flat.get("training.enable_cpu_offload"):
        out.refuse("training.enable_cpu_offload", True, "false (FSDP2's CPU offloading is not modelled)")
    for key, target in (("training.mixed_precision_param", "compute_dtype"),
                        ("training.mixed_precision_reduce", "grad_dtype")):
        dtype = flat.get(key, "bfloat16" if target == "compute_dtype" else "float32")
        if dtype not in DTYPES:
            out.refuse(key, dtype, " or ".join(DTYPES))
            continue
        p[target] = DTYPES[dtype]
        out.mapped(key, dtype + ("" if key in flat else " (torchtitan's default)"), f"{target} {DTYPES[dtype]}")


def _batch(out: Imported, flat: dict, pp: int, dp) -> None:
    """mbs and gbs: the local batch is one microbatch without a pipeline, pipeline_parallel_microbatch_size
    with one; global_batch_size -1 is the local batch times dp (no accumulation, train.py)."""
    local = _get(out, flat, "training.local_batch_size", 8)
    micro = _get(out, flat, "parallelism.pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    out.plan["mbs"] = micro
    out.mapped("training.local_batch_size" if pp == 1 else "parallelism.pipeline_parallel_microbatch_size",
               micro, f"mbs {micro}")
    total = _get(out, flat, "training.global_batch_size", -1)
    if total > 0:
        out.plan["gbs"] = total
        out.mapped("training.global_batch_size", total, f"gbs {total}")
    elif isinstance(dp, int):
        out.plan["gbs"] = local * dp
        out.mapped("training.global_batch_size", total, f"gbs {local * dp} (local_batch_size {local} x dp {dp})")
    elif local != micro:
        out.refuse("training.global_batch_size", total, "a size, or data-parallel degrees that are not -1, under a "
                   "pipeline (the global batch is local_batch_size x dp)")
    else:
        out.lines.append(f"torchtitan: training.global_batch_size {total} -> gbs mbs x dp (no accumulation)")


def _parallelism(out: Imported, flat: dict) -> None:
    p = out.plan
    for key, degree in DEGREES.items():
        value = _get(out, flat, f"parallelism.{key}", 1)
        if value < 1:
            out.refuse(f"parallelism.{key}", value, "an integer >= 1")
            continue
        p[degree] = value
        out.mapped(f"parallelism.{key}", value, f"{degree} {value}")
    if p.get("ep", 1) > 1:
        p["etp"] = _get(out, flat, "parallelism.expert_tensor_parallel_degree", 1)
        out.mapped("parallelism.expert_tensor_parallel_degree", p["etp"], f"etp {p['etp']}")
    if p.get("tp", 1) > 1:
        p["sequence_parallel"] = True
        out.lines.append("torchtitan: tensor_parallel_degree > 1 -> sequence_parallel true (torchtitan's "
                         "SequenceParallel norms)")
        if flat.get("parallelism.enable_async_tensor_parallel"):
            p["tp_overlap"] = True
            out.mapped("parallelism.enable_async_tensor_parallel", True, "tp_overlap true")
    for key in ("parallelism.pipeline_parallel_schedule_csv", "parallelism.module_fqns_per_model_part"):
        if flat.get(key):
            out.refuse(key, flat[key], "unset (a custom schedule or split is not modelled)")
    _data_parallel(out, flat)
    _schedule(out, flat)


def _data_parallel(out: Imported, flat: dict) -> None:
    p = out.plan
    replicate = _get(out, flat, "parallelism.data_parallel_replicate_degree", 1)
    shard = _get(out, flat, "parallelism.data_parallel_shard_degree", -1)
    if replicate > 1 and shard != 1:
        out.refuse("parallelism.data_parallel_replicate_degree", replicate, "1 where data_parallel_shard_degree is "
                   f"{shard} (HSDP, sharded within replica groups, is not modelled)")
        _batch(out, flat, p.get("pp", 1), None)
        return
    if shard == 1:
        p["zero"] = 0
        dp = replicate
        out.mapped("parallelism.data_parallel_replicate_degree", replicate, f"dp {replicate}, zero 0 (DDP)")
    else:
        policy = flat.get("parallelism.fsdp_reshard_after_forward", "default")
        keep = policy == "never" or (policy == "default" and p.get("pp", 1) > 1)
        if policy not in ("default", "always", "never"):
            out.refuse("parallelism.fsdp_reshard_after_forward", policy, "default, always or never")
        p["zero"] = 2 if keep else 3
        if "parallelism.data_parallel_replicate_degree" in flat:
            out.ignored("parallelism.data_parallel_replicate_degree", replicate, "1: FSDP alone, no replica groups")
        dp = shard if shard > 0 else "auto"
        out.mapped("parallelism.data_parallel_shard_degree", shard,
                   f"dp {dp}{' (the ranks left)' if shard < 0 else ''}, zero {p['zero']} (FSDP2, "
                   f"reshard_after_forward {policy}: parameters {'kept' if keep else 'gathered again'} for the "
                   "backward)")
    if dp != "auto":
        p["dp"] = dp
    _batch(out, flat, p.get("pp", 1), dp if dp != "auto" else None)


def _schedule(out: Imported, flat: dict) -> None:
    name = flat.get("parallelism.pipeline_parallel_schedule", "1F1B")
    if out.plan.get("pp", 1) == 1:
        if "parallelism.pipeline_parallel_schedule" in flat:
            out.ignored("parallelism.pipeline_parallel_schedule", name, "pipeline_parallel_degree 1")
        return
    if name not in SCHEDULES:
        out.refuse("parallelism.pipeline_parallel_schedule", name, " or ".join(SCHEDULES))
        return
    schedule = SCHEDULES[name]
    if schedule == "interleaved":
        per_stage = flat.get("parallelism.pipeline_parallel_layers_per_stage")
        layers, pp = out.model.get("num_layers"), out.plan["pp"]
        if per_stage is None:
            virtual = 2
        elif layers:            # pipeline_parallel.py: ceil((layers + first + last weights) / per_stage) stages
            weights = flat.get("parallelism.pipeline_parallel_first_stage_less_layers", 1) + \
                flat.get("parallelism.pipeline_parallel_last_stage_less_layers", 1)
            virtual = -(-(layers + weights) // per_stage) // pp
        else:
            out.refuse("parallelism.pipeline_parallel_layers_per_stage", per_stage, "unset where the model's "
                       "layers are not known (a flavor the catalog has)")
            return
        schedule = f"interleaved:{virtual}"
    out.plan["schedule"] = schedule
    out.mapped("parallelism.pipeline_parallel_schedule", name, f"schedule {schedule}")


def _recompute(out: Imported, flat: dict) -> None:
    mode = flat.get("activation_checkpoint.mode", "selective")
    option = str(flat.get("activation_checkpoint.selective_ac_option", "2"))
    key = "activation_checkpoint.mode" + ("" if "activation_checkpoint.mode" in flat else " (torchtitan's default)")
    if mode in ("none", "full"):
        out.plan["recompute"] = mode
        out.mapped(key, mode, f"recompute {mode}")
    elif mode == "selective" and option == "op":
        out.plan["recompute"] = "selective"
        out.mapped(f"{key} selective_ac_option", "op", "recompute selective (torchtitan's op policy)")
    elif mode == "selective" and option == "1":
        out.plan["recompute"] = "full"
        out.mapped(f"{key} selective_ac_option", "1", "recompute full (every layer)")
    elif mode == "selective":
        out.refuse("activation_checkpoint.selective_ac_option", option + ("" if "activation_checkpoint.selective_ac_"
                   "option" in flat else " (torchtitan's default)"), "op or 1 (every N-th layer recomputed is not "
                   "modelled): set [activation_checkpoint] mode and selective_ac_option")
    else:
        out.refuse("activation_checkpoint.mode", mode, "none, full or selective")


def _converters(out: Imported, flat: dict) -> None:
    names = flat.get("model.converters", [])
    names = names.split(",") if isinstance(names, str) else names
    kinds = [CONVERTERS.get(n.strip()) for n in names if n.strip()]
    for name, kind in zip(names, kinds):
        if kind is None:
            out.refuse("model.converters", name, "float8, mx (quantize.linear.float8, quantize.linear.mx)")
    if "float8" in kinds:
        recipe = flat.get("float8.recipe_name")
        if recipe not in FLOAT8_RECIPES:
            out.refuse("float8.recipe_name", recipe, "tensorwise (rowwise scaling is not modelled)")
            return
        out.plan["precision"] = FLOAT8_RECIPES[recipe]
        out.mapped("model.converters float8 recipe_name", recipe or "tensorwise (default)",
                   f"precision {FLOAT8_RECIPES[recipe]}")
        if flat.get("float8.enable_fsdp_float8_all_gather"):
            out.policy.append("fp8-param-gather")
            out.mapped("float8.enable_fsdp_float8_all_gather", True, "policy fp8-param-gather (FSDP2 gathers FP8)")
    elif "mx" in kinds:
        recipe = flat.get("mx.recipe_name", "mxfp8_cublas")
        if recipe not in MX_RECIPES:
            out.refuse("mx.recipe_name", recipe, " or ".join(MX_RECIPES))
            return
        out.plan["precision"] = "mxfp8"
        out.mapped("model.converters mx recipe_name", recipe, "precision mxfp8")
    for key in ("float8.recipe_name", "float8.enable_fsdp_float8_all_gather", "mx.recipe_name"):
        if key in flat and key.split(".")[0] not in kinds:
            out.ignored(key, flat[key], "its converter is not in model.converters")


__all__ = ["FLAVORS", "flatten", "from_config", "load"]
