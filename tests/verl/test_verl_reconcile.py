"""The work ledger levelled with verl's TransferQueue (:func:`~partial_rollout_integrations.verl.reconcile.reconcile`).

In ``separate_async`` the servers generate until the save aborts them, so a cut can find a sample
its server finished while verl's reward loop has not stored it yet: the cut captures it finished.
It must still be recorded (and forgotten by its server) at the cut that finds it stored; otherwise
its group goes ready with a sample never recorded, and once trained, the record its server still
holds makes the next cut yield the group again (the duplicate the separate_async kill test found).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from partial_rollout.ledger import EventLog, WorkLedger, audit, request_id
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec
from partial_rollout_integrations.verl.reconcile import TqView, reconcile
from partial_rollout_integrations.verl.wire import HeldSample, sample_key, trajectory_key

UID = "group-a"
SPEC = SamplingSpec(max_tokens=8)


def _finished(index: int, tokens: int) -> HeldSample:
    record = SampleRecord(
        index=index,
        state=SampleState.FINISHED,
        sampling=SPEC,
        token_ids=np.full(tokens, 3, dtype=np.int32),
        logprobs=np.zeros(tokens, dtype=np.float32),
        versions=np.zeros(tokens, dtype=np.int32),
        finish_reason="stop",
    )
    return HeldSample(key=sample_key(UID, index), prompt_token_ids=[1, 2], record=record)


def _tq(*stored: int, prompt: bool = True) -> TqView:
    items = {trajectory_key(sample_key(UID, i)): {"status": "success"} for i in stored}
    if prompt:
        items[UID] = {"is_prompt": True, "status": "running"}
    return TqView.of(items)


def test_a_sample_captured_finished_before_verl_stored_it_is_recorded_once_stored(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    ledger = WorkLedger(EventLog(events, fresh=True))
    ledger.record_start(trainer="verl")
    first, second = _finished(0, 5), _finished(1, 4)
    held = {s.key: s for s in (first, second)}

    # Cut 1: verl stored sample 0; sample 1 finished on its server, its reward still running.
    forget = reconcile(ledger, held, _tq(0), n=2, policy_version=0, step=1)
    assert forget == [first.key]
    ledger.capture({request_id(UID, 1): second.record})  # the cut takes the servers' view of the rest
    assert ledger[UID].samples[1].state is SampleState.FINISHED
    held.pop(first.key)

    # Cut 2: verl stored sample 1 too; it is recorded now, and its server may forget it.
    forget = reconcile(ledger, held, _tq(0, 1), n=2, policy_version=1, step=2)
    assert forget == [second.key]
    held.pop(second.key)

    # Cut 3: verl trained the group (it left the TQ); nothing is yielded again.
    assert reconcile(ledger, held, _tq(0, 1, prompt=False), n=2, policy_version=2, step=3) == []
    ledger.record_end(step=3)
    assert ledger.events is not None
    ledger.events.close()

    finished = [(e["prompt"], e["sample"]) for e in map(json.loads, events.open()) if e["event"] == "finish"]
    assert finished == [(UID, 0), (UID, 1)]
    report = audit(events)
    assert (report.yielded, report.trained, report.duplicated, report.lost) == (1, 1, 0, 0)
