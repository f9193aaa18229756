"""Bring the work ledger level with verl's TransferQueue, inside a cut's frozen window.

verl's TransferQueue (TQ) is where its trainer keeps prompts (under their ``uid``, tagged pending,
running, finished or failure) and finished trajectories (``{uid}_{session}_0``); its replay buffer
takes a group out of it when it trains or evicts it. The trainer process never sees a sample
generated: the agent loops in other processes store it. So the ledger learns of the work at each
cut, from the two places that hold it: the servers (what they hold, by sample key) and the TQ tags.

- A group is yielded the first time a cut finds one of its samples, with the prompt the agent loop
  sent (the trainer holds only verl's raw chat messages); its not-started samples take a started
  sibling's sampling, seedless (the server derives a seed from the key when one runs).
- A sample is finished when verl has it: its trajectory is in the TQ, or its group left the TQ. One
  a cut captured finished before verl stored it (its server finished it, the reward was still
  running) is recorded at the first cut that finds it stored.
- A group that left the TQ was trained (consumed) if all its samples finished, else verl evicted it.

:func:`reconcile` returns the keys of finished samples the servers may now forget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from partial_rollout.ledger import WorkLedger
from partial_rollout.snapshot import GroupState, SampleState
from partial_rollout_integrations.verl.wire import HeldSample, sample_key, split_key, trajectory_key

EVICTED_BY_VERL = "evicted_by_verl"
"""Eviction reason of a group verl's replay buffer dropped unfinished (a failure, staleness, a filter)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TqView:
    """What the TQ's tags say, read once in the window."""

    prompts: frozenset[str]
    """Prompt uids still in the TQ (not yet trained or evicted)."""
    stored: frozenset[str]
    """Trajectory keys of finished samples."""

    @classmethod
    def of(cls, items: Mapping[str, Mapping[str, Any]]) -> TqView:
        """From ``tq.kv_list(partition)[partition]``: key to tag."""
        prompts = {k for k, tag in items.items() if tag.get("is_prompt", False)}
        stored = {k for k, tag in items.items() if not tag.get("is_prompt", False) and tag.get("status") == "success"}
        return cls(prompts=frozenset(prompts), stored=frozenset(stored))

    def has(self, key: str) -> bool:
        """Whether verl holds sample ``key`` finished (stored, or its group already taken out)."""
        uid, _ = split_key(key)
        return trajectory_key(key) in self.stored or uid not in self.prompts


def reconcile(
    ledger: WorkLedger,
    held: Mapping[str, HeldSample],
    tq: TqView,
    *,
    n: int,
    policy_version: int,
    step: int,
) -> list[str]:
    """Yield, finish, consume and evict so the ledger says what verl and the servers hold (see module)."""
    _yield_new_groups(ledger, held, n=n, policy_version=policy_version)
    forget = []
    for group in list(ledger.groups(GroupState.IN_FLIGHT)):
        for sample in group.samples:
            key = sample_key(group.group_id, sample.index)
            got = held.get(key)
            # One the ledger holds finished may only have been captured so (finished on its server,
            # not yet stored in the TQ, at an earlier cut): a sample recorded finished is forgotten
            # by its server at once, so one still held was never recorded, and is now.
            if got is None or got.record.state is not SampleState.FINISHED:
                continue
            if tq.has(key):
                ledger.finish(group.group_id, got.record, prefix_tokens=got.continued_tokens, settle=False)
                forget.append(key)
        ledger.settle(group.group_id)
    for group in list(ledger.groups()):
        if group.group_id in tq.prompts:
            continue
        if group.state is GroupState.READY:
            ledger.consume([group.group_id], step=step)
        else:
            ledger.evict(group.group_id, reason=EVICTED_BY_VERL)
    return forget


def _yield_new_groups(ledger: WorkLedger, held: Mapping[str, HeldSample], *, n: int, policy_version: int) -> None:
    known = {g.group_id for g in ledger.groups()}
    by_uid: dict[str, dict[int, HeldSample]] = {}
    for key, sample in held.items():
        uid, session = split_key(key)
        if uid not in known:
            by_uid.setdefault(uid, {})[session] = sample
    for uid, sessions in by_uid.items():
        first = next(iter(sessions.values()))
        unseeded = dataclasses.replace(first.record.sampling, seed=None)
        specs = [sessions[i].record.sampling if i in sessions else unseeded for i in range(n)]
        ledger.yield_group(uid, first.prompt_token_ids, specs, data={"uid": uid})
        versions = [int(s.record.versions.min()) for s in sessions.values() if s.record.num_tokens]
        ledger.dispatch(uid, min(versions, default=policy_version))
