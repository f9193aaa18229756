"""One object that owns the checkpoint protocol, so a trainer adds partial rollouts in a few calls.

A consistent checkpoint of asynchronous rollouts is a fixed sequence: close the gate to the engine,
take the engine's cut (what this process has received of each request: the engines never pause),
capture it into the ledger, read the loader's cursor and cut the ledger into memory (no ``await``
anywhere in between), open the gate, log the ``save`` event, then encode and write, logging the
outcome. A resume is another: load and check the
snapshot, log the ``resume``, put the loader back, apply the staleness policy. :class:`RolloutCheckpointer`
does both, and runs samples so that a saved prefix is continued rather than regenerated::

    ckpt = RolloutCheckpointer(engine, events=run_dir / "events.jsonl", loader=loader)
    restored = await ckpt.restore(folder)              # folder=None: a run with nothing to resume
    ckpt.yield_group(group_id, prompt_ids, [spec] * n)
    await ckpt.rollout(group_id, policy_version=v, reward=score)   # generate or continue, finish, settle
    ckpt.consume(ready_group_ids, step=s)
    pending = await ckpt.save(folder, trainer_step=s, policy_version=v)
    await asyncio.to_thread(pending.write)             # logs save_written or save_failed itself
    ckpt.end(step=s)

Its :meth:`~RolloutCheckpointer.state_dict` / :meth:`~RolloutCheckpointer.load_state_dict` follow
torch.distributed.checkpoint's ``Stateful`` protocol for what a trainer's own checkpoint holds
(the ledger's manifest and the loader cursor of the last cut), so it drops into an existing
checkpoint beside the model; the outstanding groups and their tokens are only in the snapshot.

A trainer drives this one object: the ledger's transitions a trainer makes (a prompt yielded, groups
trained on or evicted, the run's end) are methods here. The pieces underneath
(:attr:`~RolloutCheckpointer.ledger`, :class:`~partial_rollout.engine.RolloutEngine`) stay reachable
for integrations that must split the protocol across threads or processes;
:meth:`~RolloutCheckpointer.frozen` is the step between.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from partial_rollout.checkpoint.policy import RestorePolicy
from partial_rollout.checkpoint.staleness import OnStale, apply_on_stale
from partial_rollout.checkpoint.window import ALL_STATES, FrozenWindow, PendingSnapshot, StatefulLoader
from partial_rollout.engine import CheckpointableEngine
from partial_rollout.errors import BadInputError, SnapshotError
from partial_rollout.ledger import EventLog, GroupEntry, WorkLedger, request_id
from partial_rollout.ledger.cut import LedgerCut
from partial_rollout.snapshot import Fingerprints, GroupState, SampleRecord, SampleState, SamplingSpec, Snapshot

STATE_VERSION = 1
"""Version of :meth:`RolloutCheckpointer.state_dict`."""
VERSION_KEY = "version"
"""State key: :data:`STATE_VERSION` of the code that wrote it."""
LEDGER_KEY = "ledger"
"""State key: the ledger's manifest (:meth:`WorkLedger.state_dict`) as of the last cut, as one JSON
string: its evictions are keyed by reason, and DCP loads only the keys the target already has."""
LOADER_KEY = "loader"
"""State key: the loader's ``state_dict()`` read in the last cut's frozen window (or restored; the
live one before any cut, so a fresh target has the structure DCP loads into)."""
STATE_KEYS = (VERSION_KEY, LEDGER_KEY, LOADER_KEY)

RECORD_ONLY = Fingerprints(model="record-only", tokenizer="record-only", vocab_size=2**31 - 1, vllm_version="n/a")
"""What the snapshots of a record-only checkpointer (:meth:`RolloutCheckpointer.record_only`) are
bound to: they hold no tokens to continue, so no model; a checkpointer of a model refuses them."""

Reward = Callable[[GroupEntry, SampleRecord], float]
"""Scores one finished sample of a group (its ``data`` holds what the loader yielded)."""


@dataclass(frozen=True, kw_only=True)
class SampleOutcome:
    """One sample generated (or continued) to its end and reported finished to the ledger."""

    group_id: str
    record: SampleRecord
    """The finished sample, with the reward given to it."""
    continued_tokens: int
    """Tokens of a saved prefix it went on from (0 when generated in one go)."""

    @property
    def generated_tokens(self) -> int:
        """Tokens this process's engine produced for it."""
        return self.record.num_tokens - self.continued_tokens


@dataclass(frozen=True, kw_only=True)
class Restored:
    """What a resume hands back to the trainer, by group id in yield order."""

    snapshot: Snapshot | None
    """The snapshot read (its ``trainer_step``, ``policy_version`` and ``metadata`` are the trainer's);
    ``None`` for a run restored from nothing."""
    in_flight: list[str]
    """Dispatched groups not settled (samples to continue, or all finished before the trainer heard of
    the last): run :meth:`RolloutCheckpointer.rollout` on each, which continues what is unfinished
    and settles the group."""
    pending: list[str]
    """Yielded, never dispatched (or regenerated): dispatch them before any new loader batch."""
    ready: list[str]
    """Finished, not yet trained on."""
    on_stale: dict[str, OnStale] = field(default_factory=dict)
    """Groups the staleness policy regenerated or dropped."""


class RolloutCheckpointer:
    """The work ledger, the engine and the checkpoint protocol between them (see the module docstring)."""

    def __init__(
        self,
        engine: CheckpointableEngine | None,
        *,
        ledger: WorkLedger | None = None,
        events: str | os.PathLike[str] | None = None,
        fresh: bool = False,
        loader: StatefulLoader | None = None,
        fingerprints: Fingerprints | None = None,
    ) -> None:
        """
        Args:
            engine: where samples are generated (it needs only :class:`CheckpointableEngine`'s three
                methods); ``None`` for a ledger that only keeps records
                (it can then save no in-flight work, and needs ``fingerprints``).
            ledger: the work ledger to use, or
            events: the path of the run's ``events.jsonl``, for a ledger of its own.
            fresh: with ``events``, start the log anew instead of appending (a resume appends).
            loader: the loader whose cursor goes into each cut (read in the frozen window) and is
                restored from it.
            fingerprints: what a snapshot of this run must be resumed with; default: the engine's.
        """
        if (ledger is None) == (events is None):
            raise ValueError("pass exactly one of ledger= (a WorkLedger) or events= (the path of events.jsonl)")
        if engine is None and fingerprints is None:
            raise ValueError(
                "a checkpointer without an engine needs fingerprints= to bind its snapshots to "
                "(RolloutCheckpointer.record_only for one that only keeps records)"
            )
        self.engine = engine
        self.ledger = ledger if ledger is not None else WorkLedger(EventLog(events, fresh=fresh))  # type: ignore[arg-type]
        self.loader = loader
        self._fingerprints = fingerprints
        self._open = asyncio.Event()
        self._open.set()
        self._running: set[str] = set()
        self._loader_state: dict[str, Any] | None = None
        self._expected_save_id: str | None = None

    @classmethod
    def record_only(
        cls,
        engine: CheckpointableEngine | None,
        *,
        ledger: WorkLedger | None = None,
        events: str | os.PathLike[str] | None = None,
        fresh: bool = False,
        loader: StatefulLoader | None = None,
    ) -> RolloutCheckpointer:
        """A checkpointer that only keeps the work ledger's records: a trainer's run with partial rollouts
        off, so that an audit counts what its own checkpoints lose.

        Its snapshots are bound to :data:`RECORD_ONLY`, not to a model: they hold the ledger and the
        loader's cursor, and a trainer saves them without in-flight groups (``save(states=...)``).
        ``engine``: what its cuts read when the trainer saves in-flight groups' records, if any.
        """
        return cls(engine, ledger=ledger, events=events, fresh=fresh, loader=loader, fingerprints=RECORD_ONLY)

    # ---------------------------------------------------------------- identity

    async def fingerprints(self) -> Fingerprints:
        """The model, tokenizer and vLLM this run's snapshots are bound to (asked of the engine once)."""
        if self._fingerprints is None:
            assert self.engine is not None, "checked in __init__"
            self._fingerprints = await self.engine.fingerprints()
        return self._fingerprints

    # ---------------------------------------------------------------- the trainer's transitions

    def yield_group(
        self,
        group_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        samplings: Sequence[SamplingSpec],
        *,
        data: dict[str, Any] | None = None,
    ) -> GroupEntry:
        """Record a prompt the loader just yielded, as a pending group of ``len(samplings)`` samples.

        Call it in the loader's turn, before anything is awaited: a cut between the loader's step and
        this call would hold a cursor past a prompt it does not hold.
        """
        return self.ledger.yield_group(group_id, prompt_token_ids, samplings, data=data)

    def dispatch(self, group_id: str, *, policy_version: int) -> GroupEntry:
        """Record that a pending group goes to the engine under ``policy_version``, for a trainer that
        dispatches in one turn and runs it later (:meth:`rollout` dispatches a pending group itself)."""
        return self.ledger.dispatch(group_id, policy_version)

    def consume(self, group_ids: Iterable[str], *, step: int) -> list[GroupEntry]:
        """Record that the trainer took these ready groups into training ``step``; returns them."""
        return self.ledger.consume(group_ids, step=step)

    def evict(self, group_id: str, *, reason: str) -> GroupEntry:
        """Record that a group leaves without being trained on (``reason``: why, e.g. ``too_stale``)."""
        return self.ledger.evict(group_id, reason=reason)

    def end(self, *, step: int, running: Collection[str] | None = None, engines_left: int | None = None) -> None:
        """Record that the run reached its end at training ``step``.

        ``running``: the request ids the engine was still generating (default: those this
        checkpointer submitted that have not returned), so an audit tells a continuation the end cut
        short from one never resubmitted; ``engines_left``: for a pool, the engines alive.
        """
        live = self.running if running is None else running
        self.ledger.record_end(step=step, running=live, engines_left=engines_left)

    # ---------------------------------------------------------------- generation

    @property
    def running(self) -> frozenset[str]:
        """Request ids submitted through :meth:`generate` that have not returned."""
        return frozenset(self._running)

    async def generate(
        self,
        group_id: str,
        index: int,
        prompt_token_ids: Sequence[int],
        sampling: Any,
        *,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        """Generate sample ``index`` of a group on the engine (continuing ``resume_from``), once no cut runs.

        A request is submitted only while no window is frozen, so every request the engine holds
        at a freeze is one the cut finds; the ledger is not told (:meth:`sample` does that).
        """
        if self.engine is None:
            raise RuntimeError("this checkpointer has no engine to generate on")
        await self._open.wait()
        rid = request_id(group_id, index)
        self._running.add(rid)
        try:
            return await self.engine.generate(rid, prompt_token_ids, sampling, index=index, resume_from=resume_from)
        finally:
            self._running.discard(rid)

    async def sample(self, group_id: str, index: int, *, reward: Reward | None = None) -> SampleOutcome | None:
        """Run one sample of a dispatched group to its end and report it finished; ``None`` if it was.

        A sample saved in flight continues from its prefix; any other unfinished one starts. The
        group is not settled (a group ready early could be consumed while its other samples are
        still being reported): :meth:`rollout` settles it once after the last.
        """
        group = self.ledger[group_id]
        saved = group.samples[index]
        if saved.state is SampleState.FINISHED:
            return None
        resume_from = saved if saved.state is SampleState.IN_FLIGHT else None
        record = await self.generate(
            group_id, index, group.prompt_token_ids.tolist(), saved.sampling, resume_from=resume_from
        )
        if reward is not None:
            record = dataclasses.replace(record, reward=float(reward(group, record)))
        continued = 0 if resume_from is None else resume_from.num_tokens
        self.ledger.finish(group_id, record, prefix_tokens=continued, settle=False)
        return SampleOutcome(group_id=group_id, record=record, continued_tokens=continued)

    async def rollout(
        self, group_id: str, *, policy_version: int | None = None, reward: Reward | None = None
    ) -> list[SampleOutcome]:
        """Run every unfinished sample of a group concurrently, then settle it; returns what ran.

        A pending group is dispatched under ``policy_version`` first; a dispatched or restored one
        goes on where it is.
        """
        group = self.ledger[group_id]
        if group.state is GroupState.PENDING:
            if policy_version is None:
                raise ValueError(f"group {group_id!r} is pending: pass policy_version= to dispatch it")
            self.ledger.dispatch(group_id, policy_version)
        outcomes = await asyncio.gather(*(self.sample(group_id, i, reward=reward) for i in range(len(group.samples))))
        self.ledger.settle(group_id)
        return [o for o in outcomes if o is not None]

    # ---------------------------------------------------------------- save

    async def save(
        self,
        folder: str | os.PathLike[str],
        *,
        trainer_step: int,
        policy_version: int,
        states: Collection[GroupState] = ALL_STATES,
        metadata: Mapping[str, Any] | None = None,
    ) -> PendingSnapshot:
        """Take one consistent cut into memory; returns the write to do.

        No engine pauses: the cut holds what this process has received of each request, and the
        gate to the engine is closed only while it is copied. Nothing is encoded or written until
        :meth:`PendingSnapshot.write`. A save of ``states`` without in-flight groups (the baseline
        that keeps only what trainers keep today) takes no engine cut at all.
        """
        async with self.frozen(engine=GroupState.IN_FLIGHT in states) as window:
            return window.cut(
                folder, trainer_step=trainer_step, policy_version=policy_version, states=states, metadata=metadata
            )

    @asynccontextmanager
    async def frozen(self, *, engine: bool = True) -> AsyncIterator[FrozenWindow]:
        """``async with ckpt.frozen() as window:`` cut the window (no ``await`` between), thawed on the way
        out whatever happens.

        For trainers that must read their own state in the cut's turn; :meth:`save` is this plus the
        cut. The engine keeps generating throughout; the gate only holds back new requests, so that
        every request it has is one the cut holds. ``engine=False`` opens a window over the ledger alone.
        """
        window = await self.freeze(engine=engine)
        try:
            yield window
        finally:
            await window.thaw()

    async def freeze(self, *, engine: bool = True) -> FrozenWindow:
        """:meth:`frozen`'s window, for a trainer whose thaw must run elsewhere than where it cut (one that
        lets its own save begin in the cut's turn, before the thaw is awaited); it must thaw it."""
        fingerprints = await self.fingerprints()
        requested = time.perf_counter()
        engine_cut = None
        if engine:
            if self.engine is None:
                raise RuntimeError("this checkpointer has no engine: it can save no in-flight work")
            self._open.clear()
            try:
                engine_cut = await self.engine.cut()
            except BaseException:
                self._open.set()
                raise
        return FrozenWindow(
            ledger=self.ledger,
            loader=self.loader,
            fingerprints=fingerprints,
            running=lambda: self.running,
            engine_cut=engine_cut,
            requested=requested,
            open_gate=self._open.set,
            on_cut=self._cut_taken,
        )

    def _cut_taken(self, cut: LedgerCut) -> None:
        self._loader_state = copy.deepcopy(cut.loader_state)

    # ---------------------------------------------------------------- resume

    async def restore(
        self,
        folder: str | os.PathLike[str] | None,
        *,
        policy: RestorePolicy | None = None,
        is_stale: Callable[[GroupEntry], bool] | None = None,
        check: Callable[[Snapshot, Path], None] | None = None,
        **resume_fields: Any,
    ) -> Restored:
        """Resume from the snapshot in ``folder``: load and check it, log the resume, restore the loader.

        Args:
            folder: a checkpoint folder holding a snapshot this run's save wrote; ``None`` when there is
                nothing to resume: a run whose event log is empty is logged as a fresh start (an audit
                forgets everything before it), one whose log holds an earlier attempt as a resume from
                nothing (the audit then reports that attempt rolled back, none of it saved, where a
                start would make it forget the attempt). ``resume_fields``
                describe the run either way; every other argument needs a snapshot and is unused.
            policy: whether a snapshot of another vLLM version is resumed, and what happens to
                dispatched groups (in flight or ready) that ``is_stale`` (default: the policy's defaults).
            is_stale: the trainer's staleness rule; without it no group is stale.
            check: the trainer's own test of the snapshot against its run (another run's, another
                sampling), called with the snapshot and its file after the library's checks and
                before anything is restored; it refuses the snapshot by raising ``SnapshotError``.
            resume_fields: written into the ``resume`` event (e.g. ``step=``).

        A group in flight whose samples all finished before the cut comes back in flight, not ready:
        :meth:`rollout` on it runs nothing and settles it, as a trainer's own pump would.

        Raises:
            SnapshotError: the snapshot is damaged, of another run's model or settings, or not the
                one the trainer's own checkpoint names (:meth:`load_state_dict`).
        """
        policy = RestorePolicy() if policy is None else policy
        if folder is None:
            if self.ledger.events is None or self.ledger.events.logged == 0:
                self.ledger.record_start(**resume_fields)
            else:
                self.ledger.record_resume(checkpoint=None, **resume_fields)
            return Restored(snapshot=None, in_flight=[], pending=[], ready=[])
        expect = await self.fingerprints()
        snapshot = self.ledger.load(folder, expect=expect, allow_vllm_change=policy.allow_vllm_change, check=check)
        if self._expected_save_id is not None and self.ledger.last_save_id != self._expected_save_id:
            raise SnapshotError(
                f"is save {self.ledger.last_save_id!r}, the trainer's checkpoint is of save {self._expected_save_id!r}",
                path=folder,
                field="metadata.ledger.last_save_id",
                fix="Restore the snapshot and the trainer state from the same checkpoint folder",
            )
        self.ledger.record_resume(checkpoint=os.fspath(folder), **resume_fields)
        self._loader_state = copy.deepcopy(snapshot.loader_state)
        if self.loader is not None and snapshot.loader_state is not None:
            self.loader.load_state_dict(copy.deepcopy(snapshot.loader_state))
        acted: dict[str, OnStale] = {}
        if is_stale is not None:
            dispatched = self.ledger.groups(GroupState.IN_FLIGHT, GroupState.READY)
            acted = apply_on_stale(self.ledger, dispatched, is_stale=is_stale, policy=policy.on_stale)
        ids = {state: [g.group_id for g in self.ledger.groups(state)] for state in GroupState}
        return Restored(
            snapshot=snapshot,
            in_flight=ids[GroupState.IN_FLIGHT],
            pending=ids[GroupState.PENDING],
            ready=ids[GroupState.READY],
            on_stale=acted,
        )

    # ---------------------------------------------------------------- Stateful

    def state_dict(self) -> dict[str, Any]:
        """The ledger's manifest and the loader cursor of the last cut (``Stateful``).

        Take it after :meth:`save`: it describes that save (the cursor read in its frozen window,
        not the live one, which has run past work the snapshot holds). Put it in the trainer's own
        checkpoint instead of the loader's live ``state_dict()``.
        """
        loader_state = self._loader_state
        if loader_state is None and self.loader is not None:
            loader_state = self.loader.state_dict()
        return {
            VERSION_KEY: STATE_VERSION,
            LEDGER_KEY: json.dumps(self.ledger.state_dict(), sort_keys=True),
            LOADER_KEY: copy.deepcopy(loader_state),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take back :meth:`state_dict` (``Stateful``): the manifest and the loader's cursor.

        The outstanding groups come back with :meth:`restore`, which then checks that its snapshot
        is the save this state was taken after.

        Raises:
            BadInputError: a state of another version or with a missing, unknown or invalid key.
        """
        where = "rollout checkpointer state"
        if not isinstance(state_dict, Mapping):
            raise BadInputError(f"must be a mapping, got {type(state_dict).__name__}", field=where)
        if state_dict.get(VERSION_KEY) != STATE_VERSION:
            raise BadInputError(
                f"version {state_dict.get(VERSION_KEY)!r}, expected {STATE_VERSION}",
                field=f"{where}.{VERSION_KEY}",
                fix="It was written by another partial-rollout version; resume with the one that wrote it.",
            )
        if set(state_dict) != set(STATE_KEYS):
            missing, unknown = sorted(set(STATE_KEYS) - set(state_dict)), sorted(set(state_dict) - set(STATE_KEYS))
            raise BadInputError(f"missing keys {missing}, unknown keys {unknown}", field=where)
        loader_state = state_dict[LOADER_KEY]
        if loader_state is not None and not isinstance(loader_state, Mapping):
            what = f"must be the loader's state_dict or null, got {type(loader_state).__name__}"
            raise BadInputError(what, field=f"{where}.{LOADER_KEY}")
        try:
            manifest = json.loads(state_dict[LEDGER_KEY])
        except (TypeError, ValueError) as exc:
            what = f"must be the ledger's manifest as JSON: {exc}"
            raise BadInputError(what, field=f"{where}.{LEDGER_KEY}") from None
        self.ledger.load_state_dict(manifest)
        self._expected_save_id = self.ledger.last_save_id
        self._loader_state = copy.deepcopy(dict(loader_state)) if loader_state is not None else None
        if self.loader is not None and self._loader_state is not None:
            self.loader.load_state_dict(copy.deepcopy(self._loader_state))

    def close(self) -> None:
        """Close the event log (the engine is the caller's to shut down)."""
        if self.ledger.events is not None:
            self.ledger.events.close()
