"""Every example launch script and config of Megatron-LM, torchtitan and DeepSpeedExamples through ``--from``'s
importers, tallied: imported cleanly, refused (naming the keys) or crashed (a traceback: a bug).

The repositories are read from git directories (``fetch``'s mirrors, or any clone's ``.git``), never a work
tree: each example is written to a temporary folder at its own name and read by the importer the way
``perfmodel import FORMAT:PATH`` reads it (``perfmodel.importers.read``; a DeepSpeed config is mapped as
``predict --deepspeed`` maps it on 8 GPUs a node, 64 GPUs). What counts as an example:

* Megatron-LM: ``examples/**/*.sh`` at ``--megatron-rev`` that run a GPT-like trainer (``pretrain_gpt.py``,
  ``pretrain_hybrid.py``, ``pretrain_mamba.py``, ``finetune_gpt.py``); the other scripts (BERT, T5,
  multimodal, inference, conversion) are counted as out of scope;
* torchtitan: every ``*.toml`` under ``torchtitan/`` at each of ``--torchtitan-revs`` (the TOML job configs
  were replaced by Python config registries at 9810191bbb, 2026-02-23: the default revisions are v0.1.0,
  v0.2.2 and that commit's parent);
* DeepSpeedExamples: every ``*.json`` under ``training/`` whose name holds ``ds_config``, ``deepspeed`` or
  ``zero`` at ``--deepspeed-rev``;
* Megatron-Bridge (``--bridge``): its example and tutorial override YAMLs (``examples/**/conf/*.yaml``,
  ``tutorials/**/conf/*.yaml``);
* NeMo 1 (``--nemo``): ``examples/nlp/language_modeling/conf/megatron_*config*.yaml``, the decoder-only
  models' training configs (``NEMO1_GPT``); the others are out of scope.

Usage::

    python scripts/import_examples.py --megatron Megatron-LM/.git --torchtitan torchtitan/.git \\
        --deepspeed DeepSpeedExamples/.git --bridge Megatron-Bridge/.git

prints a table a file (``--markdown`` as docs/importers.md has it) and the tally a repository; ``--verbose``
adds every refused line. ``--predict CLUSTER`` (``--model NAME`` where the files give no model) goes on to
predict each clean import (``predict_one``). Exit 1 where any example crashed.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topologies.errors import InputError  # noqa: E402

GPT_TRAINERS = re.compile(r"\b(pretrain_gpt|pretrain_hybrid|pretrain_mamba|finetune_gpt)\.py\b")
TORCHTITAN_REVS = ("v0.1.0", "v0.2.2", "9810191bbb^")
# NeMo 1's decoder-only training configs (the rest: BERT, BART, T5, T0, UL2, RETRO, validation and generation)
NEMO1_GPT = re.compile(r"^megatron_(gpt|llama|baichuan2|chatglm|falcon|gemma2?|qwen2|starcoder2?|mamba|griffin)"
                       r"_config(_hyena)?\.yaml$")
DS_NAMES = re.compile(r"ds_config|deepspeed|zero", re.I)


def git(gitdir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={gitdir}", *args], check=True, capture_output=True,
                          text=True, errors="replace").stdout


def files(gitdir: str, rev: str) -> list[str]:
    return git(gitdir, "ls-tree", "-r", "--name-only", rev).splitlines()


def run_one(fmt: str, path: str) -> tuple[str, str]:
    """(outcome, detail) of one file: ok, refused (the keys) or crashed (the exception's last line)."""
    from perfmodel.importers import read
    from perfmodel.plan.deepspeed import map_config, read_config

    try:
        if fmt == "deepspeed":
            ds = map_config(read_config(path), 8, 64)
            return "ok", f"{len(ds.mapped)} mapped, {len(ds.ignored)} ignored"
        imported = read(f"{fmt}:{path}")
        return "ok", f"{len(imported.lines)} lines, {len(imported.model)} model keys, {len(imported.plan)} plan keys"
    except InputError as err:
        if getattr(err, "refused", None):
            keys = [_key(line) for line in err.refused]
            more = f" | and {len(keys) - 3} more" if len(keys) > 3 else ""
            return "refused", " | ".join(keys[:3]) + more
        value = "" if str(err.value) == path else f"{err.value}: "
        return "refused", f"{value}{err.allowed}"[:160]
    except Exception as err:  # noqa: BLE001 -- the point: a traceback is a bug to count
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return "crashed", last


def predict_one(fmt: str, path: str, cluster: str, model: str | None) -> tuple[str, str]:
    """(outcome, detail) of predicting a clean import on ``cluster``: the files' model (else ``model``; a
    DeepSpeed config names none), on the fewest GPUs, tp x pp x cp x dp (``_data_parallel``), that the
    plan takes (a refusal of one size tries the next; the smallest size's line, and the last other one, is
    the detail)."""
    from perfmodel.importers import build_model, merge, plan_of, predict, read

    spec = f"{fmt}:{path}"
    both = merge([read(spec)])                # the format's defaults under the file's keys
    plan = plan_of(both)
    try:
        imported = build_model(both.model, both.name, spec) if both.model else None
    except InputError as err:
        imported, why = None, f"the files' model lacks {err.value}"
    else:
        why = "the files give none"
    if imported is None and model is None:
        return "no model", f"{why} (--model NAME predicts with it)"
    base = max(1, plan.get("tp", 1)) * max(1, plan.get("pp", 1)) * max(1, plan.get("cp", 1))
    seen = {}
    for dp in _data_parallel(fmt, path, plan):
        try:
            result = predict(spec, cluster, model=None if imported is not None else model, gpus=base * dp)
        except InputError as err:
            seen.setdefault(str(err)[:120], base * dp)
            continue
        except Exception as err:  # noqa: BLE001 -- a traceback is a bug to count
            return "crashed", traceback.format_exception_only(type(err), err)[-1].strip()
        return "predicts", f"{base * dp} GPUs, {result.step_time_s:.3g} s a step"
    shown = list(seen.items())[:1] + list(seen.items())[1:][-1:]
    return "refused", "; ".join(f"on {gpus} GPUs: {line}" for line, gpus in shown)


def _data_parallel(fmt: str, path: str, plan: dict) -> list[int]:
    """The data-parallel degrees to try: a DeepSpeed config's own where its batch says it
    (train_batch_size / (micro-batch x accumulation)), else ep x 1, 2, 4, ... 1024."""
    if fmt == "deepspeed":
        from perfmodel.plan.deepspeed import read_config

        config = read_config(path)
        sizes = [config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                         "gradient_accumulation_steps")]
        if all(isinstance(v, int) and v > 0 for v in sizes) and sizes[0] % (sizes[1] * sizes[2]) == 0:
            return [sizes[0] // (sizes[1] * sizes[2])]
    return [max(1, plan.get("ep", 1)) * 2 ** k for k in range(11)]


def _key(line: str) -> str:
    """The key a refusal line names (``megatron: cannot honour --foo 3: why`` -> ``--foo 3``)."""
    line = re.sub(r"^\w+: cannot honour ", "", line)
    return line.split(": ", 1)[0][:60]


def add_predictions(rows: list[tuple], cluster: str, model: str | None, tmp: Path) -> list[tuple]:
    """``rows`` with each clean import's prediction as a row of its own (format ``FMT predict``)."""
    out = []
    for fmt, name, outcome, _, path in rows:
        if outcome == "ok":
            importer = "nemo" if fmt == "nemo1" else fmt          # NeMo 1's YAML: the nemo: importer
            out.append((f"{fmt} predict", name, *predict_one(importer, path, cluster, model), path))
    return out


def megatron(gitdir: str, rev: str, tmp: Path) -> list[tuple]:
    out = []
    for name in files(gitdir, rev):
        if not (name.startswith("examples/") and name.endswith(".sh")):
            continue
        text = git(gitdir, "show", f"{rev}:{name}")
        if not GPT_TRAINERS.search(text):
            out.append(("megatron", name, "out of scope", "runs no GPT-like trainer", ""))
            continue
        path = _write(tmp, "megatron", name, text)
        out.append(("megatron", name, *run_one("megatron", path), path))
    return out


def torchtitan(gitdir: str, revs: list[str], tmp: Path) -> list[tuple]:
    out = []
    for rev in revs:
        for name in files(gitdir, rev):
            if name.startswith("torchtitan/") and name.endswith(".toml"):
                path = _write(tmp, f"torchtitan-{rev}", name, git(gitdir, "show", f"{rev}:{name}"))
                out.append(("torchtitan", f"{rev}:{name}", *run_one("torchtitan", path), path))
    return out


def deepspeed(gitdir: str, rev: str, tmp: Path) -> list[tuple]:
    out = []
    for name in files(gitdir, rev):
        if name.startswith("training/") and name.endswith(".json") and DS_NAMES.search(Path(name).name):
            path = _write(tmp, "deepspeed", name, git(gitdir, "show", f"{rev}:{name}"))
            out.append(("deepspeed", name, *run_one("deepspeed", path), path))
    return out


def bridge(gitdir: str, rev: str, tmp: Path) -> list[tuple]:
    out = []
    for name in files(gitdir, rev):
        if re.match(r"(examples|tutorials)/.*/conf/[^/]+\.ya?ml$", name):
            path = _write(tmp, "bridge", name, git(gitdir, "show", f"{rev}:{name}"))
            out.append(("nemo", name, *run_one("nemo", path), path))
    return out


def nemo1(gitdir: str, rev: str, tmp: Path) -> list[tuple]:
    out = []
    for name in files(gitdir, rev):
        if not re.match(r"examples/nlp/language_modeling/conf/megatron_[^/]*config[^/]*\.yaml$", name):
            continue
        if not NEMO1_GPT.search(Path(name).name):
            out.append(("nemo1", name, "out of scope", "not a decoder-only model's training config", ""))
        else:
            path = _write(tmp, "nemo1", name, git(gitdir, "show", f"{rev}:{name}"))
            out.append(("nemo1", name, *run_one("nemo", path), path))
    return out


def _write(tmp: Path, prefix: str, name: str, text: str) -> str:
    path = tmp / prefix / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def tally(rows: list[tuple]) -> dict:
    """{format: Counter of outcomes}."""
    out: dict[str, Counter] = {}
    for fmt, _, outcome, *_ in rows:
        out.setdefault(fmt, Counter())[outcome] += 1
    return out


def report(rows: list[tuple], revs: dict, markdown: bool, verbose: bool) -> str:
    lines = []
    if markdown:
        lines += ["| format | file | outcome | detail |", "|---|---|---|---|"]
        lines += [f"| `{f}` | `{n}` | {o} | {d.replace('|', '/')} |" for f, n, o, d, _ in rows
                  if verbose or o != "out of scope"]
        counted = tally(rows)
        for stage, columns in (("", ("ok", "refused", "crashed", "out of scope")),
                               (" predict", ("predicts", "refused", "crashed", "no model"))):
            chosen = [f for f in counted if f.endswith(stage) and (stage or " " not in f)]
            if not chosen:
                continue
            names = ["imported cleanly" if c == "ok" else c for c in columns]
            lines += ["", f"| format | snapshot | {' | '.join(names)} |", "|---|---|" + "---|" * len(columns)]
            for fmt in chosen:
                lines.append(f"| `{fmt}` | {revs.get(fmt.split()[0], '')} | "
                             + " | ".join(str(counted[fmt][c]) for c in columns) + " |")
        return "\n".join(lines)
    for fmt, name, outcome, detail, _ in rows:
        if outcome not in ("out of scope", "no model") or verbose:
            lines.append(f"{outcome:8s} {fmt}:{name}" + (f"  [{detail}]" if outcome != "ok" or verbose else ""))
    for fmt, counts in tally(rows).items():
        lines.append(f"{fmt} @ {revs.get(fmt.split()[0], '')}: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--megatron", metavar="GITDIR", help="NVIDIA/Megatron-LM's git directory")
    p.add_argument("--megatron-rev", default="HEAD")
    p.add_argument("--torchtitan", metavar="GITDIR", help="pytorch/torchtitan's git directory (with its history)")
    p.add_argument("--torchtitan-revs", default=",".join(TORCHTITAN_REVS), help="comma-separated revisions")
    p.add_argument("--deepspeed", metavar="GITDIR", help="microsoft/DeepSpeedExamples' git directory")
    p.add_argument("--deepspeed-rev", default="HEAD")
    p.add_argument("--bridge", metavar="GITDIR", help="NVIDIA-NeMo/Megatron-Bridge's git directory")
    p.add_argument("--bridge-rev", default="HEAD")
    p.add_argument("--nemo", metavar="GITDIR", help="NVIDIA/NeMo's git directory (NeMo 1's training YAMLs)")
    p.add_argument("--nemo-rev", default="HEAD")
    p.add_argument("--predict", metavar="CLUSTER", help="also predict every clean import on this cluster (rows "
                   "'FORMAT predict': predicts, refused with the prediction's line, crashed, or no model)")
    p.add_argument("--model", help="with --predict: the model of imports that give none (a DeepSpeed config's)")
    p.add_argument("--markdown", action="store_true", help="tables as docs/importers.md has them")
    p.add_argument("--verbose", action="store_true", help="every file, the clean ones' details too")
    args = p.parse_args(argv)
    rows, revs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.megatron:
            rows += megatron(args.megatron, args.megatron_rev, Path(tmp))
            revs["megatron"] = git(args.megatron, "rev-parse", args.megatron_rev).strip()[:10]
        if args.torchtitan:
            found = args.torchtitan_revs.split(",")
            rows += torchtitan(args.torchtitan, found, Path(tmp))
            revs["torchtitan"] = ", ".join(f"{r} {git(args.torchtitan, 'rev-parse', r).strip()[:10]}" for r in found)
        if args.deepspeed:
            rows += deepspeed(args.deepspeed, args.deepspeed_rev, Path(tmp))
            revs["deepspeed"] = git(args.deepspeed, "rev-parse", args.deepspeed_rev).strip()[:10]
        if args.bridge:
            rows += bridge(args.bridge, args.bridge_rev, Path(tmp))
            revs["nemo"] = git(args.bridge, "rev-parse", args.bridge_rev).strip()[:10]
        if args.nemo:
            rows += nemo1(args.nemo, args.nemo_rev, Path(tmp))
            revs["nemo1"] = git(args.nemo, "rev-parse", args.nemo_rev).strip()[:10]
        if args.predict:
            rows += add_predictions(rows, args.predict, args.model, Path(tmp))
    print(report(rows, revs, args.markdown, args.verbose))
    return 1 if any(r[2] == "crashed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
