"""The verl settings partial rollouts support, refused at set-up otherwise.

Each refusal is one line naming verl's key, why, and what to set instead, raised before Ray or any
verl worker starts (upstream's own rule: an unsupported configuration fails at set-up, never at the
first checkpoint). With the block off nothing here runs: verl keeps every setting it supports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from partial_rollout.errors import ConfigError
from partial_rollout_integrations.verl.config import BLOCK

MODES = ("colocate_async", "separate_async")
"""The V1 trainer modes partial rollouts were tested in (``trainer.v1.trainer_mode``)."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One verl key and the values partial rollouts support for it."""

    key: str
    allowed: tuple[object, ...]
    why: str
    """Why another value cannot work, for the refusal."""
    fix: str
    """What to set instead."""
    when: tuple[str, object] | None = None
    """Checked only where this other key has this value (a mode's own requirement)."""


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(
        "trainer.use_v1",
        (True,),
        "partial rollouts hook verl's V1 trainer, not the legacy one",
        "Set trainer.use_v1=true",
    ),
    Requirement(
        "trainer.v1.trainer_mode",
        MODES,
        "partial rollouts hook verl's asynchronous trainers only",
        f"Set trainer.v1.trainer_mode={' or '.join(MODES)}",
    ),
    Requirement(
        "actor_rollout_ref.hybrid_engine",
        (False,),
        "separate_async was tested with standalone rollout servers only, not with hybrid replicas lent"
        " from the training side",
        "Set actor_rollout_ref.hybrid_engine=false",
        when=("trainer.v1.trainer_mode", "separate_async"),
    ),
    Requirement(
        "actor_rollout_ref.rollout.name",
        ("vllm",),
        "partial rollouts cut and continue requests on vLLM engines only",
        "Set actor_rollout_ref.rollout.name=vllm",
    ),
    Requirement(
        "actor_rollout_ref.rollout.agent.default_agent_loop",
        ("single_turn_agent",),
        "a multi-turn agent loop's later turns are not cut yet",
        "Set actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
    ),
    Requirement(
        "actor_rollout_ref.rollout.multi_turn.enable",
        (False, None),
        "a multi-turn rollout's later turns are not cut yet",
        "Set actor_rollout_ref.rollout.multi_turn.enable=false",
    ),
    Requirement(
        "actor_rollout_ref.actor.checkpoint.async_save",
        (False, None),
        "verl then skips latest_checkpointed_iteration.txt, the commit point the snapshot is written before",
        "Set actor_rollout_ref.actor.checkpoint.async_save=false",
    ),
    Requirement(
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class",
        (None,),
        "partial rollouts set verl's agent loop manager themselves",
        "Remove actor_rollout_ref.rollout.agent.agent_loop_manager_class",
    ),
)
"""What :func:`check_supported` checks, in order."""


NOT_YET: tuple[tuple[str, object], ...] = (("on_stale", "continue"),)
"""Keys of the block the verl integration does not act on yet, with the one value it supports:
another is refused rather than silently ignored."""


def select(config: Mapping[str, Any], key: str) -> Any:
    """The value at dotted ``key`` of a nested mapping (a verl ``DictConfig`` too), ``None`` if absent."""
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def shown(value: object) -> str:
    """``value`` as a Hydra override would spell it (``false``, ``null``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def check_supported(config: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` on the first verl setting of ``config`` partial rollouts do not support.

    Call it only when the block is on (:attr:`.config.PartialRolloutCheckpointConfig.active`).
    """
    for name, default in NOT_YET:
        value = select(config, f"{BLOCK}.{name}")
        if value is not None and value != default:
            raise ConfigError(
                f"{shown(value)} is not implemented for verl yet",
                field=f"{BLOCK}.{name}",
                fix=f"Leave {BLOCK}.{name} at {shown(default)}",
            )
    for requirement in REQUIREMENTS:
        if requirement.when is not None and select(config, requirement.when[0]) != requirement.when[1]:
            continue
        value = select(config, requirement.key)
        if value not in requirement.allowed:
            raise ConfigError(
                f"{shown(value)} is not supported with {BLOCK} on: {requirement.why}",
                field=requirement.key,
                fix=f"{requirement.fix}, or turn {BLOCK}.enable and .record_events off",
            )
