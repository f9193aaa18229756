"""The checkpoint protocol in one object: a trainer saves with two calls and restores with one.

::

    from partial_rollout.checkpoint import RolloutCheckpointer

    ckpt = RolloutCheckpointer(engine, events=run_dir / "events.jsonl", loader=loader)
    pending = await ckpt.save(folder, trainer_step=step, policy_version=version)
    await asyncio.to_thread(pending.write)
    ...
    restored = await ckpt.restore(folder)   # in the restarted process

:class:`RolloutCheckpointer` owns the ordering (close the gate, take the engine's cut, capture it,
cut the ledger, open the gate, log, write, log the outcome; no engine pauses); :mod:`.window` is
the frozen window and the pending write; :mod:`.staleness` the one definition of what a resume does
with work dispatched too long ago; :mod:`.policy` the resume settings every trainer's config block
shares; :mod:`.sync` the checkpointer for a synchronous trainer loop.
"""

from partial_rollout.checkpoint.checkpointer import RECORD_ONLY, Restored, RolloutCheckpointer, SampleOutcome
from partial_rollout.checkpoint.policy import RestorePolicy
from partial_rollout.checkpoint.staleness import ON_STALE_CHOICES, STALE_AT_RESUME, OnStale, apply_on_stale
from partial_rollout.checkpoint.sync import SyncCheckpointer
from partial_rollout.checkpoint.window import FrozenWindow, PendingSnapshot, StatefulLoader

__all__ = [
    "ON_STALE_CHOICES",
    "RECORD_ONLY",
    "STALE_AT_RESUME",
    "FrozenWindow",
    "OnStale",
    "PendingSnapshot",
    "RestorePolicy",
    "Restored",
    "RolloutCheckpointer",
    "SampleOutcome",
    "StatefulLoader",
    "SyncCheckpointer",
    "apply_on_stale",
]
