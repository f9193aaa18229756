"""Check a snapshot file's header and structural tensors against format version 1, before any payload is read.

:mod:`~partial_rollout.snapshot.layout` says what a version-1 file holds; these functions check that
a file holds exactly that, as functions over its parsed :class:`~partial_rollout.snapshot.container.Header`
and its structural arrays, so the reader's job is only to read. The order of the checks is part of
the contract: the format and version come first (a file of another kind or a newer version gets
that message, not a list of missing keys), then the metadata and its checksum, then the tensor
table, and only then the arrays' contents.

Every problem raises :class:`~partial_rollout.errors.SnapshotError` naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import container, layout
from partial_rollout.snapshot._checks import INT32_MAX, INT64_MAX
from partial_rollout.snapshot.checksum import ALGORITHM, CHECKSUMS_KEY, metadata_checksum
from partial_rollout.snapshot.container import Header
from partial_rollout.snapshot.fingerprints import Fingerprints
from partial_rollout.snapshot.layout import FORMAT_NAME, FORMAT_VERSION
from partial_rollout.snapshot.runs import run_ends
from partial_rollout.snapshot.sampling import SamplingSpec

_PER_SAMPLE = (
    "sample.sampling_index",
    "sample.seed",
    "sample.has_seed",
    "sample.finish_reason",
    "sample.stop_reason",
    "sample.inexact",
    "sample.reward",
    "sample.has_reward",
)
"""Tensors with one entry per sample besides ``sample.state``, which defines S."""
_GROUP_OFFSETS = ("group.id_offsets", "group.data_offsets", "group.prompt_offsets", "group.sample_offsets")
_SAMPLE_OFFSETS = ("sample.token_offsets", "sample.version_run_offsets", "sample.sampler_state_offsets")


@dataclass(frozen=True, kw_only=True, slots=True)
class Metadata:
    """A file's ``__metadata__``, parsed and checked (:func:`check_header`)."""

    format_version: int
    writer: str
    """Free text naming the program that wrote the file."""
    fingerprints: Fingerprints
    trainer_step: int
    policy_version: int
    counters: dict[str, int]
    evicted_by_reason: dict[str, int]
    metadata: dict[str, Any]
    """The trainer's JSON-native extras."""
    tables: dict[str, list[Any]]
    """The ``tables`` object: sampling parameters and reason strings, indexed by the ``sample.*`` codes."""
    sampling: list[SamplingSpec]
    """``tables.sampling`` parsed, seedless."""
    loader_tree: Any
    """The ``loader_state`` document (None, or the tree that names the ``loader.*`` tensors)."""
    checksums: dict[str, str]
    """Each tensor's stored checksum, by name."""


def check_header(header: Header, *, path: Path) -> Metadata:
    """Check the metadata and the tensor table of ``header``; returns the parsed metadata.

    Raises:
        SnapshotError: another format or version, a missing or unknown key, a metadata checksum
            mismatch, an invalid value, or a tensor missing, unknown, of another dtype or length.
    """
    metadata = header.metadata
    version = _check_format(metadata, path)
    _check_metadata_keys(metadata, path)
    checksums = _parse_checksums(metadata, header.tensors, path)
    parsed = _parse_metadata(metadata, version=version, checksums=checksums, path=path)
    _check_tensor_entries(header.tensors, path)
    return parsed


def check_structure(header: Header, arrays: Mapping[str, np.ndarray], meta: Metadata, *, path: Path) -> None:
    """Check the structural ``arrays`` (offsets, states, codes, version runs) against each other and ``meta``.

    Args:
        header: the file's header, already checked by :func:`check_header` (it gives the payload
            tensors' lengths, which ``arrays`` lacks).
        arrays: every tensor of :data:`~partial_rollout.snapshot.layout.TENSORS` except the payload ones.
        meta: the file's checked metadata.
        path: the file, named in errors.

    Raises:
        SnapshotError: offsets that do not bound their tensor, a code outside its table, or
            version runs that do not add up to a sample's tokens.
    """
    # Only the fixed tensors, which check_header proved one-dimensional: loader.* tensors may have
    # any shape (0-d included) and are checked when the loader state is decoded.
    size = {name: header.tensors[name].shape[0] for name in layout.TENSORS}
    offsets = (
        ("group.id_offsets", "group.id_bytes", 1),
        ("group.data_offsets", "group.data_bytes", 0),
        ("group.prompt_offsets", "group.prompt_tokens", 1),
        ("group.sample_offsets", "sample.state", 1),
        ("sample.token_offsets", "sample.tokens", 0),
        ("sample.version_run_offsets", "sample.version_run_values", 0),
        ("sample.sampler_state_offsets", "sample.sampler_state_bytes", 0),
    )
    for name, bounded, minimum_step in offsets:
        _check_offsets(arrays, name, size[bounded], minimum_step=minimum_step, path=path)
    codes = (
        ("group.state", 0, len(layout.GROUP_STATES) - 1),
        ("sample.state", 0, len(layout.SAMPLE_STATES) - 1),
        ("group.dispatch_version", -1, meta.policy_version),
        ("sample.has_seed", 0, 1),
        ("sample.has_reward", 0, 1),
        ("sample.sampling_index", 0, len(meta.sampling) - 1),
        ("sample.finish_reason", layout.NO_CODE, len(meta.tables["finish_reasons"]) - 1),
        ("sample.stop_reason", layout.NO_CODE, len(meta.tables["stop_reasons"]) - 1),
        ("sample.inexact", layout.NO_CODE, len(meta.tables["inexact_reasons"]) - 1),
        ("sample.version_run_lengths", 1, INT32_MAX),
        ("sample.version_run_values", 0, meta.policy_version),
    )
    for name, low, high in codes:
        _check_codes(arrays, name, low, high, path=path)
    run_starts = run_ends(arrays["sample.version_run_lengths"])[arrays["sample.version_run_offsets"]]
    if not np.array_equal(run_starts, arrays["sample.token_offsets"]):
        what = "the runs of some sample do not add up to its token count"
        raise SnapshotError(what, path=path, field="sample.version_run_lengths")


def group_index(arrays: Mapping[str, np.ndarray], *, path: Path) -> dict[str, int]:
    """Each group's id to its position, in file order (checked: valid UTF-8, no id twice).

    Raises:
        SnapshotError: a group id is not valid UTF-8, or appears twice.
    """
    id_bytes, offsets = arrays["group.id_bytes"].tobytes(), arrays["group.id_offsets"].tolist()
    try:
        group_ids = [id_bytes[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(len(offsets) - 1)]
    except UnicodeDecodeError as exc:
        raise SnapshotError(f"a group id is not valid UTF-8: {exc}", path=path, field="group.id_bytes") from None
    index = {gid: i for i, gid in enumerate(group_ids)}
    if len(index) != len(group_ids):
        duplicate = next(gid for i, gid in enumerate(group_ids) if index[gid] != i)
        raise SnapshotError(f"group id {duplicate!r} appears twice", path=path, field="group.id_bytes")
    return index


def _check_format(metadata: dict[str, str], path: Path) -> int:
    name = metadata.get("format")
    if name is None:
        raise SnapshotError(
            "no 'format' in __metadata__: this safetensors file is not a partial-rollout snapshot (model weights?)",
            path=path,
            field="format",
        )
    if name != FORMAT_NAME:
        what = f"format is {name!r}, not {FORMAT_NAME!r}: not a partial-rollout snapshot"
        raise SnapshotError(what, path=path, field="format")
    text = metadata.get("format_version")
    if text is None or not text.isdigit() or not text.isascii():
        what = f"format_version must be a decimal integer, got {text!r}"
        raise SnapshotError(what, path=path, field="format_version")
    version = int(text)
    if version > FORMAT_VERSION:
        raise SnapshotError(
            f"format_version {version} was written by a newer partial-rollout; this one reads {FORMAT_VERSION}",
            path=path,
            field="format_version",
            fix="Upgrade partial-rollout to load it.",
        )
    if version != FORMAT_VERSION:
        what = f"unknown format_version {version}; this one reads {FORMAT_VERSION}"
        raise SnapshotError(what, path=path, field="format_version")
    return version


def _check_metadata_keys(metadata: dict[str, str], path: Path) -> None:
    missing = [k for k in layout.METADATA_KEYS if k not in metadata]
    if missing:
        raise SnapshotError(f"missing metadata keys {missing}", path=path, field="__metadata__")
    unknown = sorted(set(metadata) - set(layout.METADATA_KEYS))
    if unknown:
        what = f"unknown metadata keys {unknown} (not in version {FORMAT_VERSION})"
        raise SnapshotError(what, path=path, field="__metadata__")


def _parse_checksums(
    metadata: dict[str, str], entries: Mapping[str, container.TensorEntry], path: Path
) -> dict[str, str]:
    checksums = _json(metadata, CHECKSUMS_KEY, path)
    if not isinstance(checksums, dict) or set(checksums) != {"algorithm", "metadata", "tensors"}:
        raise SnapshotError("must be an object with algorithm, metadata and tensors", path=path, field=CHECKSUMS_KEY)
    if checksums["algorithm"] != ALGORITHM:
        what = f"algorithm is {checksums['algorithm']!r}, expected {ALGORITHM!r}"
        raise SnapshotError(what, path=path, field=CHECKSUMS_KEY)
    computed = metadata_checksum(metadata)
    if checksums["metadata"] != computed:
        what = f"metadata checksum mismatch (stored {checksums['metadata']!r}, computed {computed!r}): damaged header"
        raise SnapshotError(what, path=path, field=CHECKSUMS_KEY)
    tensors = checksums["tensors"]
    if not isinstance(tensors, dict) or not all(isinstance(v, str) for v in tensors.values()):
        raise SnapshotError("tensors must map tensor names to checksums", path=path, field=CHECKSUMS_KEY)
    if set(tensors) != set(entries):
        extra, missing = sorted(set(tensors) - set(entries)), sorted(set(entries) - set(tensors))
        what = f"checksums do not match the tensors (unknown: {extra}, missing: {missing})"
        raise SnapshotError(what, path=path, field=CHECKSUMS_KEY)
    return tensors


def _parse_metadata(metadata: dict[str, str], *, version: int, checksums: dict[str, str], path: Path) -> Metadata:
    try:
        fingerprints = Fingerprints.from_json(_json(metadata, "fingerprints", path))
    except SnapshotError:
        raise
    except (TypeError, ValueError) as exc:
        raise SnapshotError(str(exc), path=path, field="fingerprints") from None
    writer = metadata["writer"]
    trainer_step = _json_int(metadata, "trainer_step", maximum=INT64_MAX, path=path)
    policy_version = _json_int(metadata, "policy_version", maximum=INT32_MAX, path=path)
    counters = _json_counts(metadata, "counters", path)
    evicted_by_reason = _json_counts(metadata, "evicted_by_reason", path)
    extras = _json(metadata, "metadata", path)
    if not isinstance(extras, dict):
        raise SnapshotError("must be a JSON object", path=path, field="metadata")
    loader_tree = _json(metadata, "loader_state", path)
    tables = _json(metadata, "tables", path)
    if not isinstance(tables, dict) or set(tables) != set(layout.TABLE_KEYS):
        raise SnapshotError(f"must be an object with exactly {list(layout.TABLE_KEYS)}", path=path, field="tables")
    if not all(isinstance(tables[k], list) for k in layout.TABLE_KEYS):
        raise SnapshotError("every table must be a JSON array", path=path, field="tables")
    sampling = []
    for i, entry in enumerate(tables["sampling"]):
        try:
            if isinstance(entry, dict) and "seed" in entry:
                raise ValueError("seeds are stored in sample.seed, not in the table")
            sampling.append(SamplingSpec.from_json(entry))
        except (TypeError, ValueError) as exc:
            raise SnapshotError(str(exc), path=path, field=f"tables.sampling[{i}]") from None
    for key, ok in (
        ("finish_reasons", lambda v: isinstance(v, str) and v),
        ("stop_reasons", lambda v: isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))),
        ("inexact_reasons", lambda v: isinstance(v, str) and v),
    ):
        bad = [v for v in tables[key] if not ok(v)]
        if bad:
            raise SnapshotError(f"invalid entry {bad[0]!r}", path=path, field=f"tables.{key}")
    return Metadata(
        format_version=version,
        writer=writer,
        fingerprints=fingerprints,
        trainer_step=trainer_step,
        policy_version=policy_version,
        counters=counters,
        evicted_by_reason=evicted_by_reason,
        metadata=extras,
        tables=tables,
        sampling=sampling,
        loader_tree=loader_tree,
        checksums=checksums,
    )


def _check_tensor_entries(entries: Mapping[str, container.TensorEntry], path: Path) -> None:
    for name, dtype in layout.TENSORS.items():
        entry = entries.get(name)
        if entry is None:
            fix = f"Every version-{FORMAT_VERSION} snapshot has it; the file is damaged or incomplete."
            raise SnapshotError("tensor missing", path=path, field=name, fix=fix)
        if entry.dtype != np.dtype(dtype).name:
            raise SnapshotError(f"dtype is {entry.dtype}, expected {np.dtype(dtype).name}", path=path, field=name)
        if len(entry.shape) != 1:
            raise SnapshotError(f"must be one-dimensional, got shape {list(entry.shape)}", path=path, field=name)
    unknown = sorted(n for n in entries if n not in layout.TENSORS and not layout.LOADER_TENSOR.fullmatch(n))
    if unknown:
        what = f"unknown tensors {unknown} (version {FORMAT_VERSION} has no such tensors)"
        raise SnapshotError(what, path=path, field=unknown[0])
    size = {name: entry.shape[0] for name, entry in entries.items() if name in layout.TENSORS}
    groups, samples = size["group.state"], size["sample.state"]
    expected = {
        "group.dispatch_version": groups,
        "sample.logprobs": size["sample.tokens"],
        "sample.version_run_lengths": size["sample.version_run_values"],
    }
    expected.update((name, groups + 1) for name in _GROUP_OFFSETS)
    expected.update((name, samples + 1) for name in _SAMPLE_OFFSETS)
    expected.update((name, samples) for name in _PER_SAMPLE)
    for name, length in expected.items():
        if size[name] != length:
            what = f"has {size[name]} entries, expected {length} to match the other tensors"
            raise SnapshotError(what, path=path, field=name)


def _check_offsets(arrays: Mapping[str, np.ndarray], name: str, total: int, *, minimum_step: int, path: Path) -> None:
    offsets = arrays[name]
    if offsets[0] != 0 or offsets[-1] != total:
        raise SnapshotError(f"must run from 0 to {total}, got {offsets[0]}..{offsets[-1]}", path=path, field=name)
    steps = np.diff(offsets)
    if len(steps) and steps.min() < minimum_step:
        i = int(np.argmin(steps))
        what = "decrease" if steps[i] < 0 else "leave an item empty"
        raise SnapshotError(f"offsets {what} at entry {i} ({offsets[i]} -> {offsets[i + 1]})", path=path, field=name)


def _check_codes(arrays: Mapping[str, np.ndarray], name: str, low: int, high: int, *, path: Path) -> None:
    values = arrays[name]
    if len(values) and (values.min() < low or values.max() > high):
        bad = values[(values < low) | (values > high)][0]
        raise SnapshotError(f"value {bad} is outside {low}..{high}", path=path, field=name)


def _json(metadata: dict[str, str], key: str, path: Path) -> Any:
    try:
        return container.loads_json(metadata[key])
    except ValueError as exc:
        raise SnapshotError(f"not valid JSON: {exc}", path=path, field=key) from None


def _json_int(metadata: dict[str, str], key: str, *, maximum: int, path: Path) -> int:
    value = _json(metadata, key, path)
    if type(value) is not int or not 0 <= value <= maximum:
        raise SnapshotError(f"must be an integer in 0..{maximum}, got {value!r}", path=path, field=key)
    return value


def _json_counts(metadata: dict[str, str], key: str, path: Path) -> dict[str, int]:
    value = _json(metadata, key, path)
    if not isinstance(value, dict) or not all(type(v) is int and v >= 0 for v in value.values()):
        raise SnapshotError("must be an object of non-negative integers", path=path, field=key)
    return value
