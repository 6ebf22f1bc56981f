"""Text reports of step predictions: one step, policies side by side, sweep tables, catalogs."""
from __future__ import annotations

import csv
import io

from perfmodel.axes import AXES, PHASES, REPORTED
from perfmodel.devices import gpu_catalog
from perfmodel.explore.sweep import best_uncompressed_s, plan_row
from perfmodel.phases import COMPRESSION, COMPUTE
from perfmodel.plan.degrees import DEFAULT_ORDER, Degrees
from perfmodel.plan.precision import PRECISION_NAMES, peak_dtype, recipe
from perfmodel.workload import model_catalog
from topologies import catalog_names, load_spec
from topologies.clikit import table

GiB = 2**30


def _plan_line(r) -> str:
    p = r.plan
    sched = p["schedule"] + (f":{p['virtual_stages']}" if p["schedule"] == "interleaved" else "")
    layers = sorted(set(r.stage_layers))
    split = f"{layers[0]} layers per stage" if len(layers) == 1 else \
        "uneven stages: " + "/".join(map(str, r.stage_layers)) + " layers"
    routing = f" routing={p['routing']}" if p.get("routing") else ""   # a MoE plan's, where it names one
    if p.get("ep_overlap", "none") != "none":   # a MoE plan's expert overlap and its kernels
        routing += f" ep_overlap={p['ep_overlap']} ep_kernels={p['ep_kernels']}"
    return (f"plan: {Degrees.of(p).describe()} zero={p['zero']} mbs={p['mbs']} gbs={p['gbs']} "
            f"({p['microbatches']} microbatches) seq={p['seq']} sp={str(p['sequence_parallel']).lower()} "
            f"recompute={p['recompute']} schedule={sched} {_precision_text(p)}{routing}; {split}")


def _precision_text(p: dict) -> str:
    """The plan's precision: its compute dtype, or a low recipe with the activations' dtype."""
    precision, dtype = p["precision"], p["compute_dtype"]
    text = precision if precision == dtype else f"{precision} ({dtype} activations)"
    return text + (" fp8 attention" if p.get("fp8_attention") else "")


def _mfu_text(r) -> str:
    """MFU against the compute dtype's peak and, for a low precision, against its GEMMs' own peak."""
    peak, own = r.plan["compute_dtype"], peak_dtype(r.plan["precision"], r.plan["compute_dtype"])
    if own == peak:
        return f"MFU {100 * r.mfu:.1f}% of {peak} peak"
    return f"MFU {100 * r.mfu:.1f}% of {peak} peak, {100 * r.mfu_precision:.1f}% of {own}"


def _breakdown_rows(r) -> list[tuple]:
    """The breakdown, with compute split by kind and compression by axis (indented, ``of which``)."""
    rows = []
    for phase in shown_phases([r]):
        seconds = r.breakdown[phase.name]
        rows.append((phase.name.removesuffix("_s"), seconds, 100 * seconds / r.step_time_s))
        if phase is COMPUTE:
            rows += [(f"  {name[:-2].replace('_', '-')}", v, 100 * v / r.step_time_s)
                     for name, v in r.compute_detail.items() if v > 0 or name != "host_bound_s"]
        if phase is COMPRESSION:
            for axis, kinds in r.kernel_s.items():
                rows += [(f"  {axis} kernels" + (" beside compute" if kind == "beside_compute_s" else ""), v,
                          100 * v / r.step_time_s) for kind, v in kinds.items() if v > 0]
    return rows


def _shown_axes(r) -> dict:
    """The policy's axes a report lists: every axis, the optional ones (ep, ep_combine, cp) only
    where they carry traffic or the policy compresses them."""
    return {a: v for a, v in r.policy_axes.items()
            if not AXES[a].optional or v["spec"] != "none" or a in r.wire_bytes}


def step_report(r) -> str:
    axes = ", ".join(f"{a}={v['spec']}" + (f" (>= {v['min_bytes']} B)" if v["min_bytes"] else "")
                     for a, v in _shown_axes(r).items())
    lines = [f"{r.model} on {r.cluster}: {r.gpus} x {r.gpu}", _plan_line(r), f"policy: {r.policy}  [{axes}]", "",
             f"step time     {r.step_time_s:10.3f} s   speedup {r.speedup_vs_uncompressed:.3f}x over uncompressed",
             f"samples/s     {r.samples_per_s:10.2f}     tokens/s {r.tokens_per_s:,.0f}",
             f"TFLOPS/GPU    {r.model_tflops_per_gpu:10.2f}     (hardware {r.hardware_tflops_per_gpu:.2f}, "
             f"{_mfu_text(r)})",
             f"memory/GPU    {r.memory_per_gpu_bytes / GiB:10.1f} GiB" + ("" if r.fits else "  DOES NOT FIT"),
             *_to_target_lines(r), ""]
    lines.append(table(("breakdown", "seconds", "%"), _breakdown_rows(r)))
    wire = [(axis, tier, nbytes / 1e9) for axis, tiers in r.wire_bytes.items() for tier, nbytes in tiers.items()]
    if wire:
        lines += ["", table(("axis", "tier", "GB per rank per step"), wire)]
    errors = [(a, e) for a, e in r.error_estimate.items()]
    if errors:
        lines += ["", table(("axis", "error estimate (relative RMS)"), errors)]
    return "\n".join(lines)


def _to_target_lines(r) -> list[str]:
    """A lossy policy's time to the uncompressed loss (``perfmodel.explore.convergence.record_cost``:
    the steps inflation, a recipe's uncompressed warm-up): nothing for a lossless one."""
    from perfmodel.explore.convergence import default_regime, record_cost

    if not any(r.error_estimate.values()):
        return []
    cost = record_cost(r)
    uncompressed = r.step_time_s * r.speedup_vs_uncompressed
    warm = f", {cost['warmup']:.0%} of the steps uncompressed warm-up" if cost["warmup"] else ""
    return [f"to target     {cost['effective_step_time_s']:10.3f} s   speedup "
            f"{uncompressed / cost['effective_step_time_s']:.3f}x in time to the uncompressed loss "
            f"(steps x {cost['steps_inflation']:.3f}{warm}; {default_regime().source})"]


ERR_AXES = REPORTED   # the error columns every table has (the optional axes' where used)


def shown_phases(records) -> tuple:
    """The step phases (``perfmodel.axes.PHASES``, in their order) a table of ``records`` shows:
    an ``optional`` one only where some record has it nonzero, one an engine alone produces
    (``engines``) only where that engine ran."""
    return tuple(p for p in PHASES
                 if (not p.engines or any(r.engine in p.engines for r in records))
                 and (not p.optional or any(r.breakdown.get(p.name, 0.0) for r in records)))


def _err_axes(records) -> tuple:
    return ERR_AXES + tuple(a for a in AXES if AXES[a].optional and any(a in r.error_estimate for r in records))


def compare_report(records) -> str:
    phases, err_axes = shown_phases(records), _err_axes(records)
    head = ("policy", "step_s", "speedup", "samples/s", "TFLOPS", "MFU%") + tuple(p.short for p in phases) \
        + tuple(f"err {a}" for a in err_axes) + ("mem GiB",)
    rows = []
    for r in records:
        e = r.error_estimate
        rows.append((r.policy, r.step_time_s, r.speedup_vs_uncompressed, r.samples_per_s,
                     r.model_tflops_per_gpu, 100 * r.mfu) + tuple(r.breakdown[p.name] for p in phases)
                    + tuple(e.get(a, 0.0) for a in err_axes)
                    + (f"{r.memory_per_gpu_bytes / 2**30:.1f}" + ("" if r.fits else " (OOM)"),))
    first = records[0]
    note = ("# seconds per step by kind (compute, TP and PP communication, exposed DP/ZeRO communication, "
            "compression kernels, pipeline bubble, optimizer, overlap slowdown); err = relative RMS error per axis "
            "(dp: gradients, zero: gathered parameters, tp and pp: activations and their gradients); mem GiB: "
            "peak per GPU with the policy's state (OOM: does not fit)")
    return "\n".join([f"{first.model} on {first.cluster}: {first.gpus} x {first.gpu}", _plan_line(first), note,
                      table(head, rows)])


def sweep_table(records, top: int) -> str:
    best = best_uncompressed_s(records)
    rows = []
    for i, r in enumerate(records[:top], 1):
        d = plan_row(r, best)
        rows.append((i, d["policy"], *(d[n] for n in DEFAULT_ORDER), d["mbs"], d["zero"], d["recompute"],
                     d["step_time_s"], d["samples_per_s"], 100 * d["mfu"], d["speedup_vs_best_uncompressed"],
                     d["speedup_vs_uncompressed"], *(d[f"error_{a}"] for a in ERR_AXES), d["memory_GiB"]))
    return table(("#", "policy", *DEFAULT_ORDER, "mbs", "zero", "recompute", "step_s", "samples/s",
                  "MFU%", "vs best none", "vs same plan", *(f"err {a}" for a in ERR_AXES), "mem GiB"), rows)


def sweep_csv(records) -> bytes:
    best = best_uncompressed_s(records)
    return rows_csv([plan_row(r, best) for r in records])


def rows_csv(rows: list[dict]) -> bytes:
    """CSV of flat rows (the keys of the first are the header): sweep's and search's files."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["policy"])
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


def catalog_report(kind: str) -> str:
    parts = []
    if kind in ("gpus", "all"):
        rows = [(k, d.name, d.peak_flops_per_s.get("bf16", d.peak_flops_per_s.get("fp16", 0)) / 1e12,
                 d.hbm_bytes / 2**30, d.hbm_Bps / 1e12, d.stream_Bps / 1e12,
                 "-" if d.board_power_W is None else d.board_power_W) for k, d in gpu_catalog().items()]
        parts.append(table(("gpu", "name", "bf16/fp16 TFLOPS", "HBM GiB", "HBM TB/s", "stream TB/s", "TDP W"), rows))
    if kind in ("models", "all"):
        rows = [(n, m.params / 1e9, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_hidden_size,
                 m.vocab_size, m.seq_len, m.activation) for n, m in model_catalog().items()]
        parts.append(table(("model", "params B", "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq", "act"),
                           rows))
    if kind in ("clusters", "all"):
        specs = [(n, load_spec(n)[0]) for n in catalog_names()]
        rows = [(n, s["gpu"], s["description"]) for n, s in specs]
        parts.append(table(("cluster", "gpu", "description"), rows))
    if kind in ("compressors", "all"):
        parts.append(compressor_catalog())
    if kind in ("libraries", "all"):
        parts.append(library_catalog())
    if kind in ("policies", "all"):
        parts.append(policy_catalog())
    if kind in ("precisions", "all"):
        parts.append(precision_catalog())
    return "\n\n".join(parts)


def policy_catalog() -> str:
    """Every policy preset (--policy): the spec of each axis it compresses, and its source."""
    from perfmodel.compression.policy import PRESET_SOURCES, PRESETS

    rows = [(name, ", ".join(f"{a}={spec}" + (f" (>= {m} B)" if m else "") for a, (spec, m) in axes.items()),
             PRESET_SOURCES[name]) for name, axes in PRESETS.items()]
    return table(("preset", "axes (the others: none)", "source"), rows,
                 title="# policy presets; also naive:SPEC (SPEC on every axis) and AXIS=SPEC items")


def precision_catalog() -> str:
    """Every precision (--precision): its GEMMs' kernel and the quantized copies it makes."""
    rows = []
    for name in PRECISION_NAMES:
        r = recipe(name)
        if not r.is_low:
            rows.append((name, name, "-", "-", "-", "-"))
            continue
        block = f"{r.activation_block or 'tensor'} / {r.weight_block or 'tensor'}"
        rows.append((name, r.gemm, ", ".join(r.low_gemms), r.element_bytes, block,
                     ", ".join(r.archs) or "any with the peak"))
    return table(("precision", "GEMM kernel", "low GEMMs", "bytes/elem", "scale block (act / weight)", "needs"), rows,
                 title="# precisions: attention, the embedding and the LM head stay in the compute dtype; "
                 "catalog/precisions.toml gives each number's source")


def library_catalog() -> str:
    """Every collective library (--library): the all-reduce algorithms 'auto' weighs, its protocols,
    and what it is (catalog/libraries.toml gives each constant's source)."""
    from perfmodel.collectives.library import libraries

    rows = [(lib.name, lib.doc.split(":")[0], ", ".join(lib.auto["allreduce"]),
             ", ".join(lib.compressed.get("allreduce", ("any",))), ", ".join(lib.protocol_names()))
            for lib in libraries().values()]
    return table(("library", "what", "allreduce", "compressed allreduce", "protocols"), rows)


def compressor_catalog() -> str:
    """Every compressor family: its arguments with their defaults, and each example spec's wire
    ratio on 64 Mi fp32 values and relative RMS error on unit-Gaussian data (the model's numbers)."""
    from perfmodel.compression import compile_spec
    from perfmodel.compression.families import FAMILIES

    rows = []
    count = 64 * 2**20
    for name, family in FAMILIES.items():
        args = ", ".join(p.name + ("" if p.required else f"={p.default if p.default is not None else 'unset'}")
                         for p in family.PARAMS) or "-"
        for i, example in enumerate(family.EXAMPLES or (name,)):
            codec = compile_spec(example)
            ratio = 4 * count / codec.wire_bytes(count, 4)
            rows.append((name if i == 0 else "", args if i == 0 else "", example, ratio, codec.error,
                         "yes" if codec.lossless else "no"))
    rows.append(("ef(...)", "spec", "ef(topk(0.01))+int8", 4 * count / compile_spec("ef(topk(0.01))+int8").wire_bytes(
        count, 4), compile_spec("ef(topk(0.01))+int8").error, "no"))
    return table(("family", "arguments (default)", "example", "ratio fp32", "error", "lossless"), rows,
                 title="# compressors: chain with + (applied left to right), ef(SPEC) adds error feedback; "
                 "ratio = fp32 bytes / wire bytes for 64 Mi values; error = relative RMS error, unit-Gaussian data")


def plan_text(r: dict) -> str:
    extra = (" sp" if r["sequence_parallel"] else "") + (f" {r['schedule']}" if r["schedule"] != "1f1b" else "") \
        + (" hpz" if r["hpz"] else "") + (f" rc={r['recompute']}" if r["recompute"] != "none" else "")
    return f"{Degrees.of(r).describe(form='{}{}')} mbs{r['mbs']} z{r['zero']}{extra}"


def search_err_axes(rows: list) -> tuple:
    """The error columns of search tables: dp, zero, tp, pp, and ep, ep_combine, cp where a row's
    plan has them."""
    used = {n for n in Degrees.names() if any(r.get(n, 1) > 1 for r in rows)}
    return ERR_AXES + tuple(a for a in AXES if AXES[a].optional and AXES[a].mesh_axis in used)


def search_table(rows: list, top: int, title: str | None = None, show_cluster: bool | None = None) -> str:
    """Ranked (plan, policy) rows: both speedups, the steps inflation and the speedup in time to
    target (``perfmodel.explore.convergence``), per-axis errors (dp gradients, zero gathered
    parameters, tp and pp activations); the cluster where rows come from several, and what training
    the token budget takes where rows carry it (``perfmodel.explore.cost``: days, GPU-hours, USD, MWh)."""
    out, axes = [], search_err_axes(rows[:top])
    several = len({r.get("cluster") for r in rows}) > 1 if show_cluster is None else show_cluster
    costs = [c for c in COST_COLUMNS if rows and c[0] in rows[0]]
    accuracy = bool(rows) and "speedup_to_target" in rows[0]   # the steps inflation (perfmodel.explore.convergence)
    for i, r in enumerate(rows[:top], 1):
        out.append((i,) + ((r["cluster"],) if several else ()) + (r["policy"], plan_text(r), r["step_time_s"])
                   + tuple(_amount(r[k], scale) for k, _, scale in costs)
                   + (r["speedup_vs_best_uncompressed"], r["speedup_vs_same_plan_uncompressed"])
                   + ((r["steps_inflation"], r["speedup_to_target"]) if accuracy else ())
                   + tuple(r[f"error_{a}"] for a in axes) + (100 * r["mfu"], r["memory_GiB"]))
    return table(("#",) + (("cluster",) if several else ()) + ("policy", "plan", "step_s")
                 + tuple(h for _, h, _ in costs) + ("vs best none", "vs same plan")
                 + (("steps x", "to target") if accuracy else ())
                 + tuple(f"err {a}" for a in axes) + ("MFU%", "mem GiB"), out, title=title)


# (row key, column, divisor): what training the token budget takes, in readable units
COST_COLUMNS = (("time_to_train_s", "days", 86400.0), ("gpu_hours", "GPU-h", 1.0), ("cost_usd", "USD", 1.0),
                ("energy_kWh", "MWh max", 1000.0))


def _amount(value: float | None, scale: float):
    """A cost column's cell: whole numbers from 1000 up (GPU-hours, dollars), '-' where unknown."""
    if value is None:
        return "-"
    value /= scale
    return int(round(value)) if abs(value) >= 1000 else value
