"""``python -m partial_rollout_integrations.reference_grpo CONFIG [overrides] [--resume]``: the trainer alone.

The same as ``partial-rollout train``; the demo runs trainers this way in child processes so it can
kill them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from partial_rollout.errors import EXIT_BAD_INPUT, PartialRolloutError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config (e.g. integrations/reference_grpo/configs/demo.yaml)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="NeMo RL-style overrides: key=value for keys the YAML has, ++key=value to add one",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def train(args: argparse.Namespace) -> int:
    """Load the config and train; prints the summary as one JSON line."""
    from partial_rollout_integrations.reference_grpo import load_config, run_training

    config = load_config(args.config, args.overrides)
    summary = asyncio.run(run_training(config, resume=args.resume, progress=not args.no_progress))
    print(
        json.dumps(
            {
                "step": summary["step"],
                "final_reward": summary["rewards"][-1] if summary["rewards"] else None,
                "counters": summary["counters"],
            }
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m partial_rollout_integrations.reference_grpo", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return train(args)
    except PartialRolloutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
