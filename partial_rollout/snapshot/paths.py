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
    """The file :func:`~partial_rollout.snapshot.save_snapshot` writes for ``path``.

    ``<path>/partial_rollouts.safetensors`` for a folder: one that exists, or a path that does not
    exist yet and does not end in ``.safetensors`` (a trainer's checkpoint folder may be made after
    the cut is taken; the writer makes it). Else ``path`` itself: a ``.safetensors`` file, or an
    existing file to replace. A missing folder named as the file would leave a file where the
    trainer then makes its folder.
    """
    target = Path(path)
    if target.is_dir() or (not target.exists() and target.suffix != ".safetensors"):
        return target / SNAPSHOT_FILENAME
    return target


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
