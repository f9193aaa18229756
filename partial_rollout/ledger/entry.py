"""The ledger's own state of one outstanding group, which its transitions change as the group moves on.

A :class:`~partial_rollout.snapshot.GroupRecord` is a frozen value: what a snapshot stores, checked
once when it is built. The ledger keeps a :class:`GroupEntry` per outstanding group instead, changes
it in place at each transition (and writes the event of it), and turns it into a record only when it
saves (:meth:`GroupEntry.record`). The samples it holds are frozen records, so a cut copies an entry
without copying a token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from partial_rollout.snapshot import GroupRecord, GroupState, SampleRecord


@dataclass(kw_only=True, slots=True, eq=False)
class GroupEntry:
    """One outstanding group as the ledger holds it: read it anywhere, change it through the ledger.

    Its fields read as a :class:`~partial_rollout.snapshot.GroupRecord`'s. One state exists only
    here: a group the trainer's own checkpoint holds finished (:attr:`trainer_holds`) is ready, while its
    samples here may not be finished; its record keeps the state its samples are in.
    """

    group_id: str
    """Stable id, unique among the outstanding groups."""
    prompt_token_ids: np.ndarray
    """int32 [P]: the prompt."""
    data: dict[str, Any]
    """JSON-native payload of the trainer's; :meth:`~partial_rollout.ledger.WorkLedger.set_data`
    replaces it (a cut shares the dict it had)."""
    state: GroupState
    """Pending, in flight, or ready."""
    dispatch_version: int
    """Policy version when the group was dispatched; -1 while pending."""
    samples: list[SampleRecord]
    """The samples as last reported, in index order."""
    trainer_holds: bool = False
    """The trainer's own checkpoint holds this group finished while its samples here are not: it
    is ready, and trained from the trainer's copy
    (:meth:`~partial_rollout.ledger.WorkLedger.adopt_ready`)."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroupEntry):
            return NotImplemented
        same = (self.state, self.trainer_holds) == (other.state, other.trainer_holds)
        return same and self.record() == other.record()

    @classmethod
    def of(cls, record: GroupRecord) -> GroupEntry:
        """An entry starting where ``record`` is (a yielded group, or one a snapshot restored)."""
        return cls(**_as_stored(record), state=record.state, samples=list(record.samples))

    @property
    def saved_state(self) -> GroupState:
        """The state a snapshot saves it in; for a group the trainer holds, the one its samples here are in."""
        if not self.trainer_holds:
            return self.state
        return GroupState.PENDING if self.dispatch_version < 0 else GroupState.IN_FLIGHT

    def copy(self) -> GroupEntry:
        """An entry the ledger's next transitions leave as it is (the samples, frozen, are shared)."""
        return dataclasses.replace(self, samples=list(self.samples))

    def record(self) -> GroupRecord:
        """The group as a snapshot stores it, checked.

        Raises:
            ValueError: the group is invalid (its message names the group and the field).
        """
        try:
            return GroupRecord(**_as_stored(self), state=self.saved_state, samples=self.samples)
        except ValueError as exc:
            raise ValueError(f"group {self.group_id!r}: {exc}") from None


def _as_stored(group: GroupEntry | GroupRecord) -> dict[str, Any]:
    """The fields an entry and a record hold alike (their states and sample containers differ)."""
    return {name: getattr(group, name) for name in ("group_id", "prompt_token_ids", "data", "dispatch_version")}
