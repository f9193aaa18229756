"""One verl V1 async run on the CPU harness, in verl's environment; a test starts, kills and resumes it.

Usage: ``.venv-verl/bin/python tests/verl/cpu_run.py RUN_DIR [hydra overrides...]``

It is the run of ``partial-rollout demo --trainer verl`` (:mod:`partial_rollout_integrations.verl.demo`:
:func:`~partial_rollout_integrations.verl.demo.compose`, verl 0.9.1's own ``ppo_trainer`` config with
our block and the overrides a tiny CPU run needs, then those given; and
:func:`~partial_rollout_integrations.verl.demo.train`, verl's ``TaskRunnerV1`` flow in this process)
with the test's hooks below. With ``trainer.v1.partial_rollout_checkpoint.enable=true`` the trainer
and the agent-loop manager are ours; with ``record_events=true`` alone, verl's trainer that only
records; off, verl's own. Either way :class:`~partial_rollout_integrations.verl.cpu.CpuHarness`
stands in for the GPU-only parts. ``trainer.resume_mode=auto`` (verl's default) resumes from ``RUN_DIR/checkpoints``
when a checkpoint is there. ``PARTIAL_ROLLOUT_EXIT_AFTER_SAVE=N`` kills the run (``os._exit(137)``)
right after the first checkpoint from step N on that committed with work to lose: with the flag on,
one whose snapshot holds a sample in flight with tokens (whether a step's cut catches one depends on
how fast the engine ran against the trainer, which differs from machine to machine); off, step N's.
It prints ``{"killed_after_save": step}`` first. ``PARTIAL_ROLLOUT_EXIT_BEFORE_COMMIT=N`` kills the
run inside a save instead, after the snapshot and verl's TransferQueue save and before verl writes
``latest_checkpointed_iteration.txt`` (its commit point): the latest moment of a save a kill can
leave uncommitted. It is the save of the first step from N on whose previous checkpoint, the one
left committed, holds a sample in flight with tokens (flag on; off: step N's); before that save
begins, the sha256 of every committed file is written to ``RUN_DIR/committed.json``
(:func:`committed_digests`), and ``{"killed_before_commit": step}`` is printed first. After verl's re-issue
of the prompts in flight at a resume it prints ``{"reissued_at": step, "prompt_steps": {uid: step}}``:
the dispatch step each prompt in the TransferQueue is tagged with, which verl's sampler reads for
staleness and order.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from partial_rollout_integrations.verl.demo import compose, train

LATEST = "latest_checkpointed_iteration.txt"
"""verl's commit point: the file naming the last committed checkpoint."""


def committed_digests(checkpoints: Path) -> dict[str, str]:
    """sha256 of every file of verl's commit: the checkpoint folders and the file naming the latest."""
    files = [checkpoints / LATEST, *(p for p in sorted(checkpoints.glob("global_step_*/**/*")) if p.is_file())]
    return {str(p.relative_to(checkpoints)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _holds_tokens_in_flight(config: Any, step: int) -> bool:
    from partial_rollout.snapshot import SampleState, load_snapshot

    snapshot = load_snapshot(Path(config.trainer.default_local_dir) / f"global_step_{step}")
    return any(s.state is SampleState.IN_FLIGHT and s.num_tokens for g in snapshot.groups for s in g.samples)


def main() -> None:
    run_dir = Path(sys.argv[1]).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    config = compose(run_dir, sys.argv[2:])

    import transfer_queue as tq
    from omegaconf import OmegaConf

    enabled = bool(OmegaConf.select(config, "trainer.v1.partial_rollout_checkpoint.enable", default=False))
    exit_after = int(os.environ.get("PARTIAL_ROLLOUT_EXIT_AFTER_SAVE", "0"))
    exit_before_commit = int(os.environ.get("PARTIAL_ROLLOUT_EXIT_BEFORE_COMMIT", "0"))
    dying_at = 0  # the step inside whose save the run dies (exit_before_commit), once chosen
    if exit_before_commit:
        # verl's _save_checkpoint saves its TransferQueue (as tq.save_checkpoint) right before it writes
        # latest_checkpointed_iteration.txt, and our snapshot is on disk before verl's save begins.
        save_tq = tq.save_checkpoint

        def save_tq_then_die(path: str, *args: Any, **kwargs: Any) -> Any:
            saved = save_tq(path, *args, **kwargs)
            step = int(kwargs["metadata"]["global_steps"])
            if step == dying_at:
                print(json.dumps({"killed_before_commit": step}), flush=True)
                os._exit(137)
            return saved

        tq.save_checkpoint = save_tq_then_die

    def hooks(base: type) -> dict[str, Any]:
        def save_then_maybe_die(self: Any) -> None:
            nonlocal dying_at
            step = self.global_steps
            if (
                exit_before_commit
                and not dying_at
                and step >= exit_before_commit
                and (not enabled or _holds_tokens_in_flight(config, step - 1))
            ):
                dying_at = step
                checkpoints = Path(config.trainer.default_local_dir)
                (run_dir / "committed.json").write_text(json.dumps(committed_digests(checkpoints)))
            base._save_checkpoint(self)  # type: ignore[attr-defined]
            if exit_after and step >= exit_after and (not enabled or _holds_tokens_in_flight(config, step)):
                print(json.dumps({"killed_after_save": step}), flush=True)  # killed right after it committed
                os._exit(137)

        def reissue_and_report(self: Any, partition_id: str = "train") -> int:
            reissued: int = base._reissue_inflight_prompts(self, partition_id)  # type: ignore[attr-defined]
            listed = (tq.kv_list(partition_id) or {}).get(partition_id, {})
            steps = {key: tag.get("global_steps") for key, tag in listed.items() if tag.get("is_prompt", False)}
            print(
                json.dumps({"reissued_at": self.global_steps, "prompt_steps": steps}), flush=True
            )  # as verl left them
            return reissued

        return {"_save_checkpoint": save_then_maybe_die, "_reissue_inflight_prompts": reissue_and_report}

    train(config, hooks=hooks)


if __name__ == "__main__":
    main()
