"""Refuse, before anything is restored, a snapshot that is not of the verl run resuming from it.

The library refuses a snapshot of another model, tokenizer or vLLM (its fingerprints). What only
the verl side can see is checked here, against what verl itself just restored from the same
``global_step_N/`` and the run's config:

- **another run's snapshot** (or another step's): verl's TransferQueue holds every group a
  snapshot holds untrained (``tests/verl/test_verl_kill_resume.py`` checks the two agree at every
  kill), so a group it does not hold means the snapshot is not of this checkpoint;
- **another ``actor_rollout_ref.rollout.n``**: a group holds another number of samples;
- **other sampling** (``temperature``, ``top_p``, ``top_k``): a server continues a saved sample
  under the sampling it was saved with, so a resume under other settings would finish the run's
  in-flight samples from a distribution the config no longer names.

The last two need only the snapshot and the config, so :func:`check_before_start` runs them at set-up
too, on the checkpoint verl is about to resume from: a refused resume then costs a config load, not
the start of Ray, verl's workers and every server (most of a run on a small machine).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import SNAPSHOT_FILENAME, GroupState, SampleState, Snapshot, load_snapshot
from partial_rollout_integrations.verl.reconcile import TqView

ROLLOUT = "actor_rollout_ref.rollout"
START_FRESH = "resume from the checkpoint this snapshot was written with, or start the run from scratch"


def check_resume(
    snapshot: Snapshot, path: str | os.PathLike[str], *, tq: TqView, n: int, rollout: Mapping[str, Any]
) -> None:
    """Raise :class:`SnapshotError` naming the file and field where ``snapshot`` does not fit the run.

    Args:
        snapshot: the snapshot of the checkpoint verl resumes from, loaded but not yet restored.
        path: its file, for the message.
        tq: verl's TransferQueue as it restored it from the same checkpoint.
        n: the run's samples per prompt (``actor_rollout_ref.rollout.n``).
        rollout: the run's ``actor_rollout_ref.rollout`` config (its sampling keys).
    """
    held = [g for g in snapshot.groups if g.state in (GroupState.IN_FLIGHT, GroupState.READY)]
    unknown = [g.group_id for g in held if g.group_id not in tq.prompts]
    if unknown:
        raise SnapshotError(
            f"holds {len(unknown)} of its {len(held)} unfinished prompt groups that verl's TransferQueue of this"
            f" checkpoint does not (first: uid {unknown[0]}): it was written by another run or at another step",
            path=path,
            field="groups",
            fix=f"Put back this checkpoint's own {os.path.basename(path)}, or {START_FRESH}",
        )
    check_sampling(snapshot, path, n=n, rollout=rollout)


def check_sampling(snapshot: Snapshot, path: str | os.PathLike[str], *, n: int, rollout: Mapping[str, Any]) -> None:
    """Raise :class:`SnapshotError` where a group of ``snapshot`` holds another ``n`` or a started sample other
    sampling than the run's (the checks that need no TransferQueue)."""
    held = [g for g in snapshot.groups if g.state in (GroupState.IN_FLIGHT, GroupState.READY)]
    for group in held:
        if len(group.samples) != n:
            raise SnapshotError(
                f"prompt group {group.group_id} holds {len(group.samples)} samples, the run has {ROLLOUT}.n={n}",
                path=path,
                field=f"groups[{group.group_id}].samples",
                fix=f"Resume with {ROLLOUT}.n={len(group.samples)}, or {START_FRESH}",
            )
    top_k = int(rollout.get("top_k", -1))
    wanted = {
        "temperature": float(rollout.get("temperature", 1.0)),
        "top_p": float(rollout.get("top_p", 1.0)),
        "top_k": 0 if top_k < 0 else top_k,  # as the server maps verl's -1 (no limit)
    }
    for group in held:
        for sample in group.samples:
            if sample.state is SampleState.NOT_STARTED:
                continue  # it starts under the run's sampling, like any new sample
            for name, value in wanted.items():
                saved = getattr(sample.sampling, name)
                if saved != value:
                    as_verl = -1 if name == "top_k" and saved == 0 else saved
                    raise SnapshotError(
                        f"sample {sample.index} of prompt group {group.group_id} was sampled with {name}={as_verl},"
                        f" the run has {ROLLOUT}.{name}={rollout.get(name)}",
                        path=path,
                        field=f"groups[{group.group_id}].samples[{sample.index}].sampling.{name}",
                        fix=f"Resume with {ROLLOUT}.{name}={as_verl} as saved, or {START_FRESH}",
                    )


def resumed_checkpoint(trainer: Mapping[str, Any]) -> str | None:
    """The ``global_step_N`` folder verl's V1 trainer will load for the run's ``trainer`` config, or ``None``.

    verl's ``_load_checkpoint`` decides it only after every worker and server started; this is its
    rule: ``resume_mode=auto`` takes the folder ``find_latest_ckpt_path`` finds (verl's own function),
    ``resume_path`` takes ``resume_from_path``, ``disable`` none. Relative paths are the run's working
    directory's, as verl's.
    """
    mode = trainer.get("resume_mode", "auto")
    if mode == "auto":
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

        found = find_latest_ckpt_path(os.path.abspath(str(trainer["default_local_dir"])))
        return None if found is None else str(found)
    if mode == "resume_path":
        return os.path.abspath(str(trainer["resume_from_path"]))
    return None


def check_before_start(trainer: Mapping[str, Any], rollout: Mapping[str, Any]) -> None:
    """At set-up: refuse the snapshot of the checkpoint the run will resume from if it cannot fit the run.

    A checkpoint without our snapshot is left to the resume (a run that saved without the flag resumes
    from nothing); a snapshot that cannot be read is refused here, naming its file.
    """
    folder = resumed_checkpoint(trainer)
    path = None if folder is None else os.path.join(folder, SNAPSHOT_FILENAME)
    if path is None or not os.path.exists(path):
        return
    check_sampling(load_snapshot(path), path, n=int(rollout.get("n", 1)), rollout=rollout)
