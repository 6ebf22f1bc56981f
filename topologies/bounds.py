"""Declared bounds of every input that sizes work or memory: one table, one check.

A cluster file's counts and rates, a model file's dimensions, a message size, a measured
record's numbers: each field has a kind (a whole number or any number) and the lowest and
highest value a run can mean. ``check(field, value)`` returns the value or refuses it in one
line naming the field, the value and the limit (``InputError``), before anything is built
from it. A field is looked up by its last dotted part (``node.gpus`` -> ``gpus``), else by its
unit suffix (``nic_Gbps`` -> ``_Gbps``). The limits are far beyond any real system and far
below what would exhaust this machine (a graph, a schedule, a float).
"""
from __future__ import annotations

import math

from topologies.errors import InputError

INT, NUMBER = "an integer", "a number"
MAX_NODES = 16384          # hosts in one graph: the largest catalog systems have ~10k; building takes seconds
MAX_GPUS_PER_NODE = 1024
MAX_GPUS = 2**17           # GPUs in one graph (16384 nodes of 8): larger graphs take minutes and gigabytes
MAX_SIZE_BYTES = 2**50     # one message or tensor: 1 PiB

BOUNDS: dict[str, tuple[str, float, float]] = {
    # cluster files: nodes, node and fabric builders
    "default_nodes": (INT, 1, MAX_NODES),
    "nodes": (INT, 1, MAX_NODES),
    "gpus": (INT, 1, MAX_GPUS_PER_NODE),
    "nics": (INT, 1, MAX_GPUS_PER_NODE),
    "sockets": (INT, 1, 64),
    "cpus": (INT, 1, 64),
    "hosts_per_domain": (INT, 1, MAX_NODES),
    "gpus_per_socket": (INT, 1, MAX_GPUS_PER_NODE),
    "nics_per_socket": (INT, 1, MAX_GPUS_PER_NODE),
    "gpus_per_switch": (INT, 1, MAX_GPUS_PER_NODE),
    "cores": (INT, 1, 4096),
    "slow_host": (INT, -1, MAX_NODES - 1),
    "cpu_share": (NUMBER, 0.0, 1.0),
    "radix": (INT, 2, 4096),
    "levels": (INT, 1, 3),
    "routers_per_group": (INT, 1, 4096),
    "hosts_per_router": (INT, 1, 4096),
    "hosts_per_group": (INT, 1, MAX_NODES),
    "oversubscription": (NUMBER, 1.0, 1024.0),
    "_GBps": (NUMBER, 1e-6, 1e6),       # link rates in GB/s (10^9 bytes/s)
    "_Gbps": (NUMBER, 1e-6, 1e7),       # network rates in Gb/s
    "_us": (NUMBER, 0.0, 1e6),          # latencies: up to one second
    # model files
    "hidden_size": (INT, 1, 2**18),
    "num_layers": (INT, 1, 2**14),
    "num_heads": (INT, 1, 2**14),
    "num_kv_heads": (INT, 1, 2**14),
    "ffn_hidden_size": (INT, 1, 2**20),
    "vocab_size": (INT, 1, 2**24),
    "seq_len": (INT, 1, 2**24),
    # messages and measured records
    "size_bytes": (INT, 0, MAX_SIZE_BYTES),
    "wire_bytes": (INT, 0, MAX_SIZE_BYTES),
    "world": (INT, 1, MAX_GPUS),
    # calibration profiles: protocol costs (a second at most) and GEMM sizes (the efficiency table's keys)
    "base_us": (NUMBER, 0.0, 1e5),       # 100 ms: 100x the slowest fitted step (emulated TCP, ~1 ms)
    "step_us": (NUMBER, 0.0, 1e5),       # a loaded 2-core emulated cluster fitted 13 ms
    "gemm_size": (NUMBER, 1.0, 1e12),
    # realrun's emulated links (tc tbf on this machine): below 1 mbit a step takes hours, above 100 gbit
    # no veth pair on one machine carries it
    "link_bits_per_s": (INT, 10**6, 10**11),
    # realrun's launchers: threads per rank (a pool each; 256 is past any host's cores here, 1e5 exhausts the
    # process table) and how long one waits for its ranks (a week, what realrun train waits; NaN, inf or 0 never
    # end a run or end it at once)
    "threads": (INT, 1, 256),
    "timeout_s": (NUMBER, 1.0, 7 * 86400.0),
    # perfmodel search's cost of a token budget: the largest published runs train on ~4e13 tokens; 1e16 tokens at
    # 1e4 USD per GPU-hour (cloud GPUs rent for 1-100) keep every cost column a finite number
    "tokens": (NUMBER, 1.0, 1e16),
    "gpu_hour_price": (NUMBER, 0.0, 1e4),
    # perfmodel search's worker processes on one machine (a pool's or a local Dask cluster's): 256 is past any
    # host's cores here; each is an interpreter of ~100 MB, and 3000 did not start in a minute
    "workers": (INT, 1, 256),
    # measured records and the profiles fitted from them: one timed call (1 ns is under any timer's resolution,
    # a day past any benchmark's), one compute record's FLOPs (1e21: hours on the fastest GPU), a device's
    # fitted fp32 peak (1e5 TFLOP/s, 1000x any GPU's), memory rate (1e3 TB/s, 100x HBM3e) and eager-attention
    # nanoseconds per score (1e6, 1e5x a CPU's): past these a fit reads noise or a corrupt record
    "measured_s": (NUMBER, 1e-9, 86400.0),
    "flops": (NUMBER, 0.0, 1e21),
    "fp32_TFLOPS": (NUMBER, 1e-6, 1e5),
    "memory_TBps": (NUMBER, 1e-6, 1e3),
    "eager_score_ns": (NUMBER, 0.0, 1e6),
    # batch sizes in sequences: a plan's pipeline schedule holds every micro-batch (~2 KB each); the largest
    # published global batch is 15360 (DeepSeek-V3), 2^20 of them take seconds and a few hundred MB
    "gbs": (INT, 1, 2**20),
    "mbs": (INT, 1, 2**16),
    # DeepSpeed's micro-batches per step and GPU (gbs / (mbs x dp): bounded as gbs) and its gradient bucket in
    # elements (default 5e8; 2^48 fp32 elements are the 1 PiB of size_bytes)
    "gradient_accumulation_steps": (INT, 1, 2**20),
    "reduce_bucket_size": (INT, 1, 2**48),
    "bucket_bytes": (INT, 1, MAX_SIZE_BYTES),
    # a pipeline schedule timed operation by operation (stages x micro-batches x chunks; ~2 KB and ~20 us each):
    # published runs reach ~3e4 (GPT-1T: pp 64 x 512), 2^19 take ~20 s and ~1.3 GB; past it only a schedule that
    # settles into a repeating pattern (perfmodel.step.schedule) is timed
    "schedule_operations": (INT, 1, 2**19),
    # mixture-of-experts model files: the catalog's largest are DeepSeek-V3's 256 routed experts (top 8, 1 shared,
    # 2048 wide) and Mixtral's 14336-wide experts; the router is h x num_experts and every expert a GEMM
    "num_experts": (INT, 1, 2**14),
    "moe_top_k": (INT, 1, 2**14),
    "moe_shared_experts": (INT, 0, 2**10),
    "moe_ffn_hidden_size": (INT, 1, 2**20),
    "moe_layer_freq": (INT, 1, 2**14),
    "moe_first_dense": (INT, 0, 2**14),
    "moe_capacity_factor": (NUMBER, 0.0, 1e4),   # published 1-2 (Switch 1.25, GShard 2)
    "moe_load_imbalance": (NUMBER, 1.0, 1e4),    # the most loaded expert over its fair share
    "moe_latent_size": (INT, 0, 2**20),          # LatentMoE's expert width (Nemotron 3 Super: 1024); <= hidden_size
    # measured routing histograms (perfmodel.plan.routing): tokens routed to one expert (the largest runs train
    # ~4e13 tokens x top-8: 3e14), and the file (64 MiB hold 4M counts of 16 characters, 280x DeepSeek-V3's 58 x 256)
    "tokens_per_expert": (NUMBER, 0.0, 1e16),
    "routing_file_bytes": (INT, 0, 2**26),
    # attention and multi-token prediction in model files (perfmodel.workload): published heads are 64-256 wide
    # (DeepSeek's MLA scores over 192), latents 512-1536, windows 128-4096 tokens, one MTP module (DeepSeek-V3);
    # each sizes a GEMM or a layer, so bounded as the dimensions beside it
    "head_dim": (INT, 1, 2**14),
    "sliding_window": (INT, 0, 2**24),           # tokens, as seq_len; 0: no window
    "window_attn_skip_freq": (INT, 0, 2**14),    # every N-th layer full, as moe_layer_freq; 0: all windowed
    "q_lora_rank": (INT, 0, 2**18),              # 0: a plain query projection (DeepSeek-V2-Lite)
    "kv_lora_rank": (INT, 1, 2**18),
    "qk_nope_head_dim": (INT, 1, 2**14),
    "qk_rope_head_dim": (INT, 0, 2**14),
    "v_head_dim": (INT, 1, 2**14),
    "mtp_layers": (INT, 0, 2**10),               # each a layer on the last stage, bounded as num_layers
    "pipeline_layout_chars": (INT, 1, 2**16),    # a Megatron layout string unrolled: num_layers (2^14) and a stage each
}


def bound(field: str) -> tuple[str, float, float] | None:
    """The declared bound of ``field`` (by its last dotted part, else its unit suffix), or None."""
    key = field.rsplit(".", 1)[-1]
    if key in BOUNDS:
        return BOUNDS[key]
    for suffix in ("_GBps", "_Gbps", "_us"):
        if key.endswith(suffix):
            return BOUNDS[suffix]
    return None


def _text(kind: str, x: float) -> str:
    return str(int(x)) if kind == INT else f"{x:g}"


def describe(field: str) -> str:
    """``an integer from 1 to 1024``: what ``field`` allows."""
    kind, low, high = bound(field)
    return f"{kind} from {_text(kind, low)} to {_text(kind, high)}"


def check(field: str, value, name: str | None = None):
    """``value`` if it is of the kind and within the bound of ``name`` (default ``field``);
    else InputError naming ``field``, the value and the limit."""
    kind, low, high = bound(name or field)
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and (kind == NUMBER or value == int(value))
    if not ok or not low <= value <= high:
        raise InputError(field, value, describe(name or field))
    return int(value) if kind == INT else value
