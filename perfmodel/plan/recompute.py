"""Selective recompute of named modules, as Megatron-Core runs it (``--recompute-modules``).

Megatron-Core's selective recompute (``recompute_granularity = "selective"``) reruns, in backward,
the forward of the modules ``recompute_modules`` names, and keeps fewer activations for it
(megatron/core/transformer/transformer_config.py, ``recompute_modules``; default ``["core_attn"]``,
which is what ``--recompute selective`` alone means here). The modules modelled, per layer and
microbatch (``dropped_bytes``: what it no longer keeps; ``perfmodel.step.recompute``: what it reruns):

* ``core_attn``: attention's scores and values; it drops the softmax statistics (what the plain
  ``selective`` drops, ``ModelSpec.activation_bytes_per_layer``) and reruns attention's forward.
* ``layernorm``: the input and pre-MLP norms, output-discarding (their outputs are the QKV and the
  MLP's or router's GEMM input: 2 sbh each, at the bytes the layer stores a GEMM input, sequence-split
  under sequence parallelism); reruns both norms.
* ``moe_act``: the routed experts' activation, output-discarding: drops its output (the experts'
  second GEMM input, per dispatched copy ``moe_ffn_hidden_size`` elements at the stored bytes,
  tp-split as the expert activations are counted) and reruns the activation.
* ``mla_up_proj``: multi-head latent attention's up projections and RoPE, output-discarding: drops
  Q, K (qk wide) and V (v wide), 2 bytes each, tp-split; reruns the two up-projection GEMMs.
* ``mlp``: a dense layer's MLP, checkpointed whole: drops its kept activations but its input
  (Korthikanti's 16 sbh, tp-split, its down projection's 8 sbh input at the stored bytes) and reruns
  its GEMMs and activation.
* ``moe``: a MoE layer's MLP, checkpointed whole: drops its dispatched copies and its experts'
  activations (what ``moe_act`` drops among them), keeping its input; reruns everything of the layer
  but its attention block (``StageCompute.moe_split``), the dispatch and combine all-to-alls included
  (``perfmodel.events``: a recompute pass of each).

Not modelled (refused in one line): ``shared_experts`` apart from its MoE layer, and the hybrid models'
``gdn_*``, ``gdp_*`` and ``mhc`` modules. Only Megatron-Core's stacks (``megatron-core``, ``nemo``) take the
list: other stacks' ``selective`` is their own policy (``perfmodel.plan.framework``).
"""
from __future__ import annotations

from topologies.errors import InputError

MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe")
DEFAULT_MODULES = ("core_attn",)           # Megatron-Core's default recompute_modules
REFUSED = {"shared_experts": "not modelled apart from the MoE layer it belongs to: name moe"}
STACKS = ("megatron-core", "nemo")         # the stacks whose selective recompute takes the list
NORMS = 2                                  # input_layernorm and pre_mlp_layernorm
NORM_OUTPUT_SBH = 2.0                      # each norm's output: a GEMM input of 2 bytes per element


def parse(text) -> tuple[str, ...]:
    """The module names of ``--recompute-modules`` (comma-separated, or a list), in ``MODULES`` order;
    an unknown or unmodelled name is refused in one line."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    for name in names:
        if name in REFUSED:
            raise InputError("recompute_modules", name, f"one of {', '.join(MODULES)} ({name}: {REFUSED[name]})")
        if name not in MODULES:
            raise InputError("recompute_modules", name, f"one of {', '.join(MODULES)} (Megatron-Core's names)")
    if not names:
        raise InputError("recompute_modules", text, f"at least one of {', '.join(MODULES)}")
    return tuple(m for m in MODULES if m in names)


def resolve(recompute: str, modules, framework: str) -> tuple[str, ...]:
    """The plan's recomputed modules: ``DEFAULT_MODULES`` under ``selective`` where none are named,
    the named ones (only with ``selective``, and only on ``STACKS``), () otherwise."""
    if modules is None or modules == ():
        return DEFAULT_MODULES if recompute == "selective" else ()
    if recompute != "selective":
        raise InputError("recompute_modules", ",".join(parse(modules)),
                         f"only with recompute selective (not {recompute}), as Megatron-Core's --recompute-modules")
    if framework not in STACKS:
        raise InputError("recompute_modules", ",".join(parse(modules)),
                         f"a Megatron-Core stack ({', '.join(STACKS)}; {framework}'s selective recompute is its own)")
    return parse(modules)


def named(plan) -> bool:
    """Whether ``plan`` recomputes a list of modules other than the default (the plain selective)."""
    return plan.recompute == "selective" and tuple(plan.recompute_modules) != DEFAULT_MODULES


def reruns_experts(plan) -> bool:
    """Whether backward reruns the MoE layers' dispatch, experts and combine: a full recompute, or
    selective with ``moe``."""
    return plan.recompute == "full" or (plan.recompute == "selective" and "moe" in plan.recompute_modules)


def reruns_attention(plan) -> bool:
    """Whether backward reruns attention's forward: a full recompute, or selective with ``core_attn``."""
    return plan.recompute == "full" or (plan.recompute == "selective" and "core_attn" in plan.recompute_modules)


def dropped_bytes(model, plan, moe: bool, stored: float = 2.0) -> float:
    """Bytes per layer and microbatch (one GPU) that the plan's named modules no longer keep against
    no recompute (module doc); ``stored``: bytes a GEMM input keeps per element (a low precision's)."""
    mods = plan.recompute_modules if plan.recompute == "selective" else ()
    s, b, h, tp = plan.local_seq, plan.mbs, model.hidden_size, plan.tp
    sp = tp if plan.sequence_parallel else 1
    tokens = s * b
    out = 0.0
    if "core_attn" in mods:
        out += model.activation_bytes_per_layer(b, s, tp, plan.sequence_parallel, "none") \
            - model.activation_bytes_per_layer(b, s, tp, plan.sequence_parallel, "selective")
    if "layernorm" in mods:
        out += NORMS * tokens * h * stored / sp
    if "moe" in mods and moe:         # its dispatched copies and expert activations (moe_act's among them)
        out += tokens * model.expert_copies * (model.expert_width * stored / sp + model.expert_load
                                               * (2.0 * model.expert_up_width + stored * model.moe_ffn_hidden_size) / tp)
    elif "moe_act" in mods and moe:
        out += tokens * model.expert_copies * model.expert_load * model.moe_ffn_hidden_size * stored / tp
    if "mla_up_proj" in mods and model.is_mla:
        out += tokens * 2.0 * (2 * model.q_width + model.out_width) / tp
    if "mlp" in mods and not moe:     # Korthikanti's 16 sbh; its 8 sbh down-projection input at ``stored``
        out += tokens * h * (8.0 + 4.0 * stored) / tp
    return out
