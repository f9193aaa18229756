"""The ``partial-rollout`` command.

Usage::

    partial-rollout demo [--out DIR] [--seed S]
    partial-rollout train CONFIG [key=value | ++key=value ...] [--resume]
    partial-rollout dump PATH [--json | --request ID | --decode | --verify]
    partial-rollout generate [--model DIR] [--prompts N] [--max-tokens M]
    partial-rollout check-resume [--model DIR] [--requests N] [--seed S]
    partial-rollout --help

Each subcommand lives in its own module and registers itself here through a ``register(subparsers)``
function that adds its parser and sets ``func`` to a ``run(args) -> int`` callable. Errors caused
by the user's input print one line and exit with :data:`~partial_rollout.errors.EXIT_BAD_INPUT`;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence

from partial_rollout.errors import EXIT_BAD_INPUT, EXIT_FAILURE, PartialRolloutError

SUBCOMMAND_MODULES = (
    "partial_rollout.cli.demo",
    "partial_rollout.cli.train",
    "partial_rollout.cli.dump",
    "partial_rollout.cli.generate",
    "partial_rollout.cli.check_resume",
)
"""Modules that provide a ``register(subparsers)`` function, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="partial-rollout",
        description="Persist and resume in-flight RL rollouts across checkpoints.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks instead of one-line errors")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PartialRolloutError as exc:
        if args.debug:
            traceback.print_exc()
        else:
            print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        else:
            print(f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
        return EXIT_FAILURE
