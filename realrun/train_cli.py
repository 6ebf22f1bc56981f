"""``realrun train``: the subcommand's parser and what it runs (kept apart from realrun.cli's
measurement commands)."""
from __future__ import annotations

import json
import os
from dataclasses import replace

from perfmodel.cli.common import batch_size, microbatch_size
from perfmodel.plan.degrees import Degrees
from perfmodel.plan.degrees import add_arguments as add_degree_arguments
from realrun.comm.names import OP_TIMEOUT_S
from topologies.clikit import check_writable, positive_int
from topologies.errors import InputError

TRAIN_EPILOG = """examples:
  realrun train --model gpt-tiny --dp 2 --mbs 8 --steps 100 --policy "dp=ef(topk(0.01))+int8" \\
      --metrics train.jsonl --plot loss.png
  torchrun --nproc_per_node 4 -m realrun.cli train --model gpt-tiny --dp 4 --policy naive:int8
  realrun cluster run -- python -m realrun.cli train --model gpt-tiny --dp 4 --policy hybrid
"""

# what realrun's runs add to each degree's help (perfmodel.plan.degrees has the rest)
DEGREE_HELPS = {
    "tp": "ranks per stage; tp x cp x pp x dp ranks in all",
    "cp": "every sequence cut into 2 cp chunks, rank i keeps chunks i and 2cp-1-i; K/V (backward also their "
          "gradients) pass round the ring under the policy's cp spec; here with tp = pp = ep = 1 and zero 0",
    "ep": "tokens dispatched and combined by all-to-alls under the policy's ep and ep_combine specs (each expert "
          "padded to capacity where the model says moe_pad_to_capacity, else its rows only: uneven splits); with tp "
          "the experts stay whole on each tp rank",
    "pp": "layers split as perfmodel splits them, activations between stages under the policy's pp spec",
}


def add_parser(sub, command) -> None:
    t = command(sub, "train", "train a small GPT with compressed gradients, for real",
                "Tensor-, context-, pipeline-, expert- and data-parallel training (and ZeRO-1) of a GPT built "
                "from a perfmodel model description (catalog name or TOML file) on the Python standard "
                "library's source (bytes): every TP all-reduce, K/V ring step, expert all-to-all, pipeline "
                "transfer, gradient bucket and parameter gather goes through realrun.comm under the policy's "
                "tp, cp, ep, pp, dp and zero specs. Starts tp x cp x pp x dp local ranks, or runs as the ranks "
                "of torchrun / realrun cluster run. One JSON line per step (--metrics): loss, phase seconds, "
                "payload bytes and measured error per axis.",
                TRAIN_EPILOG)
    t.add_argument("--model", default="gpt-tiny", help="catalog name or model TOML (default gpt-tiny)")
    add_degree_arguments(t, helps=DEGREE_HELPS, dp_auto=False, int_type=positive_int)
    t.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule (default 1f1b)")
    t.add_argument("--zero", type=int, choices=(0, 1), default=0, help="1: ZeRO-1, optimizer state sharded over "
                   "dp (gradients reduce-scattered under the dp spec, parameters all-gathered under the zero spec; "
                   "with --ep the routed experts' state stays whole on their ranks)")
    t.add_argument("--mbs", type=microbatch_size, default=8, help="sequences per microbatch per rank (default 8)")
    t.add_argument("--gbs", type=batch_size, help="global batch (a multiple of mbs x dp; default mbs x dp)")
    t.add_argument("--seq", type=positive_int, help="sequence length (default the model's)")
    t.add_argument("--steps", type=positive_int, default=50)
    t.add_argument("--policy", default="none", help="compression policy, perfmodel's grammar (dp: gradients, "
                   "zero: gathered parameters, tp and pp: activations and their gradients)")
    t.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--eval-every", type=int, default=10, help="validation loss every N steps (0: never)")
    t.add_argument("--error-every", type=int, default=10, help="measure each compressed axis's error against "
                   "the exact result every N steps")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto (default): a GPU per rank "
                   "with NCCL and the CuPy compressors where CUDA is available, else the CPU with gloo")
    t.add_argument("--threads", type=positive_int, default=None, help="CPU threads per local rank (torch and the "
                   "codecs; default: the host's cores over its local ranks, or COMMPRESS_CODEC_THREADS)")
    t.add_argument("--op-timeout", type=float, default=OP_TIMEOUT_S, help="seconds a collective or transfer waits "
                   f"for a peer (default {OP_TIMEOUT_S:g})")
    t.add_argument("--checkpoint", metavar="DIR", help="checkpoint folder: every rank's state, written atomically "
                   "at the end and every --checkpoint-every steps")
    t.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: only the last)")
    t.add_argument("--resume", action="store_true", help="continue the run in --checkpoint from its last step "
                   "(same model, plan, batch, policy, seed and lr; --steps is the new total: a checkpoint at it "
                   "trains nothing, past it is refused); every rank's file is checked before any rank starts; "
                   "under torchrun --max-restarts, from step 0 while no checkpoint is written yet")
    t.add_argument("--metrics", help="JSON Lines file, one record per step (rank 0 appends)")
    t.add_argument("--routing-out", metavar="FILE.json", help="a mixture-of-experts model's measured routing "
                   "histogram, written at the end: the router's assignments per expert of each MoE layer summed over "
                   "the run's steps and ranks, in the JSON format perfmodel predict --routing FILE reads (default: "
                   "next to --metrics, its name with .routing.json for .jsonl; none without --metrics)")
    t.add_argument("--routing-steps", type=int, default=0, metavar="N", help="the histogram sums the last N steps "
                   "only (default 0: every step the run trains; a resumed run: those since the resume)")
    t.add_argument("--profile", metavar="DIR", help="write PyTorch profiler traces (Chrome trace JSON, operator "
                   "shapes recorded) of up to 5 steady steps after the warm-up, DIR/trace-rank<R>.json per rank, "
                   "for perfmodel calibrate --from-file torch-trace:DIR (docs: calibrate-from-files.md)")
    t.add_argument("--plot", help="loss-curve PNG at the end")
    t.add_argument("--json", action="store_true", help="print the summary as JSON")


def _steps_left(cfg, done: int) -> bool:
    """Whether a resumed run has steps left to train: a checkpoint at --steps is a finished run
    (said on stderr, once per run; nothing trained, exit 0), one past it is refused."""
    import sys

    if done > cfg.steps:
        raise InputError("steps", cfg.steps, f"at least the {done} steps checkpoint {cfg.checkpoint} has done "
                         "(--steps is the run's new total)")
    if done < cfg.steps:
        return True
    if os.environ.get("RANK", "0") == "0":
        print(f"realrun train: checkpoint {cfg.checkpoint} has {done} steps done, --steps is {cfg.steps}: "
              "nothing to train", file=sys.stderr)
    return False


def _default_routing_out(metrics: str | None, model: str) -> str | None:
    """The histogram's default path: beside ``metrics`` (``train.jsonl`` -> ``train.routing.json``) for a
    mixture-of-experts model; None for a dense one or without metrics."""
    from perfmodel.workload import load_model

    if not metrics or not load_model(model).is_moe:
        return None
    stem = metrics[:-len(".jsonl")] if metrics.endswith(".jsonl") else metrics
    return stem + ".routing.json"


def run_train(args) -> None:
    import sys

    from realrun.train import checkpoint, profiling
    from realrun.train.config import TrainConfig
    from realrun.train.launch import run_training
    from realrun.train.trainer import device_of
    from realrun.train.report import plot_losses, summary, summary_table

    routing_out = args.routing_out or _default_routing_out(args.metrics, args.model)
    for path, field in ((args.metrics, "metrics"), (args.plot, "plot"), (routing_out, "routing_out")):
        if path:
            check_writable(path, field)
    cfg = TrainConfig(model=args.model, degrees=Degrees.of(args), routing_out=routing_out,
                      routing_steps=args.routing_steps, schedule=args.schedule, zero=args.zero, mbs=args.mbs,
                      gbs=args.gbs, seq=args.seq, steps=args.steps, policy=args.policy, lr=args.lr, seed=args.seed,
                      eval_every=args.eval_every, error_every=args.error_every, threads=args.threads,
                      op_timeout_s=args.op_timeout, metrics=args.metrics, device=args.device,
                      checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every, resume=args.resume,
                      profile=args.profile)
    profiling.check(cfg)
    device_of(cfg, 0)   # cuda without a CUDA device: one line here, not a failed rank
    if cfg.resume and checkpoint.under_elastic_launcher() and not checkpoint.written(cfg.checkpoint):
        cfg = replace(cfg, resume=False)   # torchrun's first attempt: every restart passes the same --resume
    if cfg.resume:   # the checkpoint checked here, before any rank starts
        if not _steps_left(cfg, checkpoint.verify(cfg.checkpoint, cfg)):
            return
    elif cfg.checkpoint:   # the folder, or its parent, takes new files (before any work)
        folder = cfg.checkpoint
        check_writable(os.path.join(folder, "latest") if os.path.isdir(folder) else folder, "checkpoint")
    for axis in cfg.idle_axes():
        print(f"realrun train: policy axis {axis} has no traffic in this plan (tp={cfg.tp}, pp={cfg.pp}, "
              f"dp={cfg.dp}, ep={cfg.ep}, cp={cfg.cp}, zero={cfg.zero})",
              file=sys.stderr)
    records = run_training(cfg)
    if not records:   # ranks other than 0 of a launch
        return
    s = summary(records)
    if args.plot:
        plot_losses({cfg.policy: records}, args.plot)
    if args.json:
        print(json.dumps(s, indent=1))
        return
    ep = (f" ep={cfg.ep}" if cfg.ep > 1 else "") + (f" cp={cfg.cp}" if cfg.cp > 1 else "")
    print(f"# realrun train {cfg.model}: tp={cfg.tp} pp={cfg.pp} ({cfg.schedule}) dp={cfg.dp}{ep} zero={cfg.zero} "
          f"mbs={cfg.mbs} gbs={cfg.global_batch} seq={cfg.seq_len} steps={cfg.steps} policy={cfg.policy}")
    print(summary_table(s))
    if cfg.routing_out:
        print(f"routing histogram: {cfg.routing_out} (perfmodel predict --routing {cfg.routing_out})")
