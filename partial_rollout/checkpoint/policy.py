"""What a resume accepts and what it does with stale work: the settings every trainer's block shares.

The reference trainer's, NeMo RL's and verl's partial-rollout config blocks each let a user choose
the same two things about a resume; :class:`RestorePolicy` defines them once, with their checks, and
is what a block hands to :meth:`~partial_rollout.checkpoint.RolloutCheckpointer.restore`.
"""

from __future__ import annotations

from dataclasses import dataclass

from partial_rollout.checkpoint.staleness import OnStale, check_on_stale


@dataclass(kw_only=True, slots=True, frozen=True)
class RestorePolicy:
    """How :meth:`~partial_rollout.checkpoint.RolloutCheckpointer.restore` treats a snapshot."""

    on_stale: OnStale = "continue"
    """A restored group the trainer's staleness rule finds too old at the resume: ``continue`` it
    anyway (the trainer's sampler may still evict it later), ``regenerate`` it from scratch, or
    ``drop`` it (an eviction with reason ``stale_at_resume``)."""
    allow_vllm_change: bool = False
    """Resume a snapshot written under another vLLM version, its in-flight samples continued and
    declared inexact. Off, such a resume fails naming both versions."""

    def __post_init__(self) -> None:
        check_on_stale(self.on_stale)
        if not isinstance(self.allow_vllm_change, bool):
            raise ValueError(f"allow_vllm_change: must be true or false, got {self.allow_vllm_change!r}")
