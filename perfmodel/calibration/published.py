"""Published measurements against the model: ``validate_published``.

Each source of ``validation/published/sources.toml`` is a table copied from a public page, with
its conditions per row. A collective row's ``busbw_GBps`` is compared with ``collective_time``
on the named cluster and GPU count (the row's algorithm: ``auto`` as NCCL chose, or the one it
forced); a training row's achieved TFLOP/s per GPU with ``predict`` on the same plan, both sides
counted with the source's own FLOP formula (so the error is that of the step time, inverted), or
its tokens/s with the predicted tokens/s.
Rows whose cluster the catalog does not have are kept and reported as skipped. Per source:
MAPE (mean |predicted / measured - 1|), bias (mean signed error) and the worst row. ``bounds.json``
records the MAPE each source may reach (``check_bounds``): a regression guard.

A training row is also a memory check: the run was measured, so its plan fit on its GPUs. Each
row carries the memory per GPU ``perfmodel.plan.memory`` predicts for its plan and whether that fits;
``check_bounds`` names every row predicted not to fit (``perfmodel.plan.memory`` kept Korthikanti's
s x s attention scores, which no flash-style attention keeps, until these rows showed it).
"""
from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache
from itertools import combinations
from pathlib import Path
import tempfile

from perfmodel.calibration import tables
from perfmodel.calibration.bridge import COLUMNS as BRIDGE_COLUMNS
from perfmodel.calibration.bridge import bridge_row
from perfmodel.calibration.regimes import regime_of
from perfmodel.plan.framework import DEFAULT_FRAMEWORK
from perfmodel.plan.precision import PRECISION_NAMES
from topologies.errors import InputError

PUBLISHED_DIR = Path(__file__).resolve().parents[2] / "validation" / "published"
BOUNDS_FILE = "bounds.json"
SOURCES_FILE = "sources.toml"
KINDS = ("collective", "training")
FORMATS = ("", "megatron-bridge")   # how a table's rows read: this folder's columns, or bridge.py's
FAMILIES = ("", "dense", "moe", "hybrid")
SOURCE_KEYS = ("kind", "file", "title")   # what every source names
DTYPES = {"float": "fp32", "half": "fp16", "bfloat16": "bf16"}   # nccl-tests' names
TFLOPS = "TFLOP/s/GPU"


@dataclass(frozen=True)
class Source:
    key: str
    kind: str
    file: str
    title: str
    system: str = ""
    cluster: str = ""
    op: str = "allreduce"
    format: str = ""      # how the file's rows read: '' (this folder's columns) or megatron-bridge (bridge.py)
    family: str = ""      # only rows of this model family (dense, moe) where the rows say


@dataclass(frozen=True)
class RowResult:
    source: str
    label: str
    measured: float
    predicted: float | None
    error: float | None         # predicted / measured - 1; None where skipped
    unit: str
    skipped: str = ""
    memory_GiB: float | None = None   # per GPU, perfmodel.plan.memory's peak stage (training rows)
    fits: bool | None = None          # that memory within the GPU's (a measured run did fit)
    regime: dict = field(default_factory=dict)   # where the row stands (perfmodel.calibration.regimes.REGIME_KEYS)

    def to_dict(self) -> dict:
        return asdict(self)


def load_sources(folder: Path = PUBLISHED_DIR) -> dict[str, Source]:
    """{key: Source} from ``sources.toml`` in ``folder``, every entry checked: a table of the keys of
    ``Source``, each a string, ``kind`` (and ``format``, ``family``) one of those known, ``file`` an
    existing table inside ``folder``."""
    folder = Path(folder)
    raw = _read_sources(folder / SOURCES_FILE)
    return {key: _source(folder, key, spec) for key, spec in raw.items()}


def _read_sources(path: Path) -> dict:
    if not path.parent.is_dir():
        raise InputError("dir", str(path.parent), f"a folder of published tables with their {SOURCES_FILE}")
    try:
        return tomllib.loads(path.read_text())
    except OSError as err:
        raise InputError("dir", str(path.parent), f"a folder with a readable {SOURCES_FILE} ({err.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(str(path), "bytes that are not UTF-8", "a UTF-8 TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise InputError(str(path), "not TOML", f"a TOML file of [source] tables ({err})") from None


def _source(folder: Path, key: str, spec) -> Source:
    """One entry of sources.toml as a Source, or one line naming what is wrong with it."""
    names = [f.name for f in fields(Source) if f.name != "key"]
    if not isinstance(spec, dict):
        raise InputError(f"sources.{key}", spec, "a [table] with the keys " + ", ".join(SOURCE_KEYS))
    unknown = sorted(set(spec) - set(names))
    if unknown:
        raise InputError(f"sources.{key}", ", ".join(unknown), "keys among " + ", ".join(names))
    for name in SOURCE_KEYS:
        if name not in spec:
            raise InputError(f"sources.{key}.{name}", None, "required in every source (" + ", ".join(SOURCE_KEYS) + ")")
    for name, value in spec.items():
        if not isinstance(value, str):
            raise InputError(f"sources.{key}.{name}", value, "a string")
    for name, allowed in (("kind", KINDS), ("format", FORMATS), ("family", FAMILIES)):
        if spec.get(name, "") not in allowed:
            raise InputError(f"sources.{key}.{name}", spec[name], "one of " + ", ".join(a or "absent" for a in allowed))
    table = (folder / spec["file"]).resolve()
    if not table.is_relative_to(folder.resolve()) or not table.is_file():
        raise InputError(f"sources.{key}.file", spec["file"], f"a CSV table in {folder} (a name inside the folder)")
    return Source(key=key, **spec)


def select_sources(name: str | None, folder: Path = PUBLISHED_DIR) -> list[Source]:
    """Every source (``name`` None or 'all') or the one named."""
    sources = load_sources(folder)
    if name in (None, "all"):
        return list(sources.values())
    if name not in sources:
        raise InputError("published", name, "all or one of " + ", ".join(sources))
    return [sources[name]]


def source_rows(source: Source, folder: Path = PUBLISHED_DIR) -> list[dict]:
    """The source's rows as this module predicts them (a ``format``'s rows mapped to these columns)."""
    return [row for _, row in located_rows(source, folder)]


def located_rows(source: Source, folder: Path = PUBLISHED_DIR) -> list[tuple[str, dict]]:
    """[(``FILE:LINE``, row)] of the source's rows (its system's, its family's), every cell this
    module reads checked (``check_row``): a bad one is one line naming the file, line and column."""
    path, field = Path(folder) / source.file, f"sources.{source.key}.file"
    table = tables.read_table(path, field, "a CSV table of published measurements")
    if source.format == "megatron-bridge":
        tables.require(path, table, COLUMNS_OF[source.format], field, "a Megatron-Bridge performance table")
        table = [(where, row) for where, raw in table for row in bridge_row(raw, where)]
    else:
        tables.require(path, table, COLUMNS_OF[source.kind], field, f"a table of {source.kind} measurements")
    out = [(where, r) for where, r in table if r["system"].startswith(source.system)
           and (not source.family or r.get("family") == source.family)]
    for where, row in out:
        check_row(source, where, row)
    return out


# the columns every row of a kind has (a megatron-bridge table: bridge.py's)
COLUMNS_OF = {"collective": ("system", "total_gpus", "message_size_bytes", "busbw_GBps"),
              "training": ("system", "model_label", "cluster", "gpus", "tp", "pp", "dp", "mbs", "gbs", "seq_len",
                           "precision", "recompute", "sequence_parallel"),
              "megatron-bridge": BRIDGE_COLUMNS}
# a training row's integers and their declared bounds (topologies.bounds; zero: its stage, checked by the plan)
TRAINING_INTEGERS = {"gpus": "world", "tp": "world", "pp": "world", "dp": "world", "mbs": "mbs", "gbs": "gbs",
                     "seq_len": "seq_len"}
OPTIONAL_INTEGERS = {"cp": "world", "ep": "world", "vp": "world", "zero": None}
SHAPE = {"hidden_size": "hidden_size", "num_layers": "num_layers", "num_heads": "num_heads",
         "vocab_size": "vocab_size"}   # a row without a catalog model, or counted with its source's FLOP formula
FLOPS_FORMULAS = ("megatron-2021", "megatron-core-2024")


def check_row(source: Source, where: str, row: dict) -> None:
    """Refuse a row (``where``: ``FILE:LINE``) any cell of which this module reads as what it is not:
    counts within their declared bounds, measurements finite and above 0, flags True or False."""
    if source.kind == "collective":
        tables.integer(where, row, "total_gpus", "world")
        tables.integer(where, row, "message_size_bytes", "size_bytes", positive=True)
        tables.number(where, row, "busbw_GBps", "busbw_GBps")
        return
    for column in ("model_label", "cluster", "precision", "recompute"):
        tables.text(where, row, column)
    for column, bound in TRAINING_INTEGERS.items():
        tables.integer(where, row, column, bound)
    for column, bound in OPTIONAL_INTEGERS.items():
        tables.integer(where, row, column, bound, required=False)
    tables.flag(where, row, "sequence_parallel")
    for column in ("tp_overlap", "dp_overlap"):
        tables.flag(where, row, column, required=False)
    unit, _ = _measured(row, where)
    if row.get("skip"):     # kept and reported, not predicted
        return
    if unit == TFLOPS:
        tables.choice(where, row, "flops_formula", FLOPS_FORMULAS)
    if unit == TFLOPS or not row.get("model"):
        for column, bound in SHAPE.items():
            tables.integer(where, row, column, bound)


def _size_label(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _collective_row(source: Source, row: dict) -> RowResult:
    from perfmodel.collectives.predict import collective_time

    op = row.get("op") or source.op
    algorithm = row.get("algorithm") or "auto"
    gpus, size = int(row["total_gpus"]), int(row["message_size_bytes"])
    label = f"{op} {algorithm} {gpus} GPUs {_size_label(size)}"
    measured = float(row["busbw_GBps"])
    cluster = row.get("cluster") or source.cluster
    try:
        rec = collective_time(op, size, cluster=cluster, gpus=gpus, algorithm=algorithm,
                              dtype=DTYPES.get(row.get("dtype", "float"), "fp32"))
    except InputError as e:
        if e.field != "cluster":
            raise
        return RowResult(source.key, label, measured, None, None, "busbw GB/s", f"cluster {cluster} not in the catalog")
    return RowResult(source.key, label, measured, rec.busbw_GBps, rec.busbw_GBps / measured - 1, "busbw GB/s")


def source_flops(formula: str, row: dict) -> float:
    """FLOPs per step as the source counted them. ``megatron-2021``: Narayanan et al. 2021's
    96 B s l h^2 (1 + s/6h + V/16lh) (with one recomputed forward); ``megatron-core-2024``:
    Megatron-LM's ``num_floating_point_operations`` (megatron/training/training.py @ f2e5db402c)
    for a GPT with ffn 4h, no GQA, no MoE: 72 B s l h^2 (1 + s/6h + V/12lh)."""
    b, s, layers, h, v = (int(row[k]) for k in ("gbs", "seq_len", "num_layers", "hidden_size", "vocab_size"))
    if formula == "megatron-2021":
        return 96.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    if formula == "megatron-core-2024":
        return 72.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    raise InputError("flops_formula", formula, "megatron-2021 or megatron-core-2024")


@lru_cache(maxsize=64)
def _model_toml(hidden: int, layers: int, heads: int, vocab: int, seq: int) -> str:
    """A GPT model TOML (gelu, layernorm, ffn 4h, embeddings tied as Megatron's default) for a table's row."""
    text = (f"hidden_size = {hidden}\nnum_layers = {layers}\nnum_heads = {heads}\nnum_kv_heads = {heads}\n"
            f"ffn_hidden_size = {4 * hidden}\nvocab_size = {vocab}\nseq_len = {seq}\nactivation = \"gelu\"\n"
            "norm = \"layernorm\"\ntied_embeddings = true\n")
    path = _toml_folder() / f"gpt-h{hidden}-l{layers}-a{heads}-v{vocab}-s{seq}.toml"
    path.write_text(text)
    return str(path)


_FOLDER: list = []   # [TemporaryDirectory]: one per process, removed when the process exits


def _toml_folder() -> Path:
    """The folder the rows' model TOMLs are written to (one per process, not one per model: a
    folder per model was left behind in the temp directory by every run)."""
    if not _FOLDER:
        _FOLDER.append(tempfile.TemporaryDirectory(prefix="perfmodel-published-"))
    return Path(_FOLDER[0].name)


def _training_row(source: Source, row: dict) -> RowResult:
    from perfmodel.prediction import predict

    gpus = int(row["gpus"])
    label = f"{row['model_label']} {gpus} GPUs " + " ".join(
        f"{k}{row[k]}" for k in ("tp", "pp", "cp", "ep", "dp") if k in ("tp", "pp", "dp") or _int(row, k) > 1)
    unit, measured = _measured(row)
    if row.get("precision", "").startswith(("fp8", "mxfp8", "nvfp4")):
        label += f" {row['precision']}"
    if row.get("skip"):
        return RowResult(source.key, label, measured, None, None, unit, row["skip"])
    try:
        rec = predict(row_model(row), row["cluster"], gpus=gpus, **row_plan(row), policy=row.get("policy") or "none",
                      allow_oom=True)
    except InputError as e:
        if e.field != "cluster" and not source.format:
            raise
        why = f"cluster {row['cluster']} not in the catalog" if e.field == "cluster" else f"refused: {e}"
        return RowResult(source.key, label, measured, None, None, unit, why)
    if unit == "tokens/s":
        predicted = rec.tokens_per_s
    elif unit == "tokens/s/GPU":
        predicted = rec.tokens_per_s / gpus
    else:
        predicted = source_flops(row["flops_formula"], row) / (rec.step_time_s * gpus) / 1e12
    fits = None if row.get("memory_unchecked") else rec.fits     # bridge.py says why a row's fit is not checked
    return RowResult(source.key, label, measured, predicted, predicted / measured - 1, unit,
                     memory_GiB=rec.memory_per_gpu_bytes / 2**30, fits=fits)


def _int(row: dict, key: str, default: int = 1) -> int:
    return int(row.get(key) or default)


MEASURED = {"measured_tokens_per_s_per_gpu": "tokens/s/GPU", "measured_tokens_per_s": "tokens/s",
            "measured_tflops_per_gpu": TFLOPS}   # what a training row measured, the first it has


def _measured(row: dict, where: str = "row") -> tuple[str, float]:
    """(unit, value) of what the row measured: tokens/s per GPU, tokens/s, or TFLOP/s per GPU (a
    finite number above 0; a row with none of them is refused)."""
    column = next((c for c in MEASURED if str(row.get(c) or "").strip()), "measured_tflops_per_gpu")
    return MEASURED[column], tables.number(where, row, column)


def _flag(row: dict, key: str) -> bool | None:
    """A True/False cell; empty or absent: None (the framework's default)."""
    cell = row.get(key) or ""
    return None if not cell else cell == "True"


def row_model(row: dict) -> str:
    """The row's catalog model, or a GPT TOML of its shape columns."""
    if row.get("model"):
        return row["model"]
    return _model_toml(*(int(row[k]) for k in ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_len")))


def row_plan(row: dict) -> dict:
    """predict's plan keywords of a row (cp, ep, vp, precision and framework where it has them). A
    precision that is no name of ``perfmodel.plan.precision`` is half precision described in words
    (megatron-lm-a100-2021: 'half precision ..., run as fp16')."""
    precision = row["precision"] if row["precision"] in PRECISION_NAMES else "fp16"
    vp = _int(row, "vp")
    plan = dict(tp=_int(row, "tp"), pp=_int(row, "pp"), dp=_int(row, "dp"), cp=_int(row, "cp"), ep=_int(row, "ep"),
                mbs=int(row["mbs"]), gbs=int(row["gbs"]), seq=int(row["seq_len"]), recompute=row["recompute"],
                zero=_int(row, "zero", 0), sequence_parallel=row["sequence_parallel"] == "True",
                tp_overlap=_flag(row, "tp_overlap"), dp_overlap=_flag(row, "dp_overlap"), precision=precision,
                grad_dtype=row.get("grad_dtype") or "fp32",
                framework=row.get("framework") or DEFAULT_FRAMEWORK)
    if vp > 1:
        plan["schedule"] = f"interleaved:{vp}"
    if row.get("etp"):                   # bridge.py's MoE rows: the recipes' expert tensor parallelism
        plan["etp"] = _int(row, "etp")
    if row.get("pipeline_layout"):       # bridge.py's DeepSeek-V3 and Kimi-K2 rows: the recipes' stage split
        plan["pipeline_layout"] = row["pipeline_layout"]
    if row.get("recompute_modules"):     # a row whose run recomputed named modules (--recompute-modules)
        plan["recompute_modules"] = row["recompute_modules"]
    if _flag(row, "fp8_attention"):      # bridge.py's rows whose recipe runs attention in FP8
        plan["fp8_attention"] = True
    if row.get("ep_overlap", "none") != "none":   # bridge.py's rows whose recipe overlaps the all-to-alls
        plan["ep_overlap"], plan["ep_kernels"] = row["ep_overlap"], row.get("ep_kernels") or "nccl"
    return plan


def predict_source(source: Source, folder: Path = PUBLISHED_DIR) -> list[RowResult]:
    """Every row of ``source`` predicted (``predicted_rows``)."""
    return [result for _, result in predicted_rows(source, folder)]


def predicted_rows(source: Source, folder: Path = PUBLISHED_DIR) -> list[tuple[dict, RowResult]]:
    """[(row, its prediction)] of every row of ``source`` (a value the model refuses, or a prediction
    that is no number above 0, named with its row's file and line)."""
    one = _collective_row if source.kind == "collective" else _training_row
    out = []
    for where, row in located_rows(source, folder):
        try:
            result = one(source, row)
        except InputError as err:
            raise tables.located(where, err) from None
        if result.predicted is not None and not (math.isfinite(result.predicted) and result.predicted > 0):
            raise InputError(f"{where}.predicted", result.predicted, f"a prediction above 0 for {result.label} (the "
                             "model gives none for this row, e.g. a collective of one GPU: its error is no number)")
        out.append((row, replace(result, regime=regime_of(source, row))))
    return out


# the precisions from the highest to the lowest: a pair's lower precision is the later one
PRECISION_ORDER = ("bf16", "fp8-blockwise", "fp8-tensorwise", "fp8-delayed", "mxfp8", "nvfp4")
# what two rows share to be one plan (the model label names the container; a parenthesised row's, bridge.py's
# ' (alt)', is the same)
PAIR_PLAN = ("model_label", "cluster", "gpus", "tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "zero")


def precision_pairs(folder: Path = PUBLISHED_DIR) -> list[dict]:
    """Every identical-plan pair of the Megatron-Bridge sources (``format`` megatron-bridge) with both
    rows predicted: two rows of the same model, system, GPUs and plan in the same container that differ
    only in precision, with the lower precision's published speedup over the other (its tokens/s/GPU
    over the other's), the predicted one, and their difference in points
    (``scripts/bridge_precision_pairs.py`` prints them)."""
    rows = []
    for source in load_sources(folder).values():
        if source.format != "megatron-bridge":
            continue
        for row, result in predicted_rows(source, folder):     # the table read and checked once
            if result.predicted is not None:
                key = tuple(str(row[k]).replace(" (alt)", "") for k in PAIR_PLAN)
                rows.append((key, row["precision"], result))
    out = []
    for (ka, pa, ra), (kb, pb, rb) in combinations(rows, 2):
        if ka != kb or pa == pb:
            continue
        (low, lo), (high, hi) = sorted(((pa, ra), (pb, rb)), key=lambda x: -PRECISION_ORDER.index(x[0]))
        measured, predicted = lo.measured / hi.measured, lo.predicted / hi.predicted
        out.append(dict(plan=lo.label.split(" GPUs")[0] + " GPUs", low=low, high=high, measured=round(measured, 3),
                        predicted=round(predicted, 3), points=round(100 * (predicted - measured), 1)))
    return out


def summarize(source: Source, results: list[RowResult]) -> dict:
    """MAPE, bias and the worst row of a source's predicted rows (None where none was predicted)."""
    done = [r for r in results if r.error is not None]
    worst = max(done, key=lambda r: abs(r.error)) if done else None
    checked = [r for r in done if r.fits is not None]
    return dict(source=source.key, title=source.title, kind=source.kind, rows=len(results), predicted=len(done),
                fit_checked=len(checked), unfit=[r.label for r in checked if not r.fits],
                skipped=len(results) - len(done),
                mape=sum(abs(r.error) for r in done) / len(done) if done else None,
                bias=sum(r.error for r in done) / len(done) if done else None,
                worst_label=worst.label if worst else None, worst_error=worst.error if worst else None)


def validate_published(name: str | None = None, folder: Path = PUBLISHED_DIR) -> list[dict]:
    """[{summary fields, 'results': [RowResult]}] for every source (or the one named)."""
    out = []
    for source in select_sources(name, folder):
        results = predict_source(source, folder)
        out.append(dict(summarize(source, results), results=results))
    return out


# the largest MAPE bound a source may declare: 1000%, past any model a guard is worth keeping for
MAX_MAPE_BOUND = 10.0
BOUNDS_SHAPE = 'a JSON object {"mape": {SOURCE: bound}}'


def load_bounds(folder: Path = PUBLISHED_DIR) -> dict[str, float]:
    """{source: the MAPE it may reach} of ``bounds.json`` in ``folder`` (``{"mape": {SOURCE: NUMBER}}``),
    each a finite number from 0 to ``MAX_MAPE_BOUND``: a NaN, inf or text bound, which no MAPE can
    exceed, would turn the guard off. {} where the folder has no bounds.json."""
    path = Path(folder) / BOUNDS_FILE
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
    except OSError as err:
        raise InputError(str(path), "unreadable", f"a readable JSON file ({err.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(str(path), "bytes that are not UTF-8", "a UTF-8 JSON file") from None
    except json.JSONDecodeError as err:
        raise InputError(str(path), "not JSON", f"{BOUNDS_SHAPE} ({err.msg} at line {err.lineno})") from None
    except RecursionError:
        raise InputError(str(path), "nested too deeply", BOUNDS_SHAPE) from None
    if not isinstance(raw, dict):
        raise InputError(str(path), f"a JSON {type(raw).__name__}", BOUNDS_SHAPE)
    mape = raw.get("mape")
    if not isinstance(mape, dict):
        raise InputError(f"{path}:mape", mape if mape is None else f"a JSON {type(mape).__name__}",
                         "an object of SOURCE: the MAPE it may reach (0.05 is 5%)")
    for source, bound in mape.items():
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound) \
                or not 0 <= bound <= MAX_MAPE_BOUND:
            raise InputError(f"{path}:mape.{source}", bound, f"a finite number from 0 to {MAX_MAPE_BOUND:g} "
                             "(the MAPE the source may reach; 0.05 is 5%)")
    return {source: float(bound) for source, bound in mape.items()}


def check_bounds(reports: list[dict], bounds: dict[str, float]) -> list[str]:
    """One line per source whose MAPE exceeds its bound, or that was predicted but has none, and
    per measured run whose plan the model says does not fit its GPUs' memory."""
    bad = []
    for rep in reports:
        for r in rep.get("results", []):
            if r.fits is False:
                bad.append(f"{rep['source']}: {r.label} ran, but is predicted not to fit "
                           f"({r.memory_GiB:.1f} GiB per GPU)")
        if rep["mape"] is None:
            continue
        bound = bounds.get(rep["source"])
        if bound is None:
            bad.append(f"{rep['source']}: MAPE {rep['mape']:.1%} and no bound in {BOUNDS_FILE}")
        elif not math.isfinite(rep["mape"]):    # a prediction that is no number fails the guard, never passes it
            bad.append(f"{rep['source']}: MAPE {rep['mape']} is not a number (a row's prediction is not finite)")
        elif rep["mape"] > bound:
            bad.append(f"{rep['source']}: MAPE {rep['mape']:.1%} above its bound {bound:.1%}")
    return bad


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def summary_markdown(reports: list[dict], bounds: dict[str, float]) -> str:
    """The per-source table as Markdown (README's 'How close is the model' block)."""
    lines = ["| source | what | rows | MAPE | bias | worst row | bound | fits memory |",
             "|---|---|---:|---:|---:|---|---:|---:|"]
    for rep in reports:
        mape = "-" if rep["mape"] is None else f"{rep['mape']:.1%}"
        worst = f"{rep['worst_label']} ({_pct(rep['worst_error'])})" if rep["worst_label"] else \
            f"not predicted ({rep['skipped']} rows: cluster not in the catalog)"
        bound = bounds.get(rep["source"])
        checked = rep.get("fit_checked", 0)
        fits = f"{checked - len(rep.get('unfit', []))}/{checked}" if checked else "-"
        lines.append(f"| `{rep['source']}` | {rep['title']} | {rep['predicted']}/{rep['rows']} | {mape} | "
                     f"{_pct(rep['bias'])} | {worst} | {'-' if bound is None else f'{bound:.1%}'} | {fits} |")
    return "\n".join(lines)


def results_csv_rows(reports: list[dict]) -> list[list]:
    header = ["source", "label", "unit", "measured", "predicted", "error", "skipped", "memory_GiB", "fits"]
    rows = [[r.source, r.label, r.unit, r.measured, "" if r.predicted is None else round(r.predicted, 3),
             "" if r.error is None else round(r.error, 4), r.skipped,
             "" if r.memory_GiB is None else round(r.memory_GiB, 2), "" if r.fits is None else r.fits]
            for rep in reports for r in rep["results"]]
    return [header, *rows]


def plot_published(reports: list[dict], path: str) -> str:
    """Predicted against measured, log-log, one panel per unit (busbw, TFLOP/s per GPU, tokens/s),
    a colour per source, the diagonal and +-10% drawn."""
    from perfmodel.report.plots import new_figure, save_figure

    units = list(dict.fromkeys(r.unit for rep in reports for r in rep["results"] if r.predicted is not None))
    units = units or ["busbw GB/s"]
    plt, fig, axes = new_figure(5.5 * len(units), 5.0, cols=len(units))
    axes = axes if len(units) > 1 else [axes]
    for ax, unit in zip(axes, units):
        lo, hi = float("inf"), 0.0
        for rep in reports:
            pts = [(r.measured, r.predicted) for r in rep["results"] if r.predicted is not None and r.unit == unit]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, label=f"{rep['source']} ({rep['mape']:.1%})")
                lo, hi = min(lo, *(min(p) for p in pts)), max(hi, *(max(p) for p in pts))
        lo, hi = (lo * 0.8, hi * 1.25) if hi else (1.0, 10.0)
        for f, style in ((1.0, "-"), (0.9, "--"), (1.1, "--")):
            ax.plot([lo, hi], [lo * f, hi * f], color="#444444" if f == 1.0 else "#999999", lw=0.7, ls=style)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        ax.set_title(f"published measurements: {unit} (dashed: +-10%)", fontsize=10)
        ax.legend(fontsize=7)
    return save_figure(plt, fig, path)
