"""What partial rollouts know about a NeMo RL run: every prompt, every engine request, and the cut.

One :class:`Session` lives in the SingleController actor, on its event loop. NeMo RL's own objects
report to it through thin wrappers (:mod:`.hooks`): the loader when it yields a prompt, the rollout
when it dispatches a group and when a sample's generation returns, the replay buffer when a group
is consumed or evicted. The session keeps those facts in the work ledger
(:class:`~partial_rollout.ledger.WorkLedger`, which writes ``events.jsonl``) and knows which engine
requests are running for which sample.

The checkpoint protocol is the library's :class:`~partial_rollout.checkpoint.RolloutCheckpointer`
(:attr:`Session.checkpointer`): its frozen window closes the gate so no new request reaches an
engine and takes the engines' cut (what this process has received of every request: no engine
pauses); then, without awaiting anything, :meth:`Session.cut` turns every sample into a record
(finished, in flight with its prefix, or not started) and cuts the ledger, in the same event-loop
turn in which NeMo RL reads its loader cursor. The gate opens before anything is written.

Ids: NeMo RL names a group attempt with a fresh uuid (a retry gets another); the ledger names the
prompt ``e<epoch>:<dataset idx>``, stable across attempts and restarts, carried in the DatumSpec
under :data:`GROUP_KEY`.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from partial_rollout.checkpoint import FrozenWindow, PendingSnapshot, RolloutCheckpointer
from partial_rollout.engine import RolloutEngine
from partial_rollout.errors import SnapshotError
from partial_rollout.ledger import TRAIN_STEP, GroupEntry, request_id
from partial_rollout.snapshot import (
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    sample_seed,
)
from partial_rollout_integrations.nemo_rl import datum as datum_codec
from partial_rollout_integrations.nemo_rl import turns
from partial_rollout_integrations.nemo_rl.config import PartialRolloutsConfig
from partial_rollout_integrations.nemo_rl.turns import TURNS_KEY, UNSAVEABLE_KEY

GROUP_KEY = "partial_rollout_group"
"""DatumSpec key holding the ledger's stable group id (added by the loader wrapper)."""
DATUM_KEY = "datum"
"""Key of the encoded DatumSpec in a group's ``data``."""
NEMO_GROUP_KEY = "nemo_group_id"
"""Key of NeMo RL's group id (the attempt's uuid) in a group's ``data``."""
TURNS_REPLAYED = "turns_replayed"
"""Event: a restored sample's turns completed before the cut were served again, not redone."""
ENV_NOT_SAVED = "environment_state_not_saved"
"""Regeneration reason of a restored group whose environment return had no stored form."""
COMMITTED_AFTER_CUT = "committed_after_cut"
"""Ready reason of a restored group NeMo RL's replay buffer holds finished while our cut does not."""
EPOCH_KEY = "loader_epoch"
"""Snapshot metadata key: the epoch the loader wrapper was in at the cut."""


@dataclass(slots=True)
class SampleContext:
    """Which sample of which group the current rollout coroutine generates, and at which turn."""

    group_id: str
    index: int
    turn: int = 0
    """Turns whose environment step is done in this attempt (replayed ones included)."""


@dataclass(slots=True)
class SampleProgress:
    """One sample's rollout in the current attempt, as much as a cut needs of it."""

    replay: list[dict[str, Any]]
    """Turns completed before the cut this attempt resumed from: served again, not redone."""
    resume: SampleRecord | None
    """The saved record of the turn in progress at that cut (continued when that turn comes)."""
    turns: list[dict[str, Any]] = field(default_factory=list)
    """Completed turns (encoded by :func:`~.turns.encode_turn`), replayed ones first."""
    last: SampleRecord | None = None
    """The last generation returned to NeMo RL."""
    stepped: bool = False
    """Whether the environment has stepped :attr:`last` (it is then the last of :attr:`turns`)."""
    done: bool = False
    """NeMo RL's rollout of this sample returned."""
    prefix: int = 0
    """Tokens continued from a saved prefix (the audit's tokens continued)."""
    unsaveable: str | None = None
    """Why a completed turn could not be saved, if one could not."""


CURRENT_SAMPLE: contextvars.ContextVar[SampleContext | None] = contextvars.ContextVar(
    "partial_rollout_sample", default=None
)
"""Set by the rollout wrapper around each sample's rollout; read by the generation backend, which
NeMo RL calls with token ids only."""


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """NeMo RL's ``policy.generation`` settings a sample's :class:`SamplingSpec` is built from."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    max_seq_len: int
    stop_token_ids: tuple[int, ...]
    stop_strings: tuple[str, ...]
    seed: int

    @classmethod
    def from_nemo(cls, generation: Mapping[str, Any], *, max_seq_len: int, seed: int) -> GenerationSettings:
        top_k = generation.get("top_k")
        return cls(
            temperature=float(generation["temperature"]),
            top_p=float(generation["top_p"]),
            top_k=-1 if top_k is None else int(top_k),
            max_new_tokens=int(generation["max_new_tokens"]),
            max_seq_len=int(max_seq_len),
            stop_token_ids=tuple(int(t) for t in generation.get("stop_token_ids") or ()),
            stop_strings=tuple(generation.get("stop_strings") or ()),
            seed=int(seed),
        )

    def sampling(
        self, group_id: str | None, index: int, prompt_len: int, stop_strings: Sequence[str] | None, turn: int = 0
    ) -> SamplingSpec:
        """One turn's sampling, as NeMo RL's vLLM worker sets it, plus a seed (none without a group)."""
        stop = tuple(dict.fromkeys([*self.stop_strings, *(stop_strings or ())]))
        return SamplingSpec(
            max_tokens=max(1, min(self.max_new_tokens, self.max_seq_len - prompt_len)),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=None if group_id is None else sample_seed(self.seed, group_id, index, turn),
            stop=stop,
            stop_token_ids=self.stop_token_ids,
            # NeMo RL keeps a matched stop string in the completion's text and tokens.
            extra={"include_stop_str_in_output": True} if stop else {},
        )


class Session:
    """The ledger of a NeMo RL run and the engine requests of its samples (one per controller actor)."""

    def __init__(
        self,
        config: PartialRolloutsConfig,
        *,
        events_path: str,
        settings: GenerationSettings,
        group_size: int,
        engine: RolloutEngine | None,
    ) -> None:
        self.config = config
        # Flag off (record_events), or no engine of ours: the ledger only records, bound to no model.
        make = RolloutCheckpointer if config.enabled and engine is not None else RolloutCheckpointer.record_only
        self.checkpointer = make(engine, events=events_path)
        """The checkpoint protocol: the gate to the engines, the frozen window, the restore."""
        self.ledger = self.checkpointer.ledger
        self.settings = settings
        self.group_size = group_size
        self.engine = engine
        self.epoch = 0
        """The loader epoch group ids are minted in (kept by the loader wrapper)."""
        self.policy_version = 0
        self._nemo_ids: dict[str, str] = {}
        """NeMo RL group id (an attempt's uuid) -> our group id."""
        self._progress: dict[tuple[str, int], SampleProgress] = {}
        """Samples of dispatched groups that have not finished, by (group id, index)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.restored: dict[str, GroupEntry] = {}
        """Groups restored from a snapshot that have not been dispatched again yet."""
        self._started = time.perf_counter()
        self._last_step: tuple[float, float] = (self._started, 0.0)

    # ---------------------------------------------------------------- the loader

    def on_yield(self, group_id: str, datum: Mapping[str, Any]) -> None:
        """A prompt the loader just yielded: a pending group (its DatumSpec kept to dispatch it again)."""
        prompt = datum_codec.prompt_token_ids(datum)
        stop = datum.get("stop_strings")
        samplings = [self.settings.sampling(group_id, i, len(prompt), stop) for i in range(self.group_size)]
        encoded = datum_codec.encode(dict(datum), field=f"group {group_id}: DatumSpec")
        self.ledger.yield_group(group_id, prompt, samplings, data={DATUM_KEY: encoded})

    # ---------------------------------------------------------------- the rollout

    def on_dispatch(self, group_id: str, nemo_group_id: str | None) -> None:
        """NeMo RL starts rolling out ``group_id`` (a first attempt, a retry, or a restored group)."""
        group = self.ledger[group_id]
        if group_id in self.restored:
            del self.restored[group_id]  # restored in flight: its samples continue, nothing to redo
            self._continue(group)
        elif group.state is not GroupState.PENDING:
            self._forget_samples(group_id)
            self.ledger.regenerate(group_id, reason="retry")
        if group.state is GroupState.PENDING:
            self.ledger.dispatch(group_id, self.policy_version)
        if nemo_group_id is not None:
            self._nemo_ids[nemo_group_id] = group_id
            self.ledger.set_data(group_id, {**group.data, NEMO_GROUP_KEY: nemo_group_id})

    def _continue(self, group: GroupEntry) -> None:
        """A restored in-flight group is dispatched again: each sample replays its turns, then continues."""
        saved_turns = group.data.get(TURNS_KEY, {})
        for sample in group.samples:
            replay = list(saved_turns.get(str(sample.index), []))
            resume = None if sample.state is SampleState.NOT_STARTED else sample
            self._progress[(group.group_id, sample.index)] = SampleProgress(replay=replay, resume=resume)

    def start_sample(self, ctx: SampleContext) -> None:
        """NeMo RL's rollout of one sample starts (its first attempt, a retry, or a restored sample)."""
        self._loop = asyncio.get_running_loop()
        key = (ctx.group_id, ctx.index)
        if key not in self._progress:
            self._progress[key] = SampleProgress(replay=[], resume=None)

    async def generate(
        self, ctx: SampleContext, prompt_token_ids: Sequence[int], stop_strings: Sequence[str] | None
    ) -> SampleRecord:
        """Generate (or continue, or replay) the current turn of one sample; returns its finished record."""
        progress = self._progress[(ctx.group_id, ctx.index)]
        if ctx.turn < len(progress.replay):  # completed before the cut: served from the snapshot
            where = f"group {ctx.group_id} sample {ctx.index} turn {ctx.turn}"
            progress.last = turns.turn_record(progress.replay[ctx.turn], ctx.index, field=where)
            progress.stepped = False
            return progress.last
        resume_from, progress.resume = progress.resume, None
        if resume_from is not None:
            sampling = resume_from.sampling
        else:
            sampling = self.settings.sampling(ctx.group_id, ctx.index, len(prompt_token_ids), stop_strings, ctx.turn)
        # Gated: a request waits while a checkpoint's window is frozen, and starts after it.
        record = await self.checkpointer.generate(
            ctx.group_id, ctx.index, prompt_token_ids, sampling, resume_from=resume_from
        )
        # Continued tokens: a saved prefix the engine went on from. A turn saved finished (generated,
        # not yet stepped at the cut) is kept whole, not continued.
        if resume_from is not None and resume_from.state is SampleState.IN_FLIGHT:
            progress.prefix += resume_from.num_tokens
        progress.last, progress.stepped = record, False
        return record

    def turn_of(self, group_id: str, index: int) -> int:
        """Turns a sample has completed in this attempt (0 before its first environment step)."""
        progress = self._progress.get((group_id, index))
        return 0 if progress is None else len(progress.turns)

    def rolling_out(self) -> list[str]:
        """The request ids of samples whose rollout is under way (generating or in an environment step)."""
        return [request_id(g, i) for (g, i), p in self._progress.items() if not p.done]

    def saved_env_return(self, ctx: SampleContext) -> dict[str, Any] | None:
        """The saved environment step of the current turn, if it was completed before the cut."""
        progress = self._progress[(ctx.group_id, ctx.index)]
        return progress.replay[ctx.turn] if ctx.turn < len(progress.replay) else None

    def on_env_step(self, ctx: SampleContext, env_return: Any) -> None:
        """The environment stepped the current turn (or its saved step was replayed): the turn is complete.

        It runs on the loop after the step returned in its worker thread (:meth:`call_on_loop`): by then
        NeMo RL may have aborted the group, or the run ended, and the sample is no longer followed.
        """
        progress = self._progress.get((ctx.group_id, ctx.index))
        if progress is None:
            return
        assert progress.last is not None and not progress.stepped, "an environment step without a generation"
        if ctx.turn < len(progress.replay):
            progress.turns.append(progress.replay[ctx.turn])
            if ctx.turn + 1 == len(progress.replay):
                self.ledger.log(TURNS_REPLAYED, prompt=ctx.group_id, sample=ctx.index, turns=len(progress.replay))
        elif progress.unsaveable is None:
            try:
                progress.turns.append(
                    turns.encode_turn(progress.last, env_return, field=f"group {ctx.group_id} sample {ctx.index}")
                )
            except SnapshotError as e:
                progress.unsaveable = str(e)
        progress.stepped = True
        ctx.turn += 1

    def call_on_loop(self, callback: Any, *args: Any) -> None:
        """Run ``callback(*args)`` on the session's event loop, from a worker thread (an environment step)."""
        assert self._loop is not None, "no sample has started"
        self._loop.call_soon_threadsafe(callback, *args)

    def on_sample_done(self, ctx: SampleContext) -> None:
        """NeMo RL's rollout of the sample returned its completion."""
        self._progress[(ctx.group_id, ctx.index)].done = True

    def on_group_done(self, group_id: str, rewards: Sequence[float]) -> None:
        """Every sample of the group was generated and scored: it is ready for NeMo RL's buffer."""
        progresses = {index: self._progress.pop((group_id, index)) for index in range(len(rewards))}
        # Its turns stay with it: a group finished here but not in NeMo RL's buffer at a cut is replayed.
        self.ledger.set_data(group_id, _with_turns(self.ledger[group_id].data, progresses))
        for index, reward in enumerate(rewards):
            last = progresses[index].last
            assert last is not None, "a finished sample without a generation"
            sample = replace(last, reward=float(reward))
            self.ledger.finish(group_id, sample, prefix_tokens=progresses[index].prefix, settle=False)
        ready = self.ledger.settle(group_id)
        assert ready, "every sample of a done group is finished"

    def on_abort(self, group_id: str, reason: str) -> None:
        """NeMo RL cancelled the group's rollout (a stale abort at a weight sync): it drops the prompt."""
        self._forget_samples(group_id)
        if group_id in self.ledger:
            self.ledger.evict(group_id, reason=reason)

    def _forget_samples(self, group_id: str) -> None:
        for key in [k for k in self._progress if k[0] == group_id]:
            del self._progress[key]

    def on_train_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        """NeMo RL logged a training step's metrics: the reward curve of the event log."""
        now = time.perf_counter()
        tokens = float(metrics.get("total_num_tokens", 0.0))
        last_time, _ = self._last_step
        self._last_step = (now, tokens)
        self.ledger.log(
            TRAIN_STEP,
            step=step,
            reward=round(float(metrics["reward"]), 4),
            tokens_per_s=round(tokens / max(now - last_time, 1e-6), 1),
            elapsed_s=round(now - self._started, 3),
        )

    # ---------------------------------------------------------------- the replay buffer

    def on_buffer_remove(self, nemo_group_ids: Sequence[str], *, consumed: bool, step: int) -> None:
        """Groups left NeMo RL's buffer: selected for training (``consumed``) or evicted as stale."""
        for nemo_id in nemo_group_ids:
            group_id = self._nemo_ids.pop(nemo_id, None)
            if group_id is None or group_id not in self.ledger:
                continue  # a group of ours only if we saw it dispatched (or restored it)
            if consumed:
                self.ledger.consume([group_id], step=step)
            else:
                self.ledger.evict(group_id, reason="stale")

    # ---------------------------------------------------------------- checkpoint

    def cut(
        self, window: FrozenWindow, folder: str | os.PathLike[str], *, trainer_step: int, policy_version: int
    ) -> PendingSnapshot:
        """Cut a frozen window with every sample as it stands now (call in the freeze's turn, no await).

        A sample's turn in progress is, at this instant, exactly one of: running on an engine (the
        cut holds its prefix), generated and returned to NeMo RL but not stepped by the environment
        yet, or rolled out to its end (either way its record is kept whole: the resume steps the
        environment again or replays it), or not submitted (not started). Its completed turns go into
        its group's ``data``.
        """
        assert window.engine_cut is not None, "a window with the engines' cut"
        running = self.checkpointer.running
        samples = {rid: record for rid, record in window.engine_cut.samples.items() if rid in running}
        by_group: dict[str, dict[int, SampleProgress]] = {}
        for (group_id, index), progress in self._progress.items():
            by_group.setdefault(group_id, {})[index] = progress
            rid = request_id(group_id, index)
            if rid not in running and progress.last is not None and (progress.done or not progress.stepped):
                samples[rid] = progress.last
        for group in self.ledger.groups(GroupState.IN_FLIGHT):
            self.ledger.set_data(group.group_id, _with_turns(group.data, by_group.get(group.group_id, {})))
        return window.cut(
            folder,
            trainer_step=trainer_step,
            policy_version=policy_version,
            metadata=self.metadata(),
            samples=samples,
        )

    def metadata(self) -> dict[str, Any]:
        """What a snapshot keeps of the session itself."""
        return {EPOCH_KEY: self.epoch}

    # ---------------------------------------------------------------- resume

    def restore(
        self, snapshot: Snapshot, *, in_nemo_buffer: Sequence[str], redispatch: bool = True
    ) -> list[dict[str, Any]]:
        """Take back a loaded snapshot's groups; returns the DatumSpecs to dispatch again, in yield order.

        ``in_nemo_buffer`` are the NeMo RL group ids NeMo RL restored into its own replay buffer:
        those groups are trained from there (a group committed after our cut but before NeMo RL read
        its buffer is in both; NeMo RL's finished copy wins). Every other group is dispatched
        again through NeMo RL's pump: pending ones from scratch, in-flight ones continuing their
        samples (finished samples return at once, unfinished ones continue their prefixes).
        Without ``redispatch`` (a record-only run) only the buffer's groups are taken back.
        """
        self.epoch = int(snapshot.metadata.get(EPOCH_KEY, 0))
        in_buffer = set(in_nemo_buffer)
        again: list[dict[str, Any]] = []
        for group in self.ledger.groups():
            nemo_id = group.data.get(NEMO_GROUP_KEY)
            if nemo_id in in_buffer:
                self._nemo_ids[nemo_id] = group.group_id
                # Finished and committed between the cut and NeMo RL's read of its buffer, if not ready here.
                self.ledger.adopt_ready(group.group_id, reason=COMMITTED_AFTER_CUT)
                continue
            if not redispatch:
                continue
            if group.state is GroupState.READY:
                self.ledger.reopen(group.group_id)  # finished here but not in NeMo RL's buffer: commit it again
            if group.state is GroupState.IN_FLIGHT and UNSAVEABLE_KEY in group.data:
                why = "; ".join(group.data[UNSAVEABLE_KEY].values())
                self.ledger.regenerate(group.group_id, reason=f"{ENV_NOT_SAVED}: {why}")
            datum = datum_codec.decode(group.data[DATUM_KEY], field=f"group {group.group_id}: DatumSpec")
            datum[GROUP_KEY] = group.group_id
            if group.state is GroupState.IN_FLIGHT:
                self.restored[group.group_id] = group
            again.append(datum)
        return again


def _with_turns(data: Mapping[str, Any], progresses: Mapping[int, SampleProgress]) -> dict[str, Any]:
    """A group's ``data`` holding its samples' completed turns (and why any could not be kept)."""
    data = {k: v for k, v in data.items() if k not in (TURNS_KEY, UNSAVEABLE_KEY)}
    saved = {str(i): list(p.turns) for i, p in progresses.items() if p.turns}
    unsaveable = {str(i): p.unsaveable for i, p in progresses.items() if p.unsaveable is not None}
    if saved:
        data[TURNS_KEY] = saved
    if unsaveable:
        data[UNSAVEABLE_KEY] = unsaveable
    return data
