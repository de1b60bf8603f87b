"""Command line: ``outpace generate | serve | bench | train | token-map``. The CLI only parses arguments,
builds configs and calls the API; what a drafter or a model family needs comes from its class.

One module per verb (generate.py, serve.py, bench.py, train.py, token_map.py), each adding its parser and running
its command; engine_args.py and speculative_args.py hold the flags they share. Parsing imports no torch, so
``outpace --help`` is fast: the engine is imported by the function that runs a command.
"""

from __future__ import annotations

import argparse
import sys

from outpace import __version__
from outpace.cli import bench, generate, serve, token_map, train
from outpace.cli.engine_args import resolve_model
from outpace.distributed.process_exit import launched_by_torchrun, run_then_leave


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outpace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"outpace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in (generate, serve, bench, train, token_map):
        verb.add_parser(sub)
    refuse_abbreviations(parser)
    return parser


def refuse_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Turn off argparse's prefix matching in the parser and every subcommand's: a flag we do not take is refused
    by name rather than read as the flag it begins (serve's --max-tokens as --max-tokens-limit, generate's
    --speculative FILE as --speculative-token-map)."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                refuse_abbreviations(subparser)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line parsed, with the model resolved (``resolve_model``) where the command loads one."""
    args = build_parser().parse_args(argv)
    if hasattr(args, "model") and not (args.command == "bench" and args.what in bench.MODEL_FREE):
        resolve_model(args)
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the command line's command. A process that torchrun started (the driver: its other ranks leave
    from launch.py) leaves through distributed/process_exit.py ``run_then_leave`` once the command is done
    and its engine closed, without the interpreter's teardown, which aborted a torchrun-started driver on
    gloo at exit."""
    args = parse_args(argv)
    if launched_by_torchrun():
        run_then_leave(lambda: run(args))
    run(args)


def run(args: argparse.Namespace) -> None:
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as e:  # ConfigError and CheckpointError are ValueErrors
        sys.exit(f"error: {e}")
