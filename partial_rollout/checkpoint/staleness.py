"""What a resume does with restored work that was dispatched under a policy too old to train on.

A checkpoint holds groups dispatched some weight updates ago; by the time a run resumes, the
trainer's staleness window may have moved past them. Three answers, one per :data:`OnStale`
value, each leaving a trace in the event log that an audit accounts for (a regenerated group's
discarded tokens, an evicted group's reason), so none of them looks like a loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, get_args

from partial_rollout.ledger import GroupEntry, WorkLedger

OnStale = Literal["continue", "regenerate", "drop"]
"""``continue``: keep the work (the trainer's sampler may still evict it later); ``regenerate``:
discard its tokens and dispatch it anew; ``drop``: evict it on purpose."""
ON_STALE_CHOICES: tuple[str, ...] = get_args(OnStale)
"""The values of :data:`OnStale`, in order: what a config block's ``on_stale`` accepts."""
STALE_AT_RESUME = "stale_at_resume"
"""Regeneration or eviction reason of a restored group that ``on_stale`` does not continue."""


def check_on_stale(value: str, *, field: str = "on_stale") -> OnStale:
    """``value`` as an :data:`OnStale`, or a ``ValueError`` naming ``field`` and the choices."""
    if value not in ON_STALE_CHOICES:
        raise ValueError(f"{field}: must be one of {', '.join(ON_STALE_CHOICES)}, got {value!r}")
    return value  # type: ignore[return-value]


def apply_on_stale(
    ledger: WorkLedger,
    groups: Iterable[GroupEntry],
    *,
    is_stale: Callable[[GroupEntry], bool],
    policy: OnStale,
) -> dict[str, OnStale]:
    """Apply ``policy`` to each of ``groups`` that ``is_stale``; returns what was done, by group id.

    Groups left as they are (fresh ones, or every one under ``continue``) are not in the result.
    """
    check_on_stale(policy)
    done: dict[str, OnStale] = {}
    for group in list(groups):
        if policy == "continue" or not is_stale(group):
            continue
        if policy == "regenerate":
            ledger.regenerate(group.group_id, reason=STALE_AT_RESUME)
        else:
            ledger.evict(group.group_id, reason=STALE_AT_RESUME)
        done[group.group_id] = policy
    return done
