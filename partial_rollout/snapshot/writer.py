"""Turn a :class:`Snapshot` into flat tensors plus JSON metadata, and save it atomically.

Everything per group or per sample becomes a flat tensor (plus offsets when ragged), so the header
stays a few kilobytes for 100,000 samples. Token ids and logprobs are written straight from each
sample's array (:class:`~partial_rollout.snapshot.container.Chunks`), never copied into one big
array first, so saving is one streaming write at disk speed. The exact layout is in
docs/snapshot_format.md and :mod:`partial_rollout.snapshot.layout`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from partial_rollout.atomic import atomic_write
from partial_rollout.snapshot import container, layout, state_codec
from partial_rollout.snapshot._checks import canonical_json
from partial_rollout.snapshot.checksum import ALGORITHM, CHECKSUMS_KEY, metadata_checksum, tensor_checksum
from partial_rollout.snapshot.container import Chunks
from partial_rollout.snapshot.layout import FORMAT_NAME, FORMAT_VERSION
from partial_rollout.snapshot.paths import SNAPSHOT_FILENAME, snapshot_path
from partial_rollout.snapshot.runs import encode_runs
from partial_rollout.snapshot.schema import Snapshot


def save_snapshot(snapshot: Snapshot, path: str | os.PathLike[str]) -> int:
    """Save ``snapshot`` atomically; a save that dies at any instant leaves the previous file intact.

    Its records checked themselves when they were built (they are frozen), so this only encodes
    and writes.

    Args:
        snapshot: what to save.
        path: a checkpoint folder (the file is then ``<folder>/partial_rollouts.safetensors``;
            the folder is made if it does not exist, its parent is not), or a file to write
            (:func:`~partial_rollout.snapshot.paths.snapshot_path` says which).

    Returns:
        The size of the file written, in bytes.
    """
    tensors, metadata = encode_snapshot(snapshot)
    final = snapshot_path(path)
    if final.name == SNAPSHOT_FILENAME and final.parent.parent.is_dir():
        final.parent.mkdir(exist_ok=True)  # the checkpoint folder itself; in a missing parent, atomic_write refuses
    with atomic_write(final) as tmp:
        return container.write_file(tmp, tensors, metadata)


def encode_snapshot(snapshot: Snapshot) -> tuple[dict[str, np.ndarray | Chunks], dict[str, str]]:
    """The tensors and ``__metadata__`` strings that represent ``snapshot`` (checksums included)."""
    groups = snapshot.groups
    samples = [s for g in groups for s in g.samples]
    tensors: dict[str, np.ndarray | Chunks] = {}

    ids = [g.group_id.encode("utf-8") for g in groups]
    tensors["group.id_offsets"], tensors["group.id_bytes"] = _ragged_bytes(ids)
    data = [canonical_json(g.data, what="data").encode("utf-8") for g in groups]
    tensors["group.data_offsets"], tensors["group.data_bytes"] = _ragged_bytes(data)
    tensors["group.prompt_offsets"] = _offsets([len(g.prompt_token_ids) for g in groups])
    tensors["group.prompt_tokens"] = Chunks([g.prompt_token_ids for g in groups], np.int32)
    tensors["group.state"] = np.array([layout.GROUP_STATE_CODES[g.state] for g in groups], dtype=np.uint8)
    tensors["group.dispatch_version"] = np.array([g.dispatch_version for g in groups], dtype=np.int64)
    tensors["group.sample_offsets"] = _offsets([len(g.samples) for g in groups])

    tensors["sample.state"] = np.array([layout.SAMPLE_STATE_CODES[s.state] for s in samples], dtype=np.uint8)
    tensors["sample.token_offsets"] = _offsets([s.num_tokens for s in samples])
    tensors["sample.tokens"] = Chunks([s.token_ids for s in samples], np.int32)
    tensors["sample.logprobs"] = Chunks([s.logprobs for s in samples], np.float32)
    run_offsets, run_values, run_lengths = encode_runs([s.versions for s in samples])
    tensors["sample.version_run_offsets"] = run_offsets
    tensors["sample.version_run_values"] = run_values
    tensors["sample.version_run_lengths"] = run_lengths

    sampling: list[dict[str, Any]] = []
    sampling_codes: dict[tuple[Any, ...], int] = {}
    sampling_index = np.empty(len(samples), dtype=np.int32)
    for i, sample in enumerate(samples):
        key = sample.sampling.unseeded_key()
        if key not in sampling_codes:
            sampling_codes[key] = len(sampling)
            sampling.append({k: v for k, v in sample.sampling.to_json().items() if k != "seed"})
        sampling_index[i] = sampling_codes[key]
    seeds = [s.sampling.seed for s in samples]
    tensors["sample.sampling_index"] = sampling_index
    tensors["sample.seed"] = np.array([0 if seed is None else seed for seed in seeds], dtype=np.int64)
    tensors["sample.has_seed"] = np.array([seed is not None for seed in seeds], dtype=np.uint8)

    finish_reasons: list[str] = []
    stop_reasons: list[int | str] = []
    inexact_reasons: list[str] = []
    tensors["sample.finish_reason"] = _Interner(finish_reasons).codes([s.finish_reason for s in samples])
    tensors["sample.stop_reason"] = _Interner(stop_reasons).codes(
        [None if s.stop_reason is None else (type(s.stop_reason).__name__, s.stop_reason) for s in samples],
        values=[s.stop_reason for s in samples],
    )
    tensors["sample.inexact"] = _Interner(inexact_reasons).codes([s.inexact for s in samples])
    tensors["sample.reward"] = np.array([0.0 if s.reward is None else s.reward for s in samples], dtype=np.float64)
    tensors["sample.has_reward"] = np.array([s.reward is not None for s in samples], dtype=np.uint8)
    tensors["sample.sampler_state_offsets"], tensors["sample.sampler_state_bytes"] = _ragged_bytes(
        [s.sampler_state or b"" for s in samples]
    )

    loader_tree = None
    if snapshot.loader_state is not None:
        loader_tree, loader_tensors = state_codec.encode(snapshot.loader_state, prefix=layout.LOADER_PREFIX)
        tensors.update(loader_tensors)

    tables = {
        "sampling": sampling,
        "finish_reasons": finish_reasons,
        "stop_reasons": stop_reasons,
        "inexact_reasons": inexact_reasons,
    }
    metadata = {
        "format": FORMAT_NAME,
        "format_version": str(FORMAT_VERSION),
        "writer": _writer(),
        "fingerprints": _json(snapshot.fingerprints.to_json()),
        "trainer_step": _json(snapshot.trainer_step),
        "policy_version": _json(snapshot.policy_version),
        "counters": _json(snapshot.counters),
        "evicted_by_reason": _json(snapshot.evicted_by_reason),
        "metadata": _json(snapshot.metadata),
        "tables": _json(tables),
        "loader_state": _json(loader_tree),
    }
    metadata[CHECKSUMS_KEY] = _json(
        {
            "algorithm": ALGORITHM,
            "metadata": metadata_checksum(metadata),
            "tensors": {name: tensor_checksum(array) for name, array in sorted(tensors.items())},
        }
    )
    return tensors, metadata


class _Interner:
    """Assigns each distinct value a code: its index in ``table`` (appended on first sight)."""

    def __init__(self, table: list[Any]) -> None:
        self.table = table
        self.index: dict[Hashable, int] = {}

    def code(self, key: Hashable, value: Any) -> int:
        if key not in self.index:
            self.index[key] = len(self.table)
            self.table.append(value)
        return self.index[key]

    def codes(self, keys: Sequence[Hashable | None], values: Sequence[Any] | None = None) -> np.ndarray:
        """int32 codes of ``keys``, :data:`~layout.NO_CODE` for None."""
        values = keys if values is None else values
        codes = [
            layout.NO_CODE if key is None else self.code(key, value) for key, value in zip(keys, values, strict=True)
        ]
        return np.array(codes, dtype=np.int32)


def _offsets(lengths: Sequence[int]) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _ragged_bytes(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    return _offsets([len(b) for b in items]), np.frombuffer(b"".join(items), dtype=np.uint8)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _writer() -> str:
    try:
        return f"partial-rollout {importlib.metadata.version('partial-rollout')}"
    except importlib.metadata.PackageNotFoundError:
        return "partial-rollout"
