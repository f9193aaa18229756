"""Run-length coding of per-token policy versions.

A sample's tokens almost always come from one or two policy versions (a weight update mid-flight
starts a new run), so storing ``(value, length)`` runs instead of one int32 per token makes the
versions nearly free. Runs never cross a sample boundary, so each sample's runs are the slice
``run_offsets[i]:run_offsets[i + 1]``.
"""

from __future__ import annotations

import numpy as np


def encode_runs(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run-length code the flat ``values`` of samples bounded by ``offsets`` (vectorised).

    Args:
        values: int32 [T], every sample's values concatenated.
        offsets: int64 [S+1], sample ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    Returns:
        ``(run_offsets int64 [S+1], run_values int32 [R], run_lengths int32 [R])``.
    """
    total = len(values)
    changes = np.flatnonzero(values[1:] != values[:-1]) + 1
    starts = np.unique(np.concatenate([offsets[:-1][offsets[:-1] < total], changes])).astype(np.int64)
    run_lengths = np.diff(np.append(starts, total)).astype(np.int32)
    run_offsets = np.searchsorted(starts, offsets, side="left").astype(np.int64)
    return run_offsets, values[starts].astype(np.int32), run_lengths


def run_ends(run_lengths: np.ndarray) -> np.ndarray:
    """int64 [R+1]: the token offset where each run starts, then the total (prefix sums of lengths)."""
    return np.concatenate([[0], np.cumsum(run_lengths, dtype=np.int64)])


def decode_runs(run_values: np.ndarray, run_lengths: np.ndarray) -> np.ndarray:
    """Expand runs back to one int32 value per token."""
    return np.repeat(run_values, run_lengths).astype(np.int32, copy=False)
