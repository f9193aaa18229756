"""SkyRL's fully async trainer with partial rollouts, through its public save, load and batch hooks.

SkyRL saves, at each checkpoint, the uids of the prompt groups it trained on, and at a resume asks
again for every other prompt, from scratch. This trainer also saves what the servers hold of those
prompts (:mod:`.checkpoint`) and hands it back at the resume, so the same requests continue their
prefixes, or are answered from their finished record, instead of being generated again.

- :meth:`~PartialRolloutTrainer.save_checkpoints` cuts the servers, writes our snapshot and SkyRL's
  ``fully_async_state.pt`` (atomically), and only then runs SkyRL's base save, which writes the
  commit marker ``latest_ckpt_global_step.txt`` last. SkyRL's own order writes the state file after
  the marker: a kill between the two leaves a checkpoint its resume refuses.
- :meth:`~PartialRolloutTrainer.load_checkpoints` loads them back and hands the samples to the servers.
- :meth:`~PartialRolloutTrainer.convert_generation_group_mini_batch_to_training_input` gives a resumed
  group the step it was first scheduled at: SkyRL's loop would tag it with the resumed step, and
  under-count its staleness.

The step each group is scheduled at lives in a local of SkyRL's loop; :class:`SchedulingGenerator`
(SkyRL's generator, from ``BasePPOExp.get_generator``) notes it as each group starts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from skyrl.train.fully_async_trainer import FullyAsyncRayPPOTrainer
from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator
from skyrl.train.trainer import RayPPOTrainer

from partial_rollout.atomic import atomic_write
from partial_rollout.ledger import EventKind, EventLog
from partial_rollout.snapshot import SampleState, save_snapshot
from partial_rollout_integrations.skyrl.checkpoint import Servers, load_restored, snapshot_of

FULLY_ASYNC_STATE = "fully_async_state.pt"
"""SkyRL's file of trained uids (consumed and filtered) and the epoch, in each checkpoint folder."""


class SchedulingGenerator(SkyRLGymGenerator):  # type: ignore[misc]
    """SkyRL's single-turn generator, noting the training step each group is scheduled at.

    SkyRL's loop reads its step right before it calls :meth:`generate` (nothing awaited between), so
    the step :attr:`current_step` gives here is the one the loop tags the group with.
    """

    def __init__(self, *args: Any, scheduled_at: dict[str, int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scheduled_at = scheduled_at
        self.current_step: Callable[[], int] | None = None
        """The trainer's step (set by :class:`PartialRolloutTrainer`)."""

    async def generate(self, input_batch: Any, disable_tqdm: bool = False) -> Any:
        metadata = input_batch.get("batch_metadata")
        if self.current_step is not None and metadata is not None and str(metadata.training_phase) == "train":
            step = self.current_step()
            for trajectory in input_batch["trajectory_ids"]:
                self.scheduled_at.setdefault(str(trajectory.instance_id), step)
        return await super().generate(input_batch, disable_tqdm=disable_tqdm)


class PartialRolloutTrainer(FullyAsyncRayPPOTrainer):  # type: ignore[misc]
    """SkyRL's ``FullyAsyncRayPPOTrainer`` whose checkpoints hold the servers' samples (module docstring)."""

    def __init__(
        self, *args: Any, servers: Servers, scheduled_at: dict[str, int], events: EventLog, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.servers = servers
        self.scheduled_at = scheduled_at
        self.events = events
        if isinstance(self.generator, SchedulingGenerator):
            self.generator.current_step = lambda: int(self.global_step)

    def save_checkpoints(self) -> str:
        consumed = list(self.async_train_dataloader.get_consumed_uids_list())
        filtered = list(self.async_train_dataloader.get_filtered_uids_list())
        folder = Path(self.cfg.trainer.ckpt_path) / f"global_step_{self.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        cut = self.servers.cut(consumed)
        for uid in consumed:
            self.scheduled_at.pop(uid, None)
        snapshot = snapshot_of(
            cut,
            n=self.cfg.generator.n_samples_per_prompt,
            trainer_step=self.global_step,
            scheduled_at=self.scheduled_at,
            metadata={"skyrl_epoch": self.epoch},
        )
        in_flight = [s for _, s in snapshot.iter_samples(SampleState.IN_FLIGHT)]
        self.events.append(
            EventKind.SAVE,
            step=self.global_step,
            groups=len(snapshot.groups),
            samples=len(cut.samples),
            prefix_tokens=sum(s.num_tokens for s in in_flight),
            in_flight=len(in_flight),
            finished=sum(1 for _ in snapshot.iter_samples(SampleState.FINISHED)),
        )
        save_snapshot(snapshot, folder)
        state = {"consumed_uids": consumed, "filtered_uids": filtered, "epoch": self.epoch}
        with atomic_write(folder / FULLY_ASYNC_STATE) as tmp:
            torch.save(state, tmp)
        self.events.append(EventKind.SAVE_WRITTEN, step=self.global_step, durable=True)
        saved: str = RayPPOTrainer.save_checkpoints(self)  # its commit marker, written last
        return saved

    def load_checkpoints(self) -> tuple[int, str, set[str] | None, set[str] | None, int | None]:
        step, path, consumed, filtered, epoch = super().load_checkpoints()
        if step == 0:
            self.events.append(EventKind.RESUME, step=0, save=None)
            return step, path, consumed, filtered, epoch
        restored = load_restored(path, expect=self.servers.fingerprints())
        self.servers.restore(restored.samples)
        self.scheduled_at.update(restored.scheduled_at)
        self.events.append(
            EventKind.RESUME,
            step=step,
            save=os.fspath(path),
            groups=len(restored.snapshot.groups),
            samples=len(restored.samples),
            prefix_tokens=sum(s.record.num_tokens for s in restored.samples if s.record.state is SampleState.IN_FLIGHT),
        )
        return step, path, consumed, filtered, epoch

    def convert_generation_group_mini_batch_to_training_input(
        self, cur_generation_group_mini_batch: list[Any], dropped_groups: list[Any] | None = None
    ) -> Any:
        groups = [
            dataclasses.replace(
                g, global_step_when_scheduled=self.scheduled_at.get(g.uid, g.global_step_when_scheduled)
            )
            for g in cur_generation_group_mini_batch
        ]
        return super().convert_generation_group_mini_batch_to_training_input(groups, dropped_groups)
