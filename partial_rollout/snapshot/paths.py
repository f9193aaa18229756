"""Where a snapshot lives: one file of a fixed name in its checkpoint folder.

A trainer names the checkpoint folder, and a user may name either the folder or the file, so the
writer (:func:`snapshot_path`) and the reader (:func:`find_snapshot`) both turn such a path into the
file; the two rules sit side by side here so they cannot drift apart.
"""

from __future__ import annotations

import os
from pathlib import Path

from partial_rollout.errors import SnapshotError

SNAPSHOT_FILENAME = "partial_rollouts.safetensors"
"""Name of the snapshot inside a checkpoint folder."""


def snapshot_path(path: str | os.PathLike[str]) -> Path:
    """The file :func:`~partial_rollout.snapshot.save_snapshot` writes for ``path``:
    ``<path>/partial_rollouts.safetensors`` for an existing folder, else ``path`` itself."""
    target = Path(path)
    return target / SNAPSHOT_FILENAME if target.is_dir() else target


def find_snapshot(path: str | os.PathLike[str]) -> Path:
    """The snapshot file at ``path``: the file itself, or ``partial_rollouts.safetensors`` in a folder.

    Raises:
        SnapshotError: ``path`` does not exist, or is a folder without a snapshot (leftover
            ``.partial_rollouts.safetensors.*.tmp`` files of an interrupted save do not count).
    """
    path = Path(path)
    if path.is_dir():
        candidate = path / SNAPSHOT_FILENAME
        if not candidate.is_file():
            raise SnapshotError(
                f"no {SNAPSHOT_FILENAME} in this folder",
                path=path,
                fix="Pass the snapshot file itself, or a checkpoint folder that holds one.",
            )
        return candidate
    if not path.exists():
        raise SnapshotError("no such file or folder", path=path)
    return path
