"""``partial-rollout train CONFIG [key=value ...] [--resume]``: run the reference async GRPO trainer alone.

A subcommand the ``partial_rollout.commands`` entry point registers (``pyproject.toml``).

CONFIG is a YAML file in NeMo RL's layout (``integrations/reference_grpo/configs/demo.yaml`` is a
complete example). Overrides follow NeMo RL: ``key=value`` for keys the YAML has, ``++key=value``
for a key of the schema the YAML leaves at its default; unknown keys and bad values fail before
anything starts. ``--resume`` continues from the latest complete checkpoint in
``checkpointing.checkpoint_dir``.

Examples::

    partial-rollout train integrations/reference_grpo/configs/demo.yaml grpo.max_num_steps=20
    partial-rollout train integrations/reference_grpo/configs/demo.yaml checkpointing.partial_rollouts.enabled=false
    partial-rollout train integrations/reference_grpo/configs/demo.yaml --resume
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from partial_rollout_integrations.reference_grpo.__main__ import add_arguments

    p = subparsers.add_parser(
        "train",
        help="run the reference async GRPO trainer (NeMo RL-style YAML config and overrides)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from partial_rollout_integrations.reference_grpo.__main__ import train

    return int(train(args))
