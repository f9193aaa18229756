"""Run verl's PPO trainer, with partial rollouts when the config turns them on.

Usage (in verl's controller environment, ``.venv-verl``: ``bash scripts/setup_verl.sh``):

    python -m partial_rollout_integrations.verl [hydra overrides ...]
    python -m partial_rollout_integrations.verl trainer.v1.trainer_mode=colocate_async \\
        actor_rollout_ref.rollout.name=vllm trainer.v1.partial_rollout_checkpoint.enable=true ...

It mirrors ``python -m verl.trainer.main_ppo``: the same Hydra overrides on verl's ``ppo_trainer``
config, here with our block added (``configs/partial_rollout_checkpoint.yaml``), so that
``trainer.v1.partial_rollout_checkpoint.enable=true`` needs no ``+``. A config of your own
(``--config-path``/``--config-name``, as with verl) can list ``partial_rollout_checkpoint`` in its
defaults instead of ``ppo_trainer``, or take ``+trainer.v1.partial_rollout_checkpoint.enable=true``.

With the block off (``enable`` and ``record_events`` false) this runs verl's own ``main_ppo.main``
on the config with the block removed: verl exactly as it is, nothing checked or installed. With it
on it first checks, each failure one line and exit status 3, that the settings are ones partial
rollouts support (:mod:`.setup_checks`), that this verl has every name the integration uses
(:mod:`.seams`) and that a checkpoint it resumes from holds no snapshot of another ``n`` or sampling
(:mod:`.resume_checks`); then, as verl's ``main``, validates the config with verl's ``validate_config`` and
starts verl's ``run_ppo`` with our task runner (:mod:`.runner`), which trains with our trainer classes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from partial_rollout.errors import EXIT_BAD_INPUT, BadInputError
from partial_rollout_integrations.verl.config import PartialRolloutCheckpointConfig

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
CONFIG_NAME = "partial_rollout_checkpoint"
"""Our Hydra config: verl's ``ppo_trainer`` plus the block."""


def read_block(config: Any) -> PartialRolloutCheckpointConfig:
    """Our block from a composed verl config, checked (absent means off)."""
    from omegaconf import DictConfig, OmegaConf

    v1 = config.trainer.get("v1")
    block = v1.get("partial_rollout_checkpoint") if v1 is not None else None
    raw = OmegaConf.to_container(block, resolve=True) if isinstance(block, DictConfig) else block
    return PartialRolloutCheckpointConfig.from_trainer_v1({"partial_rollout_checkpoint": raw})


def check(config: Any) -> None:
    """Refuse, at set-up, settings partial rollouts do not support, a verl without a name they use and a
    snapshot the run's resume would refuse (another ``n`` or sampling: :mod:`.resume_checks`)."""
    from omegaconf import OmegaConf

    from partial_rollout_integrations.verl import seams
    from partial_rollout_integrations.verl.resume_checks import check_before_start
    from partial_rollout_integrations.verl.setup_checks import check_supported

    check_supported(config)
    seams.check_seams()
    trainer = OmegaConf.to_container(config.trainer, resolve=True)
    rollout = OmegaConf.to_container(config.actor_rollout_ref.rollout, resolve=True)
    assert isinstance(trainer, dict) and isinstance(rollout, dict), "verl's config sections are mappings"
    check_before_start(trainer, rollout)


def run_verl(config: Any) -> None:
    """verl's own ``main_ppo.main`` on ``config`` without our block."""
    from omegaconf import open_dict
    from verl.trainer import main_ppo

    if config.trainer.get("v1") is not None:
        with open_dict(config.trainer.v1):
            config.trainer.v1.pop("partial_rollout_checkpoint", None)
    main_ppo.main(config)  # Hydra's main runs its function directly on a config passed in


def run_with_partial_rollouts(config: Any) -> None:
    """What verl's ``main_ppo.main`` does for the V1 trainer, with our task runner."""
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from partial_rollout_integrations.verl.runner import PartialRolloutTaskRunner

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=PartialRolloutTaskRunner)


def run(config: Any) -> None:
    """Hydra's task function: the composed config, to verl's path or ours."""
    try:
        block = read_block(config)
        if block.active:
            check(config)
    except BadInputError as e:
        print(f"partial-rollout: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    if not block.active:
        run_verl(config)
        return
    try:
        run_with_partial_rollouts(config)
    except BadInputError as e:  # a snapshot refused at the resume, in verl's task-runner actor
        # Ray re-raises an actor's error as an instance of its cause's class too; print the cause's line.
        print(f"partial-rollout: {getattr(e, 'cause', e)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def main() -> None:
    import hydra

    hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base=None)(run)()


if __name__ == "__main__":
    main()
