"""The ``checkpointing.partial_rollouts`` block of a NeMo RL config.

It sits under ``checkpointing`` (a ``TypedDict`` inside NeMo RL's ``extra="allow"`` master config,
so NeMo RL's validation keeps it) and not under ``rollout_checkpointing``, whose block forbids
unknown keys. Like NeMo RL's own durability blocks it refuses keys it does not know (see
:mod:`partial_rollout_integrations.config_block`): a misspelled ``enabeld`` must fail at set-up,
not silently turn durability off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from partial_rollout.checkpoint import OnStale
from partial_rollout_integrations.config_block import check_fields, from_mapping

BLOCK = "checkpointing.partial_rollouts"
"""Where the block lives in a NeMo RL config, for error messages."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PartialRolloutsConfig:
    enabled: bool = False
    """Save one consistent cut of all outstanding work at every checkpoint (in-flight prefixes,
    finished siblings, prompts yielded but not dispatched) and continue it on resume. Off: NeMo RL
    runs exactly as without this package."""
    on_stale: OnStale = "continue"
    """A restored group whose dispatch version NeMo RL's sampler would abort as stale at the resume
    version: ``continue`` it anyway (the sampler may still evict it once it is ready),
    ``regenerate`` it from scratch, or ``drop`` it (an eviction with reason ``stale_at_resume``)."""
    record_events: bool = False
    """Write the work ledger's ``events.jsonl`` even with ``enabled: false``, changing nothing else:
    how the loss of prompts at a restart is counted on unmodified NeMo RL."""
    events_path: str | None = None
    """Where ``events.jsonl`` goes; default ``<checkpoint_dir>/partial_rollouts/events.jsonl`` (it
    spans restarts, which NeMo RL's per-run log folders do not)."""
    allow_vllm_change: bool = False
    """Resume a snapshot written under another vLLM version (its in-flight samples continue declared
    inexact). Off, such a resume fails naming both versions."""

    def __post_init__(self) -> None:
        check_fields(self, block=BLOCK, flags=("enabled", "record_events", "allow_vllm_change"))

    @property
    def active(self) -> bool:
        """Whether anything of ours is installed in the run."""
        return self.enabled or self.record_events

    @classmethod
    def from_checkpointing(cls, checkpointing: Mapping[str, Any] | None) -> PartialRolloutsConfig:
        """The block from NeMo RL's ``checkpointing`` section (absent means off)."""
        return from_mapping(cls, (checkpointing or {}).get("partial_rollouts"), block=BLOCK)
