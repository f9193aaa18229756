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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import GroupState, SampleState, Snapshot
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
