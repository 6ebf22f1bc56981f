"""A Hugging Face ``config.json`` as a model file (``perfmodel --from hf:config.json``).

The field names are those of transformers' configuration classes (huggingface/transformers,
src/transformers/models/FAMILY/configuration_FAMILY.py: ``LlamaConfig``, ``MistralConfig``,
``MixtralConfig``, ``Qwen2Config``, ``Qwen3Config``, ``Qwen3MoeConfig``, ``DeepseekV2Config``,
``DeepseekV3Config`` (read @ 001f85b38f: its ``__init__`` keywords), ``GptOssConfig``), and of the hub's
config.json files they load (DeepSeek's ``moe_layer_freq`` and ``num_nextn_predict_layers`` come from
deepseek-ai's own configuration_deepseek.py; transformers v5 saves ``rope_scaling`` as
``rope_parameters``), picked by ``model_type``. Every key is mapped onto a model-file
key (``perfmodel.workload``), ignored with its reason (initializer_range: no effect on the time), or
refused naming what is supported. The shared ones:

* ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (absent:
  multi-head), ``intermediate_size``, ``vocab_size``, ``head_dim``, ``tie_word_embeddings``;
  ``hidden_act`` silu -> a gated MLP (swiglu: every family here gates it); ``rms_norm_eps`` -> rmsnorm;
* the sequence: ``rope_scaling.original_max_position_embeddings`` (the pre-training context, Llama
  3.1's 8192 and DeepSeek-V3's 4096 under their context extension; the scaling itself is ignored, with a
  note), else GPT-OSS's ``initial_context_length``, else ``max_position_embeddings`` (``--seq`` changes it);
* windows: ``sliding_window`` with ``layer_types`` (GPT-OSS: sliding and full alternate ->
  ``window_attn_skip_freq`` 2) or on every layer (Mistral 7B); Qwen's ``use_sliding_window`` false
  leaves it unused;
* experts: Mixtral ``num_local_experts`` / ``num_experts_per_tok``; Qwen3-MoE ``num_experts``,
  ``moe_intermediate_size``, ``decoder_sparse_step`` 1 and ``mlp_only_layers`` (the first layers);
  DeepSeek ``n_routed_experts``, ``n_shared_experts``, ``moe_intermediate_size``,
  ``first_k_dense_replace``, ``moe_layer_freq``; GPT-OSS ``num_local_experts``, ``experts_per_token``;
* MLA (DeepSeek-V2/V3): ``q_lora_rank`` (null: a plain query), ``kv_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``; ``num_nextn_predict_layers`` -> ``mtp_layers``.

Biases (Qwen2's q/k/v, GPT-OSS's attention and experts) are left out as the catalog's models leave them
(under 0.1% of the parameters); the routers' scoring and losses are ignored (routing is balanced unless
``--routing`` says otherwise).
"""
from __future__ import annotations

import json
from pathlib import Path

from perfmodel.importers.common import Imported, show, read_text
from topologies.errors import InputError

FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
MLA_FAMILIES = ("deepseek_v2", "deepseek_v3")
# key -> model-file key, copied as they are
DIRECT = {"hidden_size": "hidden_size", "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
          "intermediate_size": "ffn_hidden_size", "vocab_size": "vocab_size",
          "tie_word_embeddings": "tied_embeddings"}
MLA = {"kv_lora_rank": "kv_lora_rank", "qk_nope_head_dim": "qk_nope_head_dim",
       "qk_rope_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim",
       "num_nextn_predict_layers": "mtp_layers"}
# family -> {key: model-file key} of its experts
EXPERTS = {"mixtral": {"num_local_experts": "num_experts", "num_experts_per_tok": "moe_top_k"},
           "qwen3_moe": {"num_experts": "num_experts", "num_experts_per_tok": "moe_top_k",
                         "moe_intermediate_size": "moe_ffn_hidden_size"},
           "deepseek_v2": {"n_routed_experts": "num_experts", "num_experts_per_tok": "moe_top_k",
                           "n_shared_experts": "moe_shared_experts", "moe_intermediate_size": "moe_ffn_hidden_size",
                           "first_k_dense_replace": "moe_first_dense", "moe_layer_freq": "moe_layer_freq"},
           "gpt_oss": {"num_local_experts": "num_experts", "experts_per_token": "moe_top_k",
                       "num_experts_per_tok": "moe_top_k"}}
EXPERTS["deepseek_v3"] = EXPERTS["deepseek_v2"]
METADATA = ("architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
            "auto_map", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "pretraining_tp",
            "_commit_hash", "tokenizer_class", "output_attentions", "output_hidden_states", "return_dict")
ROUTING = ("router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "norm_topk_prob",
           "aux_loss_alpha", "seq_aux", "scoring_func", "topk_method", "n_group", "topk_group",
           "routed_scaling_factor", "ep_size")
IGNORED = {**{k: "metadata" for k in METADATA},
           **{k: "the router's scoring and loss: routing is balanced unless --routing says otherwise"
              for k in ROUTING},
           "initializer_range": "initialisation: " + "no effect on the step time",
           "rope_theta": "rope: the positions' rotation, no effect on the step time",
           "rope_parameters": "rope: the positions' rotation, no effect on the step time",
           "partial_rotary_factor": "rope: the positions' rotation, no effect on the step time",
           "rope_interleave": "rope: the positions' rotation, no effect on the step time",
           "attention_dropout": "dropout: elementwise, inside the fused attention kernel",
           "hidden_dropout": "dropout: elementwise, inside the fused kernels",
           "rms_norm_eps": "numerics; the norm is rmsnorm",
           "attention_bias": "biases: under 0.1% of the parameters, left out as the catalog's models do",
           "mlp_bias": "biases: under 0.1% of the parameters, left out as the catalog's models do",
           "swiglu_limit": "a clamp inside SwiGLU: elementwise, fused",
           "quantization_config": "the checkpoint's storage format; the GEMMs' precision is --precision",
           "max_window_layers": "used only with use_sliding_window true",
           "use_sliding_window": "the window is unused"}


def load(path: str) -> Imported:
    """The model-file keys of the config.json at ``path`` and a line per key (module doc)."""
    text = read_text("hf", path)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError("hf", path, f"a config.json (valid JSON: {err})") from None
    if not isinstance(cfg, dict):
        raise InputError("hf", path, "a config.json (a JSON object)")
    where = Path(path).resolve()
    return from_config(cfg, where.parent.name if where.name == "config.json" else where.stem).check(path)


def from_config(cfg: dict, name: str = "hf-model") -> Imported:
    """An Imported of the config dict ``cfg`` (refusals collected, not raised: ``Imported.check``)."""
    out = Imported("hf", name=name or "hf-model")
    family = cfg.get("model_type")
    if family not in FAMILIES:
        out.refuse("model_type", family, "one of " + ", ".join(FAMILIES))
        return out
    out.mapped("model_type", family, "rmsnorm, a gated (swiglu) MLP, no biases")
    out.model.update(norm="rmsnorm", activation="swiglu", tied_embeddings=False)
    if family in MLA_FAMILIES:
        out.model.update(attention="mla", q_lora_rank=0)
    experts = EXPERTS.get(family, {})
    for key, value in cfg.items():
        if key in ("model_type", "rope_scaling", "max_position_embeddings", "initial_context_length",
                   "max_sequence_length", "num_key_value_heads"):
            continue
        _one(out, cfg, family, experts, key, value)
    _sequence(out, cfg)
    _kv_heads(out, cfg, family)
    if family in ("mixtral", "gpt_oss") and "num_experts" in out.model:
        out.model["moe_ffn_hidden_size"] = out.model["ffn_hidden_size"]
        out.lines.append(f"hf: intermediate_size {cfg.get('intermediate_size')} -> moe_ffn_hidden_size (every "
                         "layer's experts)")
    return out


def _one(out: Imported, cfg: dict, family: str, experts: dict, key: str, value) -> None:
    if key in DIRECT:
        out.model[DIRECT[key]] = value
        out.mapped(key, value, f"{DIRECT[key]} {show(value)}")
    elif key in experts:
        _expert_key(out, cfg, key, value, experts[key])
    elif key in MLA and family in MLA_FAMILIES:
        out.model[MLA[key]] = value
        out.mapped(key, value, f"{MLA[key]} {value}")
    elif key == "q_lora_rank" and family in MLA_FAMILIES:
        out.model["q_lora_rank"] = value or 0
        out.mapped(key, value, "q_lora_rank" + ("" if value else " 0 (a plain query projection)"))
    elif key == "head_dim":
        _head_dim(out, cfg, value)
    elif key == "hidden_act":
        if value not in ("silu", "swish"):
            out.refuse(key, value, "silu (the families here gate their MLP with it)")
        else:
            out.mapped(key, value, "activation swiglu")
    elif key in ("sliding_window", "layer_types"):
        _window(out, cfg, key, value)
    elif key in ("decoder_sparse_step", "mlp_only_layers") and family == "qwen3_moe":
        _qwen_sparse(out, cfg, key, value)
    elif key == "use_sliding_window" and value:
        out.refuse(key, value, "false (Qwen's windowed layers above max_window_layers are not modelled)")
    elif key in IGNORED:
        out.ignored(key, value, IGNORED[key])
    else:
        out.refuse(key, value, f"not a key of {family}'s config.json that this importer maps or ignores "
                   "(perfmodel.importers.hf lists them)")


def _expert_key(out: Imported, cfg: dict, key: str, value, target: str) -> None:
    if target == "moe_layer_freq" and (type(value) is not int or value < 1):
        out.refuse(key, value, "an integer >= 1")
        return
    if target == "moe_layer_freq" and value != 1 and cfg.get("first_k_dense_replace", 0) % value:
        out.refuse(key, value, "1, or a divisor of first_k_dense_replace (HF counts MoE layers from layer 0, "
                   "commpress from the first MoE one)")
        return
    out.model[target] = value
    out.mapped(key, value, f"{target} {value}")


def _head_dim(out: Imported, cfg: dict, value) -> None:
    if value is None or (type(value) is int and value * cfg.get("num_attention_heads", 0) == cfg.get("hidden_size")):
        out.ignored("head_dim", value, "hidden_size / num_attention_heads already")
    else:
        out.model["head_dim"] = value
        out.mapped("head_dim", value, f"head_dim {value}")


def _kv_heads(out: Imported, cfg: dict, family: str) -> None:
    value = cfg.get("num_key_value_heads", cfg.get("num_attention_heads"))
    if "num_key_value_heads" not in cfg:
        out.lines.append(f"hf: num_key_value_heads absent -> num_kv_heads {value} (multi-head)")
    elif family in MLA_FAMILIES:
        value = cfg.get("num_attention_heads")
        out.mapped("num_key_value_heads", cfg["num_key_value_heads"], f"num_kv_heads {value} (MLA: every head "
                   "its own keys and values)")
    else:
        out.mapped("num_key_value_heads", value, f"num_kv_heads {value}")
    if value is not None:
        out.model["num_kv_heads"] = value


def _sequence(out: Imported, cfg: dict) -> None:
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}   # rope_parameters: transformers v5
    if not isinstance(scaling, dict):
        out.refuse("rope_scaling", scaling, "an object or null")
        return
    if "original_max_position_embeddings" in scaling:
        seq, why = scaling["original_max_position_embeddings"], "rope_scaling.original_max_position_embeddings"
    elif "initial_context_length" in cfg:
        seq, why = cfg["initial_context_length"], "initial_context_length"
    elif "max_sequence_length" in cfg:              # LLaMA 1's early HF conversions
        seq, why = cfg["max_sequence_length"], "max_sequence_length"
    else:
        seq, why = cfg.get("max_position_embeddings"), "max_position_embeddings"
    if seq is None:
        out.refuse("max_position_embeddings", None, "the model's context (or give --seq)")
        return
    out.model["seq_len"] = seq
    out.mapped(why, seq, f"seq_len {seq} (the pre-training context; --seq sets the job's)")
    if scaling and "rope_parameters" not in cfg:
        out.ignored("rope_scaling", scaling.get("rope_type", scaling.get("type", "")),
                    f"the context extension to max_position_embeddings {cfg.get('max_position_embeddings')}: "
                    "rope's positions, no effect on the step time")
    elif "rope_scaling" in cfg and not cfg["rope_scaling"]:
        out.ignored("rope_scaling", cfg["rope_scaling"], "no context extension")
    for key in ("initial_context_length", "max_sequence_length", "max_position_embeddings"):
        if key in cfg and key != why:
            out.ignored(key, cfg[key], f"{why} is the pre-training context" + (
                "; this one is the extended context" if key == "max_position_embeddings" else ""))


def _window(out: Imported, cfg: dict, key: str, value) -> None:
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or not window:
        out.ignored(key, value, "no window in use")
        return
    if key == "sliding_window":
        out.model["sliding_window"] = value
        out.mapped(key, value, f"sliding_window {value}")
        return
    if not isinstance(value, list):
        out.refuse(key, value, "a list of sliding_attention and full_attention, a layer each")
        return
    sliding = [t == "sliding_attention" for t in value]
    full = [i for i, s in enumerate(sliding) if not s]
    freq = full[0] + 1 if full else 0
    if set(value) - {"sliding_attention", "full_attention"} or (
            full and full != list(range(freq - 1, len(value), freq))):
        out.refuse(key, value, "sliding_attention everywhere, or full_attention every N-th layer (1-based)")
        return
    if freq:
        out.model["window_attn_skip_freq"] = freq
    out.mapped(key, f"{len(full)} full of {len(value)}", f"window_attn_skip_freq {freq}")


def _qwen_sparse(out: Imported, cfg: dict, key: str, value) -> None:
    if key == "decoder_sparse_step":
        if value != 1:
            out.refuse(key, value, "1 (every layer MoE but mlp_only_layers)")
        else:
            out.mapped(key, value, "moe_layer_freq 1")
        return
    if not isinstance(value, list) or value != list(range(len(value))):
        out.refuse(key, value, "[] or the first layers [0, 1, ..., k-1] (dense layers elsewhere are not modelled)")
        return
    if value:
        out.model["moe_first_dense"] = len(value)
    out.mapped(key, value, f"moe_first_dense {len(value)}")
