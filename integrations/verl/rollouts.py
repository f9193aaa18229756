"""The trainer's half of partial rollouts for verl: the checkpointer over verl's durable servers.

verl's trainer is synchronous and its agent loops are in other processes, so this object runs the
library's :class:`~partial_rollout.RolloutCheckpointer` through its synchronous facade
(:class:`~partial_rollout.checkpoint.SyncCheckpointer`) and adds what
verl needs around the library's protocol: the TransferQueue's tags read in the frozen window
(:mod:`.reconcile`), and at a restore the samples each agent-loop client must continue, hand back
or leave alone.

A record-only run (``record_events``, flag off) uses the same object over verl's own clients
(:class:`RecordingClients`): the cuts record what verl holds and change nothing, and at a resume
each group verl re-issues from scratch is logged regenerated (:meth:`DurableRollouts.reissued`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from partial_rollout import RolloutCheckpointer
from partial_rollout.checkpoint import PendingSnapshot, RestorePolicy, SyncCheckpointer
from partial_rollout.engine import Cut
from partial_rollout.errors import SnapshotError
from partial_rollout.ledger import request_id
from partial_rollout.snapshot import GroupState, SampleState
from partial_rollout_integrations.verl.reconcile import TqView, reconcile
from partial_rollout_integrations.verl.resume_checks import check_resume
from partial_rollout_integrations.verl.servers import VerlServers
from partial_rollout_integrations.verl.wire import HeldSample, sample_key, split_key, trajectory_key

T = TypeVar("T")
logger = logging.getLogger(__name__)

RECORD_FOLDER = "ledger_{step}"
"""Folder (beside ``events.jsonl``) of a record-only run's ledger at verl's checkpoint ``global_step_N``."""
REISSUED_BY_VERL = "reissued_by_verl"
"""Regeneration reason of a group verl's own re-issue cleared and generated again at a resume."""


class RecordingClients(VerlServers):
    """verl's own clients, in its agent-loop workers, as the engine a record-only run's ledger cuts.

    Each worker hands what its :class:`~.client.RecordingLLMServerClient` noted; nothing pauses or
    changes (verl's clients are between attempts at a checkpoint: its weight sync aborted them).
    """

    def __init__(self, workers: Callable[[], Sequence[Any]]) -> None:
        """``workers``: the agent-loop workers' Ray actor handles, asked for at each cut (verl makes them later)."""
        self._workers = workers
        self.held = {}

    async def _each(self, method: str, *args: Any) -> list[Any]:
        return list(await asyncio.gather(*(getattr(w, method).remote(*args) for w in self._workers())))

    async def cut(self) -> Cut:
        self.held = {sample.key: sample for held in await self._each("recorded") for sample in held}
        return Cut(samples={request_id(*split_key(key)): sample.record for key, sample in self.held.items()})

    async def thaw(self) -> None:
        """Nothing was held back."""


class DurableRollouts:
    """The ledger of a verl run's samples and its checkpoints (see the module docstring)."""

    def __init__(
        self,
        servers: VerlServers,
        *,
        events: str | os.PathLike[str],
        n: int,
        read_tq: Callable[[], Mapping[str, Mapping[str, Any]]],
        record_only: bool = False,
    ) -> None:
        """
        Args:
            servers: the durable servers (or, recording only, verl's clients: :class:`RecordingClients`).
            events: the run's ``events.jsonl`` (appended to across restarts).
            n: samples per prompt (verl's ``actor_rollout_ref.rollout.n``).
            read_tq: returns the training partition's TransferQueue tags, key to tag.
            record_only: the ledger only records (:meth:`RolloutCheckpointer.record_only`); otherwise its
                snapshots are bound to the servers' model and vLLM.
        """
        self.servers = servers
        self.events = os.fspath(events)
        self._n = n
        self._read_tq = read_tq
        make = RolloutCheckpointer.record_only if record_only else RolloutCheckpointer
        self._sync = SyncCheckpointer(functools.partial(make, servers, events=events), name="partial-rollout-verl")
        self.checkpointer = self._sync.checkpointer
        self.restored: dict[str, HeldSample] = {}
        """Samples a restore found unfinished or not yet stored in verl's TransferQueue, by key."""
        self.stored: frozenset[str] = frozenset()
        """Keys of samples a restore found finished in verl's TransferQueue."""
        self._forget: list[str] = []

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._sync.run(coro)

    @property
    def ledger(self) -> Any:
        return self.checkpointer.ledger

    # ---------------------------------------------------------------- save

    def cut(self, folder: str, *, step: int, policy_version: int, hold: bool = False) -> PendingSnapshot:
        """Cut the servers (they hold back new requests and replies), level the ledger with the TQ, cut into
        memory, let the servers go on; write it next.

        ``hold`` keeps the servers holding back until :meth:`release`: where they generate while verl
        saves (``separate_async``), so that verl's TransferQueue save stores no sample the snapshot holds
        unfinished. Their engines decode throughout.
        """
        return self._run(self._cut(folder, step=step, policy_version=policy_version, hold=hold))

    def release(self) -> None:
        """Let the servers take requests and answer again after a :meth:`cut` with ``hold``."""
        self._run(self.servers.thaw())

    async def _cut(self, folder: str, *, step: int, policy_version: int, hold: bool) -> PendingSnapshot:
        held_on = False
        try:
            async with self.checkpointer.frozen() as window:
                tq = TqView.of(self._read_tq())
                held = self.servers.held
                self._forget = reconcile(self.ledger, held, tq, n=self._n, policy_version=policy_version, step=step)
                self.restored = {k: v for k, v in self.restored.items() if self._unfinished(k)}
                # A restored sample no server has taken up yet is still the snapshot's; a server's copy is newer.
                captured = {**self.restored, **held}
                samples = {request_id(*split_key(key)): sample.record for key, sample in captured.items()}
                pending = window.cut(folder, trainer_step=step, policy_version=policy_version, samples=samples)
            held_on = hold
            return pending
        finally:
            if not held_on:
                await self.servers.thaw()

    def _unfinished(self, key: str) -> bool:
        uid, session = split_key(key)
        if uid not in self.ledger:
            return False
        group = self.ledger[uid]
        return group.state is GroupState.IN_FLIGHT and group.samples[session].state is not SampleState.FINISHED

    def end(self, *, step: int) -> None:
        """At the end of training: level the ledger with the TQ once more and log the ``end`` event."""
        self._run(self._end(step))

    async def _end(self, step: int) -> None:
        await self.servers.cut()
        try:
            tq = TqView.of(self._read_tq())
            reconcile(self.ledger, self.servers.held, tq, n=self._n, policy_version=step, step=step)
        finally:
            await self.servers.thaw()
        # verl dispatches every sample of a prompt at once (one agent-loop task each): a sample of a
        # group still in flight when training ends was being generated, or queued for a server.
        running = {
            request_id(g.group_id, s.index)
            for g in self.ledger.groups(GroupState.IN_FLIGHT)
            for s in g.samples
            if s.state is not SampleState.FINISHED
        }
        self.ledger.record_end(step=step, running=sorted(running))

    def written(self) -> None:
        """After the checkpoint committed: the servers drop the finished samples verl now holds."""
        forget, self._forget = self._forget, []
        self._run(self.servers.forget(forget))

    # ---------------------------------------------------------------- resume

    def start(self, *, partial_rollouts: bool = True) -> None:
        """A run verl loaded no checkpoint for: a fresh start, or a resume from nothing."""
        self._run(self.checkpointer.restore(None, trainer="verl", partial_rollouts=partial_rollouts))

    def restore(
        self, folder: str, *, step: int, rollout: Mapping[str, Any], policy: RestorePolicy | None = None
    ) -> None:
        """Load the snapshot of ``folder`` and decide, per sample, what the agent loops do with it.

        ``rollout``: the run's ``actor_rollout_ref.rollout`` config; a snapshot of another run, ``n``
        or sampling is refused (:func:`.resume_checks.check_resume`) before anything is restored.
        """
        tq = TqView.of(self._read_tq())
        fits_the_run = functools.partial(check_resume, tq=tq, n=self._n, rollout=rollout)
        restore = self.checkpointer.restore(folder, policy=policy, check=fits_the_run, step=step)
        self._run(restore)
        restored: dict[str, HeldSample] = {}
        stored = set()
        for group in self.ledger.groups(GroupState.IN_FLIGHT):
            prompt = group.prompt_token_ids.tolist()
            for sample in group.samples:
                key = sample_key(group.group_id, sample.index)
                if trajectory_key(key) in tq.stored:
                    stored.add(key)
                elif sample.state is not SampleState.NOT_STARTED:
                    restored[key] = HeldSample(
                        key=key, prompt_token_ids=prompt, record=sample, continued_tokens=sample.num_tokens
                    )
        self.restored, self.stored = restored, frozenset(stored)

    def restore_record(self, folder: str, *, step: int) -> None:
        """Load a record-only run's ledger as its cut at verl's checkpoint ``step`` left it (nothing continues).

        A cut that is not there (the run before did not record) is logged as a resume from nothing,
        with a warning: recording must not stop verl's resume.
        """
        restore = self.checkpointer.restore(folder, step=step, partial_rollouts=False)
        try:
            self._run(restore)
        except SnapshotError as e:
            logger.warning("partial rollouts (record_events): %s; this resume is logged as one from nothing", e)
            self._run(self._resume_from_nothing(folder, step=step, error=str(e)))

    async def _resume_from_nothing(self, folder: str, *, step: int, error: str) -> None:
        self.ledger.record_resume(checkpoint=folder, step=step, partial_rollouts=False, error=error)

    def reissued(self, uids: Iterable[str], *, policy_version: int) -> None:
        """verl's own re-issue is about to clear these groups' trajectories and generate them again.

        Each group the ledger holds is logged regenerated (the tokens of its samples, in flight at the
        checkpoint or finished and deleted by verl, discarded) and dispatched again, as verl does.
        """
        self._run(self._reissued(list(uids), policy_version=policy_version))

    async def _reissued(self, uids: list[str], *, policy_version: int) -> None:
        for uid in uids:
            if uid in self.ledger:
                self.ledger.regenerate(uid, reason=REISSUED_BY_VERL)
                self.ledger.dispatch(uid, policy_version)

    def close(self) -> None:
        self._sync.close()
