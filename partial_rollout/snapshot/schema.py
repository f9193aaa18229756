"""The in-memory model of a snapshot: what a trainer needs to lose nothing at resume.

A :class:`Snapshot` is one consistent cut taken at a checkpoint. It holds prompt *groups* (one
prompt x n samples, GRPO-style), the *samples* of each group with the tokens generated so far, the
data loader's cursor, fingerprints that guard the resume, and accounting counters.

These classes are frozen values: the engine adapter builds them from live requests, the ledger
builds them from its own mutable entries when it saves, and the file format
(:mod:`partial_rollout.snapshot.writer` / :mod:`~partial_rollout.snapshot.reader`) stores them. Every
class validates itself on construction, and only there, and raises :class:`ValueError` naming the
field, so a bug in the code that builds a snapshot is caught where it builds it, before anything is
written. Being frozen, a record is valid for as long as it exists and can be shared (by a cut, a
resume, another thread) without a copy; a changed record is a new one (``dataclasses.replace``,
which validates it again). Copies and unpickled records are built through the constructor too
(``__reduce__``), so a record from a Ray actor is checked as it arrives. A sample's parameters are a
:class:`~partial_rollout.snapshot.sampling.SamplingSpec`, the snapshot's identities
:class:`~partial_rollout.snapshot.fingerprints.Fingerprints`; each has its own module.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from partial_rollout.snapshot import state_codec
from partial_rollout.snapshot._checks import (
    INT32_MAX,
    INT64_MAX,
    canonical_json,
    check_array,
    check_counts,
    check_float,
    check_int,
    check_text,
    values_equal,
)
from partial_rollout.snapshot.fingerprints import Fingerprints
from partial_rollout.snapshot.sampling import SamplingSpec


class GroupState(enum.StrEnum):
    """Where a prompt group is in its life."""

    PENDING = "pending"
    """Yielded by the data loader but not dispatched to an engine yet."""
    IN_FLIGHT = "in_flight"
    """Dispatched; at least one sample may still be generating or waiting for its reward."""
    READY = "ready"
    """Every sample finished: the group waits in the buffer to be trained on."""


class SampleState(enum.StrEnum):
    """Where one sample (one completion of a prompt) is in its life."""

    NOT_STARTED = "not_started"
    """No token generated yet (its group is pending, or the engine has not scheduled it)."""
    IN_FLIGHT = "in_flight"
    """Generation started and did not finish: the tokens so far are a prefix to continue."""
    FINISHED = "finished"
    """Generation ended (``finish_reason`` says why)."""


@dataclass(kw_only=True, slots=True, frozen=True, eq=False)
class SampleRecord:
    """One completion of a group's prompt: the tokens generated so far and how to continue them.

    ``token_ids``, ``logprobs`` and ``versions`` are parallel: entry ``i`` is the ``i``-th generated
    token, the log-probability the behaviour policy gave it, and the policy version that sampled it.
    Lists are accepted and converted to arrays of the stored dtypes.
    """

    index: int
    """Position of this sample within its group (0..n-1)."""
    state: SampleState
    """Not started, in flight, or finished."""
    sampling: SamplingSpec
    """Sampling parameters of the whole completion (the seed among them)."""
    token_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    """int32 [K]: the generated tokens so far (the prefix to continue from)."""
    logprobs: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    """float32 [K]: behaviour log-probability of each sampled token (finite, <= 0)."""
    versions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    """int32 [K]: policy version that produced each token (changes when weights update mid-flight)."""
    finish_reason: str | None = None
    """Why generation ended (``"stop"``, ``"length"``, ``"abort"``, ...); set exactly when finished."""
    stop_reason: int | str | None = None
    """The stop string or token id that ended it, when that is how it ended (vLLM ``stop_reason``)."""
    reward: float | None = None
    """The score, once the finished sample has been rewarded."""
    sampler_state: bytes | None = None
    """Opaque sampler (RNG) state for an exact continuation, e.g. a torch generator's state."""
    inexact: str | None = None
    """Why a continuation cannot reproduce an uninterrupted run, when it cannot."""

    def __post_init__(self) -> None:
        """Check every field and convert lists to arrays of the stored dtypes.

        Raises:
            ValueError: naming the field and the offending value.
        """
        set_ = object.__setattr__  # frozen: normalise in place once
        set_(self, "index", check_int("index", self.index, minimum=0))
        set_(self, "state", SampleState(self.state))
        if not isinstance(self.sampling, SamplingSpec):
            raise ValueError(f"sampling must be a SamplingSpec, got {type(self.sampling).__name__}")
        set_(self, "token_ids", check_array("token_ids", self.token_ids, np.int32))
        set_(self, "logprobs", check_array("logprobs", self.logprobs, np.float32))
        set_(self, "versions", check_array("versions", self.versions, np.int32))
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"token_ids, logprobs and versions must have equal lengths, got {n}, {len(self.logprobs)},"
                f" {len(self.versions)}"
            )
        if n > self.sampling.max_tokens:
            raise ValueError(f"{n} tokens exceed sampling.max_tokens {self.sampling.max_tokens}")
        if n:
            if self.token_ids.min() < 0:
                raise ValueError(f"token_ids must be >= 0, got {self.token_ids.min()}")
            if not (math.isfinite(self.logprobs.min()) and self.logprobs.max() <= 0):  # NaN fails both
                i = int(np.flatnonzero(~(np.isfinite(self.logprobs) & (self.logprobs <= 0)))[0])
                raise ValueError(f"logprobs must be finite and <= 0, got {self.logprobs[i]} at position {i}")
            if self.versions.min() < 0:
                raise ValueError(f"versions must be >= 0, got {self.versions.min()}")
        if self.finish_reason is not None:
            set_(self, "finish_reason", check_text("finish_reason", self.finish_reason))
        if isinstance(self.stop_reason, str):
            check_text("stop_reason", self.stop_reason)
        elif self.stop_reason is not None:
            set_(self, "stop_reason", check_int("stop_reason", self.stop_reason))
        if self.reward is not None:
            set_(self, "reward", check_float("reward", self.reward))
        if self.sampler_state is not None:
            if not isinstance(self.sampler_state, (bytes, bytearray, memoryview)):
                raise ValueError(f"sampler_state must be bytes or None, got {type(self.sampler_state).__name__}")
            set_(self, "sampler_state", bytes(self.sampler_state))
            if not self.sampler_state:
                raise ValueError("sampler_state must not be empty; use None when there is none")
        if self.inexact is not None:
            set_(self, "inexact", check_text("inexact", self.inexact))
            if not self.inexact:
                raise ValueError("inexact must be a non-empty reason or None")
        self._check_state()

    def _check_state(self) -> None:
        if self.state is SampleState.FINISHED:
            if not self.finish_reason:
                raise ValueError("a finished sample needs a finish_reason")
            return
        for name in ("finish_reason", "stop_reason", "reward"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} must be None while the sample is {self.state.value}")
        if self.state is SampleState.NOT_STARTED and len(self.token_ids):
            raise ValueError(f"a not_started sample has no tokens, got {len(self.token_ids)}")

    @property
    def num_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids)

    @property
    def remaining_tokens(self) -> int:
        """What is left of the budget: ``sampling.max_tokens`` minus the prefix."""
        return self.sampling.max_tokens - len(self.token_ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleRecord):
            return NotImplemented
        return all(values_equal(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return _construct, (type(self), _field_values(self))


@dataclass(kw_only=True, slots=True, frozen=True, eq=False)
class GroupRecord:
    """One prompt and its n samples (GRPO's unit of training)."""

    group_id: str
    """Stable id, unique within a snapshot (a resume uses it to match the loader's bookkeeping)."""
    prompt_token_ids: np.ndarray
    """int32 [P]: the prompt, stored once for all samples."""
    data: dict[str, Any] = field(default_factory=dict)
    """JSON-native payload needed to re-dispatch and score the prompt (task name, ground truth, ...)."""
    state: GroupState
    """Pending, in flight, or ready."""
    dispatch_version: int = -1
    """Policy version when the group was dispatched; -1 while pending."""
    samples: Sequence[SampleRecord]
    """The samples, in index order (stored as a tuple)."""

    def __post_init__(self) -> None:
        """Check every field, and the samples' states against the group's.

        Raises:
            ValueError: naming the field and the offending value.
        """
        set_ = object.__setattr__  # frozen: normalise in place once
        set_(self, "group_id", check_text("group_id", self.group_id))
        if not self.group_id:
            raise ValueError("group_id must not be empty")
        set_(self, "prompt_token_ids", check_array("prompt_token_ids", self.prompt_token_ids, np.int32))
        if not len(self.prompt_token_ids):
            raise ValueError("prompt_token_ids must not be empty (engines refuse empty prompts)")
        if self.prompt_token_ids.min() < 0:
            raise ValueError(f"prompt_token_ids must be >= 0, got {self.prompt_token_ids.min()}")
        if not isinstance(self.data, dict):
            raise ValueError(f"data must be a dict, got {type(self.data).__name__}")
        canonical_json(self.data, what="data")
        set_(self, "state", GroupState(self.state))
        set_(
            self,
            "dispatch_version",
            check_int("dispatch_version", self.dispatch_version, minimum=-1, maximum=INT64_MAX),
        )
        set_(self, "samples", tuple(self.samples))
        if not self.samples:
            raise ValueError("a group needs at least one sample (they carry the sampling parameters)")
        for position, sample in enumerate(self.samples):
            if not isinstance(sample, SampleRecord):
                raise ValueError(f"samples[{position}] must be a SampleRecord, got {type(sample).__name__}")
            if sample.index != position:
                raise ValueError(f"samples[{position}] has index {sample.index}; samples must be in index order 0..n-1")
        if self.state is GroupState.PENDING:
            if self.dispatch_version != -1:
                raise ValueError(f"a pending group has dispatch_version -1, got {self.dispatch_version}")
            if any(s.state is not SampleState.NOT_STARTED for s in self.samples):
                raise ValueError("every sample of a pending group must be not_started")
        elif self.dispatch_version < 0:
            raise ValueError(f"a dispatched ({self.state.value}) group needs dispatch_version >= 0")
        if self.state is GroupState.READY and any(s.state is not SampleState.FINISHED for s in self.samples):
            raise ValueError("every sample of a ready group must be finished")

    @property
    def is_partial(self) -> bool:
        """True when some samples finished and some did not (a resume continues only the others)."""
        finished = sum(s.state is SampleState.FINISHED for s in self.samples)
        return 0 < finished < len(self.samples)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroupRecord):
            return NotImplemented
        return all(values_equal(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return _construct, (type(self), _field_values(self))


@dataclass(kw_only=True, slots=True, frozen=True, eq=False)
class Snapshot:
    """Everything a trainer needs to resume without losing a prompt or a generated token."""

    trainer_step: int
    """Training step of the checkpoint this snapshot belongs to."""
    policy_version: int
    """Policy version at save time; no token was generated by a newer one."""
    fingerprints: Fingerprints
    """Identities a resume must match."""
    groups: Sequence[GroupRecord] = ()
    """Every prompt group the trainer had handed out and not consumed (stored as a tuple)."""
    loader_state: dict[str, Any] | None = None
    """The data loader's cursor, e.g. ``StatefulDataLoader.state_dict()`` (tensors allowed, no pickle)."""
    counters: dict[str, int] = field(default_factory=dict)
    """Accounting, e.g. prompts ``yielded``, ``consumed`` by training, ``evicted``."""
    evicted_by_reason: dict[str, int] = field(default_factory=dict)
    """Prompts evicted on purpose, by reason (e.g. ``too_stale``)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """JSON-native extras of the trainer (run name, config hash, ...)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place once
        set_(self, "trainer_step", check_int("trainer_step", self.trainer_step, minimum=0, maximum=INT64_MAX))
        set_(self, "policy_version", check_int("policy_version", self.policy_version, minimum=0, maximum=INT32_MAX))
        if not isinstance(self.fingerprints, Fingerprints):
            raise ValueError(f"fingerprints must be a Fingerprints, got {type(self.fingerprints).__name__}")
        set_(self, "groups", tuple(self.groups))
        seen: set[str] = set()
        for position, group in enumerate(self.groups):
            if not isinstance(group, GroupRecord):
                raise ValueError(f"groups[{position}] must be a GroupRecord, got {type(group).__name__}")
            if group.group_id in seen:
                raise ValueError(f"group_id {group.group_id!r} appears twice; group ids must be unique")
            seen.add(group.group_id)
            check_group(group, vocab_size=self.fingerprints.vocab_size, policy_version=self.policy_version)
        if self.loader_state is not None:
            if not isinstance(self.loader_state, dict):
                raise ValueError(f"loader_state must be a dict or None, got {type(self.loader_state).__name__}")
            state_codec.encode(self.loader_state)
        set_(self, "counters", check_counts("counters", self.counters))
        set_(self, "evicted_by_reason", check_counts("evicted_by_reason", self.evicted_by_reason))
        if not isinstance(self.metadata, dict):
            raise ValueError(f"metadata must be a dict, got {type(self.metadata).__name__}")
        canonical_json(self.metadata, what="metadata")

    def iter_groups(self, *states: GroupState) -> Iterator[GroupRecord]:
        """The groups in any of ``states`` (all groups when none is given)."""
        return (g for g in self.groups if not states or g.state in states)

    def iter_samples(self, *states: SampleState) -> Iterator[tuple[GroupRecord, SampleRecord]]:
        """``(group, sample)`` for the samples in any of ``states`` (all when none is given).

        ``snapshot.iter_samples(SampleState.IN_FLIGHT)`` is what a resume re-submits.
        """
        return ((g, s) for g in self.groups for s in g.samples if not states or s.state in states)

    def counts(self) -> dict[str, int]:
        """Groups per state, samples per state, partial groups and tokens, for logs and the dump."""
        out = {f"groups_{state.value}": 0 for state in GroupState}
        out.update({f"samples_{state.value}": 0 for state in SampleState})
        out.update(groups_partial=0, tokens=0, tokens_in_flight=0)
        for group in self.groups:
            out[f"groups_{group.state.value}"] += 1
            out["groups_partial"] += group.is_partial
            for sample in group.samples:
                out[f"samples_{sample.state.value}"] += 1
                out["tokens"] += sample.num_tokens
                if sample.state is SampleState.IN_FLIGHT:
                    out["tokens_in_flight"] += sample.num_tokens
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshot):
            return NotImplemented
        return all(
            state_codec.states_equal(getattr(self, f.name), getattr(other, f.name))
            if f.name == "loader_state"
            else values_equal(getattr(self, f.name), getattr(other, f.name))
            for f in dataclasses.fields(self)
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return _construct, (type(self), _field_values(self))


def check_group(group: GroupRecord, *, vocab_size: int, policy_version: int) -> None:
    """Check what a group cannot check alone: token ids against the vocabulary, versions against the policy.

    Raises:
        ValueError: naming the group, the sample and the offending value.
    """
    where = f"group {group.group_id!r}"
    vocab = f"fingerprints.vocab_size {vocab_size}"
    if group.prompt_token_ids.max() >= vocab_size:
        raise ValueError(f"{where}: prompt token id {group.prompt_token_ids.max()} >= {vocab}")
    if group.dispatch_version > policy_version:
        raise ValueError(f"{where}: dispatch_version {group.dispatch_version} > policy_version {policy_version}")
    for sample in group.samples:
        if not sample.num_tokens:
            continue
        if sample.token_ids.max() >= vocab_size:
            raise ValueError(f"{where} sample {sample.index}: token id {sample.token_ids.max()} >= {vocab}")
        if sample.versions.max() > policy_version:
            version = sample.versions.max()
            raise ValueError(f"{where} sample {sample.index}: version {version} > policy_version {policy_version}")


def _field_values(record: Any) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _construct(cls: type[Any], fields: dict[str, Any]) -> Any:
    """Rebuild a pickled or copied record through its constructor, so it is checked like any other."""
    return cls(**fields)
