"""verl's V1 TaskRunner, running the trainer classes partial rollouts bring.

verl's ``TaskRunnerV1.run`` (``verl/trainer/main_ppo.py``) starts TransferQueue, builds the trainer
class registered for ``trainer.v1.trainer_mode``, then the agent loop manager, and calls ``fit``.
This runner is that class, unchanged, except that for the length of ``run`` the registry entry of
the run's mode names our trainer subclass (:func:`.trainer.trainer_class`; with ``record_events``
and the flag off, :func:`.trainer.recording_trainer_class`, verl's trainer that only records). The
runner is a Ray actor of its own, so the swap is seen by this run's trainer alone.
"""

from __future__ import annotations

from typing import Any

import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.v1 import trainer_base

from partial_rollout_integrations.seams import unwrap
from partial_rollout_integrations.verl.config import PartialRolloutCheckpointConfig

_VerlTaskRunner: Any = unwrap(TaskRunnerV1)
MANAGER = "partial_rollout_integrations.verl.client.DurableAgentLoopManager"
"""The agent-loop manager of a run with the block on (verl's, with workers that name each sample)."""


def ours(config: Any) -> type:
    """Our trainer class for the run's ``trainer.v1.trainer_mode``: the flag's, or the recording one."""
    from partial_rollout_integrations.verl import trainer

    block = PartialRolloutCheckpointConfig.from_trainer_v1(OmegaConf.to_container(config.trainer.v1, resolve=True))
    mode = config.trainer.v1.trainer_mode
    return trainer.recording_trainer_class(mode) if block.record_only else trainer.trainer_class(mode)


@ray.remote
class PartialRolloutTaskRunner(_VerlTaskRunner):  # type: ignore[misc]
    """``TaskRunnerV1`` whose trainer is the partial-rollout subclass of the mode's trainer."""

    def run(self, config: Any) -> None:
        mode = config.trainer.v1.trainer_mode
        OmegaConf.update(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class", MANAGER, force_add=True)
        registry = trainer_base.TRAINER_REGISTRY
        verl_trainer = registry[mode]
        registry[mode] = ours(config)
        try:
            super().run(config)
        finally:
            registry[mode] = verl_trainer
