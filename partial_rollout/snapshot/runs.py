"""Run-length coding of per-token policy versions.

A sample's tokens almost always come from one or two policy versions (a weight update mid-flight
starts a new run), so storing ``(value, length)`` runs instead of one int32 per token makes the
versions nearly free. Runs never cross a sample boundary, so each sample's runs are the slice
``run_offsets[i]:run_offsets[i + 1]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def encode_runs(samples: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run-length code each sample's int32 versions.

    Returns:
        ``(run_offsets int64 [S+1], run_values int32 [R], run_lengths int32 [R])``.
    """
    starts_per_sample = [np.flatnonzero(v[1:] != v[:-1]) + 1 if len(v) else _EMPTY for v in samples]
    counts = [len(starts) + 1 if len(v) else 0 for v, starts in zip(samples, starts_per_sample, strict=True)]
    run_offsets = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(counts, out=run_offsets[1:])
    values, lengths = [], []
    for v, starts in zip(samples, starts_per_sample, strict=True):
        if len(v):
            values.append(v[np.concatenate([[0], starts])] if len(starts) else v[:1])
            lengths.append(np.diff(np.concatenate([[0], starts, [len(v)]])) if len(starts) else np.array([len(v)]))
    if not values:
        return run_offsets, np.empty(0, np.int32), np.empty(0, np.int32)
    return run_offsets, np.concatenate(values).astype(np.int32), np.concatenate(lengths).astype(np.int32)


_EMPTY = np.empty(0, dtype=np.int64)


def run_ends(run_lengths: np.ndarray) -> np.ndarray:
    """int64 [R+1]: the token offset where each run starts, then the total (prefix sums of lengths)."""
    return np.concatenate([[0], np.cumsum(run_lengths, dtype=np.int64)])


def decode_runs(run_values: np.ndarray, run_lengths: np.ndarray) -> np.ndarray:
    """Expand runs back to one int32 value per token."""
    return np.repeat(run_values, run_lengths).astype(np.int32, copy=False)
