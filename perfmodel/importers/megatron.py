"""Megatron-LM training arguments as a model and a plan (``perfmodel --from megatron:train.sh``).

The flags are Megatron-LM's at NVIDIA/Megatron-LM @ d98e8a64dd (megatron/training/arguments.py and the
config dataclasses its ``ArgumentGroupFactory`` turns into flags), read from a launch script
(``perfmodel.importers.shell``) or an argument list. Mapped:

* the model: ``--num-layers``, ``--hidden-size``, ``--ffn-hidden-size`` (absent: 4h, with ``--swiglu``
  Megatron's ``int(4h x 2/3 / 64) x 64``), ``--num-attention-heads``, ``--group-query-attention`` with
  ``--num-query-groups``, ``--kv-channels``, ``--seq-length``, ``--swiglu`` / ``--squared-relu``,
  ``--normalization``, ``--untie-embeddings-and-output-weights`` (Megatron ties them by default),
  ``--vocab-size`` padded as Megatron pads it (``--make-vocab-size-divisible-by`` x tp; GPT-2's
  ``gpt2-vocab.json`` is 50257), the experts (``--num-experts``, ``--moe-router-topk`` (default 2),
  ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``, ``--moe-layer-freq``,
  ``--moe-expert-capacity-factor``, ``--moe-pad-expert-input-to-capacity``), MLA
  (``--multi-latent-attention``, ``--q-lora-rank``, ``--kv-lora-rank``, ``--qk-head-dim``,
  ``--qk-pos-emb-head-dim``, ``--v-head-dim``), ``--mtp-num-layers``, ``--window-size``,
  ``--window-attn-skip-freq``, a hybrid model's ``--hybrid-layer-pattern`` and ``--mamba-*`` shape, GPT-OSS's
  ``--quick-geglu`` (priced as SwiGLU) and ``--softmax-type`` (its sinks left out, as the catalog does);
* the plan: every degree (``--tensor-model-parallel-size`` ... ``--expert-tensor-parallel-size``), the
  virtual pipeline (``--num-layers-per-virtual-pipeline-stage``, ``--virtual-pipeline-model-parallel-size``),
  the stages' split (``--decoder-first/last-pipeline-num-layers``,
  ``--account-for-embedding/loss-in-pipeline-split``, ``--pipeline-model-parallel-layout``),
  ``--sequence-parallel``, the batch sizes, ``--seq-length`` (the plan's too), ``--bf16`` / ``--fp16``,
  ``--fp8-format`` with ``--fp8-recipe`` (and ``--fp4-format``), ``--fp8-dot-product-attention``, recompute
  (``--recompute-granularity``, ``--recompute-method`` uniform, ``--recompute-modules``,
  ``--recompute-activations``), ``--use-distributed-optimizer`` (ZeRO-1), Megatron FSDP's sharding strategy
  and gradient dtype, ``--use-torch-fsdp2``, ``--overlap-grad-reduce`` (absent: off, Megatron's default),
  ``--tp-comm-overlap``, ``--ddp-bucket-size``, ``--grad-reduce-in-bf16``, the MoE dispatcher
  (``--moe-token-dispatcher-type``, ``--moe-flex-dispatcher-backend``, ``--moe-enable-deepep``,
  ``--overlap-moe-expert-parallel-comm``), ``--fp8-param-gather`` (the
  ``fp8-param-gather`` policy).

Flags with no effect on a step's time (logging, checkpointing, data, the optimizer's and the learning
rate's settings, initialisation, the router's scoring) are ignored and listed; any other flag is refused, and so
is a mapped flag whose value is a variable the script does not set.
"""
from __future__ import annotations

import re
from pathlib import Path

from perfmodel.importers.common import NO_TIME, UNSET_RE, Imported, bounded_eval, read_text, show
from perfmodel.importers.shell import read_script, unset_names

MODEL_INTS = {"--num-layers": "num_layers", "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
              "--num-attention-heads": "num_heads", "--seq-length": "seq_len", "--num-experts": "num_experts",
              "--moe-router-topk": "moe_top_k", "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
              "--q-lora-rank": "q_lora_rank", "--kv-lora-rank": "kv_lora_rank", "--qk-head-dim": "qk_nope_head_dim",
              "--qk-pos-emb-head-dim": "qk_rope_head_dim", "--v-head-dim": "v_head_dim",
              "--mtp-num-layers": "mtp_layers", "--window-attn-skip-freq": "window_attn_skip_freq",
              "--mamba-state-dim": "mamba_state_dim", "--mamba-head-dim": "mamba_head_dim",
              "--mamba-num-groups": "mamba_num_groups", "--mamba-num-heads": "mamba_num_heads"}
PLAN_INTS = {"--tensor-model-parallel-size": "tp", "--pipeline-model-parallel-size": "pp",
             "--context-parallel-size": "cp", "--expert-model-parallel-size": "ep",
             "--expert-tensor-parallel-size": "etp", "--micro-batch-size": "mbs", "--global-batch-size": "gbs",
             "--decoder-first-pipeline-num-layers": "first_stage_layers",
             "--decoder-last-pipeline-num-layers": "last_stage_layers"}
PLAN_FLAGS = {"--sequence-parallel": ("sequence_parallel", True), "--tp-comm-overlap": ("tp_overlap", True),
              "--fp8-dot-product-attention": ("fp8_attention", True),
              "--account-for-embedding-in-pipeline-split": ("account_for_embedding", True),
              "--account-for-loss-in-pipeline-split": ("account_for_loss", True),
              "--overlap-grad-reduce": ("dp_overlap", True), "--use-distributed-optimizer": ("zero", 1),
              "--overlap-moe-expert-parallel-comm": ("ep_overlap", "batch"),
              "--moe-enable-deepep": ("ep_kernels", "deepep"), "--grad-reduce-in-bf16": ("grad_dtype", "bf16"),
              "--bf16": ("compute_dtype", "bf16"), "--fp16": ("compute_dtype", "fp16"),
              "--use-torch-fsdp2": ("zero", 3), "--recompute-activations": ("recompute", "selective")}
# read by the mapping of another flag
USED = ("--group-query-attention", "--num-query-groups", "--kv-channels", "--swiglu", "--squared-relu",
        "--normalization", "--untie-embeddings-and-output-weights", "--vocab-size", "--make-vocab-size-divisible-by",
        "--vocab-file", "--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--multi-latent-attention",
        "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity", "--window-size",
        "--num-layers-per-virtual-pipeline-stage", "--virtual-pipeline-model-parallel-size",
        "--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout", "--fp8-format",
        "--fp8-recipe", "--fp4-format", "--fp4-recipe", "--recompute-granularity", "--recompute-method",
        "--recompute-num-layers", "--recompute-modules", "--moe-token-dispatcher-type",
        "--moe-flex-dispatcher-backend", "--ddp-bucket-size", "--fp8-param-gather", "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy", "--overlap-param-gather", "--disable-bias-linear", "--add-bias-linear",
        "--max-position-embeddings", "--tokenizer-type", "--tokenizer-model", "--hybrid-layer-pattern",
        "--quick-geglu", "--softmax-type", "--megatron-fsdp-grad-comm-dtype", "--cp-comm-type")
# flags that take no value: an unset variable after one is a word of its own (it expands to none)
SWITCHES = (*PLAN_FLAGS, "--group-query-attention", "--swiglu", "--squared-relu",
            "--untie-embeddings-and-output-weights", "--moe-pad-expert-input-to-capacity",
            "--multi-latent-attention", "--fp8-param-gather", "--use-megatron-fsdp", "--overlap-param-gather",
            "--disable-bias-linear", "--add-bias-linear", "--quick-geglu")
UNSET_WHY = {"ARITHMETIC": "a value: $((...)) of integers and + - * / only (this one is not evaluated)",
             "COMMAND": "a value: a command substitution $(...) is not run"}
PATHS = ("--vocab-file", "--tokenizer-model", "--tokenizer-type")     # unset there: absent
# flag prefix -> why it does not change the step's time
IGNORED = {**dict.fromkeys(("--log", "--tensorboard", "--wandb", "--timing-log", "--logging-level", "--profile",
                            "--record-memory", "--one-logger"), "logging: " + NO_TIME),
           **dict.fromkeys(("--save", "--load", "--ckpt", "--dist-ckpt", "--auto-detect-ckpt", "--no-load",
                            "--no-save", "--use-checkpoint", "--finetune", "--pretrained-checkpoint",
                            "--exit-", "--async-save"), "checkpointing: " + NO_TIME),
           **dict.fromkeys(("--data-", "--train-data", "--valid-data", "--test-data", "--split", "--mock-data",
                            "--merge-file", "--num-workers", "--no-mmap-bin-files", "--tiktoken",
                            "--no-create-attention-mask", "--eval-", "--train-iters", "--train-samples",
                            "--num-dataset-builder", "--dataloader-type", "--reset-", "--eod-mask-loss",
                            "--sft", "--per-split-data-args-path",
                            "--seed", "--distributed-timeout-minutes", "--distributed-backend"),
                           "data, evaluation and the run's length: " + NO_TIME),
           **dict.fromkeys(("--lr", "--min-lr", "--decoupled-", "--weight-decay", "--start-weight-decay",
                            "--end-weight-decay", "--adam-", "--sgd-", "--clip-grad", "--loss-scale",
                            "--initial-loss-scale", "--min-loss-scale", "--hysteresis", "--init-method",
                            "--override-opt", "--use-checkpoint-opt", "--optimizer", "--no-check-for-nan",
                            "--fp8-amax", "--fp8-margin", "--fp8-interval", "--apply-query-key-layer-scaling",
                            "--attention-softmax-in-fp32", "--accumulate-allreduce-grads-in-fp32"),
                           "the optimizer's, learning rate's and numerics' settings: " + NO_TIME),
           **dict.fromkeys(("--moe-router-", "--moe-aux-loss", "--moe-z-loss", "--moe-input-jitter",
                            "--moe-token-drop-policy", "--moe-per-layer-logging", "--mtp-loss"),
                           "the router's scoring and losses: routing is balanced unless --routing says otherwise"),
           **dict.fromkeys(("--rotary-", "--position-embedding-type", "--no-position-embedding", "--rope-",
                            "--mscale", "--norm-epsilon", "--apply-layernorm-1p", "--qk-layernorm",
                            "--attention-dropout", "--hidden-dropout", "--no-rope-fusion", "--init-model-with-meta",
                            "--use-rotary-position-embeddings", "--glu-linear-offset", "--activation-func-clamp-value",
                            "--enable-gpt-oss"),
                           "positions, norms' numerics and dropout: elementwise, " + NO_TIME),
           **dict.fromkeys(("--use-mcore-models", "--transformer-impl", "--attention-backend", "--use-flash-attn",
                            "--moe-grouped-gemm", "--moe-permute-fusion", "--cross-entropy-loss-fusion",
                            "--cross-entropy-fusion-impl", "--no-masked-softmax-fusion", "--no-bias-",
                            "--no-gradient-accumulation-fusion", "--enable-experimental", "--manual-gc",
                            "--empty-unused-memory-level", "--calculate-per-token-loss", "--use-nccl-ub",
                            "--fsdp-double-buffer", "--no-persist-layer-norm", "--bias-",
                            "--moe-use-legacy-grouped-gemm", "--disable-tp-comm", "--tp-comm-",
                            "--fsdp-manual-registration", "--disable-bf16-reduced-precision-matmul", "--spec",
                            "--megatron-fsdp-main-grads-dtype", "--export-force-local-attention",
                            "--export-te-mcore-model", "--export-default-te-spec"),
                           "the fused kernels --kernels fused assumes, or the host's housekeeping"),
           "--modelopt-enabled": "ModelOpt's model builder, the same layers: megatron/post_training; its "
                                 "quantization recipe, --export-quant-cfg, is refused",
           **dict.fromkeys(("--step-batch-size-schedule", "--rampup-batch-size"),
                           "a batch ramp-up: the prediction is the step at --global-batch-size")}
TOKENIZER_VOCAB = {"gpt2-vocab.json": 50257}     # GPT-2's BPE (HF gpt2 config.json vocab_size)
FP8_RECIPES = {"delayed": "fp8-delayed", "tensorwise": "fp8-tensorwise", "blockwise": "fp8-blockwise",
               "mxfp8": "mxfp8"}
SHARDING = {"optim": 1, "optim_grads": 2, "optim_grads_params": 3, "no_shard": 0}
DISPATCH_BACKENDS = {"deepep": "deepep", "hybridep": "hybridep"}


def load(spec: str) -> Imported:
    """The model keys, plan keywords and lines of a launch script or argument list (a path, or the
    arguments themselves where ``spec`` starts with ``--``)."""
    text, name = (spec, "megatron-model") if spec.lstrip().startswith("--") else \
        (read_text("megatron", spec), Path(spec).stem)
    words, script = read_script(text)
    out = from_args(words, name, script.sourced)
    out.lines[:0] = [f"megatron: ${var} {value} -> from the environment (the script does not set it)"
                     for var, value in script.from_env.items()]
    return out.check(spec if len(spec) < 80 else spec[:77] + "...")


def groups(words: list[str]) -> dict[str, list[str]]:
    """{flag: its values} of an argument list (``--flag=value`` split; a repeated flag's last values)."""
    out, flag = {}, None
    for word in words:
        if word.startswith("--"):
            flag, _, value = word.partition("=")
            out[flag] = [value] if value else []
        elif flag is not None:
            out[flag].append(word)
    return out


def from_args(words: list[str], name: str = "megatron-model", sourced: tuple = ()) -> Imported:
    """An Imported of Megatron arguments (refusals collected: ``Imported.check``); ``sourced``: the files
    the script sources (not read: named where a variable is unset)."""
    flags, out = groups(words), Imported("megatron", name=name)
    hint = f" (it sources {', '.join(sourced)}, which is not read); set it in the environment" if sourced else \
        "; set it in the environment"
    unset_words = [n for w in words for n in unset_names(w) if not w.startswith("--")]
    if not flags and unset_words:
        out.refuse("arguments", " ".join(f"${n}" for n in unset_words), f"Megatron flags: the script passes "
                   f"variables it does not set{hint}")
        return out
    if not flags:
        out.refuse("arguments", "", "a launch script running a *.py with Megatron flags, or the flags themselves")
        return out
    _standalone(out, words, flags)
    for flag, values in flags.items():
        unset = [n for v in values for n in unset_names(v)]
        if unset and flag in PATHS:
            out.ignored(flag, f"${unset[0]}", "a path the script leaves to its caller")
            continue
        if unset and _known(flag) and not _ignored(flag):
            out.refuse(flag, f"${unset[0]}", UNSET_WHY.get(unset[0], f"a value: the script does not set "
                                                                    f"{unset[0]}{hint}"))
        elif flag in MODEL_INTS:
            _int(out, flag, values, out.model, MODEL_INTS[flag])
        elif flag in PLAN_INTS:
            _int(out, flag, values, out.plan, PLAN_INTS[flag])
        elif flag in PLAN_FLAGS:
            key, value = PLAN_FLAGS[flag]
            out.plan[key] = value
            out.mapped(flag, "", f"{key} {str(value).lower()}")
        elif not _known(flag):
            out.refuse(flag, " ".join(values), "not a flag this importer maps or ignores (perfmodel.importers."
                       "megatron lists them, Megatron-LM @ d98e8a64dd)")
        elif _ignored(flag) and flag not in USED:        # a flag the mapping reads says so itself
            out.ignored(flag, " ".join(values), _ignored(flag))
    if not out.refused:
        _model(out, flags)
        _plan(out, flags)
        _unsaid(out, flags)
    return out


def _standalone(out: Imported, words: list[str], flags: dict) -> None:
    """Unset variables standing alone in the arguments (before the first flag, or after a flag that takes no
    value: ``--use-distributed-optimizer ${EXTRA_ARGS}``): they expand to no words, as bash's do; a line each."""
    lead = words[:next((k for k, w in enumerate(words) if w.startswith("--")), len(words))]
    names = [n for w in lead for n in unset_names(w)]
    for flag in SWITCHES:
        if flag in flags and flags[flag] and all(unset_names(v) and not UNSET_RE.sub("", v) for v in flags[flag]):
            names += [n for v in flags[flag] for n in unset_names(v)]
            flags[flag] = []
    for name in names:
        out.lines.append(f"megatron: ${name} (not set) -> no arguments (an unset variable expands to none)")


def _unsaid(out: Imported, flags: dict) -> None:
    """A line for each flag no mapping read (one that only matters beside a flag the file does not give)."""
    said = " ".join(line.split(" -> ")[0].split(" ignored (")[0] for line in out.lines).split()
    for flag, values in flags.items():
        if flag not in said:
            out.ignored(flag, " ".join(values), "it matters only beside a flag this file does not give")


def _known(flag: str) -> bool:
    return flag in MODEL_INTS or flag in PLAN_INTS or flag in PLAN_FLAGS or flag in USED or bool(_ignored(flag))


def _ignored(flag: str) -> str:
    return next((why for prefix, why in IGNORED.items() if flag.startswith(prefix)), "")


def _int(out: Imported, flag: str, values: list, into: dict, key: str) -> int | None:
    try:
        into[key] = int(values[0])
    except (IndexError, ValueError):
        into[key] = -1
    if into[key] < 0:
        into.pop(key)
        out.refuse(flag, " ".join(values), "an integer >= 0")
        return None
    out.mapped(flag, into[key], f"{key} {into[key]}" + (" (and the plan's seq)" if key == "seq_len" else ""))
    return into[key]


def _value(out: Imported, flags: dict, flag: str, default=None, kind=str):
    """The one value of ``flag`` (``default`` where absent), as ``kind``: int (>= 1) or float (>= 0); a
    value that is not one is refused (and ``default`` returned)."""
    values = flags.get(flag)
    if values is None:
        return default
    if len(values) != 1:
        out.refuse(flag, " ".join(values), "one value")
        return default
    if kind is str:
        return values[0]
    try:
        value = kind(values[0])
    except ValueError:
        value = -1
    if value < (1 if kind is int else 0):
        out.refuse(flag, values[0], "an integer >= 1" if kind is int else "a number >= 0")
        return default
    return value


def _model(out: Imported, flags: dict) -> None:
    m = out.model
    _hybrid_and_gpt_oss(out, flags)
    d = out.defaults        # Megatron's defaults: under a model key an earlier file gave (perfmodel.importers.merge)
    d["activation"] = "gelu"
    if "--quick-geglu" in flags:
        m["activation"] = "swiglu"
    elif "--swiglu" in flags or "--squared-relu" in flags:
        m["activation"] = "swiglu" if "--swiglu" in flags else "relu2"
        out.mapped("--swiglu" if "--swiglu" in flags else "--squared-relu", "", f"activation {m['activation']}")
    norm = _value(out, flags, "--normalization", "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        out.refuse("--normalization", norm, "LayerNorm or RMSNorm")
    (m if "--normalization" in flags else d)["norm"] = norm.lower()
    if "--normalization" in flags:
        out.mapped("--normalization", norm, f"norm {m['norm']} (" + ("no biases)" if norm == "RMSNorm" else
                                                                      "biases on every linear layer)"))
    for flag in ("--disable-bias-linear", "--add-bias-linear"):
        if flag in flags:
            out.ignored(flag, "", "biases follow the norm in commpress's model (rmsnorm: none); under 0.1% "
                        "of the parameters")
    if "--untie-embeddings-and-output-weights" in flags:
        m["tied_embeddings"] = False
        out.mapped("--untie-embeddings-and-output-weights", "", "tied_embeddings false")
    else:
        d["tied_embeddings"] = True
        out.lines.append("megatron: --untie-embeddings-and-output-weights absent -> tied_embeddings true")
    if "hidden_size" in m and "ffn_hidden_size" not in m:
        h = m["hidden_size"]
        d["ffn_hidden_size"] = int(4 * h * 2 / 3 / 64) * 64 if m.get("activation") == "swiglu" else 4 * h
        out.lines.append(f"megatron: --ffn-hidden-size absent -> ffn_hidden_size {d['ffn_hidden_size']} "
                         "(Megatron's default)")
    _heads(out, flags)
    _vocab(out, flags)
    _experts(out, flags)
    _window(out, flags)
    for flag in ("--max-position-embeddings", "--tokenizer-type", "--tokenizer-model"):
        if flag in flags and not unset_names(" ".join(flags[flag])):
            out.ignored(flag, " ".join(flags[flag]), "the positions' table and the tokenizer: seq_len is "
                        "--seq-length, vocab_size --vocab-size")


def _hybrid_and_gpt_oss(out: Imported, flags: dict) -> None:
    """``--hybrid-layer-pattern`` (its length the layers: Megatron ignores --num-layers then, arguments.py
    line 793), GPT-OSS's ``--quick-geglu`` (a gated MLP, priced as swiglu as the catalog's gpt-oss-120b) and
    ``--softmax-type`` (its attention sinks: a logit per head, left out as the catalog's model leaves them)."""
    pattern = _value(out, flags, "--hybrid-layer-pattern")
    if pattern is not None:
        out.model.update(hybrid_layer_pattern=pattern, num_layers=len(pattern))
        out.mapped("--hybrid-layer-pattern", pattern, f"hybrid_layer_pattern, num_layers {len(pattern)}")
    if "--quick-geglu" in flags:
        out.mapped("--quick-geglu", "", "activation swiglu (a gated MLP; GPT-OSS's clamped GLU priced as SwiGLU)")
    kind = _value(out, flags, "--softmax-type")
    if kind is not None:
        out.ignored("--softmax-type", kind, "attention sinks: a logit per head, left out as the catalog's "
                    "gpt-oss-120b leaves them")
    comm = _value(out, flags, "--megatron-fsdp-grad-comm-dtype")
    if comm in ("bf16", "fp16", "fp32"):
        out.plan["grad_dtype"] = comm
        out.mapped("--megatron-fsdp-grad-comm-dtype", comm, f"grad_dtype {comm}")
    elif comm is not None:
        out.ignored("--megatron-fsdp-grad-comm-dtype", comm, "the main gradients' dtype: grad_dtype stays")


def _heads(out: Imported, flags: dict) -> None:
    m = out.model
    if "--multi-latent-attention" in flags:
        m["attention"] = "mla"
        for key, default in (("q_lora_rank", 0), ("kv_lora_rank", 32), ("qk_nope_head_dim", 128),
                             ("qk_rope_head_dim", 64), ("v_head_dim", 128)):
            m.setdefault(key, default)
        out.mapped("--multi-latent-attention", "", "attention mla (every head its own keys and values)")
        if "num_heads" in m:
            m["num_kv_heads"] = m["num_heads"]
        if "--kv-channels" in flags:
            out.ignored("--kv-channels", flags["--kv-channels"][0], "MLA's heads are --qk-head-dim, "
                        "--qk-pos-emb-head-dim and --v-head-dim wide")
        return
    if "num_heads" in m:
        groups_ = _value(out, flags, "--num-query-groups", m["num_heads"], int)
        m["num_kv_heads"] = groups_ if "--group-query-attention" in flags else m["num_heads"]   # with the heads
        out.mapped("--group-query-attention --num-query-groups", groups_, f"num_kv_heads {m['num_kv_heads']}") \
            if "--group-query-attention" in flags else None
    channels = _value(out, flags, "--kv-channels", None, int)
    if channels is not None:
        if "hidden_size" in m and "num_heads" in m and channels * m["num_heads"] == m["hidden_size"]:
            out.ignored("--kv-channels", channels, "hidden_size / num_heads already")
        else:
            m["head_dim"] = channels
            out.mapped("--kv-channels", channels, f"head_dim {channels}")


def _vocab(out: Imported, flags: dict) -> None:
    vocab = _value(out, flags, "--vocab-size", None, int)
    files = [Path(f).name for f in flags.get("--vocab-file", []) if not unset_names(f)]
    if vocab is None and files and files[0] in TOKENIZER_VOCAB:
        vocab = TOKENIZER_VOCAB[files[0]]
        out.mapped("--vocab-file", files[0], f"{vocab} tokens (GPT-2's BPE)")
    elif files:
        out.ignored("--vocab-file", " ".join(flags["--vocab-file"]), "a tokenizer's file: give --vocab-size")
    if vocab is None:
        tokenizer = " ".join(_value(out, flags, f, "") or "" for f in ("--tokenizer-type", "--tokenizer-model"))
        out.lines.append(f"megatron: --vocab-size absent: vocab_size is not read from the tokenizer "
                         f"({show(' '.join(tokenizer.split())) or 'none named'}): --from hf:config.json before "
                         "this file or --model gives it")
        return
    multiple = _value(out, flags, "--make-vocab-size-divisible-by", 128, int) * max(1, out.plan.get("tp", 1))
    padded = -(-vocab // multiple) * multiple
    out.model["vocab_size"] = padded
    key = "--vocab-size" + (f" {vocab} --make-vocab-size-divisible-by" if "--make-vocab-size-divisible-by" in flags
                            else "")
    out.mapped(key, flags["--make-vocab-size-divisible-by"][0] if " --make" in key else vocab,
               f"vocab_size {padded} (padded to a multiple of "
               f"--make-vocab-size-divisible-by x tp = {multiple}, as Megatron pads it)")


def _experts(out: Imported, flags: dict) -> None:
    m = out.model
    if not m.get("num_experts"):
        return
    m.setdefault("moe_top_k", 2)
    m.setdefault("moe_ffn_hidden_size", m.get("ffn_hidden_size", out.defaults.get("ffn_hidden_size", 0)))
    shared = _value(out, flags, "--moe-shared-expert-intermediate-size", None, int)
    if shared is not None:
        if not m["moe_ffn_hidden_size"] or shared % m["moe_ffn_hidden_size"]:
            out.refuse("--moe-shared-expert-intermediate-size", shared, f"a multiple of --moe-ffn-hidden-size "
                       f"{m['moe_ffn_hidden_size']} (shared experts as wide as the routed ones)")
        else:
            m["moe_shared_experts"] = shared // m["moe_ffn_hidden_size"]
            out.mapped("--moe-shared-expert-intermediate-size", shared, f"moe_shared_experts "
                       f"{m['moe_shared_experts']}")
    freq = _value(out, flags, "--moe-layer-freq")
    if freq is not None:
        _layer_freq(out, freq)
    factor = _value(out, flags, "--moe-expert-capacity-factor", None, float)
    if factor is not None:
        m["moe_capacity_factor"] = factor
        out.mapped("--moe-expert-capacity-factor", factor, f"moe_capacity_factor {factor}")
    if "--moe-pad-expert-input-to-capacity" in flags:
        m["moe_pad_to_capacity"] = True
        out.mapped("--moe-pad-expert-input-to-capacity", "", "moe_pad_to_capacity true")


def _layer_freq(out: Imported, text: str) -> None:
    """``--moe-layer-freq``: N (every N-th layer from layer 0) or a pattern such as [0]*3+[1]*58."""
    if text.isdigit() and int(text) > 0:
        out.model["moe_layer_freq"] = int(text)
        out.mapped("--moe-layer-freq", text, f"moe_layer_freq {text}")
        return
    try:
        pattern = _eval_pattern(text)
    except ValueError:
        pattern = []
    first = next((i for i, v in enumerate(pattern) if v), len(pattern))
    ones = [i for i, v in enumerate(pattern) if v]
    freq = ones[1] - ones[0] if len(ones) > 1 else 1
    if not ones or ones != list(range(first, len(pattern), freq)):
        out.refuse("--moe-layer-freq", text, "N, or a list of 0s then every N-th layer 1 (e.g. [0]*3+[1]*58)")
        return
    out.model.update(moe_first_dense=first, moe_layer_freq=freq)
    out.mapped("--moe-layer-freq", text, f"moe_first_dense {first}, moe_layer_freq {freq}")


def _eval_pattern(text: str) -> list:
    """Megatron's moe_freq_type pattern (arguments.py, ``_eval_pattern``): lists of 0/1, + and * only."""
    value = bounded_eval(text)
    if not isinstance(value, list) or set(value) - {0, 1}:
        raise ValueError(text)
    return value


def _window(out: Imported, flags: dict) -> None:
    window = _value(out, flags, "--window-size")
    if window is None:
        return
    sizes = re.findall(r"-?\d+", window)
    if len(sizes) != 2 or int(sizes[1]) != 0 or int(sizes[0]) < 0:
        out.refuse("--window-size", window, "(W, 0): a causal window of W earlier tokens")
        return
    out.model["sliding_window"] = int(sizes[0]) + 1
    out.mapped("--window-size", window, f"sliding_window {int(sizes[0]) + 1} (the query itself included)")


def _plan(out: Imported, flags: dict) -> None:
    p = out.plan
    if "seq_len" in out.model:          # the job's sequence too: under another model (--model) it still holds
        p["seq"] = out.model["seq_len"]
    if "--overlap-grad-reduce" not in flags:
        p["dp_overlap"] = False
        out.lines.append("megatron: --overlap-grad-reduce absent -> dp_overlap false (Megatron's default)")
    _schedule(out, flags)
    _cp_comm(out, flags)
    _precision(out, flags)
    _recompute(out, flags)
    _dispatcher(out, flags)
    _data_parallel(out, flags)


def _schedule(out: Imported, flags: dict) -> None:
    layout = _value(out, flags, "--pipeline-model-parallel-layout")
    if layout is not None:
        out.plan["pipeline_layout"] = layout
        out.mapped("--pipeline-model-parallel-layout", layout, f"pipeline_layout {layout}")
    virtual = _value(out, flags, "--virtual-pipeline-model-parallel-size", None, int) or \
        _value(out, flags, "--num-virtual-stages-per-pipeline-rank", None, int)
    per_stage = _value(out, flags, "--num-layers-per-virtual-pipeline-stage", None, int)
    if per_stage is not None:
        layers, pp = out.model.get("num_layers", 0), max(1, out.plan.get("pp", 1))
        if not layers or layers % (pp * per_stage):
            out.refuse("--num-layers-per-virtual-pipeline-stage", per_stage, f"a divisor of num_layers / pp "
                       f"({layers} / {pp})")
            return
        virtual = layers // (pp * per_stage)
    if virtual is not None and virtual > 1:
        out.plan["schedule"] = f"interleaved:{virtual}"
        out.lines.append(f"megatron: virtual pipeline stages {virtual} -> schedule interleaved:{virtual}")


def _cp_comm(out: Imported, flags: dict) -> None:
    """``--cp-comm-type``: p2p (Megatron's default, every layer) is the K/V ring the model prices; a2a,
    allgather and a2a+p2p are refused."""
    kinds = flags.get("--cp-comm-type")
    if kinds is None:
        return
    if kinds and set(kinds) == {"p2p"}:
        out.ignored("--cp-comm-type", " ".join(kinds), "p2p: the key-value ring context parallelism is priced as")
    else:
        out.refuse("--cp-comm-type", " ".join(kinds), "p2p (the K/V ring; a2a, allgather and a2a+p2p are not "
                   "modelled)")


def _precision(out: Imported, flags: dict) -> None:
    fmt, recipe = _value(out, flags, "--fp8-format"), _value(out, flags, "--fp8-recipe", "delayed")
    if fmt is not None:
        if recipe not in FP8_RECIPES:
            out.refuse("--fp8-recipe", recipe, "one of " + ", ".join(FP8_RECIPES))
            return
        out.plan["precision"] = FP8_RECIPES[recipe]
        out.mapped(f"--fp8-format {fmt} --fp8-recipe", recipe + ("" if "--fp8-recipe" in flags else " (default)"),
                   f"precision {FP8_RECIPES[recipe]}")
    if _value(out, flags, "--fp4-format") is not None:
        out.plan["precision"] = "nvfp4"
        out.mapped("--fp4-format", flags["--fp4-format"][0], "precision nvfp4")
    if "--fp8-param-gather" in flags:
        out.policy.append("fp8-param-gather")
        out.mapped("--fp8-param-gather", "", "policy fp8-param-gather (parameters gathered in FP8)")


def _recompute(out: Imported, flags: dict) -> None:
    granularity = _value(out, flags, "--recompute-granularity")
    if granularity is None:
        return
    if granularity not in ("full", "selective"):
        out.refuse("--recompute-granularity", granularity, "full or selective")
        return
    method = _value(out, flags, "--recompute-method", "uniform")
    if granularity == "full" and method != "uniform":
        out.refuse("--recompute-method", method, "uniform (every layer recomputed; block's partial recompute "
                   "is not modelled)")
        return
    out.plan["recompute"] = granularity
    out.mapped("--recompute-granularity", granularity, f"recompute {granularity}")
    if "--recompute-modules" in flags and granularity == "selective":
        out.plan["recompute_modules"] = ",".join(flags["--recompute-modules"])
        out.mapped("--recompute-modules", " ".join(flags["--recompute-modules"]),
                   f"recompute_modules {out.plan['recompute_modules']}")
    for flag in ("--recompute-method", "--recompute-num-layers"):
        if flag in flags:
            out.ignored(flag, " ".join(flags[flag]), "uniform recompute reruns every layer whatever its chunks")


def _dispatcher(out: Imported, flags: dict) -> None:
    kind = _value(out, flags, "--moe-token-dispatcher-type")
    if kind is None:
        return
    if kind == "flex":
        backend = _value(out, flags, "--moe-flex-dispatcher-backend", "deepep")
        if backend not in DISPATCH_BACKENDS:
            out.refuse("--moe-flex-dispatcher-backend", backend, " or ".join(DISPATCH_BACKENDS))
            return
        out.plan["ep_kernels"] = DISPATCH_BACKENDS[backend]
        out.mapped("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend", backend,
                   f"ep_kernels {backend}")
    elif kind == "alltoall":
        out.mapped("--moe-token-dispatcher-type", kind, "all-to-all dispatch (ep_kernels nccl)")
    else:
        out.refuse("--moe-token-dispatcher-type", kind, "alltoall or flex (the all-gather dispatcher is not "
                   "modelled)")


def _data_parallel(out: Imported, flags: dict) -> None:
    if "--use-megatron-fsdp" in flags:
        strategy = _value(out, flags, "--data-parallel-sharding-strategy", "optim_grads_params")
        if strategy not in SHARDING:
            out.refuse("--data-parallel-sharding-strategy", strategy, " or ".join(SHARDING))
            return
        out.plan["zero"] = SHARDING[strategy]
        out.mapped("--use-megatron-fsdp --data-parallel-sharding-strategy", strategy, f"zero {SHARDING[strategy]}")
    bucket = _value(out, flags, "--ddp-bucket-size", None, int)
    if bucket is not None:
        width = 2 if out.plan.get("grad_dtype") == "bf16" else 4
        out.plan["bucket_bytes"] = bucket * width
        out.mapped("--ddp-bucket-size", bucket, f"bucket_bytes {out.plan['bucket_bytes']} ({width}-byte gradients)")
    if "--overlap-param-gather" in flags:
        out.ignored("--overlap-param-gather", "", "the framework's: megatron-core charges the parameter gather "
                    "after the step, --framework nemo overlaps it")
