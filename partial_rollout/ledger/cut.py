"""The ledger's half of a checkpoint, split in two so the engine stays frozen only for the cheap one.

Inside the engine's frozen window the ledger only copies its group entries into a
:class:`LedgerCut`; turning them into records (which checks them), encoding and writing the snapshot
happen later, in :meth:`LedgerCut.write`, while the engine runs again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partial_rollout.ledger.entry import GroupEntry
from partial_rollout.ledger.events import SaveEvent
from partial_rollout.snapshot import Fingerprints, Snapshot, save_snapshot


@dataclass(kw_only=True, eq=False)
class LedgerCut:
    """The ledger's outstanding work at one instant, held in memory until it is written.

    :meth:`~partial_rollout.ledger.WorkLedger.cut` takes it inside the engine's frozen window;
    :meth:`write` encodes and writes it later, in any thread, while the ledger goes on changing.
    The groups are copies of the ledger's entries (:meth:`GroupEntry.copy`); their sample records,
    frozen, are shared.
    """

    path: Path
    """The snapshot file :meth:`write` creates."""
    save_id: str
    """Id of the ``save`` event; a resume from this cut names it."""
    trainer_step: int
    """Training step of the checkpoint."""
    policy_version: int
    """Policy version at the cut."""
    fingerprints: Fingerprints
    """Identities a resume must match."""
    groups: list[GroupEntry]
    """Copies of the entries of the groups saved (those in the requested states), in yield order."""
    loader_state: dict[str, Any] | None
    """A deep copy of the loader's cursor at the cut."""
    counters: dict[str, int]
    """The ledger's counters at the cut."""
    evicted_by_reason: dict[str, int]
    """Evictions by reason at the cut."""
    metadata: dict[str, Any]
    """The trainer's metadata plus the ledger's manifest."""
    event: SaveEvent
    """Fields of the ``save`` event: what was outstanding and what is saved."""
    previous_save: tuple[str | None, str | None]
    """The ledger's ``last_save_id`` and ``snapshot_file`` before the cut (restored if the write fails)."""

    def to_snapshot(self) -> Snapshot:
        """The snapshot of this cut; checking it reads every token, so it is not done in the frozen window.

        Raises:
            ValueError: a group is invalid (e.g. ready with unfinished samples), naming it.
        """
        return Snapshot(
            trainer_step=self.trainer_step,
            policy_version=self.policy_version,
            fingerprints=self.fingerprints,
            groups=[g.record() for g in self.groups],
            loader_state=self.loader_state,
            counters=self.counters,
            evicted_by_reason=self.evicted_by_reason,
            metadata=self.metadata,
        )

    def write(self) -> int:
        """Validate, encode and write the snapshot atomically (fsync and rename included); returns its size.

        A failure leaves no file behind and every earlier snapshot intact
        (:func:`~partial_rollout.snapshot.save_snapshot`).
        """
        return save_snapshot(self.to_snapshot(), self.path)
