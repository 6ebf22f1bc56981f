"""``perfmodel import``: another tool's files as commpress's model TOML and plan flags (``perfmodel.importers``)."""
from __future__ import annotations

from perfmodel.cli.common import RAW, say_refused
from topologies.clikit import atomic_write, check_writable, dump_json
from topologies.errors import InputError

IMPORT_EPILOG = """examples:
  perfmodel import hf:config.json --toml llama.toml
  perfmodel import megatron:train_llama3_8b_h100_fp8.sh
  perfmodel import hf:config.json megatron:train.sh --json

then: perfmodel predict --model llama.toml --cluster dgx-h100 --gpus 64 ..., or the same files as
perfmodel predict --from hf:config.json --from megatron:train.sh --cluster dgx-h100 --gpus 64
"""


def add_import(sub) -> None:
    p = sub.add_parser("import", help="another tool's config as a model TOML and plan flags",
                       description="Read a Hugging Face config.json, a Megatron-LM launch script or argument list, "
                       "a torchtitan job config, a NeMo / Megatron-Bridge YAML, or a DeepSpeed config: print how "
                       "each key maps (or why it is ignored or refused), the "
                       "plan as perfmodel flags, and write the model as a model TOML.",
                       epilog=IMPORT_EPILOG, formatter_class=RAW)
    p.add_argument("sources", nargs="+", metavar="FORMAT:PATH",
                   help="hf:config.json, megatron:train.sh (or megatron:'--num-layers 32 ...'), torchtitan:job.toml, "
                   "nemo:config.yaml, deepspeed:ds.json; "
                   "a later file's keys over an earlier one's")
    p.add_argument("--toml", metavar="FILE.toml", help="write the model TOML there (for --model FILE.toml)")
    p.add_argument("--json", action="store_true", help="model keys, plan keywords and the lines as JSON")


def plan_flags(plan: dict) -> str:
    """The plan keywords as perfmodel predict's flags."""
    names = {"bucket_bytes": "bucket", "first_stage_layers": "first-stage-layers", "policy_items": "policy"}
    out = []
    for key, value in plan.items():
        flag = "--" + names.get(key, key).replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append(f"--no-{flag[2:]}" if key in ("dp_overlap", "tp_overlap") else "")
        else:
            out.append(f"{flag} {','.join(value) if isinstance(value, list) else value}")
    return " ".join(o for o in out if o)


def run_import(args) -> None:
    from perfmodel.importers import build_model, merge, model_toml, plan_of, read
    from perfmodel.workload import _spec_keys

    if args.toml:
        check_writable(args.toml, "toml")
    with say_refused():
        both = merge([read(s) for s in args.sources])
    plan, lines, model, missing = plan_of(both), both.lines, None, None
    try:
        model = build_model(both.model, both.name, ", ".join(args.sources)) if both.model else None
    except InputError as err:         # the mapping and the plan shown, then the model's missing key
        missing = err
    if args.toml and model is not None:
        atomic_write(args.toml, lambda h: h.write(model_toml(model, lines).encode()))
    if args.json:
        print(dump_json({"model": _spec_keys(model) if model else None, "plan": plan, "imported": lines,
                         "missing": str(missing) if missing else None}))
        return
    print("\n".join(lines))
    if missing is not None:
        print(f"plan: {plan_flags(plan) or '(none)'}")
        raise missing
    if model is not None:
        print(f"model: {model.name}: {model.params / 1e9:.2f}B parameters ({model.active_params / 1e9:.2f}B active)"
              + (f", written to {args.toml}" if args.toml else " (--toml FILE writes it)"))
    print(f"plan: {plan_flags(plan) or '(none)'}")


COMMANDS = {"import": (add_import, run_import)}
