"""Sweep every valid plan of a model on a cluster under several policies; rank them.

Plans: tp over the divisors of GPUs per node that divide the heads and KV heads; pp over
divisors of gpus / tp up to the layer count; dp = gpus / (tp pp); mbs over powers of two up
to ``max_mbs`` dividing gbs / dp; ZeRO 0-3 (0 only when dp = 1); recompute as given ('any'
tries all three). Plans that do not fit in memory are counted and skipped. Expert parallelism
enters only for MoE models, folded as Megatron-Core folds it (``perfmodel.plan.mesh``): expert
tensor parallelism etp = tp, or 1 where tp > 1 (the two Megatron-Bridge's MoE recipes use; each
dividing the experts' FFN width), and ep over the divisors of tp x cp x dp / etp that divide the
experts (with etp 1, only multiples of tp: the expert groups fold over whole tensor-parallel groups,
to keep the plans few), every ZeRO stage with them;
context parallelism only for sequences of at least ``LONG_SEQ`` tokens: cp over the divisors of
gpus / (tp pp) up to ``MAX_CP`` that cut the sequence into 2 cp chunks. Dense models at ordinary
lengths get exactly the plans they always had.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from perfmodel.axes import REPORTED
from perfmodel.plan.degrees import DEFAULT_ORDER
from perfmodel.prediction import StepRecord, predict
from perfmodel.plan.parallel import RECOMPUTE, divisors
from perfmodel.compression.policy import split_policies
from perfmodel.workload import load_model
from topologies import InputError, cluster_for


LONG_SEQ = 16384   # cp is tried from here: below it a sequence's activations fit without splitting it
MAX_CP = 16        # the largest cp tried (Llama 3's long-context training used 16)


@dataclass(frozen=True)
class SweepResult:
    records: list          # StepRecords, fastest first
    evaluated: int         # (plan, policy) pairs predicted
    skipped_oom: int       # plans that do not fit
    plans: int             # candidate plans before the memory check


def candidate_plans(model: str, cluster: str, gpus: int | None, nodes: int | None, gbs: int,
                    max_mbs: int = 8, recompute: str = "none", zero=(0, 1, 2, 3), seq: int | None = None) -> list[dict]:
    spec, (built, ranks) = load_model(model), cluster_for(cluster, nodes=nodes, gpus=gpus)
    seq = seq or spec.seq_len
    if recompute != "any" and recompute not in RECOMPUTE:
        raise InputError("recompute", recompute, "none, selective, full or any")
    recomputes = RECOMPUTE if recompute == "any" else (recompute,)
    out = []
    # TP stays inside an NVLink domain (a node; a rack of trays on NVL72)
    tps = [t for t in divisors(math.gcd(built.gpus_per_domain, ranks)) if spec.num_heads % t == 0
           and spec.num_kv_heads % t == 0]
    for tp in tps:
        for pp in (p for p in divisors(ranks // tp) if p <= spec.num_layers):
            for cp, ep, etp in _ep_cp(spec, tp, ranks // (tp * pp), seq):
                dp = ranks // (tp * pp * cp)
                mbss = [m for m in (2 ** i for i in range(max_mbs.bit_length())) if m <= max_mbs
                        and gbs % (m * dp) == 0]
                zeros = [z for z in zero if dp * cp > 1 or z == 0]
                extra = {k: v for k, v in (("ep", ep), ("cp", cp)) if v > 1} | ({"etp": etp} if spec.is_moe else {})
                for mbs, z, rc in itertools.product(mbss, zeros, recomputes):
                    out.append(dict(tp=tp, pp=pp, dp=dp, mbs=mbs, zero=z, recompute=rc, **extra))
    return out


def _ep_cp(spec, tp: int, rest: int, seq: int) -> list[tuple[int, int, int]]:
    """(cp, ep, etp) for ``rest`` = gpus / (tp pp) GPUs (module doc); (1, 1, tp) first."""
    cps = [1] + ([c for c in divisors(rest) if 1 < c <= MAX_CP and seq % (2 * c) == 0] if seq >= LONG_SEQ else [])
    etps = [e for e in dict.fromkeys((tp, 1)) if spec.moe_ffn_hidden_size % e == 0] if spec.is_moe else [tp]
    out = []
    for cp, etp in itertools.product(cps, etps):
        folded = tp * rest // etp            # tp x cp x dp / etp: the ranks ep folds over
        eps = [1] + ([e for e in divisors(folded) if e > 1 and spec.num_experts % e == 0] if spec.is_moe else [])
        out += [(cp, ep, etp) for ep in eps if etp == tp or ep % tp == 0]
    return out


def sweep_plans(model: str, cluster: str, *, gpus: int | None = None, nodes: int | None = None, gbs: int,
          policies: str = "none,hybrid", max_mbs: int = 8, recompute: str = "none", zero=(0, 1, 2, 3),
          progress=None, **fixed) -> SweepResult:
    """Predict every candidate plan under every policy; records sorted by step time.
    ``progress(done, total)`` is called after each plan; ``fixed`` goes to ``predict``."""
    names = split_policies(policies)
    plans = candidate_plans(model, cluster, gpus, nodes, gbs, max_mbs, recompute, zero)
    records, skipped = [], 0
    for i, plan in enumerate(plans):
        for policy in names:
            try:
                records.append(predict(model, cluster, gpus=gpus, nodes=nodes, gbs=gbs, policy=policy,
                                       **plan, **fixed))
            except InputError as err:
                if err.field != "memory":
                    raise
                skipped += 1
                break
        if progress:
            progress(i + 1, len(plans))
    records.sort(key=lambda r: r.step_time_s)
    return SweepResult(records=records, evaluated=len(records), skipped_oom=skipped, plans=len(plans))


def best_uncompressed_s(records) -> float:
    """The fastest uncompressed step among the records' plans (each record knows its own plan's:
    its step time times its speedup over it), so no policy list needs ``none``."""
    return min((r.step_time_s * r.speedup_vs_uncompressed for r in records), default=float("nan"))


def plan_row(r: StepRecord, best_none_s: float | None = None) -> dict:
    """A flat row for tables and CSV: both speedups (over the best uncompressed plan, over the
    same plan uncompressed) and the error of every axis."""
    p = r.plan
    return {"policy": r.policy, **{n: p[n] for n in DEFAULT_ORDER}, "mbs": p["mbs"], "zero": p["zero"],
            "recompute": p["recompute"], "step_time_s": r.step_time_s, "samples_per_s": r.samples_per_s,
            "model_tflops_per_gpu": r.model_tflops_per_gpu, "mfu": r.mfu,
            "speedup_vs_best_uncompressed": (best_none_s / r.step_time_s) if best_none_s else float("nan"),
            "speedup_vs_uncompressed": r.speedup_vs_uncompressed,
            **{f"error_{a}": r.error_estimate.get(a, 0.0) for a in REPORTED},
            "memory_GiB": r.memory_per_gpu_bytes / 2**30}
