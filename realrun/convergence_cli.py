"""``realrun convergence``: the subcommand's parser and what it runs."""
from __future__ import annotations

import json

from perfmodel.cli.common import microbatch_size
from realrun.convergence import CONVERGENCE_POLICIES
from topologies.clikit import positive_int

EPILOG = """examples:
  realrun convergence --out conv/                       # none, fp16, int8, ef(topk)+int8, ef(powersgd), 2 seeds
  realrun convergence --policies "dp=ef(topk(0.01))+int8" --seeds 1,2,3 --steps 600 --out conv/
  realrun convergence --fit conv-mbs4/,conv/,conv-mbs16/ --out conv-all/    # one fit over campaigns, no training
  perfmodel search --model gpt3-1.3b --cluster dgx-a100 --gpus 32 --gbs 512 --convergence conv/convergence.json
"""


def _seeds(text: str) -> tuple[int, ...]:
    from topologies.errors import InputError

    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        seeds = ()
    if not seeds or len(set(seeds)) != len(seeds):
        raise InputError("seeds", text, "distinct integers, comma-separated, e.g. 1,2")
    return seeds


def add_parser(sub, command) -> None:
    c = command(sub, "convergence", "measure the steps compression costs in training, fit perfmodel's model",
                "Trains the small GPT uncompressed and under each gradient policy for every seed, measures the "
                "steps each takes to reach the uncompressed runs' validation loss at --target-step (the "
                "steps inflation), the gradient's error and error feedback's contraction on the real "
                "gradients, and fits perfmodel's inflation model (perfmodel.explore.convergence: the critical batch "
                "of the regime) on them: each policy's inflation measured, fitted, predicted with it held out "
                "of the fit, and predicted a priori from perfmodel's error estimates. Writes convergence.csv, "
                "convergence.json (what perfmodel search --convergence reads), report.md and loss_curves.png.",
                EPILOG)
    c.add_argument("--model", default="gpt-tiny", help="catalog name or model TOML (default gpt-tiny)")
    c.add_argument("--dp", type=positive_int, default=2, help="data-parallel replicas (default 2)")
    c.add_argument("--mbs", type=microbatch_size, default=8, help="sequences per microbatch per rank (default 8)")
    c.add_argument("--steps", type=positive_int, default=400, help="steps of every run (default 400)")
    c.add_argument("--target-step", type=positive_int, help="the uncompressed step whose validation loss is the "
                   "target (default steps / 4: compressed runs may take 4x the steps)")
    c.add_argument("--policies", default=";".join(CONVERGENCE_POLICIES),
                   help="gradient policies, ';'-separated (dp=SPEC; the uncompressed one always runs)")
    c.add_argument("--seeds", type=_seeds, default=(1, 2), help="seeds, comma-separated (default 1,2)")
    c.add_argument("--eval-every", type=positive_int, default=5, help="steps between validation losses (default 5)")
    c.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    c.add_argument("--threads", type=positive_int, default=1, help="CPU threads per rank (default 1)")
    c.add_argument("--fit", metavar="DIR,DIR", help="train nothing: fit one critical batch over the runs these "
                   "campaigns' folders hold (e.g. one campaign per --mbs), each (policy, batch) held out in turn; "
                   "every cell of their files checked first")
    c.add_argument("--out", metavar="DIR", help="folder for the outputs, created; checked before any run (a file, "
                   "or a folder that cannot be created or written in, is refused; with --fit not one of the "
                   "campaigns), its files replaced once all are made (default: print only)")
    c.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> None:
    from realrun.convergence import convergence, refit, summary_lines, summary_table

    if args.fit:
        result = refit([p.strip() for p in args.fit.split(",") if p.strip()], args.out)
        head = f"# realrun convergence --fit: {len(result['summary']['campaigns'])} campaigns"
    else:
        policies = [p.strip() for p in args.policies.split(";") if p.strip()]
        result = convergence(args.model, args.dp, args.mbs, args.steps, args.target_step, policies, args.seeds,
                             args.eval_every, args.lr, args.out, args.threads, progress=not args.json)
        head = f"# realrun convergence: {args.model}, dp {args.dp}, mbs {args.mbs}, {args.steps} steps, seeds " \
            + ",".join(map(str, args.seeds))
    if args.json:
        print(json.dumps(result["summary"], indent=1, default=str))
        return
    print(head + (f" -> {args.out}/" if args.out else ""))
    print("\n".join(summary_lines(result["summary"])))
    print(summary_table(result["summary"]))
