"""NeMo RL's SingleController with partial rollouts: one cut at save, the cut continued at resume.

:func:`controller_class` subclasses NeMo RL's own actor class and overrides three methods, each of
which calls NeMo RL's:

- ``_save_checkpoint``: open the checkpointer's frozen window (the generation gate closed, the
  engines frozen in keep mode), cut every sample and the ledger into memory, then call NeMo RL's
  save *in the same event-loop turn* (it reads its loader cursor before its first ``await``), so the
  cursor, the buffer's ready groups and our snapshot describe one instant. The window thaws as soon
  as NeMo RL's save first awaits; the pending snapshot is written into ``tmp_step_N`` by NeMo RL's
  finalisation thread, before the rename that commits the checkpoint, and logs its own outcome.
- ``_maybe_restore_replay_buffer``: after NeMo RL restores its buffer, restore the checkpointer from
  the same checkpoint, apply ``on_stale`` (the library's, with NeMo RL's own staleness rule), and
  hand the prompts to re-dispatch to the loader wrapper, so they enter through NeMo RL's rollout
  pump (its permits and staleness accounting stay right).
- ``_sync_weights``: keep the ledger's policy version equal to NeMo RL's trainer version.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from nemo_rl.algorithms.single_controller import SingleControllerActor

from partial_rollout.checkpoint import apply_on_stale
from partial_rollout.errors import ConfigError
from partial_rollout.snapshot import GroupState
from partial_rollout_integrations.config_block import restore_policy
from partial_rollout_integrations.nemo_rl.config import BLOCK, PartialRolloutsConfig
from partial_rollout_integrations.nemo_rl.hooks import (
    LedgerLoader,
    LedgerReplayBuffer,
    LedgerRollout,
    SnapshotCheckpointManager,
)
from partial_rollout_integrations.nemo_rl.session import GROUP_KEY, Session
from partial_rollout_integrations.seams import unwrap

RECORD_FOLDER = "ledger_{step}"
"""Folder (beside ``events.jsonl``) of a record-only run's ledger at checkpoint ``step_N``."""


@dataclass
class _Installed:
    config: PartialRolloutsConfig
    session: Session
    loader: LedgerLoader
    events_dir: Path


def events_path(config: PartialRolloutsConfig, checkpointing: dict[str, Any]) -> Path:
    """Where a run's ``events.jsonl`` goes (it spans restarts)."""
    if config.events_path is not None:
        return Path(config.events_path)
    return Path(checkpointing["checkpoint_dir"]) / "partial_rollouts" / "events.jsonl"


def _checkpoint_step(path: str) -> int:
    match = re.fullmatch(r"step_(\d+)", Path(path).name)
    if match is None:
        raise ConfigError("is not a NeMo RL step_N checkpoint folder", path=path)
    return int(match.group(1))


def controller_class() -> Any:
    """NeMo RL's ``SingleControllerActor`` with partial rollouts, as a Ray actor class."""
    base: Any = unwrap(SingleControllerActor)

    class PartialRolloutController(base):  # type: ignore[misc]  # subclasses NeMo RL's actor class, Any here
        """NeMo RL's SingleController that loses no prompt at a checkpoint (see the module docstring)."""

        def __init__(self, master_config: Any, actor_args: Any, setup_timing_metrics: Any) -> None:
            super().__init__(master_config, actor_args, setup_timing_metrics)
            config = PartialRolloutsConfig.from_checkpointing(master_config.checkpointing)
            self._pr: _Installed | None = None
            if config.active:
                self._pr = self._install(config, master_config, actor_args)

        def _install(self, config: PartialRolloutsConfig, master_config: Any, actor_args: Any) -> _Installed:
            engine = getattr(self._gen, "engine", None)
            if config.enabled and engine is None:
                raise ConfigError(
                    "needs a generation backend that can cut and continue requests",
                    field=f"{BLOCK}.enabled",
                    fix="Build the run with partial_rollout_integrations.nemo_rl's entry point",
                )
            path = events_path(config, master_config.checkpointing)
            session = Session(
                config,
                events_path=str(path),
                settings=self._gen.settings,
                group_size=master_config.grpo.num_generations_per_prompt,
                engine=engine,
            )
            self._gen.session = session
            loader = LedgerLoader(self._dataloader, session)
            self._dataloader: Any = loader  # NeMo RL's attribute (its class is Any here), now our wrapper
            self._rollout_manager._impl = LedgerRollout.wrap(
                self._rollout_manager._impl, session, self._inflight_by_group_id
            )
            LedgerReplayBuffer.adopt(self._buffer, session, lambda: self._train_steps)
            SnapshotCheckpointManager.adopt(self._checkpointer)
            log_metrics = self._logger.log_metrics

            def log_and_record(metrics: dict[str, Any], step: int, *args: Any, **kwargs: Any) -> Any:
                result = log_metrics(metrics, step, *args, **kwargs)
                if kwargs.get("prefix", args[0] if args else "") == "train" and "reward" in metrics:
                    session.on_train_step(step, metrics)
                return result

            self._logger.log_metrics = log_and_record
            if actor_args.last_checkpoint_path is None:
                session.ledger.record_start(nemo_rl=True, partial_rollouts=config.enabled)
            return _Installed(config, session, loader, path.parent)

        async def run(self) -> dict[str, Any]:
            result: dict[str, Any] = await super().run()
            if self._pr is not None:
                session = self._pr.session
                session.ledger.record_end(step=self._train_steps, running=session.rolling_out())
            return result

        # ------------------------------------------------------------ weights

        async def _sync_weights(self, **kwargs: Any) -> int:
            aborted: int = await super()._sync_weights(**kwargs)
            if self._pr is not None:
                self._pr.session.policy_version = self._trainer_version
            return aborted

        # ------------------------------------------------------------ save

        async def _save_checkpoint(self, step_metrics: dict[str, Any]) -> None:
            pr = self._pr
            if pr is None:
                await super()._save_checkpoint(step_metrics)
                return
            if not pr.config.enabled:
                await self._save_record_only(pr, step_metrics)
                return
            session = pr.session
            window = await session.checkpointer.freeze()
            try:
                pending = session.cut(
                    window,
                    Path(self._checkpointer.checkpoint_dir) / f"tmp_step_{self._train_steps}",
                    trainer_step=self._train_steps,
                    policy_version=self._trainer_version,
                )
            except BaseException:
                await window.thaw()
                raise
            thaw = asyncio.ensure_future(window.thaw())
            # NeMo RL's finalisation thread writes it into the real tmp_step_N folder, before the commit.
            self._checkpointer._before_commit = pending.write
            try:
                # NeMo RL reads its loader cursor before its first await: still this turn.
                await super()._save_checkpoint(step_metrics)
            finally:
                self._checkpointer._before_commit = None
                await thaw

        async def _save_record_only(self, pr: _Installed, step_metrics: dict[str, Any]) -> None:
            """Flag off, events on: log what NeMo RL itself keeps (its ready groups), change nothing."""
            pending = await pr.session.checkpointer.save(
                pr.events_dir / RECORD_FOLDER.format(step=self._train_steps),
                trainer_step=self._train_steps,
                policy_version=self._trainer_version,
                states={GroupState.READY},
                metadata=pr.session.metadata(),
            )
            pending.write()
            await super()._save_checkpoint(step_metrics)

        # ------------------------------------------------------------ resume

        async def _maybe_restore_replay_buffer(self) -> None:
            await super()._maybe_restore_replay_buffer()
            pr = self._pr
            if pr is None or self._last_checkpoint_path is None:
                return
            checkpointer = pr.session.checkpointer
            if pr.config.enabled:
                folder = Path(self._last_checkpoint_path)
            else:
                folder = pr.events_dir / RECORD_FOLDER.format(step=_checkpoint_step(self._last_checkpoint_path))
            restored = await checkpointer.restore(
                folder,
                policy=restore_policy(pr.config),
                step=self._train_steps,
                partial_rollouts=pr.config.enabled,
            )
            assert restored.snapshot is not None, "restored from a folder"
            datums = pr.session.restore(
                restored.snapshot, in_nemo_buffer=list(self._buffer._group_ids), redispatch=pr.config.enabled
            )
            if pr.config.enabled:
                pr.loader.restore(self._apply_on_stale(pr, datums))

        def _apply_on_stale(self, pr: _Installed, datums: list[dict[str, Any]]) -> list[dict[str, Any]]:
            """``on_stale`` over the restored in-flight groups, by NeMo RL's own staleness rule."""
            session = pr.session
            restored = [session.restored[d[GROUP_KEY]] for d in datums if d[GROUP_KEY] in session.restored]
            acted = apply_on_stale(
                session.ledger,
                restored,
                is_stale=lambda group: self._sampler.should_abort_inflight(
                    start_weight_version=group.dispatch_version, current_train_weight=self._trainer_version
                ),
                policy=pr.config.on_stale,
            )
            for group_id in acted:
                del session.restored[group_id]  # regenerated from scratch, or dropped
            return [d for d in datums if acted.get(d[GROUP_KEY]) != "drop"]

    PartialRolloutController.__name__ = PartialRolloutController.__qualname__ = "PartialRolloutController"
    return ray.remote(num_cpus=1, num_gpus=0)(PartialRolloutController)
