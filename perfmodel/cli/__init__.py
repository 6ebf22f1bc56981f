"""``perfmodel``: predict collectives and training steps with compressed communication.

One module per subcommand, each with ``COMMANDS`` = {name: (add its parser, run it)}: ``predict``
(predict and compare), ``advise``, ``sweep``, ``search``, ``breakeven``, ``catalog``, ``collective``,
``validate``, ``calibrate``; ``common`` holds what several share (the cluster and plan
arguments, the PlanRequest and PredictOptions they build). ``main(argv)`` parses and runs one;
``entry`` is the console script.
"""
from __future__ import annotations

import sys

from perfmodel.cli import advise, breakeven, calibrate, catalog, collective, predict, search, sweep, validate
from perfmodel.cli import importer
from perfmodel.cli.common import EPILOG, RAW
from topologies.clikit import Parser, run

# in the order --help lists them
_MODULES = (predict, advise, sweep, search, breakeven, catalog, collective, validate, calibrate)
_MODULES += (importer,)   # perfmodel import (perfmodel.cli.importer)
_SUBCOMMANDS = {name: pair for module in _MODULES for name, pair in module.COMMANDS.items()}
COMMANDS = {name: run_it for name, (_, run_it) in _SUBCOMMANDS.items()}


def _parser() -> Parser:
    p = Parser(prog="perfmodel", description="Predict the step time of LLM training with compressed "
               "communication, and the collectives it is made of.", epilog=EPILOG, formatter_class=RAW)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    p.commands = sub
    for add, _ in _SUBCOMMANDS.values():
        add(sub)
    return p


def main(argv=None) -> int:
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    _model_required(parser, argv)
    args = parser.parse_args(argv)
    COMMANDS[args.command](args)
    return 0


def _model_required(parser, argv: list) -> None:
    """--model is not argparse-required (``--from`` may give the model): where neither is on the command
    line of a command that takes them, argparse's missing-arguments line names it first."""
    command = parser.commands.choices.get(argv[0]) if argv else None
    given = any(a.split("=", 1)[0] in ("--model", "--from") for a in argv)
    if command is not None and getattr(command, "takes_model", False) and not given:
        command.also_required = "--model (or --from FORMAT:PATH)"


def entry() -> None:
    sys.exit(run(main))
