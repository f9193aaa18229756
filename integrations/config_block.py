"""What the trainers' partial-rollout config blocks share: reading one from the trainer's config,
checking the fields they have in common, and handing their resume settings to the checkpointer.

A block sits inside a trainer's own config (NeMo RL's ``checkpointing.partial_rollouts``, verl's
``trainer.v1.partial_rollout_checkpoint``). It refuses keys it does not know, naming the key and
listing the known ones: a misspelled ``enabel`` must fail at set-up, never silently turn
durability off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from partial_rollout.checkpoint import ON_STALE_CHOICES, RestorePolicy
from partial_rollout.errors import ConfigError

T = TypeVar("T")


def from_mapping(cls: type[T], raw: object, *, block: str) -> T:
    """Dataclass ``cls`` from the block's mapping ``raw`` (``None``, an absent block: the defaults).

    Raises:
        ConfigError: ``raw`` is not a mapping, or has a key ``cls`` lacks (named, with the known ones).
    """
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"must be a mapping, got {type(raw).__name__}", field=block)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(str(key) for key in set(raw) - known)
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r}", field=f"{block}.{unknown[0]}", fix=f"Known keys: {', '.join(sorted(known))}"
        )
    return cls(**dict(raw))


def check_fields(config: Any, *, block: str, flags: tuple[str, ...]) -> None:
    """Check the true/false ``flags`` of a block and the fields every block has: ``on_stale``
    (one of :data:`partial_rollout.checkpoint.ON_STALE_CHOICES`) and ``events_path`` (a path or null).

    Raises:
        ConfigError: the first bad value, naming its key.
    """
    for name in flags:
        if not isinstance(getattr(config, name), bool):
            raise ConfigError(f"must be true or false, got {getattr(config, name)!r}", field=f"{block}.{name}")
    if config.on_stale not in ON_STALE_CHOICES:
        raise ConfigError(
            f"must be one of {', '.join(ON_STALE_CHOICES)}, got {config.on_stale!r}", field=f"{block}.on_stale"
        )
    if config.events_path is not None and not (isinstance(config.events_path, str) and config.events_path):
        raise ConfigError(f"must be a file path, got {config.events_path!r}", field=f"{block}.events_path")


def restore_policy(config: Any) -> RestorePolicy:
    """A block's ``on_stale`` and ``allow_vllm_change``, as the checkpointer's restore takes them."""
    return RestorePolicy(on_stale=config.on_stale, allow_vllm_change=config.allow_vllm_change)
