"""The work ledger: every prompt group from the moment the loader yields it until it is gone on purpose.

A group leaves the ledger only when training *consumes* it or a sampler *evicts* it for a stated
reason; anything else that makes it disappear is a loss, and the event log shows it. The ledger is
trainer-agnostic: the trainer names groups with stable ids (e.g. ``e0:17`` for dataset index 17 of
epoch 0), reports each transition, and the ledger keeps a :class:`~partial_rollout.ledger.entry.GroupEntry`
of every outstanding group (its own mutable state, which each transition changes), writes one event
per transition to ``events.jsonl``, and at a checkpoint turns those entries into the frozen records
of a :class:`~partial_rollout.snapshot.Snapshot`.

Life of a group and the events it produces::

    yield ──> dispatch ──> finish (one per sample) ──> ready ──> consume | evict(reason)
      │           └─ regenerate (prefixes discarded, back to pending)
      └─ evict(reason) (e.g. dropped at resume by the on_stale policy)

**Groups the trainer's own checkpoint holds.** A trainer that checkpoints its own buffer of finished
groups reads it at another instant than our cut, so at a resume the two can disagree, and two
transitions reconcile them: :meth:`WorkLedger.adopt_ready` (``ready`` with a reason) for a group the
trainer holds finished while our snapshot holds it unfinished (it is trained from the trainer's copy,
and saved as its samples here are until then), and :meth:`WorkLedger.reopen` for a group ready here
that the trainer's checkpoint lacks (it goes back in flight, to be committed again).

Plus run-level events: ``start`` (a fresh run), ``save`` (a checkpoint's cut, with a ``save_id``;
then ``save_written`` or ``save_failed`` once its file is written or could not be),
``resume`` (naming the ``save_id`` it resumed from), ``end`` (with the groups still outstanding),
and trainer metrics (``log``). :func:`partial_rollout.ledger.audit.audit` turns them into lost and
duplicated counts.

**Checkpointing** is two steps, so the engine stays frozen only for the first (a trainer calls
neither: :class:`~partial_rollout.checkpoint.RolloutCheckpointer` runs them in order):
:meth:`WorkLedger.cut` copies the outstanding groups into memory (a :class:`LedgerCut`: cheap, no
I/O; take it while the engine is paused, with no ``await`` in between), and after the engine resumes
:meth:`WorkLedger.record_save` logs the ``save`` event and :meth:`LedgerCut.write` encodes, writes
and fsyncs the snapshot (``save_written`` or ``save_failed`` follows it in the log). The outstanding
groups and their tokens persist one way only: as the snapshot file written into a checkpoint folder,
which :meth:`WorkLedger.load` reads back. :meth:`WorkLedger.state_dict` /
:meth:`WorkLedger.load_state_dict` (torchdata's ``Stateful`` protocol) carry only a small JSON
manifest (:mod:`~partial_rollout.ledger.manifest`): counters, evictions by reason, the last save id,
and the name of the snapshot file that holds the groups. The snapshot embeds the same manifest in
its ``metadata``, so ``load`` alone restores everything. Each event's fields are a ``TypedDict`` of
:mod:`~partial_rollout.ledger.events`, which the audit reads through too.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import secrets
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from partial_rollout.errors import BadInputError, SnapshotError
from partial_rollout.ledger.cut import LedgerCut
from partial_rollout.ledger.entry import GroupEntry
from partial_rollout.ledger.events import (
    ConsumeEvent,
    DispatchEvent,
    EndEvent,
    EventFields,
    EventKind,
    EventLog,
    EvictEvent,
    FinishEvent,
    LogEvent,
    ReadyEvent,
    RegenerateEvent,
    ReopenEvent,
    ResumeEvent,
    SaveEvent,
    SaveFailedEvent,
    SaveWrittenEvent,
    StartEvent,
    YieldEvent,
)
from partial_rollout.ledger.manifest import COUNTER_NAMES, LEDGER_METADATA_KEY, Manifest, parse_manifest
from partial_rollout.snapshot import (
    Fingerprints,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    find_snapshot,
    load_snapshot,
    snapshot_path,
)

ALL_STATES = frozenset(GroupState)


def request_id(group_id: str, index: int) -> str:
    """The engine request id of sample ``index`` of a group: how captured samples are matched back."""
    return f"{group_id}/{index}"


class WorkLedger:
    """Outstanding prompt groups, their accounting, and the event log they write."""

    def __init__(self, events: EventLog | None = None) -> None:
        self.events = events
        self._groups: dict[str, GroupEntry] = {}
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self.evicted_by_reason: dict[str, int] = {}
        self.last_save_id: str | None = None
        """The ``save_id`` of the checkpoint this state was last saved as or loaded from."""
        self.snapshot_file: str | None = None
        """Name of the snapshot file of that checkpoint (``partial_rollouts.safetensors`` in its folder)."""
        self._held: list[tuple[EventKind, bool, dict[str, Any]]] | None = None
        """Events logged between :meth:`cut` and :meth:`record_save`, written after the ``save`` event."""

    # ---------------------------------------------------------------- transitions

    def yield_group(
        self,
        group_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        samplings: Sequence[SamplingSpec],
        *,
        data: dict[str, Any] | None = None,
    ) -> GroupEntry:
        """Record a prompt the loader just yielded, as a pending group of ``len(samplings)`` samples.

        Raises:
            ValueError: the id is outstanding already, or the group is invalid as a snapshot would
                hold it (e.g. ``data`` that is not JSON-native).
        """
        if group_id in self._groups:
            raise ValueError(f"group {group_id!r} is already outstanding; group ids must be unique")
        group = GroupEntry.of(
            GroupRecord(
                group_id=group_id,
                prompt_token_ids=np.asarray(prompt_token_ids, dtype=np.int32),
                data=dict(data or {}),
                state=GroupState.PENDING,
                samples=[
                    SampleRecord(index=i, state=SampleState.NOT_STARTED, sampling=s) for i, s in enumerate(samplings)
                ],
            )
        )
        self._groups[group_id] = group
        self.counters["yielded"] += 1
        self._emit(EventKind.YIELD, YieldEvent(prompt=group_id))
        return group

    def dispatch(self, group_id: str, policy_version: int) -> GroupEntry:
        """Record that a pending group was handed to the engine under ``policy_version``."""
        group = self._get(group_id, GroupState.PENDING)
        group.state = GroupState.IN_FLIGHT
        group.dispatch_version = policy_version
        self.counters["dispatched"] += 1
        self._emit(EventKind.DISPATCH, DispatchEvent(prompt=group_id, version=policy_version))
        return group

    def finish(self, group_id: str, sample: SampleRecord, *, prefix_tokens: int = 0, settle: bool = True) -> bool:
        """Record a finished (and rewarded) sample; returns True when that makes the group ready.

        Args:
            group_id: its group.
            sample: the finished sample; its ``index`` says which one it is.
            prefix_tokens: how many of its tokens were continued from a saved prefix (0 when it
                was generated in one go), so an audit can count tokens continued.
            settle: check whether the group is ready now. A trainer that finishes a whole group
                at once passes False and calls :meth:`settle` after its last sample: a cut may
                have recorded some of them finished (generated, not yet scored), which would
                make the group ready before the others are recorded.
        """
        group = self._get(group_id, GroupState.IN_FLIGHT)
        if sample.state is not SampleState.FINISHED:
            raise ValueError(
                f"group {group_id!r} sample {sample.index}: finish() needs a finished sample, got {sample.state.value}"
            )
        group.samples[sample.index] = sample
        self.counters["finished"] += 1
        self._emit(
            EventKind.FINISH,
            FinishEvent(
                prompt=group_id,
                sample=sample.index,
                tokens=sample.num_tokens,
                prefix_tokens=prefix_tokens,
                reward=sample.reward,
            ),
        )
        return self.settle(group_id) if settle else False

    def settle(self, group_id: str) -> bool:
        """Mark an in-flight group ready if all its samples are finished; returns whether it is ready.

        A resume calls it for restored groups whose last samples finished in the engine but were
        captured before the trainer heard of them.
        """
        group = self._get(group_id)
        if group.state is GroupState.IN_FLIGHT and all(s.state is SampleState.FINISHED for s in group.samples):
            group.state = GroupState.READY
            self._emit(EventKind.READY, ReadyEvent(prompt=group_id))
        return group.state is GroupState.READY

    def adopt_ready(self, group_id: str, *, reason: str) -> GroupEntry:
        """Mark a group ready that the trainer's own checkpoint holds finished, while this ledger
        holds it unfinished; the trainer's copy is the one trained.

        A trainer that reads its own buffer for its checkpoint some awaits after our cut can hold a
        group that finished in between finished, while our snapshot holds it in flight. Until the
        group is consumed, a cut saves it as its samples here are (pending or in flight,
        :attr:`GroupEntry.saved_state`): a snapshot keeps no ready group with unfinished samples, and
        a later resume whose trainer lacks it continues it from there.
        """
        group = self._get(group_id)
        if group.state is not GroupState.READY:
            group.trainer_holds = True
            group.state = GroupState.READY
            self._emit(EventKind.READY, ReadyEvent(prompt=group_id, reason=reason))
        return group

    def reopen(self, group_id: str) -> GroupEntry:
        """Put a ready group back in flight, for a trainer whose own checkpoint lacks it: it is
        committed again (its finished samples come back at once) and settles anew.

        Raises:
            ValueError: the group is not ready, or the trainer's checkpoint holds it (:meth:`adopt_ready`).
        """
        group = self._get(group_id, GroupState.READY)
        if group.trainer_holds:
            raise ValueError(f"group {group_id!r} is the trainer's to train (adopt_ready): it cannot be reopened")
        group.state = GroupState.IN_FLIGHT
        self._emit(EventKind.REOPEN, ReopenEvent(prompt=group_id))
        return group

    def consume(self, group_ids: Iterable[str], *, step: int) -> list[GroupEntry]:
        """Record that training step ``step`` consumed these ready groups; they leave the ledger."""
        taken = []
        for group_id in group_ids:
            taken.append(self._get(group_id, GroupState.READY))
            del self._groups[group_id]
            self.counters["consumed"] += 1
            self._emit(EventKind.CONSUME, ConsumeEvent(prompt=group_id, step=step))
        return taken

    def evict(self, group_id: str, *, reason: str) -> GroupEntry:
        """Record that a group was dropped on purpose (e.g. ``too_stale``); it leaves the ledger."""
        group = self._get(group_id)
        del self._groups[group_id]
        self.counters["evicted"] += 1
        self.evicted_by_reason[reason] = self.evicted_by_reason.get(reason, 0) + 1
        self._emit(EventKind.EVICT, EvictEvent(prompt=group_id, reason=reason, state=group.state.value))
        return group

    def regenerate(self, group_id: str, *, reason: str) -> GroupEntry:
        """Discard a group's generated tokens and make it pending again (it will be dispatched anew)."""
        group = self._get(group_id)
        discarded = sum(s.num_tokens for s in group.samples)
        group.samples = [
            SampleRecord(index=s.index, state=SampleState.NOT_STARTED, sampling=s.sampling) for s in group.samples
        ]
        group.state = GroupState.PENDING
        group.dispatch_version = -1
        group.trainer_holds = False
        self._emit(EventKind.REGENERATE, RegenerateEvent(prompt=group_id, reason=reason, discarded_tokens=discarded))
        return group

    def capture(self, samples: Mapping[str, SampleRecord]) -> None:
        """Take the engine's view of every unfinished sample of the in-flight groups.

        ``samples`` maps :func:`request_id` to what the engine captured (a prefix in flight, a
        queued request, or one finished but not yet returned to the trainer). An unfinished sample
        the engine does not know (its request was not submitted yet) becomes not started. Call it
        in the cut window, right before :meth:`save`.
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

    def set_data(self, group_id: str, data: dict[str, Any]) -> GroupEntry:
        """Replace a group's ``data`` (e.g. what a resume needs to replay a multi-turn sample).

        The ledger keeps a copy, and a cut shares the dict it had. The save checks it is
        JSON-native, as it checks every record.
        """
        group = self._get(group_id)
        group.data = dict(data)
        return group

    # ---------------------------------------------------------------- queries

    def groups(self, *states: GroupState) -> Iterator[GroupEntry]:
        """Outstanding groups in any of ``states`` (all when none is given), in yield order."""
        return (g for g in list(self._groups.values()) if not states or g.state in states)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._groups

    def __getitem__(self, group_id: str) -> GroupEntry:
        return self._get(group_id)

    # ---------------------------------------------------------------- run-level events

    def log(self, kind: str, **fields: Any) -> None:
        """Write a trainer event of ``kind`` (e.g. :data:`~partial_rollout.ledger.events.TRAIN_STEP`) to the log."""
        self._emit(EventKind.LOG, LogEvent(kind=kind), **fields)

    def record_start(self, **fields: Any) -> None:
        """Mark a fresh start: an audit forgets everything logged before it."""
        self._emit(EventKind.START, StartEvent(), **fields)

    def record_resume(self, **fields: Any) -> None:
        """Mark a resume from :attr:`last_save_id`: an audit rolls back everything logged after that save."""
        self._emit(EventKind.RESUME, ResumeEvent(save_id=self.last_save_id), **fields)

    def record_end(self, *, step: int, running: Collection[str] = (), engines_left: int | None = None) -> None:
        """Mark a run that reached its end, listing the groups still outstanding (not lost: just untrained).

        Args:
            step: the last training step.
            running: the :func:`request_id` of every request the engine was still generating when
                training stopped. The ``end`` event's ``in_flight`` maps each in-flight group to those
                of its samples, so an audit can tell a continuation the end of the run cut short
                from one the trainer never resubmitted.
            engines_left: for a pool of engines, how many were alive at the end (``engines_left`` in the event).
        """
        live = set(running)
        in_flight = {}
        for group in self.groups(GroupState.IN_FLIGHT):
            indices = [i for i in range(len(group.samples)) if request_id(group.group_id, i) in live]
            if indices:
                in_flight[group.group_id] = indices
        end = EndEvent(step=step, outstanding=list(self._groups), in_flight=in_flight)
        if engines_left is not None:
            end["engines_left"] = engines_left
        self._emit(EventKind.END, end, durable=True)

    # ---------------------------------------------------------------- checkpointing

    def cut(
        self,
        folder: str | os.PathLike[str],
        *,
        trainer_step: int,
        policy_version: int,
        fingerprints: Fingerprints,
        loader_state: dict[str, Any] | None,
        states: Collection[GroupState] = ALL_STATES,
        metadata: dict[str, Any] | None = None,
    ) -> LedgerCut:
        """Copy the outstanding groups in ``states`` into memory, to be written into ``folder`` later.

        Call it in the checkpoint's frozen window right after :meth:`capture`, with the loader's
        cursor read in the same window, then :meth:`record_save` once the engine runs again. It
        does no I/O and builds no record (that is :meth:`LedgerCut.write`'s job), so it costs a
        copy of the group entries. Until :meth:`record_save`, events are held back, so
        the ``save`` event sits in the log exactly where the cut was taken.
        """
        if self._held is not None:
            raise RuntimeError("a cut is already open: record_save() it before cutting again")
        path = snapshot_path(folder)
        previous = (self.last_save_id, self.snapshot_file)
        self.last_save_id = f"step{trainer_step}-{secrets.token_hex(4)}"
        self.snapshot_file = path.name
        copies = [g.copy() for g in self._groups.values()]
        groups = [g for g in copies if g.saved_state in states]
        outstanding = {state.value: 0 for state in GroupState}
        for group in copies:
            outstanding[group.saved_state.value] += 1
        unfinished = sum(
            s.state is not SampleState.FINISHED
            for g in copies
            if g.saved_state is GroupState.IN_FLIGHT
            for s in g.samples
        )
        saved_in_flight = [s for g in groups for s in g.samples if s.state is SampleState.IN_FLIGHT]
        event = SaveEvent(
            save_id=self.last_save_id,
            step=trainer_step,
            policy_version=policy_version,
            outstanding=outstanding,
            groups={state.value: sum(g.saved_state is state for g in groups) for state in GroupState},
            samples_unfinished=unfinished,
            samples_in_flight=len(saved_in_flight),
            prefix_tokens=sum(s.num_tokens for s in saved_in_flight),
            saved=[g.group_id for g in groups],
            in_flight={
                g.group_id: [s.index for s in g.samples if s.state is not SampleState.FINISHED]
                for g in groups
                if g.saved_state is GroupState.IN_FLIGHT
            },
        )
        cut = LedgerCut(
            path=path,
            save_id=self.last_save_id,
            trainer_step=trainer_step,
            policy_version=policy_version,
            fingerprints=fingerprints,
            groups=groups,
            loader_state=copy.deepcopy(loader_state),
            counters=dict(self.counters),
            evicted_by_reason=dict(self.evicted_by_reason),
            metadata={**copy.deepcopy(metadata or {}), LEDGER_METADATA_KEY: self.state_dict()},
            event=event,
            previous_save=previous,
        )
        self._held = []
        return cut

    def record_save(self, cut: LedgerCut, **event_fields: Any) -> None:
        """Log the ``save`` event of ``cut`` (with ``event_fields``, e.g. the measured stall), then the held events.

        The event is fsynced. Write the snapshot only after it: a kill in between leaves a
        ``save`` event that no ``resume`` refers to, which is harmless, while a snapshot whose
        ``save`` event is missing could not be audited.
        """
        held, self._held = self._held or [], None
        self._emit(EventKind.SAVE, cut.event, durable=True, **event_fields)
        if self.events is not None:
            for event, durable, fields in held:
                self.events.append(event, durable=durable, **fields)

    def record_written(self, cut: LedgerCut, **fields: Any) -> None:
        """Log that ``cut``'s snapshot is on disk (``fields``: e.g. write time and size)."""
        self._emit(EventKind.SAVE_WRITTEN, SaveWrittenEvent(save_id=cut.save_id), **fields)

    def record_save_failed(self, cut: LedgerCut, *, error: str) -> None:
        """Log that ``cut`` could not be written; the manifest names the last save that exists again.

        The groups are untouched (the cut took copies of their entries), so the next save works as if
        this one had never been tried.
        """
        if self.last_save_id == cut.save_id:
            self.last_save_id, self.snapshot_file = cut.previous_save
        self._emit(EventKind.SAVE_FAILED, SaveFailedEvent(save_id=cut.save_id, error=error), durable=True)

    def load(
        self,
        folder: str | os.PathLike[str],
        *,
        expect: Fingerprints | None = None,
        allow_vllm_change: bool = False,
        check: Callable[[Snapshot, Path], None] | None = None,
    ) -> Snapshot:
        """Replace this ledger's state with the one saved in ``folder``; returns the snapshot for the resume.

        ``check`` is the trainer's own test of the snapshot against its run (the file is read
        once): called with the snapshot and its file after the library's checks and before this
        ledger changes, it refuses the snapshot by raising.

        Raises:
            SnapshotError: the snapshot is damaged or mismatched (see
                :func:`~partial_rollout.snapshot.load_snapshot`), or its ledger manifest is invalid.
        """
        file = find_snapshot(folder)
        snapshot = load_snapshot(file, expect=expect, allow_vllm_change=allow_vllm_change)
        if check is not None:
            check(snapshot, file)
        field = f"metadata.{LEDGER_METADATA_KEY}"
        self._adopt(
            parse_manifest(snapshot.metadata.get(LEDGER_METADATA_KEY), error=SnapshotError, path=file, field=field)
        )
        self.snapshot_file = file.name  # the file actually read, should it have been renamed
        self._groups = {g.group_id: GroupEntry.of(g) for g in snapshot.groups}
        return snapshot

    def state_dict(self) -> dict[str, Any]:
        """The ledger's manifest, JSON-native (``Stateful`` protocol).

        It holds no group: those are in the snapshot file :meth:`save` wrote (named by
        ``snapshot_file``), which :meth:`load` reads back.
        """
        return Manifest(
            counters=self.counters,
            evicted_by_reason=self.evicted_by_reason,
            last_save_id=self.last_save_id,
            snapshot_file=self.snapshot_file,
        ).to_state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the manifest of :meth:`state_dict` (``Stateful`` protocol) and forget every outstanding group.

        The groups come back with :meth:`load` from the checkpoint folder holding ``snapshot_file``;
        ``load`` also restores this manifest (the snapshot embeds it), so a resume needs only ``load``.

        Raises:
            BadInputError: a manifest of another version or with a missing, unknown or invalid
                field (the message names it).
        """
        self._adopt(parse_manifest(state_dict, error=BadInputError, path=None, field="ledger state"))
        self._groups = {}

    # ---------------------------------------------------------------- internals

    def _adopt(self, manifest: Manifest) -> None:
        """Take the fields of a checked manifest (:func:`~partial_rollout.ledger.manifest.parse_manifest`)."""
        self.counters = manifest.counters
        self.evicted_by_reason = manifest.evicted_by_reason
        self.last_save_id = manifest.last_save_id
        self.snapshot_file = manifest.snapshot_file

    def _get(self, group_id: str, state: GroupState | None = None) -> GroupEntry:
        group = self._groups.get(group_id)
        if group is None:
            raise KeyError(f"group {group_id!r} is not outstanding in the ledger")
        if state is not None and group.state is not state:
            raise ValueError(f"group {group_id!r} is {group.state.value}, expected {state.value}")
        return group

    def _emit(self, event: EventKind, fields: EventFields, /, *, durable: bool = False, **extra: Any) -> None:
        """Write an event of the ledger's (``fields``) with the trainer's ``extra`` fields, or hold it during a cut."""
        record = dict(**fields, **extra)  # a trainer field that repeats one of the event's raises TypeError
        if self._held is not None:
            self._held.append((event, durable, record))
        elif self.events is not None:
            self.events.append(event, durable=durable, **record)


def _with_index(sample: SampleRecord, index: int) -> SampleRecord:
    return sample if sample.index == index else dataclasses.replace(sample, index=index)
