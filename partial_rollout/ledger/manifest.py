"""The ledger's manifest: the small JSON state a trainer's own checkpoint carries (``Stateful``).

The outstanding groups and their tokens live only in the snapshot file; the manifest holds the
accounting around them (counters, evictions by reason) and names that file and the save it belongs
to. :meth:`~partial_rollout.ledger.WorkLedger.state_dict` returns it, the snapshot embeds the same
manifest in its ``metadata`` (under :data:`LEDGER_METADATA_KEY`), and both ways back in check it
completely before the ledger adopts any of it. Its keys are named constants (torchdata's rule for
state dicts), and :data:`STATE_VERSION` changes whenever they do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from partial_rollout.errors import BadInputError

STATE_VERSION = 2
"""Version of the manifest :meth:`~partial_rollout.ledger.WorkLedger.state_dict` returns. Version 1
also held every group and token as JSON lists; since 2 they live only in the snapshot file."""
VERSION_KEY = "version"
"""Manifest key: :data:`STATE_VERSION` of the code that wrote it."""
COUNTERS_KEY = "counters"
"""Manifest key: :attr:`WorkLedger.counters <partial_rollout.ledger.WorkLedger.counters>`."""
EVICTED_BY_REASON_KEY = "evicted_by_reason"
"""Manifest key: :attr:`WorkLedger.evicted_by_reason <partial_rollout.ledger.WorkLedger.evicted_by_reason>`."""
LAST_SAVE_ID_KEY = "last_save_id"
"""Manifest key: :attr:`WorkLedger.last_save_id <partial_rollout.ledger.WorkLedger.last_save_id>`."""
SNAPSHOT_FILE_KEY = "snapshot_file"
"""Manifest key: :attr:`WorkLedger.snapshot_file <partial_rollout.ledger.WorkLedger.snapshot_file>`."""
MANIFEST_KEYS = (VERSION_KEY, COUNTERS_KEY, EVICTED_BY_REASON_KEY, LAST_SAVE_ID_KEY, SNAPSHOT_FILE_KEY)
LEDGER_METADATA_KEY = "ledger"
"""Key of the ledger's manifest in a snapshot's ``metadata``."""
COUNTER_NAMES = ("yielded", "dispatched", "finished", "consumed", "evicted")
"""The ledger's counters, each a number of groups (``finished``: of samples)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """The manifest's fields, checked (:func:`parse_manifest`) or about to be written (:meth:`to_state_dict`)."""

    counters: dict[str, int]
    """Exactly :data:`COUNTER_NAMES`, each >= 0."""
    evicted_by_reason: dict[str, int]
    """Evictions by reason."""
    last_save_id: str | None
    """The ``save_id`` of the checkpoint the ledger was last saved as or loaded from."""
    snapshot_file: str | None
    """Name of that checkpoint's snapshot file."""

    def to_state_dict(self) -> dict[str, Any]:
        """The JSON-native manifest of :data:`STATE_VERSION` (copies: the ledger goes on counting)."""
        return {
            VERSION_KEY: STATE_VERSION,
            COUNTERS_KEY: dict(self.counters),
            EVICTED_BY_REASON_KEY: dict(self.evicted_by_reason),
            LAST_SAVE_ID_KEY: self.last_save_id,
            SNAPSHOT_FILE_KEY: self.snapshot_file,
        }


def parse_manifest(
    state: Any, *, error: type[BadInputError], path: str | os.PathLike[str] | None, field: str
) -> Manifest:
    """Check a manifest completely and return its fields (the caller adopts them only then).

    Args:
        state: the manifest, as :meth:`Manifest.to_state_dict` wrote it.
        error: what to raise: :class:`~partial_rollout.errors.SnapshotError` for the copy in a
            snapshot, :class:`~partial_rollout.errors.BadInputError` for a trainer's state dict.
        path: the file it came from, if any, named in the error.
        field: where it sits (``metadata.ledger``, ``ledger state``), named in the error.

    Raises:
        BadInputError: (``error``) a manifest of another version, or with a missing, unknown or
            invalid field (the message names it).
    """
    if not isinstance(state, Mapping):
        what = (
            "missing: not written by WorkLedger"
            if state is None
            else f"must be a JSON object, got {type(state).__name__}"
        )
        raise error(what, path=path, field=field)
    if state.get(VERSION_KEY) != STATE_VERSION:
        raise error(
            f"version {state.get(VERSION_KEY)!r}, expected {STATE_VERSION}",
            path=path,
            field=f"{field}.{VERSION_KEY}",
            fix="It was written by another partial-rollout version; resume with the one that wrote it.",
        )
    if set(state) != set(MANIFEST_KEYS):
        missing, unknown = sorted(set(MANIFEST_KEYS) - set(state)), sorted(set(state) - set(MANIFEST_KEYS))
        raise error(f"missing keys {missing}, unknown keys {unknown}", path=path, field=field)
    counters, evicted = state[COUNTERS_KEY], state[EVICTED_BY_REASON_KEY]
    if not _is_counts(counters) or set(counters) != set(COUNTER_NAMES):
        what = f"must count exactly {list(COUNTER_NAMES)} with integers >= 0, got {counters!r}"
        raise error(what, path=path, field=f"{field}.{COUNTERS_KEY}")
    if not _is_counts(evicted):
        what = f"must map reasons to integers >= 0, got {evicted!r}"
        raise error(what, path=path, field=f"{field}.{EVICTED_BY_REASON_KEY}")
    for key in (LAST_SAVE_ID_KEY, SNAPSHOT_FILE_KEY):
        if state[key] is not None and not isinstance(state[key], str):
            raise error(f"must be a string or null, got {state[key]!r}", path=path, field=f"{field}.{key}")
    return Manifest(
        counters=dict(counters),
        evicted_by_reason=dict(evicted),
        last_save_id=state[LAST_SAVE_ID_KEY],
        snapshot_file=state[SNAPSHOT_FILE_KEY],
    )


def _is_counts(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items()
    )
