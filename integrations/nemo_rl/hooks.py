"""Thin wrappers around NeMo RL's loader, rollout, replay buffer and checkpointer that report to a session.

Each wrapper adds reporting (and, for the rollout, the sample's identity) and otherwise calls NeMo
RL's own method; none re-implements NeMo RL's logic. The replay buffer and the checkpoint manager
are built inside NeMo RL's set-up, so their instances get a subclass by ``__class__`` assignment
(same attributes, a few methods extended) instead of being rebuilt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from nemo_rl.algorithms.async_utils.replay_buffer import TQReplayBuffer
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.experience.interfaces import PromptGroupRecord
from nemo_rl.experience.rollout_manager import AsyncRolloutImpl
from nemo_rl.utils.checkpoint import CheckpointManager

from partial_rollout_integrations.nemo_rl import turns
from partial_rollout_integrations.nemo_rl.session import CURRENT_SAMPLE, GROUP_KEY, SampleContext, Session

ABORTED_STALE = "aborted_stale_in_flight"
"""Eviction reason of a group NeMo RL cancelled at a weight sync (its sampler would never select it)."""


class LedgerLoader:
    """NeMo RL's ``StatefulDataLoader`` that names and reports each prompt, and yields restored ones first.

    The cursor (``state_dict``) is the wrapped loader's: restored prompts are yielded from the
    snapshot, never drawn from the loader again, so none is skipped and none repeated.
    """

    def __init__(self, loader: Any, session: Session) -> None:
        self._loader = loader
        self._session = session
        self._restored: list[dict[str, Any]] = []

    def restore(self, datums: Sequence[dict[str, Any]]) -> None:
        """Yield these prompts (restored from a snapshot, ids already set) before the loader's next batch."""
        self._restored = list(datums)

    def __iter__(self) -> Iterator[BatchedDataDict[Any]]:
        if self._restored:
            datums, self._restored = self._restored, []
            yield BatchedDataDict({key: [d[key] for d in datums] for key in datums[0]})
        for batch in self._loader:
            ids = [f"e{self._session.epoch}:{int(i)}" for i in batch["idx"]]
            batch[GROUP_KEY] = ids
            for i, group_id in enumerate(ids):
                self._session.on_yield(group_id, {key: values[i] for key, values in batch.items()})
            yield batch
        self._session.epoch += 1

    def __len__(self) -> int:
        return len(self._loader)

    def state_dict(self) -> dict[str, Any]:
        return dict(self._loader.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._loader.load_state_dict(state)


class LedgerRollout(AsyncRolloutImpl):  # type: ignore[misc]
    """NeMo RL's native rollout, telling the session which group and sample each generation is for."""

    _session: Session
    _inflight: Mapping[str, tuple[asyncio.Task[None], int]]

    @classmethod
    def wrap(
        cls, impl: AsyncRolloutImpl, session: Session, inflight: Mapping[str, tuple[asyncio.Task[None], int]]
    ) -> LedgerRollout:
        """``impl`` with the same state, reporting to ``session``; ``inflight`` is the controller's
        registry of group attempts (NeMo RL group id -> task), which names the current attempt."""
        wrapped: LedgerRollout = cls.__new__(cls)
        wrapped.__dict__.update(impl.__dict__)
        wrapped._session = session
        wrapped._inflight = inflight
        wrapped._task_to_env = {name: RecordedEnvironment(env, session) for name, env in impl._task_to_env.items()}
        return wrapped

    def _nemo_group_id(self) -> str | None:
        task = asyncio.current_task()
        return next((gid for gid, (t, _) in self._inflight.items() if t is task), None)

    async def run_rollout(self, input_sample: Any) -> PromptGroupRecord:
        group_id = input_sample[GROUP_KEY]
        self._session.on_dispatch(group_id, self._nemo_group_id())
        try:
            record: PromptGroupRecord = await super().run_rollout(input_sample)
        except asyncio.CancelledError:
            self._session.on_abort(group_id, ABORTED_STALE)
            raise
        self._session.on_group_done(group_id, [c.reward for c in record.completions])
        return record

    async def _run_single_rollout(self, input_sample: Any, traj_idx: int) -> Any:
        ctx = SampleContext(input_sample[GROUP_KEY], traj_idx)
        CURRENT_SAMPLE.set(ctx)
        self._session.start_sample(ctx)
        result = await super()._run_single_rollout(input_sample, traj_idx)
        self._session.on_sample_done(ctx)
        return result


class RecordedEnvironment:
    """A NeMo RL environment actor whose steps the session records per turn, and replays after a resume.

    NeMo RL's rollout steps the environment through ``calculate_rewards`` in a worker thread (which
    carries the rollout's context, so :data:`CURRENT_SAMPLE` names the sample) as
    ``env.step.remote(...)`` followed by ``ray.get``. A step of a turn completed before the cut is
    answered from the snapshot without calling the environment; any other is the environment's own,
    recorded on the event loop before the rollout sees it. Other attributes are the actor's.
    """

    def __init__(self, env: Any, session: Session) -> None:
        self._env = env
        self.step = _Step(env, session)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class _Step:
    def __init__(self, env: Any, session: Session) -> None:
        self._env = env
        self._session = session

    def remote(self, message_logs: Any, infos: Any) -> Any:
        import ray
        from nemo_rl.environments.interfaces import EnvironmentReturn

        env, session = self._env, self._session
        ctx = CURRENT_SAMPLE.get()
        if ctx is None:
            return env.step.remote(message_logs, infos)
        saved = session.saved_env_return(ctx)
        if saved is not None:
            field = f"group {ctx.group_id} sample {ctx.index} turn {ctx.turn}"
            result = turns.env_return(saved, EnvironmentReturn, field=field)
            ref = ray.put(result)
        else:
            ref = env.step.remote(message_logs, infos)
            result = ray.get(ref)
        session.call_on_loop(session.on_env_step, ctx, result)
        return ref


class LedgerReplayBuffer(TQReplayBuffer):  # type: ignore[misc]
    """NeMo RL's replay buffer, telling the session when a group is taken for training or evicted."""

    _session: Session
    _step: Callable[[], int]

    @classmethod
    def adopt(cls, buffer: TQReplayBuffer, session: Session, step: Callable[[], int]) -> None:
        buffer.__class__ = cls
        buffer._session = session
        buffer._step = step

    async def remove(self, idxs: list[int], remove_in_dp: bool) -> int:
        # Ready slots leave either for training (the sampler's selection keeps their rows) or as
        # stale (eviction clears them); unready slots are failed attempts being cleaned up.
        ready = [self._group_ids[i] for i in idxs if self.ready_list[i]]
        removed: int = await super().remove(idxs, remove_in_dp)
        self._session.on_buffer_remove(ready, consumed=not remove_in_dp, step=self._step())
        return removed


class SnapshotCheckpointManager(CheckpointManager):  # type: ignore[misc]
    """NeMo RL's checkpoint manager, writing our snapshot into ``tmp_step_N`` before the rename commits it.

    The write runs in NeMo RL's finalisation thread (off the event loop, after the engines resumed);
    if it fails, the folder is never renamed, NeMo RL raises at the next save or at exit, and the
    previous checkpoint stays the latest.
    """

    _before_commit: Callable[[str], None] | None

    @classmethod
    def adopt(cls, manager: CheckpointManager) -> SnapshotCheckpointManager:
        manager.__class__ = cls
        manager._before_commit = None
        assert isinstance(manager, SnapshotCheckpointManager)
        return manager

    def begin_finalization(self, checkpoint_path: Any, wait_fn: Callable[[], None] | None = None) -> None:
        write, self._before_commit = self._before_commit, None
        if write is None:
            super().begin_finalization(checkpoint_path, wait_fn)
            return

        def wait_then_write() -> None:
            if wait_fn is not None:
                wait_fn()
            write(str(checkpoint_path))

        super().begin_finalization(checkpoint_path, wait_then_write)
