"""The event records the ledger writes have exactly the fields their kind's ``TypedDict`` declares.

mypy checks each ``TypedDict`` the ledger builds, but not that it builds the one of the kind it logs
(``_emit(EventKind.YIELD, ConsumeEvent(...))`` type-checks); this test reads a log back and holds
every event to its kind's declaration, which the audit reads it through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NotRequired, get_origin, get_type_hints

from snapshot_helpers import fingerprints, save_ledger

from partial_rollout.ledger import TRAIN_STEP, EventKind, EventLog, WorkLedger, read_events
from partial_rollout.ledger import events as ev
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec

DECLARED: dict[EventKind, Any] = {
    EventKind.YIELD: ev.YieldEvent,
    EventKind.DISPATCH: ev.DispatchEvent,
    EventKind.FINISH: ev.FinishEvent,
    EventKind.READY: ev.ReadyEvent,
    EventKind.REOPEN: ev.ReopenEvent,
    EventKind.CONSUME: ev.ConsumeEvent,
    EventKind.EVICT: ev.EvictEvent,
    EventKind.REGENERATE: ev.RegenerateEvent,
    EventKind.START: ev.StartEvent,
    EventKind.SAVE: ev.SaveEvent,
    EventKind.SAVE_WRITTEN: ev.SaveWrittenEvent,
    EventKind.SAVE_FAILED: ev.SaveFailedEvent,
    EventKind.RESUME: ev.ResumeEvent,
    EventKind.END: ev.EndEvent,
    EventKind.LOG: ev.LogEvent,
}
HEADER = {"seq", "time", "pid", "event"}
TRAINER = {"trainer_field", "bytes"}
"""Fields of the trainer's in this run (``save()`` adds ``bytes`` to ``save_written`` as a trainer would)."""
TAKES_TRAINER_FIELDS = {EventKind.START, EventKind.SAVE, EventKind.SAVE_WRITTEN, EventKind.RESUME, EventKind.LOG}


def _finished(index: int, spec: SamplingSpec) -> SampleRecord:
    return SampleRecord(
        index=index,
        state=SampleState.FINISHED,
        sampling=spec,
        token_ids=[4, 5],
        logprobs=[-0.1, -0.2],
        versions=[0, 0],
        finish_reason="stop",
        reward=1.0,
    )


def _every_kind(run: Path) -> list[dict[str, Any]]:
    """A run that writes each event kind at least once (``ready`` with and without a reason)."""
    spec = SamplingSpec(max_tokens=8)
    ledger = WorkLedger(EventLog(run / "events.jsonl"))
    ledger.record_start(trainer_field=1)
    for group_id in ("a", "b", "c", "d"):
        ledger.yield_group(group_id, [1, 2], [spec])
        ledger.dispatch(group_id, policy_version=0)
    ledger.finish("a", _finished(0, spec), prefix_tokens=1)
    ledger.adopt_ready("b", reason="trainer_checkpoint")
    ledger.log(TRAIN_STEP, trainer_field=2)
    (run / "ckpt").mkdir()
    fp = fingerprints()
    save_ledger(
        ledger, run / "ckpt", trainer_step=1, policy_version=0, fingerprints=fp, loader_state=None, trainer_field=3
    )
    failed = ledger.cut(run / "never", trainer_step=1, policy_version=0, fingerprints=fp, loader_state=None)
    ledger.record_save(failed)
    ledger.record_save_failed(failed, error="OSError: disk full")
    ledger.reopen("a")
    ledger.finish("a", _finished(0, spec))
    ledger.consume(["a"], step=2)
    ledger.evict("c", reason="too_stale")
    ledger.regenerate("d", reason="weights_changed")
    written = ledger.cut(run / "ckpt", trainer_step=2, policy_version=0, fingerprints=fp, loader_state=None)
    ledger.record_save(written)
    ledger.record_written(written, trainer_field=4, bytes=written.write())
    ledger.load(run / "ckpt")
    ledger.record_resume(trainer_field=5)
    ledger.record_end(step=2, engines_left=1)
    return list(read_events(run / "events.jsonl"))


def _keys(declared: Any) -> tuple[set[str], set[str]]:
    """A ``TypedDict``'s required and optional keys. Read from its hints: under ``from __future__ import
    annotations`` Python 3.11's ``__required_keys__`` counts ``NotRequired`` fields as required."""
    hints = get_type_hints(declared, include_extras=True)
    optional = {name for name, hint in hints.items() if get_origin(hint) is NotRequired}
    return set(hints) - optional, optional


def test_every_event_has_the_fields_its_kind_declares(tmp_path: Path) -> None:
    events = _every_kind(tmp_path)
    assert {e["event"] for e in events} == set(DECLARED), "the run writes every kind"
    assert any(e["event"] == EventKind.READY and "reason" in e for e in events)
    for event in events:
        kind = EventKind(event["event"])
        fields = set(event) - HEADER
        required, optional = _keys(DECLARED[kind])
        allowed = required | optional
        if kind in TAKES_TRAINER_FIELDS:
            allowed |= TRAINER
        assert required <= fields, (kind, event)
        assert fields <= allowed, (kind, sorted(fields - allowed))
