"""The flag, in SkyRL's own config style: ``trainer.fully_async.partial_rollout_checkpoint.enable``.

SkyRL's config is typed dataclasses parsed from ``key.path=value`` overrides; it refuses ``+key`` and
any key its dataclasses lack, and tells users to subclass the config to add one. So does this
module: :data:`PartialRolloutTrainConfig` is SkyRL's root config whose ``trainer.fully_async`` block
has ours. A misspelled key under it is refused by SkyRL's own check, naming it.

No ``from __future__ import annotations`` here: SkyRL builds nested blocks from each field's
runtime type, and a string annotation would leave the block a plain dict.
"""

from dataclasses import dataclass, field

from skyrl.train.config.config import BaseConfig, FullyAsyncConfig, TrainerConfig, make_config

from partial_rollout.errors import BadInputError


@dataclass
class PartialRolloutCheckpointConfig(BaseConfig):  # type: ignore[misc]
    """``trainer.fully_async.partial_rollout_checkpoint``: off, SkyRL runs exactly as it is."""

    enable: bool = False
    """Save in-flight and finished-untrained samples at each checkpoint and continue them at a resume,
    through the durable servers named in ``generator.inference_engine.external_server_urls``."""
    request_timeout_s: float = 300.0
    """How long the trainer waits for a server's answer at a cut or a restore, in seconds."""

    def __post_init__(self) -> None:
        if not isinstance(self.enable, bool):
            raise BadInputError(
                f"is {self.enable!r}; it must be true or false",
                field="trainer.fully_async.partial_rollout_checkpoint.enable",
            )
        if not self.request_timeout_s > 0:
            raise BadInputError(
                f"is {self.request_timeout_s}; it must be > 0",
                field="trainer.fully_async.partial_rollout_checkpoint.request_timeout_s",
            )


@dataclass
class PartialRolloutFullyAsyncConfig(FullyAsyncConfig):  # type: ignore[misc]
    partial_rollout_checkpoint: PartialRolloutCheckpointConfig = field(default_factory=PartialRolloutCheckpointConfig)
    """Partial rollouts across checkpoints (this project)."""


@dataclass
class PartialRolloutTrainerConfig(TrainerConfig):  # type: ignore[misc]
    fully_async: PartialRolloutFullyAsyncConfig = field(default_factory=PartialRolloutFullyAsyncConfig)


PartialRolloutTrainConfig = make_config(trainer_cls=PartialRolloutTrainerConfig)
"""SkyRL's ``SkyRLTrainConfig`` with our block: ``PartialRolloutTrainConfig.from_cli_overrides(argv)``."""
