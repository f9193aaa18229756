"""SkyRL's experiment with partial rollouts: its ``BasePPOExp``, whose public hooks pick the generator and trainer.

:func:`parse` reads SkyRL's overrides into the config with our block; :func:`check_supported` refuses, at
set-up, the settings partial rollouts cannot serve.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from skyrl.train.entrypoints.main_base import BasePPOExp

from partial_rollout.errors import EXIT_BAD_INPUT, BadInputError
from partial_rollout.ledger import EventLog

EVENTS_FILE = "events.jsonl"
"""In ``trainer.ckpt_path``: the run's events (saves, resumes, training steps), appended across restarts."""


def check_supported(cfg: Any) -> None:
    """Refuse, one line naming the key, the settings partial rollouts cannot serve.

    Raises:
        BadInputError: the first such setting.
    """
    ie = cfg.generator.inference_engine
    checks = [
        (
            not cfg.trainer.fully_async.enabled,
            "trainer.fully_async.enabled",
            "partial rollouts extend SkyRL's fully async trainer; set it to true",
        ),
        (
            ie.run_engines_locally or ie.external_server_urls is None,
            "generator.inference_engine.external_server_urls",
            "name the durable servers (python -m partial_rollout_integrations.skyrl.server) as SkyRL's external "
            "servers, with run_engines_locally=false",
        ),
        (
            cfg.generator.max_turns != 1 or cfg.generator.step_wise_trajectories,
            "generator.max_turns",
            "multi-turn generators keep their state in coroutines; only single-turn samples are saved (max_turns=1)",
        ),
        (
            cfg.trainer.policy.model.lora.rank > 0,
            "trainer.policy.model.lora.rank",
            "LoRA weight sync does not pause the servers; partial rollouts need full-weight sync (rank 0)",
        ),
        (
            cfg.trainer.strategy == "megatron" and cfg.trainer.policy.megatron_config.async_dist_ckpt_save,
            "trainer.policy.megatron_config.async_dist_ckpt_save",
            "an asynchronous model save would commit the checkpoint before its shards are written",
        ),
        (
            "://" in str(cfg.trainer.ckpt_path),
            "trainer.ckpt_path",
            "the snapshot is written to a local (or mounted) folder; give a local path",
        ),
        (
            cfg.trainer.resume_mode not in ("latest", "none", None),
            "trainer.resume_mode",
            "resume from the latest checkpoint ('latest') or from nothing ('none')",
        ),
    ]
    for refused, key, why in checks:
        if refused:
            raise BadInputError(why, field=key)


def parse(overrides: list[str]) -> Any:
    """SkyRL's config with our block, from SkyRL's overrides, checked; a refusal exits 3 with one line."""
    from skyrl.train.utils import validate_cfg

    from partial_rollout_integrations.skyrl.config import PartialRolloutTrainConfig
    from partial_rollout_integrations.skyrl.seams import check_seams

    try:
        cfg = PartialRolloutTrainConfig.from_cli_overrides(overrides)
        if cfg.trainer.fully_async.partial_rollout_checkpoint.enable:
            check_supported(cfg)
            check_seams()
    except (BadInputError, ValueError) as e:
        print(f"partial-rollout: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    validate_cfg(cfg)
    return cfg


class PartialRolloutExp(BasePPOExp):  # type: ignore[misc]
    """SkyRL's ``BasePPOExp`` with the fully async trainer: ours, and our generator, when the flag is on.

    Args:
        cfg: the parsed config (:data:`~.config.PartialRolloutTrainConfig`).
    """

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.block = cfg.trainer.fully_async.partial_rollout_checkpoint
        self.urls = list(cfg.generator.inference_engine.external_server_urls or [])
        self.scheduled_at: dict[str, int] = {}
        """The step each group was scheduled at, by uid: the generator notes it, the trainer saves it."""
        ckpt = Path(cfg.trainer.ckpt_path)
        self.events = EventLog(ckpt / EVENTS_FILE) if self.block.enable else None

    def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> Any:
        if not self.block.enable:
            return super().get_generator(cfg, tokenizer, inference_engine_client)
        from skyrl.backends.skyrl_train.inference_servers.utils import resolve_policy_model_name

        from partial_rollout_integrations.skyrl.trainer import SchedulingGenerator

        return SchedulingGenerator(
            generator_cfg=cfg.generator,
            skyrl_gym_cfg=cfg.environment.skyrl_gym,
            inference_engine_client=inference_engine_client,
            tokenizer=tokenizer,
            policy_model_name=resolve_policy_model_name(cfg),
            scheduled_at=self.scheduled_at,
        )

    def trainer_class(self) -> type:
        from skyrl.train.fully_async_trainer import FullyAsyncRayPPOTrainer

        from partial_rollout_integrations.skyrl.trainer import PartialRolloutTrainer

        return PartialRolloutTrainer if self.block.enable else FullyAsyncRayPPOTrainer

    def trainer_kwargs(self) -> dict[str, Any]:
        """What our trainer takes besides SkyRL's arguments."""
        from partial_rollout_integrations.skyrl.checkpoint import Servers

        if not self.block.enable:
            return {}
        servers = Servers(self.urls, timeout_s=self.block.request_timeout_s)
        return {"servers": servers, "scheduled_at": self.scheduled_at, "events": self.events}

    def get_trainer(self, **kwargs: Any) -> Any:
        return self.trainer_class()(**kwargs, **self.trainer_kwargs())
