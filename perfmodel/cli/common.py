"""What several subcommands share: the cluster and plan arguments, the options of a prediction,
and the PlanRequest and PredictOptions they build (predict, compare, sweep and breakeven)."""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from functools import cache

from perfmodel.collectives.library import library
from perfmodel.compression.policy import PRESETS
from perfmodel.engines import engine_names
from perfmodel.plan.degrees import DEFAULT_ORDER, Degrees
from perfmodel.plan.degrees import add_arguments as add_degree_arguments
from perfmodel.plan.framework import DEFAULT_FRAMEWORK, FRAMEWORK_NAMES
from perfmodel.plan.parallel import DEFAULT_BUCKET_BYTES, EP_KERNELS, EP_OVERLAPS, KERNELS, PlanRequest
from perfmodel.plan.precision import PRECISION_NAMES
from perfmodel.plan.recompute import MODULES as RECOMPUTE_MODULES
from perfmodel.prediction import PredictOptions, request_and_options
from perfmodel.step.timing import DEFAULT_OVERLAP_SLOWDOWN
from topologies import bounds
from topologies.errors import InputError
from topologies.units import parse_size

RAW = argparse.RawDescriptionHelpFormatter
EPILOG = """examples:
  perfmodel predict --model gpt-neox-20b --cluster lassen --gpus 192 --tp 4 --pp 4 --mbs 4 --gbs 1056 \\
      --zero 1 --recompute full --policy hybrid
  perfmodel compare --model gpt-neox-20b --cluster lassen --gpus 192 --tp 4 --pp 4 --mbs 4 --gbs 1056 \\
      --zero 1 --recompute full --policies none,naive:int8,hybrid
  perfmodel sweep --model gpt3-175b --cluster dgx-a100 --gpus 1024 --gbs 1536 --policies none,hybrid
  perfmodel search --model gpt3-175b --cluster dgx-a100 --gpus 1024 --gbs 1536 --plot pareto.png
  perfmodel collective allreduce --cluster dgx-h100 --nodes 4 --size 1GiB --compressor int8
  perfmodel predict --model deepseek-v3 --cluster dgx-h100 --gpus 2048 --pp 16 --ep 64 --policy deepseek
  perfmodel breakeven --model gpt-neox-20b --cluster lassen --gpus 192 --tp 4 --pp 4 --mbs 4 --gbs 1056 \\
      --zero 1 --recompute full --policy hybrid --target +12.7% --library mpi
  perfmodel catalog models
  perfmodel validate --published megatron-lm-a100-2021
"""
POLICY_HELP = (f"compression policy: a preset (none, {', '.join(PRESETS)}; perfmodel catalog policies), naive:SPEC, "
               "AXIS=SPEC or AXIS.min=SIZE items (AXIS: dp gradients, zero parameter gathers, tp, pp activations, "
               "ep MoE dispatch, ep_combine MoE combine (default: as ep), cp K/V ring), e.g. "
               "'hybrid,dp=ef(topk(0.01))+int8' or 'ep=fp8,ep_combine=none'")

LIBRARY_HELP = ("collective library whose algorithms and per-message constants price the collectives: nccl "
                "(default) or mpi (a GPU-aware MPI, MVAPICH2-GDR-like: ring / Rabenseifner all-reduce, eager and "
                "rendezvous protocols; catalog/libraries.toml gives each number's source)")


def _size(text):
    return parse_size(text, "bucket")


def bounded(field: str):
    """argparse type: an integer within ``field``'s declared bound (``topologies.bounds``), else one
    line naming the value and the bound."""
    def parse(text: str) -> int:
        try:
            return bounds.check(field, int(text))
        except ValueError:          # not an integer, or past the bound (InputError)
            raise argparse.ArgumentTypeError(f"{text!r}: {bounds.describe(field)}") from None

    parse.__name__ = field
    return parse


# --gbs and --mbs of every command that plans: a batch sizes the pipeline schedule (topologies.bounds)
batch_size, microbatch_size = bounded("gbs"), bounded("mbs")


def cluster_args(p) -> None:
    """--model, --cluster and the job's size (--gpus or --nodes)."""
    p.takes_model = True      # perfmodel.cli names --model among the missing arguments (it may come from --from)
    p.add_argument("--model", help="catalog model (perfmodel catalog models) or a model TOML path (or from --from)")
    p.add_argument("--from", dest="sources", action=FromAction, metavar="FORMAT:PATH", default=[],
                   help=FROM_HELP)
    p.add_argument("--cluster", required=True, help="catalog cluster (perfmodel catalog clusters) or a cluster "
                   "TOML path")
    p.add_argument("--gpus", type=int, help="GPUs in the job; not a whole number of nodes: as few nodes as hold "
                   "them, the last one partly used")
    p.add_argument("--nodes", type=int, help="nodes (instead of --gpus)")


def plan_args(p, sweep: bool = False) -> None:
    """The plan's arguments and the prediction's options (a sweep varies the layout itself:
    without tp, pp, dp, zero, mbs, ep, cp, and with --gbs required)."""
    if not sweep:
        _layout_args(p)
    _step_args(p, sweep)
    if not sweep:
        _output_args(p)
    _option_args(p)
    track_given(p)


def track_given(p) -> None:
    """Every action of ``p`` records its dest when the command line gives it (``explicit``): such a flag
    wins over --from, wherever it stands."""
    for action in p._actions:
        if action.dest not in ("help", "sources"):
            action.__class__ = _tracked(type(action))


FROM_HELP = ("take the model and plan from another tool's file: hf:config.json (a Hugging Face config), "
             "megatron:train.sh (a Megatron-LM launch script or argument list; a variable it does not set is the "
             "environment's), torchtitan:job.toml (a torchtitan "
             "job config), nemo:config.yaml (a Megatron-Bridge run_config.yaml or NeMo 1 YAML), deepspeed:ds.json (as "
             "--deepspeed); repeatable, a later file over an earlier one, and a flag given on the command line "
             "over both; the mapping is printed on stderr, a key each (docs: importers.md)")
# a predict keyword an importer gives -> the argparse dest that holds it
FROM_DESTS = {"bucket_bytes": "bucket"}


@cache
def _tracked(cls):
    """``cls`` recording its dest as given on the command line (``explicit``)."""
    def call(self, parser, namespace, values, option_string=None):
        explicit(namespace).add(self.dest)
        cls.__call__(self, parser, namespace, values, option_string)
    return type(f"Tracked{cls.__name__}", (cls,), {"__call__": call})


def explicit(namespace) -> set:
    """The dests given on the command line so far."""
    if not hasattr(namespace, "from_explicit"):
        namespace.from_explicit = set()
    return namespace.from_explicit


@contextmanager
def say_refused(prefix: str = "perfmodel: "):
    """An importer's refusal: a line per refused key on stderr, then the error (one line, exit code 2)."""
    try:
        yield
    except InputError as err:
        for line in getattr(err, "refused", ()):
            print(f"{prefix}{line}", file=sys.stderr)
        raise


class FromAction(argparse.Action):
    """``--from FORMAT:PATH``: the file read (``perfmodel.importers``) and its plan and model set on the
    arguments, but where the command line gives them (module doc of perfmodel.importers)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from perfmodel.importers import build_model, merge, read

        with say_refused():
            parts = getattr(namespace, "from_parts", []) + [read(values)]
        namespace.from_parts, namespace.sources = parts, [*namespace.sources, values]
        both = merge(parts)
        dests = {a.dest for a in parser._actions}
        given = explicit(namespace)
        fields = {**both.plan, **({"deepspeed": both.deepspeed} if both.deepspeed else {})}
        namespace.from_unused = []
        for key, value in fields.items():
            dest = FROM_DESTS.get(key, key)
            if dest not in dests:
                namespace.from_unused.append(f"{key} {value} not used (this command does not take it)")
            elif dest not in given:
                setattr(namespace, dest, value)
        namespace.from_fields = fields
        namespace.from_model_error = None
        if both.model and "model" not in given:
            try:
                namespace.model = build_model(both.model, both.name, ", ".join(namespace.sources))
            except InputError as err:
                namespace.model, namespace.from_model_error = None, err


# perfmodel's words beside a degree's own help text (perfmodel.plan.degrees)
DEGREE_HELPS = {"cp": "gpus = tp x cp x pp x dp"}


def _layout_args(p) -> None:
    add_degree_arguments(p, helps=DEGREE_HELPS)
    p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage (with --ep the experts' "
                   "states shard over their expert-data-parallel ranks, the rest over dp x cp)")
    p.add_argument("--mbs", type=microbatch_size, default=1, help=f"microbatch size ({bounds.describe('mbs')})")
    _stage_split_args(p)


def _stage_split_args(p) -> None:
    """How the pipeline stages split the layers, under Megatron's names too (``perfmodel.plan.stages``)."""
    split = "default: even, earlier stages taking the remainder; docs: 'Pipeline stages'"
    p.add_argument("--first-stage-layers", "--decoder-first-pipeline-num-layers", dest="first_stage_layers",
                   type=int, metavar="N", help="transformer layers of the first pipeline stage; the stages between "
                   f"the first and last split the rest evenly ({split})")
    p.add_argument("--last-stage-layers", "--decoder-last-pipeline-num-layers", dest="last_stage_layers",
                   type=int, metavar="N", help="transformer layers of the last pipeline stage")
    p.add_argument("--account-for-embedding", "--account-for-embedding-in-pipeline-split",
                   dest="account_for_embedding", action="store_true",
                   help="count the embedding as a layer of the first stage when splitting the layers")
    p.add_argument("--account-for-loss", "--account-for-loss-in-pipeline-split", dest="account_for_loss",
                   action="store_true", help="count the loss as a layer of the last stage when splitting the layers")
    p.add_argument("--pipeline-layout", "--pipeline-model-parallel-layout", dest="pipeline_layout", metavar="LAYOUT",
                   help="Megatron's layout string: each virtual stage's layers between '|' (E embedding, t "
                   "transformer layer, m multi-token prediction, L loss; x*n and (...)*n repeat), pp x V of them, "
                   "e.g. 'Et*4|(t*4|)*14tL' for 61 layers on pp 4 with interleaved:4")


def _step_args(p, sweep: bool) -> None:
    p.add_argument("--gbs", type=batch_size,
                   help=f"global batch size in sequences ({bounds.describe('gbs')}; " + ("required, unless --from "
                   "gives it)" if sweep else "default mbs x dp)"))
    p.add_argument("--seq", type=int, help="sequence length (default the model's)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    p.add_argument("--recompute", default="none",
                   help="activation recompute: none, selective (the attention core, or --recompute-modules), "
                   "full" + (", any" if sweep else ""))
    if not sweep:
        p.add_argument("--recompute-modules", metavar="M,M",
                       help="with --recompute selective, the modules Megatron-Core recomputes "
                       "(--recompute-modules): " + ", ".join(RECOMPUTE_MODULES) + " (default core_attn); each "
                       "keeps fewer activations and reruns its forward in backward "
                       "(docs: 'Recompute of named modules')")
    p.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b or interleaved:V")
    p.add_argument("--compute-dtype", choices=("bf16", "fp16", "fp32"), help="default bf16 (fp16 if none)")
    p.add_argument("--precision", choices=PRECISION_NAMES,
                   help="the GEMMs' recipe, as Megatron-Core / Transformer Engine name them: bf16, fp16, fp32 "
                   "(default: the compute dtype's), fp8-delayed, fp8-tensorwise (current scaling), fp8-blockwise "
                   "(DeepSeek-V3's 1x128 / 128x128 scales), mxfp8 or nvfp4 (Blackwell); a low precision runs the "
                   "layers' GEMMs (forward, dgrad, wgrad) at its peak and pays their casts, transposes and amax "
                   "reductions; attention (but with --fp8-attention), the embedding and the LM head stay bf16, "
                   "and so do the activations; "
                   "MFU is reported against the bf16 peak and the precision's own (perfmodel catalog precisions; "
                   "a GPU without the precision's peak refuses it)")
    p.add_argument("--routing", help="a MoE layer's routing: balanced (every expert its fair share), capacity:F "
                   "(token drop padded to capacity factor F) or a histogram file of measured tokens per expert "
                   "(dropless, imbalanced: the busiest expert-parallel rank sets the step; docs: 'Routing'); "
                   "default: the model file's (balanced where it says nothing)")
    if not sweep:        # a sweep's plans vary pp and the schedule, which the overlaps constrain: predict only
        _ep_overlap_args(p)
        p.add_argument("--fp8-attention", action="store_true",
                       help="attention's QK^T and PV products in FP8 as Transformer Engine's fused kernels run "
                       "them (Megatron --fp8-dot-product-attention): 1.62x faster than bf16 (FlashAttention-3's "
                       "FP8 over FP16 on H100), plus casting Q, K, V, O and dO; needs a low-precision --precision")
    p.add_argument("--framework", choices=FRAMEWORK_NAMES, default=DEFAULT_FRAMEWORK,
                   help="the software stack whose fusion, overlap and host time the step has (default "
                   f"{DEFAULT_FRAMEWORK}; docs: 'Framework profiles')")
    p.add_argument("--grad-dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--bucket", type=_size, default=DEFAULT_BUCKET_BYTES, help="DDP bucket size (25MiB)")
    p.add_argument("--order", default=",".join(DEFAULT_ORDER), help="placement order, innermost first (may name "
                   f"{' and '.join(Degrees.placed_after())}, e.g. tp,pp,dp,ep: ep across nodes)")
    engine_arg(p)
    p.add_argument("--dp-overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="reduce gradients during backward (--dp-overlap) or after it (--no-dp-overlap, as realrun "
                   "train does); default: the framework's")


def _ep_overlap_args(p) -> None:
    """--ep-overlap and --ep-kernels (perfmodel.step.expert_overlap)."""
    p.add_argument("--ep-overlap", choices=EP_OVERLAPS, default="none",
                   help="a MoE model's all-to-alls hidden behind another micro-batch's compute: none (default: on "
                   "the critical path of their own operation), batch (Megatron-Core's "
                   "--overlap-moe-expert-parallel-comm, on pp 1 or --schedule interleaved:V: each steady 1F1B "
                   "forward-backward pair hides its all-to-alls behind its compute; warm-up and cool-down do not; "
                   "their kernels' SMs slow that compute), dualpipe "
                   "(DeepSeek-V3's DualPipe: every pair, the report's bubble and two parameter copies; even pp and "
                   "micro-batches; docs: 'Overlapped expert communication')")
    p.add_argument("--ep-kernels", choices=EP_KERNELS, default="nccl",
                   help="the all-to-alls' kernels, whose SMs slow the compute they hide behind: nccl (default: the "
                   "overlap slowdown), deepep (24 SMs), hybridep (32 SMs), deepep-ll (none)")


def engine_arg(p) -> None:
    """--engine, its choices the registered engines (``perfmodel.engines.engine_names``)."""
    p.add_argument("--engine", choices=engine_names(), default="analytical",
                   help="analytical (closed forms, the fast path) or des (the pipeline and every stage's gradient "
                   "buckets as events, links shared between concurrent traffic; the difference is 'contention')")


def _output_args(p) -> None:
    p.add_argument("--trace", metavar="FILE.json", help="write the step's timeline as Chrome trace-event JSON "
                   "(open in ui.perfetto.dev): per pipeline stage its forward/backward operations, transfers "
                   "with flow arrows, then the exposed reduction and optimizer (gpipe, 1f1b)")
    p.add_argument("--timeline", metavar="FILE.png",
                   help="draw the same timeline as a picture (.png, .svg or .pdf): a row per stream of each "
                   "stage; with --engine des also the gradient buckets as they share the NIC")
    p.add_argument("--plot", metavar="FILE.png", help="draw the step's breakdown as stacked bars (one per policy "
                   "with compare; .png, .svg or .pdf)")
    p.add_argument("--deepspeed", metavar="ds_config.json",
                   help="take ZeRO stage, qwZ/qgZ/hpZ, fp16/bf16, micro batch, accumulation and batch size from a "
                   "DeepSpeed config (printed as mapped; keys it cannot honour are refused)")
    p.add_argument("--tp-overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap TP all-gathers and reduce-scatters with their GEMMs (Megatron --tp-comm-overlap; "
                   "needs --sequence-parallel): all but 1/tp of them hide behind the GEMMs, which they slow by "
                   "the overlap slowdown (default: the framework's, where the plan can overlap)")
    p.add_argument("--kernels", choices=KERNELS, default="fused",
                   help="whose kernels compute the layers: fused (default: Megatron-Core with Transformer "
                   "Engine, flash attention and fused MoE permutation) or eager (PyTorch eager as realrun's "
                   "layers: ring-attention score blocks in memory, MoE permutation through capacity queues)")
    p.add_argument("--hpz", action="store_true",
                   help="ZeRO++ hpZ (with --zero 3): a secondary parameter partition inside each node, so "
                   "backward gathers stay on the node's links (costs weights / local dp ranks of memory)")


def _option_args(p) -> None:
    p.add_argument("--overlap-slowdown", type=float,
                   help=f"fraction by which overlapped communication slows compute "
                   f"(default: the profile's, else {DEFAULT_OVERLAP_SLOWDOWN})")
    p.add_argument("--calibration", help="calibration profile JSON (see docs/design.md, 'Calibration')")
    p.add_argument("--library", default="nccl", help=LIBRARY_HELP)
    p.add_argument("--allow-oom", action="store_true", help="report plans that do not fit memory")
    p.add_argument("--json", action="store_true", help="JSON instead of tables")


def plan_kwargs(args, sweep: bool = False) -> dict:
    """The plan and option fields the arguments give, by their names in PlanRequest and
    PredictOptions (a sweep varies the layout itself: without tp, pp, dp, zero, ...)."""
    library(args.library)   # an unknown name is refused before any work
    _say_imported(args)
    kw = dict(calibration=args.calibration, library=args.library, gpus=args.gpus, nodes=args.nodes, gbs=args.gbs,
              seq=args.seq,
              sequence_parallel=args.sequence_parallel, schedule=args.schedule, compute_dtype=args.compute_dtype,
              precision=args.precision, framework=args.framework, routing=args.routing,
              grad_dtype=args.grad_dtype, bucket_bytes=args.bucket, order=args.order, dp_overlap=args.dp_overlap,
              overlap_slowdown=args.overlap_slowdown, allow_oom=args.allow_oom, engine=args.engine)
    if not sweep:
        kw.update(_degrees(args), zero=args.zero, mbs=args.mbs, recompute=args.recompute, hpz=args.hpz,
                  recompute_modules=args.recompute_modules,
                  tp_overlap=args.tp_overlap, kernels=args.kernels, first_stage_layers=args.first_stage_layers,
                  ep_overlap=args.ep_overlap, ep_kernels=args.ep_kernels, fp8_attention=args.fp8_attention,
                  last_stage_layers=args.last_stage_layers, account_for_embedding=args.account_for_embedding,
                  account_for_loss=args.account_for_loss, pipeline_layout=args.pipeline_layout)
    return kw


def imported_lines(args) -> list[str]:
    """The --from files' lines, a key each (what --json gives under "imported")."""
    return [line for part in getattr(args, "from_parts", []) for line in part.lines]


def _say_imported(args) -> None:
    """The --from files' lines on stderr; no model from them nor --model: one line saying so."""
    for line in imported_lines(args):
        print(f"perfmodel: {line}", file=sys.stderr)
    given = explicit(args)
    overridden = [f"{key} {value} not used (--{FROM_DESTS.get(key, key).replace('_', '-')} given)"
                  for key, value in getattr(args, "from_fields", {}).items() if FROM_DESTS.get(key, key) in given]
    for line in getattr(args, "from_unused", []) + overridden:
        print(f"perfmodel: from: {line}", file=sys.stderr)
    if getattr(args, "sources", None) and "model" in given:
        print(f"perfmodel: from: the model is --model {args.model} (given)", file=sys.stderr)
    if args.model is None:
        raise getattr(args, "from_model_error", None) or InputError("model", None, "a catalog model or TOML "
                                                                    "path (--model), or --from hf:config.json")


def request(args, policy: str = "none") -> tuple[PlanRequest, PredictOptions]:
    """The PlanRequest and PredictOptions of predict and compare (a DeepSpeed config applied, and the
    --from files' policy items)."""
    items = [i for part in getattr(args, "from_parts", []) for i in part.policy]
    if items:
        policy = ",".join(([policy] if policy != "none" else []) + list(dict.fromkeys(items)))
    kw, policy = _deepspeed(args, plan_kwargs(args), policy)
    return request_and_options(policy=policy, trace=args.trace, timeline=args.timeline, **kw)


def _degrees(args) -> dict:
    """{degree: value} of the arguments (dp an integer or auto; a follower not given, etp, None:
    it follows its leader wherever the plan goes)."""
    out = Degrees.of(args).as_dict() | {n: None for n in Degrees.followers() if getattr(args, n, None) is None}
    if out["dp"] != "auto":
        out["dp"] = _int("dp", out["dp"])
    return out


def _int(field, text):
    try:
        return int(text)
    except ValueError:
        raise InputError(field, text, "an integer or auto") from None


def say_idle(records) -> None:
    """One line on stderr per policy axis that compresses nothing in the plan."""
    for r in records:
        for axis in r.idle_policy_axes:
            print(f"perfmodel: policy {r.policy!r}: axis {axis} has no traffic in this plan "
                  f"({Degrees.of(r.plan).describe()} zero={r.plan['zero']}); its spec "
                  f"{r.policy_axes[axis]['spec']} is not used", file=sys.stderr)


def _deepspeed(args, kw: dict, policy: str) -> tuple[dict, str]:
    """``kw`` and ``policy`` with a DeepSpeed config's plan and ZeRO++ items applied (stderr says how)."""
    if not args.deepspeed:
        return kw, policy
    from perfmodel.plan.deepspeed import map_config, read_config
    from topologies import cluster_for

    built, ranks = cluster_for(args.cluster, nodes=args.nodes, gpus=args.gpus)
    with say_refused("perfmodel: deepspeed: cannot honour "):
        ds = map_config(read_config(args.deepspeed), built.gpus_per_host, ranks, args.tp, args.pp)
    for line in ds.mapped:
        print(f"perfmodel: deepspeed: {line}", file=sys.stderr)
    if ds.ignored:
        print(f"perfmodel: deepspeed: ignored (no effect on a step's time here): {', '.join(ds.ignored)}",
              file=sys.stderr)
    if ds.policy_items:
        policy = ",".join(([policy] if policy != "none" else []) + ds.policy_items)
    return {**kw, **ds.plan}, policy

