"""What a snapshot holds, computed from its structural tensors only (never its tokens).

The dump command prints this; its JSON form (``partial-rollout dump --json``) is documented in
docs/snapshot_format.md, section "dump --json".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from partial_rollout.snapshot import layout
from partial_rollout.snapshot.layout import FORMAT_NAME
from partial_rollout.snapshot.reader import SnapshotReader
from partial_rollout.snapshot.schema import GroupState, SampleState


def summarize(reader: SnapshotReader, *, limit: int) -> dict[str, Any]:
    """The summary and the in-flight sample table of the snapshot ``reader`` has open.

    Args:
        reader: an open snapshot.
        limit: most in-flight rows to include (0 = all); ``in_flight.total`` says how many there are.

    Returns:
        A JSON-native dict (schema in docs/snapshot_format.md).
    """
    a = reader.arrays
    group_state, sample_state = a["group.state"], a["sample.state"]
    sample_offsets = a["group.sample_offsets"]
    lengths = np.diff(a["sample.token_offsets"])
    in_flight = sample_state == layout.SAMPLE_STATE_CODES[SampleState.IN_FLIGHT]
    finished = (sample_state == layout.SAMPLE_STATE_CODES[SampleState.FINISHED]).astype(np.int64)
    group_sizes = np.diff(sample_offsets)
    finished_per_group = np.add.reduceat(finished, sample_offsets[:-1]) if len(group_sizes) else np.zeros(0, np.int64)
    run_counts = np.diff(a["sample.version_run_offsets"])
    run_values = a["sample.version_run_values"]
    in_flight_runs = np.repeat(in_flight, run_counts)
    dispatch = a["group.dispatch_version"]
    sampler_bytes = np.diff(a["sample.sampler_state_offsets"])

    counts = {"groups": reader.num_groups}
    counts.update({f"groups_{s.value}": int((group_state == layout.GROUP_STATE_CODES[s]).sum()) for s in GroupState})
    counts["groups_partial"] = int(((finished_per_group > 0) & (finished_per_group < group_sizes)).sum())
    counts["samples"] = reader.num_samples
    counts.update(
        {f"samples_{s.value}": int((sample_state == layout.SAMPLE_STATE_CODES[s]).sum()) for s in SampleState}
    )
    counts["tokens"] = reader.num_tokens
    counts["tokens_in_flight"] = int(lengths[in_flight].sum())
    counts["prompt_tokens"] = int(a["group.prompt_offsets"][-1])

    sampler_total = int(sampler_bytes.sum())
    per_token = round((reader.file_size - sampler_total) / reader.num_tokens, 3) if reader.num_tokens else None
    return {
        "path": str(reader.path),
        "format": FORMAT_NAME,
        "format_version": reader.format_version,
        "writer": reader.writer,
        "trainer_step": reader.trainer_step,
        "policy_version": reader.policy_version,
        "fingerprints": reader.fingerprints.to_json(),
        "counts": counts,
        "policy_versions": {
            "in_flight_tokens": _span(run_values[in_flight_runs]),
            "all_tokens": _span(run_values),
            "dispatch": _span(dispatch[dispatch >= 0]),
        },
        "counters": reader.counters,
        "evicted_by_reason": reader.evicted_by_reason,
        "size": {
            "file_bytes": reader.file_size,
            "sampler_state_bytes": sampler_total,
            "bytes_per_token": per_token,
        },
        "in_flight": _rows(reader, np.flatnonzero(in_flight), limit, lengths, sampler_bytes),
    }


def _rows(
    reader: SnapshotReader, samples: np.ndarray, limit: int, lengths: np.ndarray, sampler_bytes: np.ndarray
) -> dict[str, Any]:
    a = reader.arrays
    sample_offsets = a["group.sample_offsets"]
    prompt_lengths = np.diff(a["group.prompt_offsets"])
    run_offsets = a["sample.version_run_offsets"]
    run_values = a["sample.version_run_values"]
    sampling = reader.tables["sampling"]
    inexact_reasons = reader.tables["inexact_reasons"]
    shown = samples if limit == 0 else samples[:limit]
    rows = []
    for s in shown.tolist():
        g = int(np.searchsorted(sample_offsets, s, side="right")) - 1
        max_tokens = sampling[int(a["sample.sampling_index"][s])]["max_tokens"]
        inexact = int(a["sample.inexact"][s])
        rows.append(
            {
                "group_id": reader.group_ids[g],
                "sample": s - int(sample_offsets[g]),
                "prompt_tokens": int(prompt_lengths[g]),
                "prefix_tokens": int(lengths[s]),
                "max_tokens": max_tokens,
                "remaining_tokens": max_tokens - int(lengths[s]),
                "versions": _span(run_values[run_offsets[s] : run_offsets[s + 1]]),
                "seeded": bool(a["sample.has_seed"][s]),
                "sampler_state_bytes": int(sampler_bytes[s]),
                "inexact": None if inexact == layout.NO_CODE else inexact_reasons[inexact],
            }
        )
    return {"total": len(samples), "shown": len(rows), "rows": rows}


def _span(values: np.ndarray) -> list[int] | None:
    return [int(values.min()), int(values.max())] if len(values) else None
