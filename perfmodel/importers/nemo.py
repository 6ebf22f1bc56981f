"""A Megatron-Bridge ``run_config.yaml`` or a NeMo 1 YAML as a model and a plan
(``perfmodel --from nemo:config.yaml``).

Both name Megatron-Core's settings with underscores where Megatron-LM's flags have dashes, so each key
is turned into its flag (``model.tensor_model_parallel_size 8`` -> ``--tensor-model-parallel-size 8``;
``RENAMED`` where the names differ) and mapped by ``perfmodel.importers.megatron`` (its list of mapped and
ignored flags holds), the lines naming the YAML's keys.

* Megatron-Bridge: the ``ConfigContainer`` that ``to_yaml`` dumps (NVIDIA-NeMo/Megatron-Bridge v0.2.0,
  7af9601c9d, src/megatron/bridge/training/config.py line 1109; utils/config_utils.py line 185,
  ``yaml.safe_dump``): ``model.*`` (the GPT provider's TransformerConfig fields: ``num_layers``,
  ``hidden_size``, ``ffn_hidden_size``, ``num_attention_heads``, ``num_query_groups``, ``seq_length``, the
  degrees, ``sequence_parallel``, ``num_moe_experts``, ``moe_*``, ``recompute_*``, ``fp8`` ...),
  ``train.micro_batch_size`` / ``global_batch_size``, ``ddp.*`` (``overlap_grad_reduce``,
  ``use_distributed_optimizer``, ``grad_reduce_in_fp32``, ``bucket_size``, ...), ``dist.use_megatron_fsdp``,
  ``comm_overlap.tp_comm_overlap``, ``mixed_precision`` (a recipe's name, mixed_precision.py: bf16_mixed,
  bf16_with_fp8_current_scaling_mixed ..., or its fields);
* NeMo 1: ``examples/nlp/language_modeling/conf/megatron_gpt_config.yaml`` (NVIDIA/NeMo @ 8cfedd7203):
  ``model.*`` (``encoder_seq_length``, ``activation``, ``activations_checkpoint_*``, ``optim.name``
  distributed_fused_adam ...), ``trainer.precision``, ``trainer.devices`` x ``trainer.num_nodes`` (gpus);
  the other decoder-only configs beside it (Llama, Qwen2, Gemma, ChatGLM, Baichuan2, StarCoder):
  ``override_vocab_size`` (the vocabulary unpadded, as NeMo takes it), GeGLU and ReGLU priced as SwiGLU
  (a gated unit's three GEMMs), ``qkv_bias`` and ``apply_embedding_scaling`` ignored.

A key that is off (null, false, empty) is ignored as such; sections with no effect on a step's time
(optimizer, scheduler, dataset, logger, tokenizer, checkpoint, profiling, rng, exp_manager, ...) are
ignored with their reason; any other key is refused as Megatron's unknown flags are. Reading YAML needs
PyYAML (``import yaml``).
"""
from __future__ import annotations

import re
from pathlib import Path

from perfmodel.importers.common import NO_TIME, Imported, read_text
from perfmodel.importers.megatron import from_args
from topologies.errors import InputError

# section -> why it does not change the step's time
IGNORED_SECTIONS = {
    **dict.fromkeys(("rng", "rerun_state_machine", "logger", "profiling", "straggler", "nvrx_straggler", "ft",
                     "tensor_inspect", "inprocess_restart", "exp_manager", "name", "defaults", "s3_checkpointing",
                     "checkpoint", "tokenizer", "dataset", "restore_from_path"),
                    "logging, checkpoints, data and the run's housekeeping: " + NO_TIME),
    **dict.fromkeys(("optimizer", "scheduler"), "the optimizer's and learning rate's settings: " + NO_TIME)}
# key prefix -> why it is ignored: keys without a Megatron-LM flag (the others go to its mapping)
IGNORED = {
    **dict.fromkeys(("model._target_", "model.generation_config", "model.hf_model_id", "model.restore_from",
                     "model.mcore_gpt", "model.skip_train", "model.resume_from_checkpoint", "model.nemo_",
                     "model.nsys_profile", "model.data", "model.tokenizer", "model.transformer_engine",
                     "model.use_te_", "model.use_transformer_engine", "model.precision", "model.pre_process",
                     "model.post_process", "model.vocab_file", "model.merges_file", "ddp._target_",
                     "train._target_", "mixed_precision._target_", "model.perform_initialization",
                     "model.use_cpu_initialization", "model.timers", "model.finalize_model_grads_func",
                     "model.no_sync_func", "model.grad_sync_func", "model.param_sync_func", "model.init_model_with",
                     "model.parallel_output", "model.megatron_amp_O2", "model.deterministic_mode", "model.gc_",
                     "dist.", "comm_overlap.", "train.train_", "train.eval_", "train.exit_", "train.manual_gc",
                     "train.check_", "trainer.", "model.seed", "model.sync_batch_comm", "model.batch_p2p",
                     "model.overlap_p2p_comm", "model.barrier_with_L1_time", "model.deallocate_pipeline_outputs",
                     "model.variable_seq_lengths", "model.microbatch_group_size", "model.bias_dropout_add_fusion",
                     "ddp.check_for_", "ddp.average_in_collective", "ddp.num_distributed_optimizer_instances",
                     "ddp.align_param_gather", "ddp.use_custom_fsdp", "ddp.preserve_fp32_weights",
                     "ddp.keep_fp8_transpose_cache", "ddp.nccl_ub", "ddp.fsdp_double_buffer", "ddp.pad_buckets",
                     "ddp.reduce_scatter_with_fp32_accumulation"),
                    "the framework's wiring and the host's housekeeping: " + NO_TIME),
    **dict.fromkeys(("model.output_layer_init_method", "model.use_scaled_init_method", "model.layernorm_epsilon",
                     "model.layernorm_zero_centered_gamma", "model.ffn_dropout", "model.seq_len_interpolation_factor",
                     "model.normalize_attention_scores", "model.scale_positional_embedding", "model.params_dtype",
                     "model.pipeline_dtype", "model.autocast_dtype", "model.fp32_residual_connection",
                     "model.fp8_wgrad", "model.first_last_layers_bf16", "model.num_layers_at_", "model.openai_gelu",
                     "model.fp16_lm_cross_entropy", "model.bias_activation_fusion", "model.masked_softmax_fusion",
                     "model.persist_layer_norm", "model.gradient_accumulation_fusion", "model.apply_rope_fusion",
                     "model.bias_dropout_fusion", "model.memory_efficient_layer_norm", "model.headscale",
                     "model.transformer_block_type", "model.attention_type", "model.do_layer_norm_weight_decay",
                     "model.reset_lr", "model.drop_layers", "mixed_precision.params_dtype",
                     "mixed_precision.pipeline_dtype", "mixed_precision.autocast", "mixed_precision.first_last",
                     "mixed_precision.num_layers_at", "mixed_precision.fp8_wgrad"),
                    "numerics, initialisation, dtypes of storage and fusions: elementwise, " + NO_TIME),
    **dict.fromkeys(("model.native_amp_", "model.grad_allreduce_chunk_size_mb", "model.grad_div_ar_fusion",
                     "model.get_attention_mask_from_fusion", "model.apex_transformer_log_level",
                     "model.gradient_as_bucket_view", "model.megatron_timer_kwargs", "model.reduce_amax",
                     "model.fp8_e4m3", "model.fp8_hybrid", "model.use_emha", "model.ub_tp_comm_overlap_cfg",
                     "model.fsdp_", "model.cpu_offloading_num_layers", "model.cpu_offloading_activations",
                     "model.cpu_offloading_weights"),
                    "NeMo 1's numerics, logging and settings used only beside another key (fp8, fsdp, "
                    "cpu_offloading): " + NO_TIME),
    "model.activation_func": "the gated unit's function: priced as SwiGLU with gated_linear_unit, GeLU without",
    "model.apply_embedding_scaling": "the embeddings scaled by sqrt(hidden) (Gemma): elementwise, " + NO_TIME,
    "model.qkv_bias": "the query, key and value biases: under 0.1% of the parameters, left out as the catalog's "
                      "models leave them"}
# a YAML key -> the Megatron-LM flag(s) it means (a value: the flag takes it; None: the flag alone)
RENAMED = {"num_moe_experts": "--num-experts", "encoder_seq_length": "--seq-length", "fp8": "--fp8-format",
           "fp4": "--fp4-format", "bucket_size": "--ddp-bucket-size", "fp8_param": "--fp8-param-gather",
           "fp8_params": "--fp8-param-gather", "fp8_param_gather": "--fp8-param-gather",
           "activations_checkpoint_granularity": "--recompute-granularity",
           "activations_checkpoint_method": "--recompute-method",
           "activations_checkpoint_num_layers": "--recompute-num-layers",
           "fp8_dot_product_attention": "--fp8-dot-product-attention", "use_megatron_fsdp": "--use-megatron-fsdp",
           "use_torch_fsdp2": "--use-torch-fsdp2", "tp_comm_overlap": "--tp-comm-overlap",
           "bias": "--add-bias-linear"}
# Megatron-Bridge's mixed_precision recipes (mixed_precision.py @ v0.2.0) -> their flags
RECIPES = {"bf16_mixed": ["--bf16"], "fp16_mixed": ["--fp16"],
           "bf16_with_fp8_delayed_scaling_mixed": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "delayed"],
           "bf16_with_fp8_current_scaling_mixed": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
           "bf16_with_fp8_subchannel_scaling_mixed": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
           "bf16_with_mxfp8_mixed": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
           "bf16_with_nvfp4_mixed": ["--bf16", "--fp4-format", "e2m1"]}
# the gated units (GeGLU, ReGLU) have SwiGLU's three GEMMs: priced as it (the function itself is elementwise)
NEMO1_ACTIVATIONS = {"gelu": [], "swiglu": ["--swiglu"], "fast-swiglu": ["--swiglu"],
                     "squared-relu": ["--squared-relu"], "geglu": ["--swiglu"], "fast-geglu": ["--swiglu"],
                     "reglu": ["--swiglu"], "fast-reglu": ["--swiglu"]}
PRECISIONS = {"bf16": "--bf16", "bf16-mixed": "--bf16", "16": "--fp16", "16-mixed": "--fp16", "32": None}
# keys whose meaning is not their name's flag (``_special``): a line shows the flags they give
SPECIAL = ("mixed_precision", "model.activation", "trainer.precision", "model.num_query_groups",
           "model.gated_linear_unit", "model.normalization", "model.optim.name", "model.optim.overlap_grad_sync",
           "model.share_embeddings_and_output_weights", "ddp.grad_reduce_in_fp32",
           "mixed_precision.grad_reduce_in_fp32",
           "model.tokenizer", "model.fp8", "model.cpu_offloading", "model.fsdp")
TOKENIZERS = {"GPT2BPETokenizer": "gpt2-vocab.json"}     # NeMo 1's tokenizer.type -> Megatron's known vocabulary file
READ = ("model", "train", "ddp", "dist", "comm_overlap", "mixed_precision", "trainer", "peft")


def load(path: str) -> Imported:
    """The model keys, plan keywords and lines of a Megatron-Bridge run_config.yaml or NeMo 1 YAML at
    ``path`` (module doc)."""
    try:
        import yaml
    except ImportError:
        raise InputError("nemo", path, "PyYAML installed (pip install pyyaml): nemo: reads YAML with it") from None
    try:
        cfg = yaml.safe_load(read_text("nemo", path))
    except yaml.YAMLError as err:
        raise InputError("nemo", path, f"a NeMo or Megatron-Bridge config (valid YAML: {' '.join(str(err).split())})") \
            from None
    if not isinstance(cfg, dict):
        raise InputError("nemo", path, "a NeMo or Megatron-Bridge config (a YAML mapping)")
    return from_config(cfg, Path(path).stem).check(path)


def flatten(cfg: dict) -> dict:
    """{"section.key": value} of the sections read (NeMo 1's ``model.optim`` kept apart), a
    ``{_target_: X}`` value as X (Megatron-Bridge dumps functions and dtypes so)."""
    flat = {}
    for section, keys in cfg.items():
        if not isinstance(keys, dict):
            flat[section] = keys
            continue
        for key, value in keys.items():
            if isinstance(value, dict) and "_target_" in value:
                value = value["_target_"]
            if key == "optim" and isinstance(value, dict):
                flat.update({f"{section}.optim.{k}": v for k, v in value.items()})
            else:
                flat[f"{section}.{key}"] = value
    return flat


def from_config(cfg: dict, name: str = "nemo-model") -> Imported:
    """An Imported of a NeMo / Megatron-Bridge config dict (refusals collected: ``Imported.check``)."""
    flat, out, words, keys = flatten(cfg), Imported("nemo", name=name), [], {}
    for key, value in flat.items():
        section = key.split(".")[0]
        if section in IGNORED_SECTIONS:
            out.ignored(key, _shown(value), IGNORED_SECTIONS[section])
        elif section not in READ:
            out.refuse(key, _shown(value), "a section of Megatron-Bridge's ConfigContainer or NeMo 1's config "
                       "(perfmodel.importers.nemo lists them)")
        else:
            _key(out, flat, key, value, words, keys)
    if out.refused:
        return out
    megatron = from_args(words, name)
    out.model, out.plan, out.defaults, out.policy = megatron.model, megatron.plan, megatron.defaults, megatron.policy
    out.lines += [_renamed(line, keys) for line in megatron.lines]
    out.refused += [_renamed(line, keys) for line in megatron.refused]
    _nemo1_gpus(out, flat)
    _override_vocab(out, flat)
    if "train" in cfg:
        out.plan["framework"] = "nemo"
        out.lines.append("nemo: train (a Megatron-Bridge ConfigContainer) -> framework nemo (Megatron-Bridge on "
                         "Megatron-Core)")
    return out


def _key(out: Imported, flat: dict, key: str, value, words: list, keys: dict) -> None:
    """``key`` turned into Megatron arguments (``words``; ``keys``: flag -> the YAML key), or a line."""
    field = key.split(".")[-1]
    if key in ("trainer.devices", "trainer.num_nodes", "model.override_vocab_size"):
        return                                              # the job's GPUs (_nemo1_gpus), _override_vocab
    if key.split(".")[0] == "peft":
        if value:
            out.refuse(key, _shown(value), "null (fine-tuning adapters are not modelled)")
        else:
            out.ignored(key, value, "no adapters")
        return
    if key in SPECIAL and value is not None:
        flags = _special(out, flat, key, value)
        if flags:
            out.lines.append(f"nemo: {key} {_shown(value)} -> {' '.join(flags)}")
        words += flags
        return
    elif key.startswith("model.optim."):
        out.ignored(key, _shown(value), "the optimizer's settings: " + NO_TIME)
        return
    elif _ignored(key):
        out.ignored(key, _shown(value), _ignored(key))
        return
    elif value in (None, False, [], {}, ""):
        out.ignored(key, _shown(value), "off or unset")
        return
    else:
        flag = RENAMED.get(field, "--" + field.replace("_", "-"))
        values = [] if value is True else [str(v) for v in value] if isinstance(value, list) else [str(value)]
        flags = [flag] + values
    if flags:
        for word in flags:
            if word.startswith("--"):
                keys.setdefault(word, key)
        words += flags


def _special(out: Imported, flat: dict, key: str, value) -> list:
    """The flags of a key whose meaning is not its name's flag."""
    if key == "mixed_precision":
        name = str(value).replace("-", "_")
        if name not in RECIPES:
            out.refuse(key, value, "one of " + ", ".join(RECIPES) + " (Megatron-Bridge's recipes)")
            return []
        return RECIPES[name]
    if key == "model.activation":
        if value not in NEMO1_ACTIVATIONS:
            out.refuse(key, value, " or ".join(NEMO1_ACTIVATIONS))
            return []
        return NEMO1_ACTIVATIONS[value] or (out.ignored(key, value, "activation gelu (Megatron's default)") or [])
    if key == "trainer.precision":
        flag = PRECISIONS.get(str(value))
        if str(value) not in PRECISIONS:
            out.refuse(key, value, " or ".join(PRECISIONS))
        return [flag] if flag else []
    if key == "model.fp8":
        if value is True:               # NeMo 1: a switch, its format from fp8_hybrid / fp8_e4m3
            return ["--fp8-format", "hybrid" if flat.get("model.fp8_hybrid") else "e4m3"]
        return ["--fp8-format", str(value)] if value else []
    if key in ("model.cpu_offloading", "model.fsdp"):
        if value:
            out.refuse(key, value, "false (" + ("offloading to the CPU" if key == "model.cpu_offloading" else
                                               "NeMo 1's PyTorch FSDP") + " is not modelled)")
        else:
            out.ignored(key, value, "off")
        return []
    if key == "model.tokenizer":
        kind = value.get("type") if isinstance(value, dict) else None
        if kind not in TOKENIZERS:
            out.ignored(key, _shown(value), "the tokenizer: give model.vocab_size, or --from hf:config.json before "
                        "this file")
            return []
        return ["--vocab-file", TOKENIZERS[kind]]
    if key == "model.num_query_groups":
        return ["--group-query-attention", "--num-query-groups", str(value)]
    if key == "model.gated_linear_unit":
        return ["--swiglu"] if value else []
    if key == "model.normalization":
        return ["--normalization", "RMSNorm" if str(value).lower() == "rmsnorm" else
                "LayerNorm" if str(value).lower() == "layernorm" else str(value)]
    if key == "model.optim.name":
        out.ignored(key, value, "the optimizer: " + NO_TIME) if value != "distributed_fused_adam" else None
        return ["--use-distributed-optimizer"] if value == "distributed_fused_adam" else []
    if key == "model.optim.overlap_grad_sync":
        return ["--overlap-grad-reduce"] if value else []
    if key in ("ddp.grad_reduce_in_fp32", "mixed_precision.grad_reduce_in_fp32"):
        return [] if value else ["--grad-reduce-in-bf16"]
    return ["--untie-embeddings-and-output-weights"] if value is False else []   # share_embeddings_...


def _ignored(key: str) -> str:
    """The reason ``key`` is ignored, or "" where it is not."""
    return next((why for prefix, why in IGNORED.items() if key.startswith(prefix)), "")


def _shown(value):
    return value if not isinstance(value, (dict, list)) or len(str(value)) < 60 else f"({len(value)} entries)"


FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")


def _renamed(line: str, keys: dict) -> str:
    """A line of the Megatron mapping, naming the YAML's keys for its flags."""
    line = line.replace("megatron: ", "nemo: ", 1)
    return FLAG.sub(lambda m: keys.get(m.group(0), m.group(0)), line)


def _override_vocab(out: Imported, flat: dict) -> None:
    """NeMo 1's ``model.override_vocab_size``: the vocabulary as it is, unpadded (NeMo's megatron_gpt_model.py
    line 501 builds the model with it in place of the padded tokenizer's size)."""
    value = flat.get("model.override_vocab_size")
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        out.refuse("model.override_vocab_size", value, "an integer >= 1")
        return
    out.model["vocab_size"] = value
    out.mapped("model.override_vocab_size", value, f"vocab_size {value} (as NeMo takes it: not padded)")


def _nemo1_gpus(out: Imported, flat: dict) -> None:
    """NeMo 1's ``trainer.devices`` x ``trainer.num_nodes``: the job's GPUs."""
    devices, nodes = flat.get("trainer.devices"), flat.get("trainer.num_nodes", 1)
    if isinstance(devices, int) and isinstance(nodes, int) and devices > 0 and nodes > 0:
        out.plan["gpus"] = devices * nodes
        out.lines.append(f"nemo: trainer.devices {devices} x trainer.num_nodes {nodes} -> gpus {devices * nodes}")


__all__ = ["flatten", "from_config", "load"]
