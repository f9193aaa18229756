"""The work ledger: track every prompt from loader yield to training (or a deliberate eviction).

::

    from partial_rollout.ledger import EventLog, WorkLedger, audit

    ledger = WorkLedger(EventLog(run_dir / "events.jsonl"))
    ledger.yield_group("e0:17", prompt_ids, [spec] * n)   # the loader yielded dataset index 17
    ledger.dispatch("e0:17", policy_version=3)
    ledger.finish("e0:17", finished_sample)              # once per sample
    ledger.consume(["e0:17"], step=4)
    # a checkpoint: partial_rollout.checkpoint.RolloutCheckpointer cuts the ledger with the engine
    report = audit(run_dir / "events.jsonl")             # lost / duplicated, from the log alone
"""

from partial_rollout.ledger.audit import AuditError, AuditReport, audit, effective_timeline
from partial_rollout.ledger.entry import GroupEntry
from partial_rollout.ledger.events import (
    ENGINE_FAILOVER,
    EVENTS_FILENAME,
    TRAIN_STEP,
    EventKind,
    EventLog,
    EventTail,
    read_events,
)
from partial_rollout.ledger.ledger import WorkLedger, request_id

__all__ = [
    "ENGINE_FAILOVER",
    "EVENTS_FILENAME",
    "TRAIN_STEP",
    "AuditError",
    "AuditReport",
    "EventKind",
    "EventLog",
    "EventTail",
    "GroupEntry",
    "WorkLedger",
    "audit",
    "effective_timeline",
    "read_events",
    "request_id",
]
