"""The work ledger: every prompt group from the moment the loader yields it until it is gone on purpose.

A group leaves the ledger only when training *consumes* it or a sampler *evicts* it for a stated
reason; anything else that makes it disappear is a loss, and the event log shows it. The ledger is
trainer-agnostic: the trainer names groups with stable ids (e.g. ``e0:17`` for dataset index 17 of
epoch 0), reports each transition, and the ledger keeps the :class:`GroupRecord` of every
outstanding group, writes one event per transition to ``events.jsonl``, and cuts the
:class:`~partial_rollout.snapshot.Snapshot` from those records at a checkpoint.

Life of a group and the events it produces::

    yield ──> dispatch ──> finish (one per sample) ──> ready ──> consume | evict(reason)
      │           └─ regenerate (prefixes discarded, back to pending)
      └─ evict(reason) (e.g. dropped at resume by the on_stale policy)

Plus run-level events: ``start`` (a fresh run), ``save`` (a checkpoint's cut, with a ``save_id``),
``resume`` (naming the ``save_id`` it resumed from), ``end`` (with the groups still outstanding),
and trainer metrics (``log``). :func:`partial_rollout.ledger.audit.audit` turns them into lost and
duplicated counts.

The checkpointing side follows the ``Stateful`` protocol (:meth:`WorkLedger.state_dict` /
:meth:`WorkLedger.load_state_dict`, JSON-native) and also saves itself as a snapshot file in a
checkpoint folder (:meth:`WorkLedger.save` / :meth:`WorkLedger.load`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from partial_rollout.ledger.events import EventLog
from partial_rollout.snapshot import (
    Fingerprints,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    load_snapshot,
    save_snapshot,
)

STATE_VERSION = 1
"""Version of :meth:`WorkLedger.state_dict`'s layout."""
LEDGER_METADATA_KEY = "ledger"
"""Key of the ledger's own state (counters, save id) in a snapshot's ``metadata``."""
ALL_STATES = frozenset(GroupState)


def request_id(group_id: str, index: int) -> str:
    """The engine request id of sample ``index`` of a group: how captured samples are matched back."""
    return f"{group_id}/{index}"


class WorkLedger:
    """Outstanding prompt groups, their accounting, and the event log they write."""

    def __init__(self, events: EventLog | None = None) -> None:
        self.events = events
        self._groups: dict[str, GroupRecord] = {}
        self.counters: dict[str, int] = dict.fromkeys(("yielded", "dispatched", "finished", "consumed", "evicted"), 0)
        self.evicted_by_reason: dict[str, int] = {}
        self.last_save_id: str | None = None
        """The ``save_id`` of the checkpoint this state was last saved as or loaded from."""

    # ---------------------------------------------------------------- transitions

    def yield_group(
        self,
        group_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        samplings: Sequence[SamplingSpec],
        *,
        data: dict[str, Any] | None = None,
    ) -> GroupRecord:
        """Record a prompt the loader just yielded, as a pending group of ``len(samplings)`` samples."""
        if group_id in self._groups:
            raise ValueError(f"group {group_id!r} is already outstanding; group ids must be unique")
        group = GroupRecord(
            group_id=group_id,
            prompt_token_ids=np.asarray(prompt_token_ids, dtype=np.int32),
            data=dict(data or {}),
            state=GroupState.PENDING,
            samples=[SampleRecord(index=i, state=SampleState.NOT_STARTED, sampling=s) for i, s in enumerate(samplings)],
        )
        self._groups[group_id] = group
        self.counters["yielded"] += 1
        self._emit("yield", prompt=group_id)
        return group

    def dispatch(self, group_id: str, policy_version: int) -> GroupRecord:
        """Record that a pending group was handed to the engine under ``policy_version``."""
        group = self._get(group_id, GroupState.PENDING)
        group.state = GroupState.IN_FLIGHT
        group.dispatch_version = policy_version
        self.counters["dispatched"] += 1
        self._emit("dispatch", prompt=group_id, version=policy_version)
        return group

    def finish(self, group_id: str, sample: SampleRecord, *, prefix_tokens: int = 0) -> bool:
        """Record a finished (and rewarded) sample; returns True when that makes the group ready.

        Args:
            group_id: its group.
            sample: the finished sample; its ``index`` says which one it is.
            prefix_tokens: how many of its tokens were continued from a saved prefix (0 when it
                was generated in one go), so an audit can count tokens continued.
        """
        group = self._get(group_id, GroupState.IN_FLIGHT)
        if sample.state is not SampleState.FINISHED:
            raise ValueError(f"group {group_id!r} sample {sample.index}: finish() needs a finished sample, got {sample.state.value}")
        group.samples[sample.index] = sample
        self.counters["finished"] += 1
        self._emit(
            "finish", prompt=group_id, sample=sample.index, tokens=sample.num_tokens, prefix_tokens=prefix_tokens,
            reward=sample.reward,
        )
        return self.settle(group_id)

    def settle(self, group_id: str) -> bool:
        """Mark an in-flight group ready if all its samples are finished; returns whether it is ready.

        A resume calls it for restored groups whose last samples finished in the engine but were
        captured before the trainer heard of them.
        """
        group = self._get(group_id)
        if group.state is GroupState.IN_FLIGHT and all(s.state is SampleState.FINISHED for s in group.samples):
            group.state = GroupState.READY
            self._emit("ready", prompt=group_id)
        return group.state is GroupState.READY

    def consume(self, group_ids: Iterable[str], *, step: int) -> list[GroupRecord]:
        """Record that training step ``step`` consumed these ready groups; they leave the ledger."""
        taken = []
        for group_id in group_ids:
            taken.append(self._get(group_id, GroupState.READY))
            del self._groups[group_id]
            self.counters["consumed"] += 1
            self._emit("consume", prompt=group_id, step=step)
        return taken

    def evict(self, group_id: str, *, reason: str) -> GroupRecord:
        """Record that a group was dropped on purpose (e.g. ``too_stale``); it leaves the ledger."""
        group = self._get(group_id)
        del self._groups[group_id]
        self.counters["evicted"] += 1
        self.evicted_by_reason[reason] = self.evicted_by_reason.get(reason, 0) + 1
        self._emit("evict", prompt=group_id, reason=reason, state=group.state.value)
        return group

    def regenerate(self, group_id: str, *, reason: str) -> GroupRecord:
        """Discard a group's generated tokens and make it pending again (it will be dispatched anew)."""
        group = self._get(group_id)
        discarded = sum(s.num_tokens for s in group.samples)
        group.samples = [SampleRecord(index=s.index, state=SampleState.NOT_STARTED, sampling=s.sampling) for s in group.samples]
        group.state = GroupState.PENDING
        group.dispatch_version = -1
        self._emit("regenerate", prompt=group_id, reason=reason, discarded_tokens=discarded)
        return group

    def capture(self, samples: Mapping[str, SampleRecord]) -> None:
        """Take the engine's view of every unfinished sample of the in-flight groups.

        ``samples`` maps :func:`request_id` to what the engine captured (a prefix in flight, a
        queued request, or one finished but not yet returned to the trainer). An unfinished sample
        the engine does not know (its request was not submitted yet) becomes not started. Call it
        in the cut window, right before :meth:`save` or :meth:`state_dict`.
        """
        for group in self.groups(GroupState.IN_FLIGHT):
            for i, sample in enumerate(group.samples):
                if sample.state is SampleState.FINISHED:
                    continue
                captured = samples.get(request_id(group.group_id, i))
                if captured is None:
                    group.samples[i] = SampleRecord(index=i, state=SampleState.NOT_STARTED, sampling=sample.sampling)
                else:
                    group.samples[i] = _with_index(captured, i)

    # ---------------------------------------------------------------- queries

    def groups(self, *states: GroupState) -> Iterator[GroupRecord]:
        """Outstanding groups in any of ``states`` (all when none is given), in yield order."""
        return (g for g in list(self._groups.values()) if not states or g.state in states)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._groups

    def __getitem__(self, group_id: str) -> GroupRecord:
        return self._get(group_id)

    # ---------------------------------------------------------------- run-level events

    def log(self, kind: str, **fields: Any) -> None:
        """Write a trainer event of ``kind`` (``train_step`` metrics, ...) to the event log."""
        self._emit("log", kind=kind, **fields)

    def record_start(self, **fields: Any) -> None:
        """Mark a fresh start: an audit forgets everything logged before it."""
        self._emit("start", **fields)

    def record_resume(self, **fields: Any) -> None:
        """Mark a resume from :attr:`last_save_id`: an audit rolls back everything logged after that save."""
        self._emit("resume", save_id=self.last_save_id, **fields)

    def record_end(self, *, step: int) -> None:
        """Mark a run that reached its end, listing the groups still outstanding (not lost: just untrained)."""
        self._emit("end", step=step, outstanding=list(self._groups), durable=True)

    # ---------------------------------------------------------------- checkpointing

    def to_snapshot(
        self,
        *,
        trainer_step: int,
        policy_version: int,
        fingerprints: Fingerprints,
        loader_state: dict[str, Any] | None,
        states: Collection[GroupState] = ALL_STATES,
        metadata: dict[str, Any] | None = None,
    ) -> Snapshot:
        """The snapshot of the outstanding groups in ``states``, with the ledger's own state in its metadata."""
        return Snapshot(
            trainer_step=trainer_step,
            policy_version=policy_version,
            fingerprints=fingerprints,
            groups=[g for g in self._groups.values() if g.state in states],
            loader_state=loader_state,
            counters=dict(self.counters),
            evicted_by_reason=dict(self.evicted_by_reason),
            metadata={**(metadata or {}), LEDGER_METADATA_KEY: self._own_state()},
        )

    def save(
        self,
        folder: str | os.PathLike[str],
        *,
        trainer_step: int,
        policy_version: int,
        fingerprints: Fingerprints,
        loader_state: dict[str, Any] | None,
        states: Collection[GroupState] = ALL_STATES,
        metadata: dict[str, Any] | None = None,
        **event_fields: Any,
    ) -> Snapshot:
        """Cut a snapshot of the groups in ``states`` into ``folder`` and log the ``save`` event.

        The event records what was outstanding (groups per state, unfinished samples) and what was
        saved (groups per state, captured in-flight samples and their prefix tokens), so an audit
        can show what a save that keeps less (ready groups only) leaves behind.

        The ``save`` event is written (and fsynced) *before* the snapshot file, and both before the
        caller commits the checkpoint folder: a kill in between leaves an uncommitted folder that
        no resume uses, and a ``save`` event that no ``resume`` refers to, which is harmless.

        Returns:
            The snapshot written.
        """
        self.last_save_id = f"step{trainer_step}-{secrets.token_hex(4)}"
        snapshot = self.to_snapshot(
            trainer_step=trainer_step, policy_version=policy_version, fingerprints=fingerprints,
            loader_state=loader_state, states=states, metadata=metadata,
        )
        stats = snapshot.counts()
        outstanding = {state.value: 0 for state in GroupState}
        for group in self._groups.values():
            outstanding[group.state.value] += 1
        unfinished = sum(s.state is not SampleState.FINISHED for g in self.groups(GroupState.IN_FLIGHT) for s in g.samples)
        self._emit(
            "save", durable=True, save_id=self.last_save_id, step=trainer_step, policy_version=policy_version,
            outstanding=outstanding, groups={s.value: stats[f"groups_{s.value}"] for s in GroupState},
            samples_unfinished=unfinished, samples_in_flight=stats["samples_in_flight"],
            prefix_tokens=stats["tokens_in_flight"], saved=[g.group_id for g in snapshot.groups], **event_fields,
        )
        save_snapshot(snapshot, folder)
        return snapshot

    def load(self, folder: str | os.PathLike[str], *, expect: Fingerprints | None = None) -> Snapshot:
        """Replace this ledger's state with the one saved in ``folder``; returns the snapshot for the rest of the resume."""
        snapshot = load_snapshot(folder, expect=expect)
        self._groups = {g.group_id: g for g in snapshot.groups}
        self._load_own_state(snapshot.metadata.get(LEDGER_METADATA_KEY, {}))
        return snapshot

    def state_dict(self) -> dict[str, Any]:
        """The ledger as a JSON-native dict (``Stateful`` protocol)."""
        return {**self._own_state(), "groups": [_group_to_json(g) for g in self._groups.values()]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`'s output (``Stateful`` protocol)."""
        if state_dict.get("version") != STATE_VERSION:
            raise ValueError(f"ledger state version {state_dict.get('version')!r} is not {STATE_VERSION}")
        self._groups = {}
        for item in state_dict["groups"]:
            group = _group_from_json(item)
            self._groups[group.group_id] = group
        self._load_own_state(state_dict)

    # ---------------------------------------------------------------- internals

    def _own_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "counters": dict(self.counters),
            "evicted_by_reason": dict(self.evicted_by_reason),
            "last_save_id": self.last_save_id,
        }

    def _load_own_state(self, state: Mapping[str, Any]) -> None:
        self.counters.update(state.get("counters", {}))
        self.evicted_by_reason = dict(state.get("evicted_by_reason", {}))
        self.last_save_id = state.get("last_save_id")

    def _get(self, group_id: str, state: GroupState | None = None) -> GroupRecord:
        group = self._groups.get(group_id)
        if group is None:
            raise KeyError(f"group {group_id!r} is not outstanding in the ledger")
        if state is not None and group.state is not state:
            raise ValueError(f"group {group_id!r} is {group.state.value}, expected {state.value}")
        return group

    def _emit(self, event: str, *, durable: bool = False, **fields: Any) -> None:
        if self.events is not None:
            self.events.append(event, durable=durable, **fields)


def _with_index(sample: SampleRecord, index: int) -> SampleRecord:
    if sample.index == index:
        return sample
    return SampleRecord(**{**_fields(sample), "index": index})


def _fields(sample: SampleRecord) -> dict[str, Any]:
    return {name: getattr(sample, name) for name in SampleRecord.__dataclass_fields__}


def _sample_to_json(sample: SampleRecord) -> dict[str, Any]:
    out = _fields(sample)
    out["state"] = sample.state.value
    out["sampling"] = sample.sampling.to_json()
    for name in ("token_ids", "logprobs", "versions"):
        out[name] = out[name].tolist()
    out["sampler_state"] = None if sample.sampler_state is None else sample.sampler_state.hex()
    return out


def _sample_from_json(item: Mapping[str, Any]) -> SampleRecord:
    kwargs = dict(item)
    kwargs["sampling"] = SamplingSpec.from_json(item["sampling"])
    kwargs["sampler_state"] = None if item["sampler_state"] is None else bytes.fromhex(item["sampler_state"])
    return SampleRecord(**kwargs)


def _group_to_json(group: GroupRecord) -> dict[str, Any]:
    return {
        "group_id": group.group_id,
        "prompt_token_ids": group.prompt_token_ids.tolist(),
        "data": group.data,
        "state": group.state.value,
        "dispatch_version": group.dispatch_version,
        "samples": [_sample_to_json(s) for s in group.samples],
    }


def _group_from_json(item: Mapping[str, Any]) -> GroupRecord:
    return GroupRecord(**{**item, "samples": [_sample_from_json(s) for s in item["samples"]]})
