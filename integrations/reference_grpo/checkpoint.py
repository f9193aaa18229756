"""Checkpoint folders as NeMo RL lays them out: written as ``step_N.tmp``, renamed to ``step_N`` when complete.

A kill at any instant of a save leaves at worst a ``step_N.tmp`` folder, which no resume reads
(and the next save of that step replaces); the rename is the commit. Every file inside is
written atomically too, so even a reader of an incomplete folder never sees half a file.

Layout of ``<checkpoint_dir>/step_N/``::

    training_info.json               step, policy version, epoch, consumed groups (NeMo RL's save state)
    policy/model.safetensors         float32 weights
    policy/optimizer.safetensors     AdamW moments; optimizer.json: steps and hyper-parameters
    partial_rollouts.safetensors     the work ledger's cut: loader cursor + outstanding groups
                                     (all of them with partial rollouts on, ready ones only off)
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from partial_rollout.atomic import atomic_write, fsync_path

TRAINING_INFO_FILE = "training_info.json"
POLICY_DIR = "policy"
_STEP = re.compile(r"^step_(\d+)$")


def step_dir(checkpoint_dir: Path, step: int) -> Path:
    return checkpoint_dir / f"step_{step}"


def begin(checkpoint_dir: Path, step: int) -> Path:
    """A fresh ``step_N.tmp`` folder to write a checkpoint into (a leftover one is removed)."""
    tmp = checkpoint_dir / f"step_{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / POLICY_DIR).mkdir(parents=True)
    return tmp


def commit(tmp: Path) -> Path:
    """Rename a complete ``step_N.tmp`` to ``step_N`` (replacing an older save of the same step)."""
    final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    for folder in (tmp / POLICY_DIR, tmp):
        fsync_path(folder)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(final.parent)
    return final


def discard(tmp: Path) -> None:
    """Remove a ``step_N.tmp`` folder whose save failed (what cannot be removed stays; no resume reads it)."""
    shutil.rmtree(tmp, ignore_errors=True)


def latest(checkpoint_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    if not checkpoint_dir.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in checkpoint_dir.iterdir() if p.is_dir() and (m := _STEP.match(p.name))]
    return max(steps)[1] if steps else None


def write_training_info(folder: Path, info: dict[str, Any]) -> None:
    with atomic_write(folder / TRAINING_INFO_FILE) as tmp:
        tmp.write_text(json.dumps(info, indent=2, sort_keys=True))


def read_training_info(folder: Path) -> dict[str, Any]:
    info: dict[str, Any] = json.loads((folder / TRAINING_INFO_FILE).read_text())
    return info
