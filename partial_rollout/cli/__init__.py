"""The ``partial-rollout`` command.

Usage::

    partial-rollout dump PATH [--json | --request ID | --decode | --verify] [--plot FILE.png]
    partial-rollout generate [--model DIR] [--prompts N] [--max-tokens M]
    partial-rollout check-resume [--model DIR] [--requests N] [--seed S]
    partial-rollout demo [--trainer NAME] [--config C] [--out DIR]        (from partial_rollout_integrations)
    partial-rollout train CONFIG [key=value | ++key=value ...] [--resume]  (from partial_rollout_integrations)
    partial-rollout --help

Each subcommand lives in its own module and registers itself here through a ``register(subparsers)``
function that adds its parser and sets ``func`` to a ``run(args) -> int`` callable. The library's own
subcommands are listed in :data:`SUBCOMMAND_MODULES`; an installed package adds more by naming such a
module under the entry-point group :data:`ENTRY_POINT_GROUP` (this repository's trainers add ``demo``
and ``train``), so the library imports no trainer. Errors caused by the user's input print one line
and exit with :data:`~partial_rollout.errors.EXIT_BAD_INPUT`; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
import traceback
import warnings
from collections.abc import Sequence
from types import ModuleType

from partial_rollout.errors import EXIT_BAD_INPUT, EXIT_FAILURE, PartialRolloutError

SUBCOMMAND_MODULES = (
    "partial_rollout.cli.dump",
    "partial_rollout.cli.generate",
    "partial_rollout.cli.check_resume",
)
"""The library's own subcommand modules, in the order ``--help`` lists them (after the plugins')."""
ENTRY_POINT_GROUP = "partial_rollout.commands"
"""Entry points of this group name a module with a ``register(subparsers)`` function: a subcommand
of the same name as the entry point."""


def plugin_modules() -> list[tuple[str, ModuleType]]:
    """The subcommand modules installed packages register, by name; one that fails to import is
    skipped with a warning naming it (the other subcommands still work)."""
    found = []
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            found.append((entry.name, importlib.import_module(entry.value)))
        except Exception as exc:
            warnings.warn(
                f"partial-rollout {entry.name}: its module {entry.value} does not import ({type(exc).__name__}: "
                f"{exc}); the subcommand is left out. Reinstall the package that registers it",
                stacklevel=2,
            )
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="partial-rollout",
        description="Persist and resume in-flight RL rollouts across checkpoints.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks instead of one-line errors")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    builtin = [importlib.import_module(name) for name in SUBCOMMAND_MODULES]
    for module in [m for _, m in plugin_modules()] + builtin:
        module.register(subparsers)
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
