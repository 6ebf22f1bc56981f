"""A DeepSpeed config as a plan and a policy (``perfmodel predict --deepspeed ds_config.json``).

Mapped (DeepSpeed's config reference, https://www.deepspeed.ai/docs/config-json/):

* ``zero_optimization.stage`` -> ``zero``; ``overlap_comm`` -> ``dp_overlap``;
  ``reduce_bucket_size`` (elements) -> ``bucket_bytes`` at the gradient dtype's width;
* ``zero_optimization.zero_quantized_weights`` -> ``zero=int8`` (ZeRO++ qwZ, blockwise int8);
  ``zero_quantized_gradients`` -> ``dp=int4`` (qgZ); ``zero_hpz_partition_size`` equal to the
  GPUs of a node -> ``hpz`` (the secondary partition inside each node; another size is refused);
* ``fp16.enabled`` / ``bf16.enabled`` -> ``compute_dtype``;
* ``train_micro_batch_size_per_gpu`` -> ``mbs``; ``train_batch_size`` -> ``gbs``, or
  ``mbs x gradient_accumulation_steps x dp`` without it (both given: they must agree);
* ``"auto"`` for the batch sizes, the accumulation steps and ``fp16``/``bf16.enabled`` (``AUTO``: the
  Hugging Face Trainer's integration fills them from the Trainer's arguments) is left to the command
  line (``--mbs``, ``--gbs``, ``--compute-dtype``), a line each; another mapped key's ``"auto"``
  (``reduce_bucket_size``: the model's hidden size squared) is refused; an ``autotuning``
  section turned on is refused (the tuner rewrites the batch and the ZeRO stage: predict the config it
  chose); turned off, its keys are ignored.

Keys that do not change a step's time in this model (optimizer and scheduler settings, logging,
gradient clipping, other bucket sizes and ZeRO tuning knobs) are ignored and listed; any other
key is refused, one line each, because a prediction that silently dropped it (CPU offload,
sparse attention, a communication dtype) would be wrong. The numbers it maps are whole and within
their declared bounds (``topologies.bounds``: the batch sizes as ``gbs`` and ``mbs``, the
accumulation steps, the bucket in elements): a batch sizes the pipeline schedule.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from topologies import bounds
from topologies.errors import InputError

IGNORED = {"optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
           "prescale_gradients", "gradient_predivide_factor", "dump_state", "flops_profiler", "tensorboard",
           "wandb", "csv_monitor", "comms_logger", "zero_allow_untested_optimizer", "memory_breakdown",
           "fp16.loss_scale", "fp16.initial_scale_power", "fp16.loss_scale_window", "fp16.hysteresis",
           "fp16.min_loss_scale", "fp16.auto_cast", "bf16.immediate_grad_update", "cuda_visible_devices",
           "zero_optimization.contiguous_gradients", "zero_optimization.allgather_partitions",
           "zero_optimization.allgather_bucket_size", "zero_optimization.reduce_scatter",
           "zero_optimization.stage3_max_live_parameters", "zero_optimization.stage3_max_reuse_distance",
           "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold",
           "zero_optimization.stage3_gather_16bit_weights_on_model_save", "zero_optimization.sub_group_size",
           "zero_optimization.round_robin_gradients", "zero_optimization.elastic_checkpoint",
           "zero_optimization.load_from_fp32_weights", "zero_optimization.ignore_unused_parameters"}
MAPPED = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "fp16.enabled",
          "bf16.enabled", "zero_optimization.stage", "zero_optimization.overlap_comm",
          "zero_optimization.reduce_bucket_size", "zero_optimization.zero_quantized_weights",
          "zero_optimization.zero_quantized_gradients", "zero_optimization.zero_hpz_partition_size"}
# the keys whose "auto" the HF Trainer fills from arguments the command line has too (--mbs, --gbs, --compute-dtype)
AUTO = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "fp16.enabled",
        "bf16.enabled")
GRAD_BYTES = 4   # DeepSpeed keeps the gradients it reduces in fp32 (the plan's grad_dtype default)


@dataclass
class DeepSpeedPlan:
    plan: dict = field(default_factory=dict)        # keyword arguments of ``predict``
    policy_items: list = field(default_factory=list)
    mapped: list = field(default_factory=list)      # "key=value -> what" lines
    ignored: list = field(default_factory=list)


def _flatten(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name not in ("optimizer", "scheduler", "flops_profiler", "tensorboard",
                                                     "wandb", "csv_monitor", "comms_logger"):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def read_config(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except OSError as err:
        raise InputError("deepspeed", path, f"a readable DeepSpeed config JSON ({err.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError("deepspeed", path, f"valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise InputError("deepspeed", path, "a JSON object")
    return config


def map_config(config: dict, gpus_per_node: int, gpus: int, tp: int = 1, pp: int = 1) -> DeepSpeedPlan:
    """The plan keywords and policy items of ``config`` for a job of ``gpus`` GPUs (dp = gpus / (tp pp))."""
    flat = _flatten(config)
    if _autotuning(flat):
        raise InputError("deepspeed", "autotuning.enabled=true", "a config that DeepSpeed's autotuner does not "
                         "rewrite: it runs experiments to choose the micro-batch and ZeRO stage; predict the config "
                         "it chose (autotuning_results/.../ds_config.json), or set autotuning.enabled false")
    auto = [k for k, v in flat.items() if v == "auto" and k in AUTO]
    flat = {k: v for k, v in flat.items() if k not in auto and not k.startswith("autotuning.")}
    refused = [k for k in flat if k not in MAPPED and k not in IGNORED and k.split(".")[0] not in IGNORED]
    if refused:
        err = InputError("deepspeed", ", ".join(refused),
                         "keys the model cannot honour (a step predicted without them would be wrong): remove "
                         f"them to predict without them; the keys it models are {', '.join(sorted(MAPPED))}, "
                         "and it ignores optimizer, scheduler, logging, clipping and ZeRO tuning keys")
        err.refused = [f"{k}={json.dumps(flat[k])}" for k in refused]
        raise err
    out = DeepSpeedPlan(ignored=sorted(k for k in flat if k not in MAPPED))
    for key in auto:          # the HF Trainer's integration fills "auto" from its own arguments
        _say(out, key, "auto", "left to the command line (the HF Trainer fills it from its arguments: "
             "--mbs, --gbs, --compute-dtype give it here)")
    _precision(flat, out)
    _zero(flat, out, gpus_per_node)
    _batch(flat, out, gpus // max(1, tp * pp))
    return out


def _autotuning(flat: dict) -> bool:
    """Whether the config turns DeepSpeed's autotuner on (its other autotuning keys are then the tuner's)."""
    enabled = flat.get("autotuning.enabled", False)
    return enabled is True or (enabled == "auto")


def _say(out: DeepSpeedPlan, key: str, value, what: str) -> None:
    out.mapped.append(f"{key}={json.dumps(value)} -> {what}")


def _flag(flat: dict, key: str) -> bool:
    value = flat.get(key, False)
    if not isinstance(value, bool):
        raise InputError("deepspeed", f"{key}={json.dumps(value)}", "true or false")
    return value


def _precision(flat: dict, out: DeepSpeedPlan) -> None:
    fp16, bf16 = _flag(flat, "fp16.enabled"), _flag(flat, "bf16.enabled")
    if fp16 and bf16:
        raise InputError("deepspeed", "fp16.enabled and bf16.enabled", "at most one of them true")
    for key, on, dtype in (("fp16.enabled", fp16, "fp16"), ("bf16.enabled", bf16, "bf16")):
        if on:
            out.plan["compute_dtype"] = dtype
            _say(out, key, True, f"--compute-dtype {dtype}")


def _zero(flat: dict, out: DeepSpeedPlan, gpus_per_node: int) -> None:
    stage = flat.get("zero_optimization.stage", 0)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in (0, 1, 2, 3):
        raise InputError("deepspeed", f"zero_optimization.stage={json.dumps(stage)}", "0, 1, 2 or 3")
    out.plan["zero"] = stage
    _say(out, "zero_optimization.stage", stage, f"--zero {stage}")
    if "zero_optimization.overlap_comm" in flat:
        out.plan["dp_overlap"] = _flag(flat, "zero_optimization.overlap_comm")
        _say(out, "zero_optimization.overlap_comm", out.plan["dp_overlap"],
             "gradients reduced during backward" if out.plan["dp_overlap"] else "--no-dp-overlap")
    elements = _count(flat, "zero_optimization.reduce_bucket_size")
    if elements is not None:
        out.plan["bucket_bytes"] = elements * GRAD_BYTES
        _say(out, "zero_optimization.reduce_bucket_size", flat["zero_optimization.reduce_bucket_size"],
             f"--bucket {out.plan['bucket_bytes']} (fp32 gradients)")
    if _flag(flat, "zero_optimization.zero_quantized_weights"):
        out.policy_items.append("zero=int8")
        _say(out, "zero_optimization.zero_quantized_weights", True, "policy zero=int8 (qwZ)")
    if _flag(flat, "zero_optimization.zero_quantized_gradients"):
        out.policy_items.append("dp=int4")
        _say(out, "zero_optimization.zero_quantized_gradients", True, "policy dp=int4 (qgZ)")
    size = flat.get("zero_optimization.zero_hpz_partition_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size not in (1, gpus_per_node):
        raise InputError("deepspeed", f"zero_optimization.zero_hpz_partition_size={json.dumps(size)}",
                         f"1 or the GPUs of a node ({gpus_per_node}): hpZ is modelled as a partition inside each node")
    if size == gpus_per_node and size > 1:
        out.plan["hpz"] = True
        _say(out, "zero_optimization.zero_hpz_partition_size", size, "--hpz")


def _count(flat: dict, key: str, bound: str | None = None) -> int | None:
    """The whole number at ``key`` (None where absent), within the declared bound ``bound`` (default:
    the key's own, ``topologies.bounds``): a batch sizes the pipeline schedule, a bucket the messages."""
    value = flat.get(key)
    if value is None:
        return None
    try:
        return bounds.check(key, value, bound)
    except InputError:
        raise InputError("deepspeed", f"{key}={json.dumps(value)}", bounds.describe(bound or key)) from None


def _batch(flat: dict, out: DeepSpeedPlan, dp: int) -> None:
    mbs = _count(flat, "train_micro_batch_size_per_gpu", "mbs")
    gas = _count(flat, "gradient_accumulation_steps")
    gbs = _count(flat, "train_batch_size", "gbs")
    if mbs is not None:
        out.plan["mbs"] = mbs
        _say(out, "train_micro_batch_size_per_gpu", mbs, f"--mbs {mbs}")
    if gbs is None and mbs is not None:
        gbs = mbs * (gas or 1) * dp
        if gbs > bounds.bound("gbs")[2]:
            raise InputError("deepspeed", f"train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp = "
                             f"{mbs} x {gas or 1} x {dp} = {gbs}",
                             f"a global batch (gbs) of at most {int(bounds.bound('gbs')[2])} sequences")
        _say(out, "gradient_accumulation_steps", gas or 1, f"--gbs {gbs} (mbs x accumulation x dp {dp})")
    elif gbs is not None:
        if mbs is not None and gas is not None and gbs != mbs * gas * dp:
            raise InputError("deepspeed", f"train_batch_size={gbs}",
                             f"train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp = {mbs * gas * dp}")
        _say(out, "train_batch_size", gbs, f"--gbs {gbs}")
    if gbs is not None:
        out.plan["gbs"] = gbs
