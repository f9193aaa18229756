"""Read snapshot files: check everything, load lazily, never load damage silently.

Opening a :class:`SnapshotReader` reads the header, the metadata and the small *structural*
tensors (states, offsets, codes, version runs: a few bytes per sample) and checks them all, with
their checksums. The *payload* tensors (tokens, logprobs, prompts, group data, sampler states) are
read only when asked: whole and checksummed by :meth:`SnapshotReader.load` and
:meth:`~SnapshotReader.verify`, streamed through their checksums without being decoded by
:meth:`~SnapshotReader.verify_checksums`, or sliced for one group by :meth:`~SnapshotReader.group`.
So the dump command summarises a multi-gigabyte snapshot in constant memory.

Every problem raises :class:`~partial_rollout.errors.SnapshotError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import container, layout, state_codec
from partial_rollout.snapshot.checksum import ALGORITHM, CHECKSUMS_KEY, metadata_checksum, tensor_checksum
from partial_rollout.snapshot.runs import decode_runs, run_ends
from partial_rollout.snapshot.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INT32_MAX,
    SNAPSHOT_FILENAME,
    Fingerprints,
    GroupRecord,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    check_group,
)

_CHUNK = 16 << 20
"""Bytes per read when streaming a tensor through its checksum."""
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


def load_snapshot(
    path: str | os.PathLike[str],
    *,
    expect: Fingerprints | None = None,
    allow_vllm_change: bool = False,
) -> Snapshot:
    """Load and fully check the snapshot at ``path`` (a file, or a checkpoint folder holding one).

    Args:
        path: the snapshot file or its checkpoint folder.
        expect: the fingerprints of the run about to resume; when given, the snapshot's must
            match (model, tokenizer, vocab_size, vllm_version and every ``extra`` key).
        allow_vllm_change: accept a snapshot written under another vLLM version than ``expect``'s.
            Its samples then continue without their sampler states (another vLLM may draw
            differently), each declared ``inexact`` with both versions named.

    Raises:
        SnapshotError: the file is damaged, of another format or version, or its fingerprints
            differ from ``expect`` (the field is named, e.g. ``fingerprints.tokenizer``).
    """
    with SnapshotReader(path) as reader:
        if expect is None:
            return reader.load()
        reader.check_fingerprints(expect, allow_vllm_change=allow_vllm_change)
        snapshot = reader.load()
    saved, now = snapshot.fingerprints.vllm_version, expect.vllm_version
    if saved == now:
        return snapshot
    reason = f"saved under vLLM {saved}, continued under vLLM {now}"
    warnings.warn(f"{reader.path}: in-flight samples continue inexactly: {reason}", stacklevel=2)
    for group in snapshot.groups:
        group.samples = [
            s
            if s.state is not SampleState.IN_FLIGHT
            else dataclasses.replace(s, sampler_state=None, inexact=s.inexact or reason)
            for s in group.samples
        ]
    return snapshot


class SnapshotReader:
    """A snapshot file opened for lazy reading.

    Example::

        with SnapshotReader(ckpt_dir) as reader:
            print(reader.trainer_step, reader.num_samples)
            group = reader.group(reader.group_ids[0])  # reads only that group's tokens

    Attributes:
        path: the snapshot file.
        file_size: its size in bytes.
        format_version: the file's format version.
        writer: free text naming the program that wrote it.
        trainer_step, policy_version, fingerprints, counters, evicted_by_reason, metadata: as in
            :class:`~partial_rollout.snapshot.Snapshot`, parsed and checked on open.
        tables: the ``tables`` metadata (sampling parameters and reason strings by code).
        arrays: the structural tensors, loaded and checked on open (every tensor of
            :data:`~partial_rollout.snapshot.layout.TENSORS` except the payload ones).
        group_ids: every group's id, in file order.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = find_snapshot(path)
        header = container.read_header(self.path)
        self.file_size = header.file_size
        self._data_start = header.data_start
        self._entries = header.tensors
        metadata = header.metadata
        self.format_version = self._check_format(metadata)
        self._check_metadata_keys(metadata)
        self._checksums = self._parse_checksums(metadata)
        self._parse_metadata(metadata)
        self._check_tensor_entries()
        try:
            self._file: Any = safe_open(self.path, framework="np")  # untyped: safetensors ships no stubs for it
        except (SafetensorError, OSError) as exc:
            raise self._error(f"safetensors cannot open it: {exc}", "header") from None
        self._full: dict[str, np.ndarray] = {}
        self._all_versions: np.ndarray | None = None
        self.arrays = {name: self.array(name) for name in layout.TENSORS if name not in layout.PAYLOAD_TENSORS}
        self._check_structure()

    # -- opening ----------------------------------------------------------------------------

    def _error(self, what: str, field: str | None, fix: str | None = None) -> SnapshotError:
        return SnapshotError(what, path=self.path, field=field, fix=fix)

    def _check_format(self, metadata: dict[str, str]) -> int:
        name = metadata.get("format")
        if name is None:
            raise self._error(
                "no 'format' in __metadata__: this safetensors file is not a partial-rollout snapshot (model weights?)",
                "format",
            )
        if name != FORMAT_NAME:
            raise self._error(f"format is {name!r}, not {FORMAT_NAME!r}: not a partial-rollout snapshot", "format")
        text = metadata.get("format_version")
        if text is None or not text.isdigit() or not text.isascii():
            raise self._error(f"format_version must be a decimal integer, got {text!r}", "format_version")
        version = int(text)
        if version > FORMAT_VERSION:
            raise self._error(
                f"format_version {version} was written by a newer partial-rollout; this one reads {FORMAT_VERSION}",
                "format_version",
                fix="Upgrade partial-rollout to load it.",
            )
        if version != FORMAT_VERSION:
            raise self._error(f"unknown format_version {version}; this one reads {FORMAT_VERSION}", "format_version")
        return version

    def _check_metadata_keys(self, metadata: dict[str, str]) -> None:
        missing = [k for k in layout.METADATA_KEYS if k not in metadata]
        if missing:
            raise self._error(f"missing metadata keys {missing}", "__metadata__")
        unknown = sorted(set(metadata) - set(layout.METADATA_KEYS))
        if unknown:
            raise self._error(f"unknown metadata keys {unknown} (not in version {FORMAT_VERSION})", "__metadata__")

    def _parse_checksums(self, metadata: dict[str, str]) -> dict[str, str]:
        checksums = self._json(metadata, CHECKSUMS_KEY)
        if not isinstance(checksums, dict) or set(checksums) != {"algorithm", "metadata", "tensors"}:
            raise self._error("must be an object with algorithm, metadata and tensors", CHECKSUMS_KEY)
        if checksums["algorithm"] != ALGORITHM:
            raise self._error(f"algorithm is {checksums['algorithm']!r}, expected {ALGORITHM!r}", CHECKSUMS_KEY)
        computed = metadata_checksum(metadata)
        if checksums["metadata"] != computed:
            raise self._error(
                f"metadata checksum mismatch (stored {checksums['metadata']!r}, computed {computed!r}): damaged header",
                CHECKSUMS_KEY,
            )
        tensors = checksums["tensors"]
        if not isinstance(tensors, dict) or not all(isinstance(v, str) for v in tensors.values()):
            raise self._error("tensors must map tensor names to checksums", CHECKSUMS_KEY)
        if set(tensors) != set(self._entries):
            extra, missing = sorted(set(tensors) - set(self._entries)), sorted(set(self._entries) - set(tensors))
            what = f"checksums do not match the tensors (unknown: {extra}, missing: {missing})"
            raise self._error(what, CHECKSUMS_KEY)
        return tensors

    def _json(self, metadata: dict[str, str], key: str) -> Any:
        try:
            return container.loads_json(metadata[key])
        except ValueError as exc:
            raise self._error(f"not valid JSON: {exc}", key) from None

    def _parse_metadata(self, metadata: dict[str, str]) -> None:
        try:
            self.fingerprints = Fingerprints.from_json(self._json(metadata, "fingerprints"))
        except SnapshotError:
            raise
        except (TypeError, ValueError) as exc:
            raise self._error(str(exc), "fingerprints") from None
        self.writer = metadata["writer"]
        self.trainer_step = self._json_int(metadata, "trainer_step", maximum=2**63 - 1)
        self.policy_version = self._json_int(metadata, "policy_version", maximum=INT32_MAX)
        self.counters = self._json_counts(metadata, "counters")
        self.evicted_by_reason = self._json_counts(metadata, "evicted_by_reason")
        self.metadata = self._json(metadata, "metadata")
        if not isinstance(self.metadata, dict):
            raise self._error("must be a JSON object", "metadata")
        self._loader_tree = self._json(metadata, "loader_state")
        tables = self._json(metadata, "tables")
        if not isinstance(tables, dict) or set(tables) != set(layout.TABLE_KEYS):
            raise self._error(f"must be an object with exactly {list(layout.TABLE_KEYS)}", "tables")
        if not all(isinstance(tables[k], list) for k in layout.TABLE_KEYS):
            raise self._error("every table must be a JSON array", "tables")
        self._sampling = []
        for i, entry in enumerate(tables["sampling"]):
            try:
                if isinstance(entry, dict) and "seed" in entry:
                    raise ValueError("seeds are stored in sample.seed, not in the table")
                self._sampling.append(SamplingSpec.from_json(entry))
            except (TypeError, ValueError) as exc:
                raise self._error(str(exc), f"tables.sampling[{i}]") from None
        for key, ok in (
            ("finish_reasons", lambda v: isinstance(v, str) and v),
            ("stop_reasons", lambda v: isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))),
            ("inexact_reasons", lambda v: isinstance(v, str) and v),
        ):
            bad = [v for v in tables[key] if not ok(v)]
            if bad:
                raise self._error(f"invalid entry {bad[0]!r}", f"tables.{key}")
        self.tables = tables

    def _json_int(self, metadata: dict[str, str], key: str, *, maximum: int) -> int:
        value = self._json(metadata, key)
        if type(value) is not int or not 0 <= value <= maximum:
            raise self._error(f"must be an integer in 0..{maximum}, got {value!r}", key)
        return value

    def _json_counts(self, metadata: dict[str, str], key: str) -> dict[str, int]:
        value = self._json(metadata, key)
        if not isinstance(value, dict) or not all(type(v) is int and v >= 0 for v in value.values()):
            raise self._error("must be an object of non-negative integers", key)
        return value

    def _check_tensor_entries(self) -> None:
        for name, dtype in layout.TENSORS.items():
            entry = self._entries.get(name)
            if entry is None:
                fix = f"Every version-{FORMAT_VERSION} snapshot has it; the file is damaged or incomplete."
                raise self._error("tensor missing", name, fix=fix)
            if entry.dtype != np.dtype(dtype).name:
                raise self._error(f"dtype is {entry.dtype}, expected {np.dtype(dtype).name}", name)
            if len(entry.shape) != 1:
                raise self._error(f"must be one-dimensional, got shape {list(entry.shape)}", name)
        unknown = sorted(n for n in self._entries if n not in layout.TENSORS and not layout.LOADER_TENSOR.fullmatch(n))
        if unknown:
            raise self._error(f"unknown tensors {unknown} (version {FORMAT_VERSION} has no such tensors)", unknown[0])
        size = {name: entry.shape[0] for name, entry in self._entries.items() if name in layout.TENSORS}
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
                raise self._error(f"has {size[name]} entries, expected {length} to match the other tensors", name)

    def _check_structure(self) -> None:
        a = self.arrays
        # Only the fixed tensors, which _check_tensor_entries proved one-dimensional: loader.* tensors
        # may have any shape (0-d included) and are checked when the loader state is decoded.
        size = {name: self._entries[name].shape[0] for name in layout.TENSORS}
        self._check_offsets("group.id_offsets", size["group.id_bytes"], minimum_step=1)
        self._check_offsets("group.data_offsets", size["group.data_bytes"])
        self._check_offsets("group.prompt_offsets", size["group.prompt_tokens"], minimum_step=1)
        self._check_offsets("group.sample_offsets", size["sample.state"], minimum_step=1)
        self._check_offsets("sample.token_offsets", size["sample.tokens"])
        self._check_offsets("sample.version_run_offsets", size["sample.version_run_values"])
        self._check_offsets("sample.sampler_state_offsets", size["sample.sampler_state_bytes"])
        self._check_codes("group.state", 0, len(layout.GROUP_STATES) - 1)
        self._check_codes("sample.state", 0, len(layout.SAMPLE_STATES) - 1)
        self._check_codes("group.dispatch_version", -1, self.policy_version)
        self._check_codes("sample.has_seed", 0, 1)
        self._check_codes("sample.has_reward", 0, 1)
        self._check_codes("sample.sampling_index", 0, len(self._sampling) - 1)
        self._check_codes("sample.finish_reason", layout.NO_CODE, len(self.tables["finish_reasons"]) - 1)
        self._check_codes("sample.stop_reason", layout.NO_CODE, len(self.tables["stop_reasons"]) - 1)
        self._check_codes("sample.inexact", layout.NO_CODE, len(self.tables["inexact_reasons"]) - 1)
        self._check_codes("sample.version_run_lengths", 1, INT32_MAX)
        self._check_codes("sample.version_run_values", 0, self.policy_version)
        run_starts = run_ends(a["sample.version_run_lengths"])[a["sample.version_run_offsets"]]
        if not np.array_equal(run_starts, a["sample.token_offsets"]):
            raise self._error("the runs of some sample do not add up to its token count", "sample.version_run_lengths")
        id_bytes, offsets = a["group.id_bytes"].tobytes(), a["group.id_offsets"].tolist()
        try:
            self.group_ids = [id_bytes[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(len(offsets) - 1)]
        except UnicodeDecodeError as exc:
            raise self._error(f"a group id is not valid UTF-8: {exc}", "group.id_bytes") from None
        self._group_index = {gid: i for i, gid in enumerate(self.group_ids)}
        if len(self._group_index) != len(self.group_ids):
            duplicate = next(gid for i, gid in enumerate(self.group_ids) if self._group_index[gid] != i)
            raise self._error(f"group id {duplicate!r} appears twice", "group.id_bytes")

    def _check_offsets(self, name: str, total: int, *, minimum_step: int = 0) -> None:
        offsets = self.arrays[name]
        if offsets[0] != 0 or offsets[-1] != total:
            raise self._error(f"must run from 0 to {total}, got {offsets[0]}..{offsets[-1]}", name)
        steps = np.diff(offsets)
        if len(steps) and steps.min() < minimum_step:
            i = int(np.argmin(steps))
            what = "decrease" if steps[i] < 0 else "leave an item empty"
            raise self._error(f"offsets {what} at entry {i} ({offsets[i]} -> {offsets[i + 1]})", name)

    def _check_codes(self, name: str, low: int, high: int) -> None:
        values = self.arrays[name]
        if len(values) and (values.min() < low or values.max() > high):
            bad = values[(values < low) | (values > high)][0]
            raise self._error(f"value {bad} is outside {low}..{high}", name)

    # -- reading ----------------------------------------------------------------------------

    @property
    def num_groups(self) -> int:
        return self._entries["group.state"].shape[0]

    @property
    def num_samples(self) -> int:
        return self._entries["sample.state"].shape[0]

    @property
    def num_tokens(self) -> int:
        """Generated tokens stored (every sample's prefix)."""
        return self._entries["sample.tokens"].shape[0]

    @property
    def tensor_names(self) -> list[str]:
        return sorted(self._entries)

    def array(self, name: str) -> np.ndarray:
        """The whole tensor ``name``, read once and checked against its checksum."""
        if name not in self._full:
            if name not in self._entries:
                raise KeyError(name)
            array = self._read(name, None)
            self._check_checksum(name, tensor_checksum(array))
            self._full[name] = array
        return self._full[name]

    def verify_checksums(self) -> None:
        """Check every tensor's checksum, streaming the bytes not loaded yet through CRC-32.

        Memory stays constant (16 MB chunks straight from the file) and nothing is decoded, so this
        costs one sequential read of the file; the dump runs it before printing anything.

        Raises:
            SnapshotError: naming the first tensor whose bytes are damaged.
        """
        buffer = memoryview(bytearray(_CHUNK))  # reused: a fresh 16 MB per read would cost page faults
        with open(self.path, "rb", buffering=0) as f:
            for name, entry in sorted(self._entries.items(), key=lambda item: item[1].start):
                if name in self._full:
                    continue
                f.seek(self._data_start + entry.start)
                crc, left = 0, entry.end - entry.start
                while left:
                    n = f.readinto(buffer[: min(left, _CHUNK)])
                    if not n:
                        raise self._error("the file ends inside this tensor: it was truncated while open", name)
                    crc, left = zlib.crc32(buffer[:n], crc), left - n
                self._check_checksum(name, f"{crc:08x}")

    def _check_checksum(self, name: str, computed: str) -> None:
        if computed != self._checksums[name]:
            stored = self._checksums[name]
            raise self._error(f"checksum mismatch (stored {stored}, computed {computed}): its bytes are damaged", name)

    def _read(self, name: str, bounds: tuple[int, int] | None) -> np.ndarray:
        try:
            if bounds is None:
                return np.asarray(self._file.get_tensor(name))
            return np.asarray(self._file.get_slice(name)[bounds[0] : bounds[1]])
        except SafetensorError as exc:
            raise self._error(f"safetensors cannot read it: {exc}", name) from None

    def _payload(self, name: str, start: int, stop: int) -> np.ndarray:
        """Items ``start:stop`` of a payload tensor: from memory once loaded whole, else a slice."""
        if name in self._full:
            return self._full[name][start:stop]
        if start == stop:  # safetensors refuses an empty slice at the very end
            return np.empty(0, dtype=layout.TENSORS[name])
        return self._read(name, (start, stop))

    def check_fingerprints(self, expect: Fingerprints, *, allow_vllm_change: bool = False) -> None:
        """Raise unless the snapshot's fingerprints match ``expect`` (see :meth:`Fingerprints.mismatches`)."""
        mismatches = expect.mismatches(self.fingerprints)
        if mismatches == ["vllm_version"] and not allow_vllm_change:
            raise self._error(
                f"the snapshot was saved under vLLM {self.fingerprints.vllm_version!r} but this run has "
                f"{expect.vllm_version!r}",
                "fingerprints.vllm_version",
                fix=f"Resume with vLLM {self.fingerprints.vllm_version}, or allow the change "
                "(allow_vllm_change=True; in a trainer checkpointing.partial_rollouts.allow_vllm_change=true): "
                "its in-flight samples then continue inexactly",
            )
        mismatches = [m for m in mismatches if not (allow_vllm_change and m == "vllm_version")]
        if mismatches:
            name = mismatches[0]
            saved = _shown(_dotted(self.fingerprints, name))
            wanted = _shown(_dotted(expect, name))
            raise self._error(
                f"the snapshot was saved with {saved} but this run has {wanted}",
                f"fingerprints.{name}",
                fix=_FIXES.get(
                    name, "Resume with the model, tokenizer and vLLM version the snapshot was written with."
                ),
            )

    def group(self, group_id: str) -> GroupRecord:
        """One group, read from slices of the payload tensors and checked like :meth:`load` does.

        Only the structural tensors are checksummed here; :meth:`verify` checks the payload too.

        Raises:
            KeyError: no group has this id.
            SnapshotError: the group's data is invalid.
        """
        group = self._group(self._group_index[group_id])
        try:
            check_group(group, vocab_size=self.fingerprints.vocab_size, policy_version=self.policy_version)
        except ValueError as exc:
            raise self._error(str(exc), f"group {group_id!r}") from None
        return group

    def _group(self, g: int) -> GroupRecord:
        """Group ``g`` checked on its own (:func:`check_group` is left to the caller)."""
        c = self._columns
        group_id = self.group_ids[g]
        where = f"group {group_id!r}"
        try:
            raw = self._payload("group.data_bytes", c["group.data_offsets"][g], c["group.data_offsets"][g + 1])
            data = container.loads_json(raw.tobytes())
        except ValueError as exc:
            raise self._error(f"{where}: data is not valid UTF-8 JSON: {exc}", "group.data_bytes") from None
        first, last = c["group.sample_offsets"][g], c["group.sample_offsets"][g + 1]
        samples = [self._sample(group_id, s, s - first) for s in range(first, last)]
        prompt = self._payload("group.prompt_tokens", c["group.prompt_offsets"][g], c["group.prompt_offsets"][g + 1])
        try:
            group = GroupRecord(
                group_id=group_id,
                prompt_token_ids=prompt,
                data=data,
                state=layout.GROUP_STATES[c["group.state"][g]],
                dispatch_version=c["group.dispatch_version"][g],
                samples=samples,
            )
        except ValueError as exc:
            raise self._error(str(exc), where) from None
        return group

    def _sample(self, group_id: str, s: int, index: int) -> SampleRecord:
        c, tables = self._columns, self.tables
        start, stop = c["sample.token_offsets"][s], c["sample.token_offsets"][s + 1]
        run_start, run_stop = c["sample.version_run_offsets"][s], c["sample.version_run_offsets"][s + 1]
        state_start, state_stop = c["sample.sampler_state_offsets"][s], c["sample.sampler_state_offsets"][s + 1]
        sampling = self._sampling[c["sample.sampling_index"][s]]
        if c["sample.has_seed"][s]:
            sampling = sampling.with_seed(c["sample.seed"][s])
        finish, stop_reason, inexact = c["sample.finish_reason"][s], c["sample.stop_reason"][s], c["sample.inexact"][s]
        fields = dict(
            index=index,
            state=layout.SAMPLE_STATES[c["sample.state"][s]],
            sampling=sampling,
            token_ids=self._payload("sample.tokens", start, stop),
            logprobs=self._payload("sample.logprobs", start, stop),
            versions=self._versions(start, stop, run_start, run_stop),
            finish_reason=None if finish == layout.NO_CODE else tables["finish_reasons"][finish],
            stop_reason=None if stop_reason == layout.NO_CODE else tables["stop_reasons"][stop_reason],
            reward=c["sample.reward"][s] if c["sample.has_reward"][s] else None,
            sampler_state=self._payload("sample.sampler_state_bytes", state_start, state_stop).tobytes() or None,
            inexact=None if inexact == layout.NO_CODE else tables["inexact_reasons"][inexact],
        )
        try:
            return SampleRecord(**fields)
        except ValueError as exc:
            raise self._error(str(exc), f"sample {group_id}/{index}") from None

    def _versions(self, start: int, stop: int, run_start: int, run_stop: int) -> np.ndarray:
        """Tokens ``start:stop``'s versions: a view of all versions once :meth:`load` expanded them, else decoded."""
        if self._all_versions is not None:
            return self._all_versions[start:stop]
        runs = slice(run_start, run_stop)
        a = self.arrays
        return decode_runs(a["sample.version_run_values"][runs], a["sample.version_run_lengths"][runs])

    @functools.cached_property
    def _columns(self) -> dict[str, list[Any]]:
        """The structural tensors as Python lists: indexing a list is ten times cheaper than an array."""
        return {name: array.tolist() for name, array in self.arrays.items()}

    def load(self) -> Snapshot:
        """Read every tensor, check every checksum and rule, and return the :class:`Snapshot`."""
        for name in self._entries:
            self.array(name)
        a = self.arrays
        self._all_versions = decode_runs(a["sample.version_run_values"], a["sample.version_run_lengths"])
        # Building ~10 objects per sample would trigger the cyclic garbage collector over and over
        # (each pass scans every object built so far), which makes a large load several times slower.
        collecting = gc.isenabled()
        gc.disable()
        try:
            groups = [self._group(g) for g in range(self.num_groups)]
        finally:
            if collecting:
                gc.enable()
        loader_state = None
        if self._loader_tree is not None:
            loader_tensors = {n: self._full[n] for n in self._entries if n.startswith(layout.LOADER_PREFIX)}
            try:
                loader_state = state_codec.decode(self._loader_tree, loader_tensors)
            except ValueError as exc:
                raise self._error(str(exc), "loader_state") from None
        elif any(n.startswith(layout.LOADER_PREFIX) for n in self._entries):
            raise self._error("loader tensors are stored but loader_state is null", "loader_state")
        try:
            return Snapshot(
                trainer_step=self.trainer_step,
                policy_version=self.policy_version,
                fingerprints=self.fingerprints,
                groups=groups,
                loader_state=loader_state,
                counters=self.counters,
                evicted_by_reason=self.evicted_by_reason,
                metadata=self.metadata,
            )
        except ValueError as exc:
            raise self._error(str(exc), "snapshot") from None

    def verify(self) -> None:
        """The full integrity check of :meth:`load`, discarding the result.

        Raises:
            SnapshotError: what is damaged, naming the field.
        """
        self.load()

    def close(self) -> None:
        """Release the file (the memory map)."""
        self._full.clear()
        self._all_versions = None
        self._file = None

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_FIXES = {
    "logprobs_kind": "Resume with an engine of the saved kind (EngineConfig.logprobs_mode): a sample's prefix and "
    "continuation must report logprobs of the same distribution for its importance ratio",
    "sampler": "Resume on the kind of device the snapshot was written on: a sampler state of one generator kind "
    "cannot seed another",
    "sampler_state_bytes": "Resume with the torch build and device the snapshot was written with",
}
"""How to fix a mismatch of the fields that are about the engine, not the model."""


def _dotted(fingerprints: Fingerprints, name: str) -> str | int | None:
    if name.startswith("extra."):
        return fingerprints.extra.get(name.removeprefix("extra."))
    value: str | int | None = getattr(fingerprints, name)
    return value


def _shown(value: str | int | None) -> str:
    return "None (not recorded)" if value is None else repr(value)
