"""The ``trainer.v1.partial_rollout_checkpoint`` block of a verl config.

It sits beside the V1 trainer's own settings (``trainer.v1.trainer_mode``, ``trainer.v1.sampler``)
and is spelled as verl spells its switches (``enable``, as ``transfer_queue.enable``). verl's
configs are Hydra struct configs, so the block's defaults come from
``configs/partial_rollout_checkpoint.yaml`` (verl's ``ppo_trainer`` plus this block) and
``trainer.v1.partial_rollout_checkpoint.enable=true`` is a plain override, no ``+`` needed. Keys it
does not know are refused (:mod:`partial_rollout_integrations.config_block`): a misspelled
``enabel`` fails at set-up instead of silently leaving durability off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from partial_rollout.checkpoint import OnStale
from partial_rollout_integrations.config_block import check_fields, from_mapping

BLOCK = "trainer.v1.partial_rollout_checkpoint"
"""Where the block lives in a verl config, for error messages."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PartialRolloutCheckpointConfig:
    enable: bool = False
    """Write one consistent cut of every in-flight trajectory into each ``global_step_N/`` verl
    saves, and at resume continue it from its prefix instead of regenerating its group. Off: verl
    runs exactly as it does without this package."""
    record_events: bool = False
    """Write the work ledger's ``events.jsonl`` even with ``enable: false``, changing nothing else:
    how what verl loses at a restart is measured on unmodified verl."""
    events_path: str | None = None
    """Where ``events.jsonl`` goes; default ``<trainer.default_local_dir>/partial_rollouts/events.jsonl``
    (beside verl's ``global_step_N/`` folders, so it spans restarts)."""
    allow_vllm_change: bool = False
    """Resume a snapshot written under another vLLM version (its in-flight samples continue declared
    inexact). Off, such a resume fails naming both versions."""
    on_stale: OnStale = "continue"
    """A restored group dispatched under a policy verl's sampler would now drop as too stale:
    ``continue`` it anyway (the sampler may still drop it once it is ready), ``regenerate`` it from
    scratch, or ``drop`` it (an eviction with reason ``stale_at_resume``)."""

    def __post_init__(self) -> None:
        check_fields(self, block=BLOCK, flags=("enable", "record_events", "allow_vllm_change"))

    @property
    def active(self) -> bool:
        """Whether anything of ours is installed in the run."""
        return self.enable or self.record_events

    @property
    def record_only(self) -> bool:
        """``record_events`` without ``enable``: verl runs as it is and the ledger only records."""
        return self.record_events and not self.enable

    def events_file(self, default_local_dir: str) -> str:
        """Where the run's ``events.jsonl`` goes, given verl's ``trainer.default_local_dir``."""
        return self.events_path or os.path.join(default_local_dir, "partial_rollouts", "events.jsonl")

    @classmethod
    def from_trainer_v1(cls, v1: Mapping[str, Any] | None) -> PartialRolloutCheckpointConfig:
        """The block from verl's ``trainer.v1`` section, resolved to plain values (absent means off)."""
        return from_mapping(cls, (v1 or {}).get("partial_rollout_checkpoint"), block=BLOCK)
