"""A training step's compute on this CPU, timed the way perfmodel counts it: the GEMMs of a
layer (forward, and the input- and weight-gradient GEMMs of backward), attention (PyTorch's
scaled-dot-product kernel, forward and backward; under cp a ring block's six products, and the
block as realrun's eager ring attention runs it, ``scores``), a layer's memory-bound work (as
realrun's Block runs it: norms, RoPE and the head layout copies, biases, residual adds, the
activation; forward and backward) and the LM head, on the shapes of the
model and plans given, with ``ranks`` processes computing at once (as the ranks of an emulated
cluster share this machine's cores). Records: ``perfmodel.calibration.measurements`` kind ``compute``;
Each record has the wall seconds per call (``time_s``) and the CPU seconds the process got
in them (``cpu_s``): on hosts with a fixed CPU share, ``perfmodel calibrate`` prices the work at
``cpu_s / share`` (what the quota grants when the machine has the cores it promised), and
reports the share the helpers were actually granted (``cpu_s / time_s``), so a calibration run
on a busy machine says so instead of fitting a slower device.
``perfmodel calibrate`` turns them into the device's GEMM efficiency table and streaming rate.
"""
from __future__ import annotations

import time

from perfmodel.step.compute import (EAGER_RING_BWD_PRODUCTS, RING_FWD_PRODUCTS, activation_bytes, attention_heads,
                               layer_gemms, moe_gemms)
from perfmodel.calibration.measurements import make_record
from perfmodel.plan.parallel import make_plan
from perfmodel.workload import load_model
from realrun.bench.instep import in_step
from topologies.errors import InputError

_RING_PRODUCTS = RING_FWD_PRODUCTS + EAGER_RING_BWD_PRODUCTS   # a ring block's GEMMs, recomputed scores too
# what makes two cases different kernels: their shape, and what runs at it (a ring block or the
# whole sequence; a memory-bound case's norm, activation, and grouped-query repeats outside cp)
_KERNEL_FIELDS = ("op", "m", "n", "k", "heads", "kv_heads", "blocks", "norm", "activation", "cp")
MIN_S = 0.3   # each case runs at least this long, so the processes' time slices interleave


def _gemm_case(m, n, k) -> dict:
    return {"op": "gemm", "m": int(m), "n": int(n), "k": int(k), "flops": 3 * 2.0 * m * n * k, "bytes": 0.0}


def _plan_cases(arch, plan) -> list[dict]:
    """One plan's distinct shapes: the layer's GEMMs (a MoE model's router and expert GEMMs at the
    expert load too), the LM head's, attention (cp blocks under cp), the memory-bound work."""
    T = plan.mbs * plan.local_seq
    gemms = layer_gemms(arch, plan) + [(T, arch.vocab_size / plan.tp, arch.hidden_size)]
    if arch.is_moe:
        gemms += [(m, n, k) for m, n, k, _ in moe_gemms(arch, plan, arch.expert_load)]
    out = [_gemm_case(m, n, k) for m, n, k in gemms]
    heads, t = int(attention_heads(arch, plan)), plan.local_seq
    n = t if plan.cp > 1 else plan.seq        # one of a cp rank's blocks, or the whole sequence
    out.append({"op": "attention", "m": t, "n": n, "k": arch.head_dim, "heads": heads, "mbs": plan.mbs,
                "blocks": plan.cp > 1, "flops": 3 * 2 * heads * 2.0 * t * n * arch.head_dim, "bytes": 0.0})
    if plan.cp > 1:   # and the block as realrun's eager ring attention runs it (its elementwise work)
        out.append({"op": "scores", "m": t, "n": t, "k": arch.head_dim, "heads": heads, "mbs": plan.mbs,
                    "kv_heads": int(plan.mbs * arch.num_kv_heads / plan.tp), "scores": heads * t * t,
                    "flops": _RING_PRODUCTS * heads * 2.0 * t * t * arch.head_dim, "bytes": 0.0})
    out.append({"op": "elementwise", "m": T, "n": arch.hidden_size, "k": int(arch.mlp_up_width / plan.tp),
                "heads": heads, "kv_heads": int(plan.mbs * arch.num_kv_heads / plan.tp), "head_dim": arch.head_dim,
                "mbs": plan.mbs, "cp": plan.cp, "norm": arch.norm, "biased": arch.biased,
                "activation": arch.activation,
                "flops": 0.0, "bytes": 3 * 2.0 * activation_bytes(arch, plan)})
    return out


def cases(model: str, world: int, tps=(1, 2), mbs: int = 4, seq: int | None = None, cps=(1,)) -> list[dict]:
    """What one rank of the model (or of each of the comma-separated models) computes per
    microbatch, for each TP degree, each CP degree the sequence splits into and (a MoE model)
    ep 2 where it divides the experts and the ranks: distinct GEMM shapes (the layer's, a MoE
    layer's, the LM head's), attention, and the memory-bound work. A layout the model or the
    ranks do not allow (tp*cp not dividing the ranks, tp not dividing the heads, a sequence not
    in 2*cp chunks) is left out; a model with no layout left is an ``InputError``, raised
    before anything runs. Attention under cp is timed as the GEMMs of its blocks (``m`` queries
    against ``n`` keys, as ``perfmodel.step.compute`` prices them) and as realrun's eager ring block
    (``scores``: what it spends beyond them is ``eager_score_ns``)."""
    out, seen = [], set()
    for name in model.split(","):
        arch = load_model(name.strip())
        for plan in _plans(arch, world, tps, mbs, seq, cps):
            for case in _plan_cases(arch, plan):
                key = tuple(case.get(f) for f in _KERNEL_FIELDS)
                if key not in seen:
                    seen.add(key)
                    out.append(case)
    return out


def _plans(arch, world: int, tps, mbs: int, seq: int | None, cps) -> list:
    """The plans of ``cases`` the model allows: each tp x cp layout the sequence splits into
    (2*cp chunks) on ranks it divides, and a MoE model's ep 2 (carved from dp: a rank's experts,
    their rows) where it divides the experts and the ranks."""
    length = arch.seq_len if seq is None else seq
    layouts = [(tp, cp, 1) for tp in tps for cp in cps
               if (cp == 1 or length % (2 * cp) == 0) and world % (tp * cp) == 0]
    if arch.is_moe and arch.num_experts % 2 == 0 and world % 2 == 0:
        layouts.append((1, 1, 2))
    plans, refused = [], None
    for tp, cp, ep in layouts:
        try:
            plans.append(make_plan(arch, world, tp=tp, cp=cp, ep=ep, mbs=mbs, seq=seq, compute_dtype="fp32"))
        except InputError as e:   # e.g. tp 2 of a model with one KV head
            refused = refused or e
    if not plans:
        raise refused or InputError("tp", ",".join(map(str, tps)), f"a degree dividing the {world} ranks")
    return plans


def _callable(case: dict):
    """A function running one case forward and backward."""
    import torch
    import torch.nn.functional as F

    m, n, k = case["m"], case["n"], case["k"]
    if case["op"] == "gemm":
        x, w, dy = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
        return lambda: (x @ w, dy @ w.T, x.T @ dy)
    if case["op"] == "attention" and case.get("blocks"):   # a ring block's products: QK^T, PV, their gradients
        b, heads = case["mbs"], case["heads"] // case["mbs"]
        q, dout = torch.randn(b, heads, m, k), torch.randn(b, heads, m, k)
        kk, v, p = torch.randn(b, heads, n, k), torch.randn(b, heads, n, k), torch.randn(b, heads, m, n)
        # forward S = Q K^T, O = P V; backward dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q
        return lambda: (q @ kk.transpose(-1, -2), p @ v, dout @ v.transpose(-1, -2), p.transpose(-1, -2) @ dout,
                        p @ kk, p.transpose(-1, -2) @ q)
    if case["op"] == "scores":
        return _ring_block(case)
    if case["op"] == "attention":
        b, heads = case["mbs"], case["heads"] // case["mbs"]
        q, kk, v = (torch.randn(b, heads, m, k, requires_grad=True) for _ in range(3))
        return lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True).sum().backward()
    return _layer_memory(case)


def _layer_memory(case: dict):
    """A layer's memory-bound work as ``realrun.train.model.Block`` runs it, forward and backward,
    without its GEMMs and attention kernel: the two norms, the QKV bias (layernorm models), the
    split into heads and RoPE on queries and keys (grouped-query: keys and values repeated to
    every head, outside cp), the attention output's copy back to rows, the output and MLP biases
    with the residual adds, and the activation (GELU, or SwiGLU's silu(gate) x up). Its time over
    perfmodel's bytes for the layer (``activation_bytes``, three passes) is the streaming rate a
    calibration fits, so the layout copies and RoPE the model does not count bytes for are priced
    at the rate they run beside the rest."""
    import torch
    import torch.nn.functional as F

    from realrun.train.model import norm_layer, rope

    b, h, up_width = case["mbs"], case["n"], case["k"]
    t, heads, kv, d = case["m"] // b, case["heads"] // b, case["kv_heads"] // b, case["head_dim"]
    norm1, norm2 = norm_layer(case["norm"], h), norm_layer(case["norm"], h)
    grad = {"requires_grad": True}
    x, proj, mlp_out = (torch.randn(b, t, h, **grad) for _ in range(3))
    qkv, att = torch.randn(b, t, (heads + 2 * kv) * d, **grad), torch.randn(b, heads, t, d, **grad)
    up = torch.randn(b, t, up_width, **grad)
    # the biases of QKV, the output projection, FC1 and FC2 (layernorm models have them)
    qkv_b, proj_b, up_b, mlp_out_b = (torch.zeros(y.shape[-1], **grad) if case["biased"] else None
                                      for y in (qkv, proj, up, mlp_out))

    def add(y, c):
        return y if c is None else y + c

    def layer():
        parts = add(qkv, qkv_b).split([heads * d, kv * d, kv * d], dim=-1)
        q, kk, v = (p.view(b, t, -1, d).transpose(1, 2) for p in parts)
        q, kk = rope(q), rope(kk)
        if kv != heads and case["cp"] == 1:
            kk, v = kk.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
        rows = att.transpose(1, 2).reshape(b, t, heads * d)
        r = x + add(proj, proj_b)
        hidden = add(up, up_b)
        if case["activation"] == "swiglu":
            gate, hidden = hidden.chunk(2, dim=-1)
            hidden = F.silu(gate) * hidden
        else:
            hidden = F.gelu(hidden)
        out = r + add(mlp_out, mlp_out_b)
        sum(y.sum() for y in (norm1(x), q, kk, v, rows, norm2(r), hidden, out)).backward()
    return layer


def _ring_block(case: dict):
    """One block of realrun's ring attention, forward and backward (a cp group of one: the
    rank's own block, no exchange)."""
    import torch

    from realrun.train.context_parallel import ContextParallel, ring_attention

    b, heads, kv = case["mbs"], case["heads"] // case["mbs"], case["kv_heads"] // case["mbs"]
    cp = ContextParallel(1, 0, None)
    q = torch.randn(b, heads, case["m"], case["k"], requires_grad=True)
    kk, v = (torch.randn(b, kv, case["n"], case["k"], requires_grad=True) for _ in range(2))
    return lambda: ring_attention(q, kk, v, cp, "block").sum().backward()


def _worker(barrier, queue, cases_: list[dict]) -> None:
    import torch

    torch.set_num_threads(1)
    out = []
    for case in cases_:
        fn = _callable(case)
        fn()   # warm: allocations, kernel selection
        barrier.wait()
        calls, begin, cpu = 0, time.perf_counter(), time.process_time()
        while calls < 3 or time.perf_counter() - begin < MIN_S:
            fn()
            calls += 1
        # wall time per call over the whole interval: the time slices other ranks took count, as
        # they do in a training step (a short call timed alone would mostly run unshared); and
        # the CPU seconds the process got in it (a host with a quota turns them into wall time)
        out.append(((time.perf_counter() - begin) / calls, (time.process_time() - cpu) / calls))
    queue.put(out)


def run_compute(model: str = "gpt-tiny", world: int = 4, ranks: int = 1, tps=(1, 2), mbs: int = 4,
                seq: int | None = None, threads: int = 1, place=None, cps=(1,)) -> list[dict]:
    """Compute records of ``model``'s shapes (``cases``) with ``ranks`` processes at once (median
    process; ``place``: as ``in_step``'s)."""
    todo = cases(model, world, tps, mbs, seq, cps)
    results = in_step(_worker, (todo,), ranks, threads, place)
    out = []
    for case, times in zip(todo, zip(*results)):
        wall, cpu = sorted(times)[len(times) // 2]
        extra = {"scores": case["scores"]} if "scores" in case else {}
        out.append(make_record("compute", op=case["op"], device="cpu", m=case["m"], n=case["n"], k=case["k"],
                               flops=case["flops"], bytes=case["bytes"], time_s=wall, cpu_s=cpu, concurrent=ranks,
                               **extra))
    return out
