"""The async GRPO loop, shaped like NeMo RL's SingleController: a rollout pump, a train pump, permits.

**Rollout pump.** Iterates a torchdata ``StatefulDataLoader`` in batches of
``grpo.num_prompts_per_step``. Each yielded prompt enters the work ledger as a pending group at
once (the cursor is already past it); then, prompt by prompt, the pump takes one replay-buffer
permit (``async_rl.max_buffered_rollouts``) and one in-flight permit (``async_rl.max_inflight_prompts``)
and dispatches the group's samples to the engine.

**Train pump.** Evicts ready groups older than the window (``async_rl.sampler.max_staleness_versions``,
reason ``too_stale``), takes the oldest ``num_prompts_per_step`` ready groups in the window (freeing
their buffer permits), runs one GRPO update, exports the weights and pushes them into the running
engine (requests in flight continue under them; vLLM labels each token with its policy version),
and checkpoints every ``checkpointing.save_period`` steps.

**Checkpoint.** The library's :class:`~partial_rollout.checkpoint.RolloutCheckpointer` owns the
protocol: with ``checkpointing.partial_rollouts.enabled`` its ``save`` takes the engine's cut (what
this process has received of every request: the engine is never paused) and, in the same
await-free window, reads the loader cursor and cuts every outstanding group (pending, in flight
with their prefixes, partly finished, ready) into memory; the pending write is encoded, fsynced and
committed in a thread, so no request waits for the disk (``gate_ms`` in the ``save`` event: how
long new requests waited for the window; the write time in ``save_written``). A write that fails
(disk full, a writer error) leaves the previous checkpoint as it was: the half-written folder is
removed, ``save_failed`` is logged, and training goes on with its
in-memory state untouched (the cut held copies), so the next save is whole. Off, it does what
NeMo RL does: the live cursor plus the ready groups only, so in-flight and yielded-but-undispatched
prompts are lost on resume.

**Logged for audits** besides the ledger's events: every weight update (``weight_update``: the
version that went live and each running request's token count just before the update was asked
for and just after it returned, so every token's version can be checked against when it was
sampled), and at the end of a process the engine's own token counts (``engine_progress``).

**Resume.** The checkpointer's ``restore`` loads the cut: ready groups go back to the buffer,
in-flight samples continue from their prefixes (its ``rollout``), pending prompts are dispatched
before any new loader batch,
and every restored group re-takes its permits so the counts stay balanced. Work dispatched too long
ago is handled by ``checkpointing.partial_rollouts.on_stale``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import Any, cast

import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from tqdm import tqdm

from partial_rollout.checkpoint import RolloutCheckpointer
from partial_rollout.engine import RolloutEngine
from partial_rollout.errors import ConfigError
from partial_rollout.ledger import ENGINE_FAILOVER, EVENTS_FILENAME, TRAIN_STEP, EventLog, GroupEntry, WorkLedger
from partial_rollout.pool import EnginePool, NoEngineLeftError
from partial_rollout.snapshot import Fingerprints, GroupState, SampleRecord
from partial_rollout_integrations.config_block import restore_policy
from partial_rollout_integrations.reference_grpo import checkpoint, task
from partial_rollout_integrations.reference_grpo.config import MasterConfig
from partial_rollout_integrations.reference_grpo.policy import Policy

logger = logging.getLogger(__name__)

WEIGHT_UPDATE = "weight_update"
"""``kind`` of the ``log`` event written at every weight update (``version``, ``tokens_before``,
``tokens_after``: each running request's engine token count around the update)."""
ENGINE_PROGRESS = "engine_progress"
"""``kind`` of the ``log`` event written when training ends (``tokens_received``: every token this
process's engine produced; ``live_tokens``: those of requests still running, by request id)."""


class GRPOLoop:
    """One process's run of the loop, from a fresh start or a checkpoint."""

    def __init__(
        self,
        config: MasterConfig,
        *,
        engine: RolloutEngine,
        policy: Policy,
        ledger: WorkLedger,
        fingerprints: Fingerprints,
        step: int,
        progress: bool,
    ) -> None:
        self.config = config
        self.engine = engine
        self.policy = policy
        self.ledger = ledger
        self.step = step
        self.version = step
        self.epoch = 0
        self.checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
        self.weights_dir = Path(config.logger.log_dir) / "weights"
        self.dataset = task.BucketTask(config.data, seed=config.grpo.seed)
        self.loader = StatefulDataLoader(
            self.dataset,
            batch_size=config.grpo.num_prompts_per_step,
            shuffle=config.data.shuffle,
            generator=torch.Generator().manual_seed(config.grpo.seed),
            collate_fn=task.collate,
            drop_last=True,
        )
        self.rollouts = RolloutCheckpointer(engine, ledger=ledger, loader=self.loader, fingerprints=fingerprints)
        """The checkpoint protocol: cuts, restores, and runs samples (continuing saved prefixes)."""
        self.buffer_permits = asyncio.Semaphore(config.async_rl.max_buffered_rollouts)
        self.inflight_permits = asyncio.Semaphore(config.async_rl.max_inflight_prompts)
        self.rollout_permitted = asyncio.Event()
        self.rollout_permitted.set()
        self.ready_changed = asyncio.Event()
        self.rollout_done = False
        self.restored_pending: list[str] = []
        self.restored_in_flight: list[str] = []
        self.generated_tokens = 0
        self.started = time.perf_counter()
        self.rewards: list[float] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._group: asyncio.TaskGroup | None = None
        self._bar = tqdm(total=config.grpo.max_num_steps, initial=step, desc="train", unit="step", disable=not progress)

    # ---------------------------------------------------------------- resume

    async def restore(self, folder: Path | None) -> None:
        """Load the checkpointer's cut and re-take every permit the restored work holds; ``None``: nothing
        to resume (a fresh run, or a resumed one killed before its first checkpoint).

        None blocks: nothing else holds one yet."""
        partial = self.config.checkpointing.partial_rollouts
        oldest = self.version - self.config.async_rl.sampler.max_staleness_versions
        restored = await self.rollouts.restore(
            folder,
            policy=restore_policy(partial),
            is_stale=lambda group: group.dispatch_version < oldest,
            step=self.step,
            partial_rollouts=partial.enabled,
            config=self.config.to_json(),
        )
        if restored.snapshot is None:
            return
        self.epoch = int(restored.snapshot.metadata.get("epoch", 0))
        held = len(restored.in_flight) + len(restored.ready)
        if held > self.config.async_rl.max_buffered_rollouts:
            raise ConfigError(
                f"the checkpoint holds {held} dispatched groups, more than max_buffered_rollouts "
                f"{self.config.async_rl.max_buffered_rollouts}",
                field="async_rl.max_buffered_rollouts",
                fix="Resume with at least the capacity the run was saved with",
            )
        if len(restored.in_flight) > self.config.async_rl.max_inflight_prompts:
            raise ConfigError(
                f"the checkpoint holds {len(restored.in_flight)} groups in flight, more than max_inflight_prompts "
                f"{self.config.async_rl.max_inflight_prompts}",
                field="async_rl.max_inflight_prompts",
                fix="Resume with at least the in-flight limit the run was saved with",
            )
        for _ in range(held):
            await self.buffer_permits.acquire()
        for _ in restored.in_flight:
            await self.inflight_permits.acquire()
        self.restored_in_flight = restored.in_flight
        self.restored_pending = restored.pending

    # ---------------------------------------------------------------- the run

    async def run(self) -> dict[str, Any]:
        lost: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                if self.step >= self.config.grpo.max_num_steps:
                    # A resume from the last step's checkpoint: its work stays saved there, outstanding.
                    logger.warning(
                        "step %d is grpo.max_num_steps: nothing left to train (raise it to train on)", self.step
                    )
                else:
                    for group_id in self.restored_in_flight:
                        self._spawn(self._generate(group_id))
                    self._spawn(self._rollout_pump())
                await self._train_pump()
                progress = await self.engine.progress()
                for t in list(self._tasks):
                    t.cancel()
            self.ledger.log(ENGINE_PROGRESS, tokens_received=progress.tokens_received, live_tokens=progress.live_tokens)
        except* NoEngineLeftError as stopped:
            lost = stopped.exceptions[0]
        finally:
            self._bar.close()
        if isinstance(lost, NoEngineLeftError):
            await self._stop_without_engines(lost)
        # Restored continuations may still be running: the run stops at its last step without waiting for them.
        left = self.engine.live_engines if isinstance(self.engine, EnginePool) else None
        self.rollouts.end(step=self.step, running=progress.live_tokens, engines_left=left)
        return {
            "step": self.step,
            "rewards": self.rewards,
            "counters": dict(self.ledger.counters),
            "evicted_by_reason": dict(self.ledger.evicted_by_reason),
        }

    def _spawn(self, coro: Any) -> None:
        assert self._group is not None
        t = self._group.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ---------------------------------------------------------------- rollout pump

    async def _rollout_pump(self) -> None:
        for group_id in self.restored_pending:
            await self._admit(group_id)
        while self.epoch < self.config.grpo.max_num_epochs:
            for batch in self.loader:
                # The cursor is past the whole batch now: every prompt of it is in the ledger before any await.
                ids = [self._yield(item) for item in batch]
                for group_id in ids:
                    await self._admit(group_id)
            self.epoch += 1
        self.rollout_done = True
        self.ready_changed.set()

    def _yield(self, item: dict[str, Any]) -> str:
        group_id = f"e{self.epoch}:{item['index']}"
        cfg = self.config
        specs = task.sampling_specs(
            item,
            group_id,
            n=cfg.grpo.num_generations_per_prompt,
            temperature=cfg.generation.temperature,
            seed=cfg.grpo.seed,
            min_tokens=cfg.data.min_tokens,
        )
        self.rollouts.yield_group(group_id, item["prompt_token_ids"], specs, data=item)
        return group_id

    async def _admit(self, group_id: str) -> None:
        await self.buffer_permits.acquire()
        await self.inflight_permits.acquire()
        await self.rollout_permitted.wait()
        self.rollouts.dispatch(group_id, policy_version=self.version)
        self._spawn(self._generate(group_id))

    async def _generate(self, group_id: str) -> None:
        outcomes = await self.rollouts.rollout(group_id, reward=self._reward)
        self.generated_tokens += sum(o.generated_tokens for o in outcomes)
        self.inflight_permits.release()
        self.ready_changed.set()

    def _reward(self, group: GroupEntry, record: SampleRecord) -> float:
        data = self.config.data
        return task.reward(group.data, record.token_ids, num_buckets=data.num_buckets, reward_tokens=data.reward_tokens)

    # ---------------------------------------------------------------- train pump

    async def _train_pump(self) -> None:
        cfg = self.config
        n = cfg.grpo.num_prompts_per_step
        last_time, last_tokens = time.perf_counter(), self.generated_tokens
        while self.step < cfg.grpo.max_num_steps:
            self._evict_stale()
            ready = list(self.ledger.groups(GroupState.READY))
            if len(ready) < n:
                if self.rollout_done and not any(self.ledger.groups(GroupState.IN_FLIGHT, GroupState.PENDING)):
                    logger.warning("the data ran out at step %d of %d", self.step, cfg.grpo.max_num_steps)
                    return
                self.ready_changed.clear()
                await self.ready_changed.wait()
                continue
            groups = self.rollouts.consume([g.group_id for g in ready[:n]], step=self.step + 1)
            for _ in groups:
                self.buffer_permits.release()
            metrics = await asyncio.to_thread(self.policy.train_step, groups)
            self.step += 1
            await self.sync_weights()
            now = time.perf_counter()
            rewards = [cast(float, s.reward) for g in groups for s in g.samples]  # ready groups: all rewarded
            reward = sum(rewards) / len(rewards)
            self.rewards.append(reward)
            self.ledger.log(
                TRAIN_STEP,
                step=self.step,
                reward=round(reward, 4),
                oldest_version=min(int(s.versions.min()) for g in groups for s in g.samples),
                tokens_per_s=round((self.generated_tokens - last_tokens) / max(now - last_time, 1e-6), 1),
                elapsed_s=round(now - self.started, 3),
                **{k: round(v, 5) for k, v in metrics.items()},
            )
            last_time, last_tokens = now, self.generated_tokens
            self._bar.update(1)
            self._bar.set_postfix(reward=f"{reward:.2f}")
            ckpt = cfg.checkpointing
            if ckpt.enabled and (self.step % ckpt.save_period == 0 or self.step == cfg.grpo.max_num_steps):
                await self._save()

    def _evict_stale(self) -> None:
        oldest = self.version - self.config.async_rl.sampler.max_staleness_versions
        for group in list(self.ledger.groups(GroupState.READY)):
            if group.dispatch_version < oldest:
                self.rollouts.evict(group.group_id, reason="too_stale")
                self.buffer_permits.release()

    async def sync_weights(self) -> None:
        """Export the new weights and load them into the running engine, as NeMo RL's refit does."""
        self.rollout_permitted.clear()
        try:
            folder = await asyncio.to_thread(self.policy.export_for_engine, self.weights_dir / f"v{self.step}")
            before = await self.engine.progress()
            await self.engine.update_weights(str(folder), self.step)
            after = await self.engine.progress()
            self.ledger.log(
                WEIGHT_UPDATE, version=self.step, tokens_before=before.live_tokens, tokens_after=after.live_tokens
            )
            self.version = self.step
            stale = self.weights_dir / f"v{self.step - 1}"
            if stale.exists():
                shutil.rmtree(stale)
        finally:
            self.rollout_permitted.set()

    # ---------------------------------------------------------------- checkpoint

    async def _stop_without_engines(self, lost: NoEngineLeftError) -> None:
        """Every engine died: save what this process holds (each request's tokens received), then stop."""
        saved = "checkpointing is off: nothing saved"
        if self.config.checkpointing.enabled:
            saved = (
                f"saved checkpoint step_{self.step} with every prompt in flight and the tokens received"
                if await self._save()
                else f"checkpoint step_{self.step} could not be written (see the log)"
            )
        raise NoEngineLeftError(
            f"training stopped at step {self.step}, every engine has died ({lost}); {saved}."
            " Resume it with --resume once engines run again",
            lost.record,
        ) from lost

    async def _save(self) -> bool:
        """Take a checkpoint; ``False`` when it could not be written (the run goes on from the previous one)."""
        folder = checkpoint.begin(self.checkpoint_dir, self.step)
        await asyncio.to_thread(self.policy.save, folder / checkpoint.POLICY_DIR)
        checkpoint.write_training_info(
            folder,
            {
                "current_step": self.step,
                "policy_version": self.version,
                "current_epoch": self.epoch,
                "consumed_samples": self.ledger.counters["consumed"],
                "sampler_name": self.config.async_rl.sampler.name,
            },
        )
        # Off: what NeMo RL saves, the live cursor and the ready groups; pending and in-flight prompts are not saved.
        keep = set(GroupState) if self.config.checkpointing.partial_rollouts.enabled else {GroupState.READY}
        pending = await self.rollouts.save(
            folder, trainer_step=self.step, policy_version=self.version, states=keep, metadata={"epoch": self.epoch}
        )
        try:
            await asyncio.to_thread(pending.write, commit=lambda: checkpoint.commit(folder))
        except Exception as exc:  # anything the writer or the disk raises: the run goes on, the last checkpoint stays
            logger.error("checkpoint of step %d not written, the previous one stays: %s", self.step, exc)
            await asyncio.to_thread(checkpoint.discard, folder)
            return False
        return True


async def run_training(
    config: MasterConfig, *, resume: bool = False, engine: RolloutEngine | None = None, progress: bool = True
) -> dict[str, Any]:
    """Train with ``config``; ``resume`` continues from the latest complete checkpoint (if any).

    Args:
        config: the checked configuration.
        resume: continue from ``checkpointing.checkpoint_dir``'s latest ``step_N``; without it, a
            folder that already holds checkpoints is refused rather than mixed with a new run.
        engine: an engine to use instead of starting the resumable vLLM engine (it must be able to
            capture when partial rollouts are on).
        progress: show a progress bar.

    Returns:
        A summary: final step, reward per step, ledger counters.
    """
    from partial_rollout.engine import EngineConfig
    from partial_rollout.models import TinyModelSpec, build_tiny_model
    from partial_rollout.pool import connect_ray

    if engine is not None and not isinstance(engine, RolloutEngine):
        # Reachable from untyped callers: the annotation promises a RolloutEngine, this checks it at run time.
        missing = [m for m in dir(RolloutEngine) if not m.startswith("_") and not hasattr(engine, m)]  # type: ignore[unreachable]
        raise ConfigError(
            f"{type(engine).__name__} is not a RolloutEngine: it lacks {', '.join(missing)}",
            field="engine",
            fix="Implement partial_rollout.engine.RolloutEngine, or wrap the engine in ResumableEngine",
        )
    checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
    restore_from = checkpoint.latest(checkpoint_dir)
    if restore_from is not None and not resume:
        raise ConfigError(
            "already holds checkpoints of another run",
            path=checkpoint_dir,
            field="checkpointing.checkpoint_dir",
            fix="Pass --resume to continue it, or choose a new folder",
        )
    model_dir = (
        Path(config.policy.model_name) if config.policy.model_name else build_tiny_model(TinyModelSpec(arch="llama"))
    )
    log_dir = Path(config.logger.log_dir)
    events = EventLog(log_dir / EVENTS_FILENAME, fresh=not resume)
    ledger = WorkLedger(events)
    policy = Policy(model_dir, config)
    step = 0
    if restore_from is not None:
        _check_same_model(restore_from, model_dir)
        policy.load(restore_from / checkpoint.POLICY_DIR)
        step = int(checkpoint.read_training_info(restore_from)["current_step"])
    own_engine = engine is None
    if engine is None:
        gen = config.generation
        engine_config = EngineConfig(
            model=str(model_dir),
            max_model_len=gen.max_model_len,
            max_num_seqs=gen.max_num_seqs,
            kv_cache_memory_bytes=gen.kv_cache_memory_bytes,
            multiprocessing=gen.multiprocessing,
            seed=config.grpo.seed,
        )
        if gen.num_engines == 1:
            if config.ray.address:
                logger.warning("ray.address is ignored: generation.num_engines is 1, which runs in this process")
            engine = await EnginePool.local(engine_config, policy_version=step)
        else:
            connect_ray(config.ray.address)
            engine = await EnginePool.ray(
                engine_config, gen.num_engines, min_engines=gen.min_engines, policy_version=step
            )
    try:
        fingerprints = await engine.fingerprints()
        loop = GRPOLoop(
            config, engine=engine, policy=policy, ledger=ledger, fingerprints=fingerprints, step=step, progress=progress
        )
        if restore_from is not None:
            await loop.sync_weights()
        await loop.restore(restore_from)
        if isinstance(engine, EnginePool):
            # An engine that dies hands its requests to the others: the log says so, after the start or
            # resume event (a death noticed earlier, one at start-up included, is told now).
            engine.failover.on_failover = lambda f: ledger.log(ENGINE_FAILOVER, **f.fields())
        return await loop.run()
    finally:
        events.close()
        if own_engine:
            await engine.shutdown()


def _check_same_model(folder: Path, model_dir: Path) -> None:
    """Refuse a checkpoint of another model before torch reports a page of size mismatches."""
    from partial_rollout.fingerprint import model_fingerprint
    from partial_rollout.snapshot import SnapshotReader

    with SnapshotReader(folder) as reader:
        saved = reader.fingerprints
    if saved.model != model_fingerprint(model_dir):
        raise ConfigError(
            f"the checkpoint was trained from {saved.model_path or saved.model!r}, this run has {str(model_dir)!r}",
            path=folder,
            field="policy.model_name",
            fix="Resume with the model the checkpoint was saved with",
        )
