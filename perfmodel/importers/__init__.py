"""Other tools' files as a model and a plan: ``--from FORMAT:PATH`` (docs/importers.md).

``load("hf:config.json")`` reads one file (``FORMATS``: ``hf`` a Hugging Face config.json,
``perfmodel.importers.hf``; ``megatron`` a Megatron-LM launch script or argument list,
``perfmodel.importers.megatron``; ``torchtitan`` a torchtitan job config TOML,
``perfmodel.importers.torchtitan``; ``nemo`` a Megatron-Bridge run_config.yaml or a NeMo 1 YAML,
``perfmodel.importers.nemo``; ``deepspeed`` a DeepSpeed config, ``perfmodel.plan.deepspeed``) into
(model, plan keywords, lines); ``merge`` combines several, a later file's keys over an earlier's;
``predict(sources, cluster, **plan)`` predicts the imported job, a keyword over every file.
"""
from __future__ import annotations

from perfmodel.importers.common import Imported, ImportedModel, build_model, model_toml
from topologies.errors import InputError

FORMATS = ("hf", "megatron", "deepspeed", "torchtitan", "nemo")


def read(spec: str) -> Imported:
    """One ``FORMAT:PATH`` read into an Imported (refusals raised: one InputError, a line each in
    ``refused``)."""
    fmt, sep, path = spec.partition(":")
    if not sep or fmt not in FORMATS or not path:
        raise InputError("from", spec, "FORMAT:PATH with FORMAT one of " + ", ".join(FORMATS)
                         + " (e.g. hf:config.json, megatron:train.sh)")
    if fmt == "hf":
        from perfmodel.importers import hf
        return hf.load(path)
    if fmt == "megatron":
        from perfmodel.importers import megatron
        return megatron.load(path)
    if fmt == "torchtitan":
        from perfmodel.importers import torchtitan
        return torchtitan.load(path)
    if fmt == "nemo":
        from perfmodel.importers import nemo
        return nemo.load(path)
    from perfmodel.plan.deepspeed import read_config
    read_config(path)                       # readable JSON now; its plan needs the cluster (at predict)
    return Imported("deepspeed", deepspeed=path, lines=[f"deepspeed: {path} -> its plan and policy, mapped "
                                                        "once the cluster is known (as --deepspeed)"])


def merge(parts: list[Imported]) -> Imported:
    """The imports combined in order: a later one's model keys, plan keywords and DeepSpeed config over
    an earlier one's (but its format's defaults, ``Imported.defaults``, under them); lines and policy
    items of all."""
    out = Imported("+".join(p.fmt for p in parts))
    for part in parts:
        out.model.update(part.model)
        for key, value in part.defaults.items():     # a format's default yields to an earlier file's key
            out.model.setdefault(key, value)
        out.plan.update(part.plan)
        out.lines += part.lines
        out.policy += [p for p in part.policy if p not in out.policy]
        out.name = part.name if part.model and not out.name else out.name
        out.deepspeed = part.deepspeed or out.deepspeed
    return out


def load(specs: str | list[str]) -> tuple[ImportedModel | None, dict, list[str]]:
    """(model, plan keywords, lines) of one ``FORMAT:PATH`` or several (``merge``): the model is None where
    the files give no model keys; the plan keywords are ``predict``'s (a DeepSpeed config's under
    ``deepspeed``, compression items under ``policy_items``)."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    both = merge([read(s) for s in specs])
    model = build_model(both.model, both.name, ", ".join(specs)) if both.model else None
    return model, plan_of(both), both.lines


def plan_of(both: Imported) -> dict:
    """The predict keywords of an import (a DeepSpeed config's under ``deepspeed``, compression items
    under ``policy_items``)."""
    plan = dict(both.plan)
    if both.deepspeed:
        plan["deepspeed"] = both.deepspeed
    if both.policy:
        plan["policy_items"] = list(both.policy)
    return plan


def predict(sources: str | list[str], cluster: str, model=None, policy: str = "none", **plan):
    """``perfmodel.prediction.predict`` of the imported job on ``cluster``: the files' model (unless
    ``model``: then the files' model keys, complete or not, are not built), their plan with ``plan``'s
    keywords over it, their policy items added to ``policy``."""
    from perfmodel.prediction import predict as predict_step

    both = merge([read(s) for s in ([sources] if isinstance(sources, str) else list(sources))])
    fields = {**plan_of(both), **plan}
    imported = None if model is not None or not both.model else build_model(both.model, both.name, str(sources))
    policy = _policy(policy, fields.pop("policy_items", []))
    deepspeed = fields.pop("deepspeed", None)
    if deepspeed:
        fields, policy = _deepspeed(deepspeed, cluster, fields, policy)
    chosen = model if model is not None else imported
    if chosen is None:
        raise InputError("model", None, "a model: the imported files give none (add --from hf:config.json or "
                         "give model=)")
    return predict_step(chosen, cluster, policy=policy, **fields)


def _policy(policy: str, items: list) -> str:
    return ",".join(([policy] if policy != "none" else []) + items) or "none"


def _deepspeed(path: str, cluster: str, fields: dict, policy: str) -> tuple[dict, str]:
    from perfmodel.plan.deepspeed import map_config, read_config
    from topologies import cluster_for

    built, ranks = cluster_for(cluster, nodes=fields.get("nodes"), gpus=fields.get("gpus"))
    ds = map_config(read_config(path), built.gpus_per_host, ranks, fields.get("tp", 1), fields.get("pp", 1))
    return {**ds.plan, **fields}, _policy(policy, ds.policy_items)


__all__ = ["FORMATS", "Imported", "ImportedModel", "load", "merge", "model_toml", "plan_of", "predict", "read"]
