"""Read snapshot files: check everything, load lazily, never load damage silently.

Opening a :class:`SnapshotReader` reads the header, the metadata and the small *structural*
tensors (states, offsets, codes, version runs: a few bytes per sample) and checks them all, with
their checksums (the rules are in :mod:`~partial_rollout.snapshot.validate`). The *payload*
tensors (tokens, logprobs, prompts, group data, sampler states) are read only when asked: whole
and checksummed by :meth:`SnapshotReader.load` and :meth:`~SnapshotReader.verify`, streamed
through their checksums without being decoded by :meth:`~SnapshotReader.verify_checksums`, or
sliced for one group by :meth:`~SnapshotReader.group`. So the dump command summarises a
multi-gigabyte snapshot in constant memory.

Every problem raises :class:`~partial_rollout.errors.SnapshotError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import warnings
import zlib
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import container, layout, state_codec, validate
from partial_rollout.snapshot.checksum import tensor_checksum
from partial_rollout.snapshot.fingerprints import Fingerprints, check_match, sampler_change
from partial_rollout.snapshot.paths import find_snapshot
from partial_rollout.snapshot.runs import decode_runs
from partial_rollout.snapshot.schema import GroupRecord, SampleRecord, SampleState, Snapshot, check_group

_CHUNK = 16 << 20
"""Bytes per read when streaming a tensor through its checksum."""


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
            differently), each declared ``inexact`` with both versions named. Under the same
            version but another sampler family (``fingerprints.sampler``), the seeded in-flight
            samples are declared inexact, with one warning.

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
    if saved != now:
        reason = f"saved under vLLM {saved}, continued under vLLM {now}"
        warnings.warn(f"{reader.path}: in-flight samples continue inexactly: {reason}", stacklevel=2)
        return _inexact(snapshot, reason, seeded_only=False)
    family = sampler_change(snapshot.fingerprints, expect)
    if family is not None and any(
        s.state is SampleState.IN_FLIGHT and _seeded(s) for g in snapshot.groups for s in g.samples
    ):
        warnings.warn(f"{reader.path}: seeded in-flight samples continue inexactly: {family}", stacklevel=2)
        return _inexact(snapshot, family, seeded_only=True)
    return snapshot


def _seeded(sample: SampleRecord) -> bool:
    return sample.sampling.seed is not None and not sample.sampling.is_greedy


def _inexact(snapshot: Snapshot, reason: str, *, seeded_only: bool) -> Snapshot:
    """``snapshot`` with its in-flight samples (the seeded ones, or all) declared inexact, without sampler states."""
    groups = [
        dataclasses.replace(
            group,
            samples=[
                dataclasses.replace(s, sampler_state=None, inexact=s.inexact or reason)
                if s.state is SampleState.IN_FLIGHT and (_seeded(s) or not seeded_only)
                else s
                for s in group.samples
            ],
        )
        for group in snapshot.groups
    ]
    return dataclasses.replace(snapshot, groups=groups)


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
        meta = validate.check_header(header, path=self.path)
        self.format_version = meta.format_version
        self.writer = meta.writer
        self.fingerprints = meta.fingerprints
        self.trainer_step = meta.trainer_step
        self.policy_version = meta.policy_version
        self.counters = meta.counters
        self.evicted_by_reason = meta.evicted_by_reason
        self.metadata = meta.metadata
        self.tables = meta.tables
        self._sampling = meta.sampling
        self._loader_tree = meta.loader_tree
        self._checksums = meta.checksums
        try:
            self._file: Any = safe_open(self.path, framework="np")  # untyped: safetensors ships no stubs for it
        except (SafetensorError, OSError) as exc:
            raise self._error(f"safetensors cannot open it: {exc}", "header") from None
        self._full: dict[str, np.ndarray] = {}
        self._all_versions: np.ndarray | None = None
        self.arrays = {name: self.array(name) for name in layout.TENSORS if name not in layout.PAYLOAD_TENSORS}
        validate.check_structure(header, self.arrays, meta, path=self.path)
        self._group_index = validate.group_index(self.arrays, path=self.path)
        self.group_ids = list(self._group_index)

    def _error(self, what: str, field: str | None, fix: str | None = None) -> SnapshotError:
        return SnapshotError(what, path=self.path, field=field, fix=fix)

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
        """Raise unless they match ``expect`` (:func:`~partial_rollout.snapshot.fingerprints.check_match`)."""
        check_match(self.fingerprints, expect, allow_vllm_change=allow_vllm_change, path=self.path)

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
