"""verl's V1 async trainers with partial rollouts: the three methods that own save, restore and re-issue.

verl saves its TransferQueue at a checkpoint and, at a resume, clears every trajectory of each
unfinished prompt group and generates the whole group again (``_reissue_inflight_prompts``). With
the mixin, a checkpoint also holds every sample in flight (prefix, logprobs, per-token versions)
and those finished that verl has not stored yet, in ``global_step_N/`` and on disk
before verl writes ``latest_checkpointed_iteration.txt``; a resume keeps a group's finished
siblings, continues its unfinished samples from their prefixes, and runs only the samples that had
not started. Everything else is verl's own trainer.

With ``record_events`` and the flag off (:class:`RecordEvents`), verl's save, load, re-issue and
client stay verl's; the work ledger only records what they do, so that the audit of its
``events.jsonl`` measures what unmodified verl regenerates at a restart.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import transfer_queue as tq
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.utils import tensordict_utils as tu

from partial_rollout_integrations.config_block import restore_policy
from partial_rollout_integrations.verl.client import DurableLLMServerClient, RecordingLLMServerClient
from partial_rollout_integrations.verl.config import PartialRolloutCheckpointConfig
from partial_rollout_integrations.verl.rollouts import RECORD_FOLDER, DurableRollouts, RecordingClients
from partial_rollout_integrations.verl.servers import VerlServers
from partial_rollout_integrations.verl.wire import split_key

PARTITION = "train"
UNFINISHED = ("pending", "running")
"""TransferQueue statuses of a prompt group verl re-issues at a resume."""
logger = logging.getLogger(__name__)


class PartialRolloutCheckpoint:
    """Mixed in before a verl V1 async trainer class (see the module docstring)."""

    config: Any
    global_steps: int
    _durable: DurableRollouts | None = None

    # ---------------------------------------------------------------- set-up

    @property
    def durable(self) -> DurableRollouts:
        """The run's rollout ledger, made once the servers run (verl's ``_setup`` loads after launching them)."""
        if self._durable is None:
            events = self._block().events_file(self.config.trainer.default_local_dir)
            os.makedirs(os.path.dirname(os.path.abspath(events)), exist_ok=True)
            handles = [h for m in self._rollout_server_managers() for h in m.server_handles]  # type: ignore[attr-defined]
            self._durable = DurableRollouts(
                VerlServers(handles), events=events, n=int(self.config.actor_rollout_ref.rollout.n), read_tq=_read_tq
            )
        return self._durable

    def _client_manager(self) -> Any:
        """The server manager whose router the mode's agent loops use."""
        return self.llm_server_manager  # type: ignore[attr-defined]

    def get_llm_client(self) -> Any:
        durable = self.durable
        return self._client_manager().get_client(
            client_cls=DurableLLMServerClient, restored=durable.restored, stored=durable.stored
        )

    def fit(self, agent_loop_manager: Any) -> None:
        super().fit(agent_loop_manager)  # type: ignore[misc]
        self.durable.end(step=self.global_steps - 1)  # verl's fit ends one past its last step

    # ---------------------------------------------------------------- save

    hold_servers_through_save = False
    """Whether the servers generate while verl saves, so they hold back replies until verl's save is done."""

    def _save_checkpoint(self) -> None:
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        hold = self.hold_servers_through_save
        pending = self.durable.cut(folder, step=self.global_steps, policy_version=self.global_steps, hold=hold)
        try:
            os.makedirs(folder, exist_ok=True)
            # verl's save writes latest_checkpointed_iteration.txt last: the snapshot is on disk before it.
            pending.write(commit=super()._save_checkpoint)  # type: ignore[misc]
        finally:
            if hold:
                self.durable.release()
        self.durable.written()

    # ---------------------------------------------------------------- resume

    def on_init_end(self) -> None:
        """Restore the snapshot of the checkpoint verl loaded, once every server runs; then verl's hook.

        verl's ``init`` loads its checkpoint inside ``_setup`` and then calls this hook, which pushes
        the loaded weights to the servers. In ``separate_async`` the standalone servers launch after
        the load, so the restore waits for this hook: the snapshot is checked against the servers
        that will continue it.
        """
        if self.global_steps == 0:
            self.durable.start()
        else:
            from omegaconf import OmegaConf

            policy = restore_policy(self._block())
            rollout = OmegaConf.to_container(self.config.actor_rollout_ref.rollout, resolve=True)
            assert isinstance(rollout, dict), "actor_rollout_ref.rollout is a mapping in verl's config"
            self.durable.restore(self._resumed_folder(), step=self.global_steps, rollout=rollout, policy=policy)
        super().on_init_end()  # type: ignore[misc]

    def _block(self) -> PartialRolloutCheckpointConfig:
        from omegaconf import OmegaConf

        return PartialRolloutCheckpointConfig.from_trainer_v1(
            OmegaConf.to_container(self.config.trainer.v1, resolve=True)
        )

    def _resumed_folder(self) -> str:
        """The ``global_step_N`` folder verl's ``_load_checkpoint`` just loaded."""
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            return os.path.abspath(str(trainer.resume_from_path))
        return os.path.abspath(os.path.join(trainer.default_local_dir, f"global_step_{self.global_steps}"))

    def _reissue_inflight_prompts(self, partition_id: str = PARTITION) -> int:
        """Dispatch the restored unfinished groups again, keeping the trajectories verl already holds.

        verl's own version clears them, regenerates each group whole and tags it with the resumed
        step, as a new dispatch. Here the agent-loop workers skip the samples the TransferQueue holds
        and continue the snapshot's prefixes, so a group that keeps any of its work keeps the step it
        was dispatched at: verl's sampler orders groups by it and evicts (or waits on) those older
        than ``trainer.v1.sampler.max_off_policy_threshold``, and work from before the restart is
        exactly as old as it was. A group nothing of which survived is a new dispatch, as in verl.
        """
        items = _read_tq(partition_id)
        uids = _unfinished_prompts(items)
        if not uids:
            return 0
        durable = self.durable
        kept = {split_key(key)[0] for key in (*durable.restored, *durable.stored)}
        by_step: dict[int, list[str]] = {}
        for uid in uids:
            step = int(items[uid].get("global_steps", self.global_steps)) if uid in kept else self.global_steps
            by_step.setdefault(step, []).append(uid)
        for step, keys in sorted(by_step.items()):
            batch = tq.kv_batch_get(keys=keys, partition_id=partition_id)
            tu.assign_non_tensor_data(batch, "global_steps", step)
            tags = [{"is_prompt": True, "status": "pending", "global_steps": step} for _ in keys]
            tq.kv_batch_put(keys=keys, partition_id=partition_id, tags=tags)
            self.agent_loop_manager.generate_sequences(batch)  # type: ignore[attr-defined]
        logger.info(
            "partial rollouts: re-issued %d in-flight prompts for step %d (%d keeping their dispatch step),"
            " keeping %d finished samples verl holds; %d samples continue or come back from the snapshot",
            len(uids),
            self.global_steps,
            sum(uid in kept for uid in uids),
            len(durable.stored),
            len(durable.restored),
        )
        return len(uids)


def _read_tq(partition_id: str = PARTITION) -> dict[str, Any]:
    listed = tq.kv_list(partition_id) or {}
    return dict(listed.get(partition_id, {}))


def _unfinished_prompts(items: dict[str, Any]) -> list[str]:
    """The prompt groups a resume re-issues: pending or running in the TransferQueue's tags."""
    return [k for k, tag in items.items() if tag.get("is_prompt", False) and tag.get("status") in UNFINISHED]


class ColocateAsyncTrainer(PartialRolloutCheckpoint, PPOTrainerColocateAsync):  # type: ignore[misc]
    """verl's ``colocate_async`` trainer with partial rollouts."""


class SeparateAsyncTrainer(PartialRolloutCheckpoint, PPOTrainerSeparateAsync):  # type: ignore[misc]
    """verl's ``separate_async`` trainer with partial rollouts."""

    hold_servers_through_save = True
    """Here the servers generate while the trainer saves: a sample finishing between the cut and verl's
    TransferQueue save would be in flight in the snapshot and finished in verl's. The servers hold back
    new requests and every reply from the cut until verl's save is done (their engines decode on), so
    the two hold the same work, as in ``colocate_async``, whose servers are aborted and asleep at
    every save by verl itself."""

    def _client_manager(self) -> Any:
        return self.standalone_server_manager


TRAINERS: dict[str, type] = {"colocate_async": ColocateAsyncTrainer, "separate_async": SeparateAsyncTrainer}


def trainer_class(mode: str) -> type:
    """The trainer class for ``trainer.v1.trainer_mode`` with the flag on."""
    try:
        return TRAINERS[mode]
    except KeyError:
        raise ValueError(f"partial rollouts support trainer modes {sorted(TRAINERS)}, not {mode!r}") from None


class RecordEvents:
    """Mixed in before a verl V1 async trainer class with ``record_events`` on and ``enable`` off.

    verl's trainer stays verl's: its own client (:class:`.client.RecordingLLMServerClient`, which
    only notes what each attempt returned), its own save (nothing of ours in ``global_step_N/``),
    its own re-issue (unfinished groups generated again from their prompts, their finished siblings
    deleted). The work ledger records what happens: at each checkpoint it is levelled with verl's
    TransferQueue and with what verl's clients hold, and its cut is written beside ``events.jsonl``
    (``ledger_<step>/``) before verl's save; at a resume that cut is read back, and each group verl
    re-issues is logged regenerated with the tokens verl throws away.
    """

    config: Any
    global_steps: int
    agent_loop_manager: Any
    _recorder: DurableRollouts | None = None

    @property
    def recorder(self) -> DurableRollouts:
        """The run's work ledger over verl's clients (asked at each cut; verl makes them in ``fit``)."""
        if self._recorder is None:
            clients = RecordingClients(lambda: self.agent_loop_manager.agent_loop_workers)
            self._recorder = DurableRollouts(
                clients,
                events=_block(self.config).events_file(self.config.trainer.default_local_dir),
                n=int(self.config.actor_rollout_ref.rollout.n),
                read_tq=_read_tq,
                record_only=True,
            )
        return self._recorder

    def _record_folder(self, step: int) -> str:
        return os.path.join(os.path.dirname(os.path.abspath(self.recorder.events)), RECORD_FOLDER.format(step=step))

    def _client_manager(self) -> Any:
        """The server manager whose router the mode's agent loops use."""
        return self.llm_server_manager  # type: ignore[attr-defined]

    def get_llm_client(self) -> Any:
        return self._client_manager().get_client(client_cls=RecordingLLMServerClient)

    def fit(self, agent_loop_manager: Any) -> None:
        super().fit(agent_loop_manager)  # type: ignore[misc]
        self.recorder.end(step=self.global_steps - 1)

    def _save_checkpoint(self) -> None:
        """The ledger's cut beside ``events.jsonl``, then verl's own save as its commit."""
        pending = self.recorder.cut(
            self._record_folder(self.global_steps), step=self.global_steps, policy_version=self.global_steps
        )
        pending.write(commit=super()._save_checkpoint)  # type: ignore[misc]
        self.recorder.written()

    def on_init_end(self) -> None:
        """Log a fresh start, or read back the ledger's cut of the checkpoint verl loaded; then verl's hook."""
        if self.global_steps == 0:
            self.recorder.start(partial_rollouts=False)
        else:
            self.recorder.restore_record(self._record_folder(self.global_steps), step=self.global_steps)
        super().on_init_end()  # type: ignore[misc]

    def _reissue_inflight_prompts(self, partition_id: str = PARTITION) -> int:
        """verl's own re-issue, each group it generates again logged regenerated first."""
        self.recorder.reissued(_unfinished_prompts(_read_tq(partition_id)), policy_version=self.global_steps)
        return super()._reissue_inflight_prompts(partition_id)  # type: ignore[misc,no-any-return]


def _block(config: Any) -> PartialRolloutCheckpointConfig:
    from omegaconf import OmegaConf

    return PartialRolloutCheckpointConfig.from_trainer_v1(OmegaConf.to_container(config.trainer.v1, resolve=True))


class RecordingColocateAsyncTrainer(RecordEvents, PPOTrainerColocateAsync):  # type: ignore[misc]
    """verl's ``colocate_async`` trainer as it is, its work recorded."""


class RecordingSeparateAsyncTrainer(RecordEvents, PPOTrainerSeparateAsync):  # type: ignore[misc]
    """verl's ``separate_async`` trainer as it is, its work recorded."""

    def _client_manager(self) -> Any:
        return self.standalone_server_manager


RECORDING: dict[str, type] = {
    "colocate_async": RecordingColocateAsyncTrainer,
    "separate_async": RecordingSeparateAsyncTrainer,
}


def recording_trainer_class(mode: str) -> type:
    """The trainer class for ``trainer.v1.trainer_mode`` with ``record_events`` on and the flag off."""
    try:
        return RECORDING[mode]
    except KeyError:
        raise ValueError(f"recording supports trainer modes {sorted(RECORDING)}, not {mode!r}") from None
