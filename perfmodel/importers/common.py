"""What the importers share: an import's result (``Imported``), its lines, its refusals, and the model
it describes built and validated as a model file is (``perfmodel.workload``).

An importer reads one file into model-file keys (possibly only some: a launch script without a vocabulary
size), ``predict`` keywords (PlanRequest's field names) and one line per key: mapped (``megatron:
--tensor-model-parallel-size 8 -> tp 8``), ignored with its reason (``megatron: --lr 3e-4 ignored (no
effect on the step time)``), or refused. Every refusal of a file is collected and raised at once, one
``InputError`` whose ``refused`` attribute holds a line each (the CLIs print them before the error).
"""
from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.workload import MODEL_KEYS, ModelSpec
from perfmodel.workload import _validate as validate_model
from topologies.errors import InputError

NO_TIME = "no effect on the step time"
# an unset shell variable's mark in an expanded word (perfmodel.importers.shell), shown as $NAME
UNSET = "\x00UNSET:{}\x00"
UNSET_RE = re.compile("\x00UNSET:(\\w+)\x00")


class ImportedModel(ModelSpec):
    """A ModelSpec read from another tool's file, shown by its name (``str``) in the CLIs' headers."""

    def __str__(self) -> str:
        return self.name


@dataclass
class Imported:
    """One import: the format, the model-file keys and plan keywords it gave, and its lines."""

    fmt: str                                      # hf, megatron, torchtitan, nemo, deepspeed
    model: dict = field(default_factory=dict)     # model-file keys (perfmodel.workload), possibly some only
    plan: dict = field(default_factory=dict)      # predict keywords: tp, pp, mbs, gbs, precision, ...
    lines: list = field(default_factory=list)     # "fmt: KEY VALUE -> what" / "... ignored (why)"
    refused: list = field(default_factory=list)   # "KEY VALUE: why, what is supported"
    name: str = ""                                # the model's name (the file's stem)
    defaults: dict = field(default_factory=dict)  # model keys the format defaults: under an earlier file's
    policy: list = field(default_factory=list)    # compression policy items (--fp8-param-gather)
    deepspeed: str | None = None                  # a DeepSpeed config's path (its plan needs the cluster)

    def mapped(self, key: str, value, what: str) -> None:
        self.lines.append(f"{self.fmt}: {_pair(key, value)} -> {what}")

    def ignored(self, key: str, value, why: str = NO_TIME) -> None:
        self.lines.append(f"{self.fmt}: {_pair(key, value)} ignored ({why})")

    def refuse(self, key: str, value, why: str) -> None:
        self.refused.append(f"{_pair(key, value)}: {why}")

    def check(self, path: str) -> Imported:
        """Itself, or InputError naming every refused key (a line each in ``refused``)."""
        if self.refused:
            err = InputError(f"{self.fmt}:{path}", " | ".join(self.refused),
                             "only keys this importer maps or ignores (a prediction without these would be wrong)")
            err.refused = [f"{self.fmt}: cannot honour {r}" for r in self.refused]
            raise err
        return self


def _pair(key: str, value) -> str:
    shown = show(value)
    return f"{key} {shown}" if shown else key


def show(value) -> str:
    """A key's value as a line shows it: text as it is (an unset variable as $NAME), the rest as JSON."""
    if isinstance(value, str):
        return UNSET_RE.sub(r"$\1", value).strip()
    return json.dumps(value)


def read_text(fmt: str, path: str) -> str:
    """The text of ``path``, or InputError naming the format and the path."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(fmt, path, f"a readable {fmt} file ({getattr(err, 'strerror', None) or err})") from None


def build_model(keys: dict, name: str, sources: str) -> ImportedModel:
    """The model ``keys`` describe, validated as a model file (``perfmodel.workload``); a missing required key
    is refused naming it and the sources read."""
    missing = [k for k in MODEL_KEYS if k not in keys]
    if missing:
        raise InputError("model", ", ".join(missing), f"given by the imported files ({sources}) or by --model: "
                         "a Megatron launch script without --vocab-size needs it, or --from hf:config.json before it")
    for key, value in keys.items():                     # a model key holds a number, true/false or text
        if not isinstance(value, (int, float, str)):
            raise InputError(f"model.{key}", value, "a number, true or false, or text (as a model file has it)")
    spec = validate_model(dict(keys), name)             # as a model file is: one line naming a bad key
    return ImportedModel(**{f: getattr(spec, f) for f in spec.__dataclass_fields__})


def model_toml(spec: ModelSpec, lines: list) -> str:
    """A model file of ``spec`` (the keys it sets apart from their defaults), its source lines as comments."""
    from perfmodel.workload import _spec_keys

    out = [f"# {spec.name}: written by perfmodel import"] + [f"# {line}" for line in lines]
    for key, value in _spec_keys(spec).items():
        out.append(f"{key} = {json.dumps(value)}")
    return "\n".join(out) + "\n"


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
        ast.FloorDiv: operator.floordiv}
MAX_VALUE = 2**62            # an integer or a list's length past this is refused, never computed


def bounded_eval(text: str):
    """``text`` as an expression of integers and lists of integers under + - * / (a shell's ``$((...))``,
    Megatron's ``--moe-layer-freq`` pattern): ValueError for anything else, a division by zero, or a
    result (a list's length) past ``MAX_VALUE`` or 10^6 elements."""
    try:
        return _node(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError, RecursionError) as err:
        raise ValueError(text) from err


def _node(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        return [_node(e) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_node(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _node(node.left), _node(node.right)
        sizes = [len(v) if isinstance(v, list) else abs(v) for v in (left, right)]
        if isinstance(left, list) or isinstance(right, list):
            if sizes[0] * sizes[1] > 10**6 if isinstance(node.op, ast.Mult) else sum(sizes) > 10**6:
                raise ValueError("a list past 10^6 elements")
        elif sizes[0] > MAX_VALUE or sizes[1] > MAX_VALUE:
            raise ValueError("an integer past 2^62")
        try:
            return _OPS[type(node.op)](left, right)
        except TypeError as err:
            raise ValueError(str(err)) from None
    raise ValueError(ast.dump(node))
