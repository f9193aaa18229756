"""The work ledger, its event log and the audit, without an engine: every rule on small hand-made runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from snapshot_helpers import save_ledger

from partial_rollout.errors import BadInputError, PartialRolloutError, SnapshotError
from partial_rollout.ledger import (
    TRAIN_STEP,
    AuditError,
    EventKind,
    EventLog,
    EventTail,
    WorkLedger,
    audit,
    read_events,
    request_id,
)
from partial_rollout.ledger.manifest import STATE_VERSION, VERSION_KEY
from partial_rollout.snapshot import (
    SNAPSHOT_FILENAME,
    Fingerprints,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    load_snapshot,
    save_snapshot,
)

SPEC = SamplingSpec(max_tokens=8, seed=1)
FP = Fingerprints(model="sha256:m", tokenizer="sha256:t", vocab_size=512, vllm_version="0.32.0")


def finished(index: int, n: int = 3, reward: float = 1.0) -> SampleRecord:
    return SampleRecord(
        index=index,
        state=SampleState.FINISHED,
        sampling=SPEC,
        token_ids=np.arange(n) + 5,
        logprobs=np.full(n, -0.5),
        versions=np.zeros(n, np.int32),
        finish_reason="length",
        reward=reward,
    )


def in_flight(n: int) -> SampleRecord:
    return SampleRecord(
        index=0,
        state=SampleState.IN_FLIGHT,
        sampling=SPEC,
        token_ids=np.arange(n) + 7,
        logprobs=np.full(n, -1.0),
        versions=np.zeros(n, np.int32),
    )


def run_group(ledger: WorkLedger, gid: str, *, step: int | None = None, samples: int = 2) -> None:
    ledger.yield_group(gid, [0, 9, 9], [SPEC] * samples, data={"target": 1})
    ledger.dispatch(gid, policy_version=0)
    for i in range(samples):
        ledger.finish(gid, finished(i))
    if step is not None:
        ledger.consume([gid], step=step)


def test_transitions_enforce_the_life_of_a_group(tmp_path: Path) -> None:
    ledger = WorkLedger(EventLog(tmp_path / "events.jsonl", fresh=True))
    ledger.yield_group("e0:1", [0, 4], [SPEC, SPEC])
    with pytest.raises(ValueError, match="already outstanding"):
        ledger.yield_group("e0:1", [0, 4], [SPEC])
    with pytest.raises(ValueError, match="pending, expected ready"):
        ledger.consume(["e0:1"], step=1)
    ledger.dispatch("e0:1", policy_version=3)
    assert ledger.finish("e0:1", finished(0)) is False
    assert ledger.finish("e0:1", finished(1)) is True
    assert ledger["e0:1"].state is GroupState.READY
    ledger.consume(["e0:1"], step=1)
    assert "e0:1" not in ledger and len(ledger) == 0
    kinds = [e["event"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds == ["yield", "dispatch", "finish", "finish", "ready", "consume"]
    assert ledger.counters == {"yielded": 1, "dispatched": 1, "finished": 2, "consumed": 1, "evicted": 0}


def test_capture_merges_engine_view_and_unknown_requests_restart(tmp_path: Path) -> None:
    ledger = WorkLedger()
    ledger.yield_group("g", [0, 4], [SPEC] * 3)
    ledger.dispatch("g", policy_version=0)
    ledger.finish("g", finished(0))
    # Engine: sample 1 has a 4-token prefix; sample 2 was never submitted (not in the cut).
    ledger.capture({request_id("g", 1): in_flight(4), request_id("g", 0): in_flight(1)})
    samples = ledger["g"].samples
    assert samples[0].state is SampleState.FINISHED  # what the trainer already has wins
    assert samples[1].state is SampleState.IN_FLIGHT and samples[1].index == 1 and samples[1].num_tokens == 4
    assert samples[2].state is SampleState.NOT_STARTED


def test_a_group_finished_at_once_is_ready_after_its_last_sample_not_before(tmp_path: Path) -> None:
    """A cut records samples generated but not yet scored as finished; a trainer that then scores the
    whole group (NeMo RL's rollout does) records every sample before the group may be ready."""
    ledger = WorkLedger(EventLog(tmp_path / "events.jsonl", fresh=True))
    ledger.yield_group("g", [0, 4], [SPEC] * 3)
    ledger.dispatch("g", policy_version=0)
    unscored = dataclasses.replace(finished(0), reward=None)
    ledger.capture({request_id("g", i): dataclasses.replace(unscored, index=i) for i in (1, 2)})
    with pytest.raises(ValueError, match="ready, expected in_flight"):  # settling per sample: ready too early
        for i in range(3):
            ledger.finish("g", finished(i))
    ledger = WorkLedger(EventLog(tmp_path / "events2.jsonl", fresh=True))
    ledger.yield_group("g", [0, 4], [SPEC] * 3)
    ledger.dispatch("g", policy_version=0)
    ledger.capture({request_id("g", i): dataclasses.replace(unscored, index=i) for i in (1, 2)})
    for i in range(3):
        assert ledger.finish("g", finished(i, reward=float(i)), settle=False) is False
    assert ledger["g"].state is GroupState.IN_FLIGHT
    assert ledger.settle("g") is True
    assert [s.reward for s in ledger["g"].samples] == [0.0, 1.0, 2.0]
    kinds = [e["event"] for e in read_events(tmp_path / "events2.jsonl")]
    assert kinds == ["yield", "dispatch", "finish", "finish", "finish", "ready"]


def busy_ledger(tmp_path: Path) -> WorkLedger:
    """A ready group, an in-flight one with a 5-token prefix captured, a pending one, and an eviction."""
    ledger = WorkLedger(EventLog(tmp_path / "events.jsonl", fresh=True))
    run_group(ledger, "ready")
    ledger.yield_group("pending", [0, 5], [SPEC])
    ledger.yield_group("flying", [0, 6], [SPEC, SPEC])
    ledger.dispatch("flying", policy_version=0)
    ledger.capture({request_id("flying", 0): in_flight(5)})
    ledger.evict("pending", reason="too_stale")
    ledger.yield_group("pending2", [0, 5], [SPEC])
    return ledger


def test_state_dict_is_a_small_manifest_without_tokens(tmp_path: Path) -> None:
    ledger = busy_ledger(tmp_path)
    for i in range(100):  # many long prompts must not grow the manifest
        ledger.yield_group(f"long{i}", np.arange(1000) % 500, [SPEC])
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_ledger(ledger, folder, trainer_step=4, policy_version=4, fingerprints=FP, loader_state=None)
    manifest = ledger.state_dict()
    assert manifest == {
        "version": STATE_VERSION,
        "counters": {"yielded": 104, "dispatched": 2, "finished": 2, "consumed": 0, "evicted": 1},
        "evicted_by_reason": {"too_stale": 1},
        "last_save_id": ledger.last_save_id,
        "snapshot_file": SNAPSHOT_FILENAME,
    }
    assert ledger.last_save_id.startswith("step4-") and (folder / manifest["snapshot_file"]).is_file()
    assert len(json.dumps(manifest)) < 400  # JSON-native and small: no group, no token


def test_save_and_load_restore_the_groups_from_the_snapshot(tmp_path: Path) -> None:
    ledger = busy_ledger(tmp_path)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    snap = save_ledger(ledger, folder, trainer_step=4, policy_version=4, fingerprints=FP, loader_state={"cursor": 3})
    restored = WorkLedger()
    loaded = restored.load(folder, expect=FP)
    assert loaded == snap and loaded.loader_state == {"cursor": 3}
    assert restored.state_dict() == ledger.state_dict()
    assert [g.group_id for g in restored.groups()] == ["ready", "flying", "pending2"]
    for group in ledger.groups():
        assert restored[group.group_id] == group  # tokens, logprobs, versions, states: all from the snapshot
    assert restored["flying"].samples[0].num_tokens == 5
    save = next(e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "save")
    assert save["samples_in_flight"] == 1 and save["prefix_tokens"] == 5
    assert save["groups"] == {"pending": 1, "in_flight": 1, "ready": 1}

    ready_only = tmp_path / "ready_only"
    ready_only.mkdir()
    save_ledger(
        ledger,
        ready_only,
        trainer_step=4,
        policy_version=4,
        fingerprints=FP,
        loader_state=None,
        states={GroupState.READY},
    )
    assert [g.group_id for g in WorkLedger().load(ready_only).groups] == ["ready"]


def test_load_state_dict_restores_the_manifest_and_leaves_groups_to_load(tmp_path: Path) -> None:
    ledger = busy_ledger(tmp_path)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_ledger(ledger, folder, trainer_step=4, policy_version=4, fingerprints=FP, loader_state=None)
    manifest = json.loads(json.dumps(ledger.state_dict()))  # as a trainer would store it
    copy = WorkLedger()
    copy.yield_group("stale", [0, 1], [SPEC])
    copy.load_state_dict(manifest)
    assert copy.state_dict() == ledger.state_dict() and len(copy) == 0
    copy.load(folder)
    assert copy.state_dict() == ledger.state_dict() and len(copy) == len(ledger)


def test_load_state_dict_rejects_another_version_or_a_bad_field(tmp_path: Path) -> None:
    ledger = busy_ledger(tmp_path)
    good = ledger.state_dict()
    version_1 = {**good, "version": 1, "groups": []}
    copy = WorkLedger()
    with pytest.raises(BadInputError, match=rf"ledger state\.version: version 1, expected {STATE_VERSION}\. "):
        copy.load_state_dict(version_1)
    with pytest.raises(BadInputError, match=r"ledger state\.version: version None"):
        copy.load_state_dict({k: v for k, v in good.items() if k != VERSION_KEY})
    with pytest.raises(BadInputError, match=r"ledger state: missing keys \['snapshot_file'\], unknown keys \[\]"):
        copy.load_state_dict({k: v for k, v in good.items() if k != "snapshot_file"})
    with pytest.raises(BadInputError, match=r"ledger state\.counters: must count exactly"):
        copy.load_state_dict({**good, "counters": {**good["counters"], "yielded": -1}})
    with pytest.raises(BadInputError, match=r"ledger state\.last_save_id: must be a string or null"):
        copy.load_state_dict({**good, "last_save_id": 7})
    assert copy.state_dict() == WorkLedger().state_dict()  # nothing was half-adopted


def test_load_refuses_a_snapshot_whose_manifest_is_not_the_ledgers(tmp_path: Path) -> None:
    ledger = busy_ledger(tmp_path)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_ledger(
        ledger,
        folder,
        trainer_step=4,
        policy_version=4,
        fingerprints=FP,
        loader_state=None,
        metadata={"ledger": {"version": 1}},
    )  # a trainer extra may not shadow the manifest: it is overwritten
    WorkLedger().load(folder)
    snapshot = load_snapshot(folder)
    old = {**snapshot.metadata, "ledger": {**snapshot.metadata["ledger"], "version": 1}}
    save_snapshot(dataclasses.replace(snapshot, metadata=old), folder)
    with pytest.raises(SnapshotError, match=rf"{SNAPSHOT_FILENAME}: metadata\.ledger\.version: version 1, expected 2"):
        WorkLedger().load(folder)
    unmarked = {k: v for k, v in snapshot.metadata.items() if k != "ledger"}
    save_snapshot(dataclasses.replace(snapshot, metadata=unmarked), folder)
    with pytest.raises(SnapshotError, match=r"metadata\.ledger: missing: not written by WorkLedger"):
        WorkLedger().load(folder)


def test_event_log_survives_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path, fresh=True)
    log.append("yield", prompt="a")
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"seq":1,"event":"yie')  # the writer was killed mid-line
    assert [e["prompt"] for e in read_events(path)] == ["a"]
    log = EventLog(path)  # a resumed writer cuts the fragment off before appending
    log.append("yield", prompt="b")
    log.close()
    assert [(e["seq"], e["prompt"]) for e in read_events(path)] == [(0, "a"), (1, "b")]
    path.write_bytes(b'{"event":"yield"}\nnot json\n{"event":"yield"}\n')
    with pytest.raises(BadInputError, match=rf"{path}: line 2: not JSON .*only the last line may be torn"):
        list(read_events(path))
    path.write_bytes(b'{"event":"yield"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    with pytest.raises(BadInputError, match=rf"{path}: line 2: not JSON"):
        list(read_events(path))
    path.write_bytes(b'{"event":"yield"}\n{"event":3}\n')
    with pytest.raises(BadInputError, match="line 2: not an event object"):
        list(read_events(path))


def test_an_event_tail_returns_each_completed_event_once_across_a_kill_and_resume(tmp_path: Path) -> None:
    """What the kill harness polls the child's log with: the bytes added since the last read, not the file."""
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read() == []  # no log yet
    log = EventLog(path, fresh=True)
    log.append("yield", prompt="a")
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"seq":1,"event":"yie')  # the writer was killed mid-line
    assert [e["prompt"] for e in tail.read()] == ["a"]  # the torn line waits
    later = EventTail(path)  # a watcher that starts now sees only what comes next
    log = EventLog(path)  # a resumed writer cuts the fragment off and appends
    log.append("yield", prompt="b")
    assert [e["prompt"] for e in tail.read()] == ["b"] and tail.read() == []
    assert [e["prompt"] for e in later.read()] == ["b"]
    log.close()
    with open(path, "ab") as f:
        f.write(b"not json\n")
    with pytest.raises(BadInputError, match=rf"{path}: line 3: not JSON"):
        tail.read()


def test_audit_clean_run_and_the_end_event(tmp_path: Path) -> None:
    ledger = WorkLedger(EventLog(tmp_path / "events.jsonl", fresh=True))
    ledger.record_start()
    run_group(ledger, "a", step=1)
    run_group(ledger, "b")
    ledger.yield_group("c", [0, 1], [SPEC])
    ledger.evict("b", reason="too_stale")
    report = audit(tmp_path / "events.jsonl")
    assert not report.complete and report.open_ids == ["c"] and report.lost == 0
    ledger.record_end(step=1)
    report = audit(tmp_path / "events.jsonl")
    assert report.complete
    assert (report.yielded, report.trained, report.evicted, report.outstanding_at_end) == (3, 1, 1, 1)
    assert report.lost == 0 and report.duplicated == 0 and report.evicted_by_reason == {"too_stale": 1}


def kill_and_resume(tmp_path: Path, *, keep: set[GroupState]) -> Path:
    """Process 1 trains a, saves with b ready, c in flight, d pending, then does more work and dies;
    process 2 resumes from the save (restoring what ``keep`` saved) and finishes."""
    path = tmp_path / "events.jsonl"
    folder = tmp_path / "step_1"
    folder.mkdir()
    p1 = WorkLedger(EventLog(path, fresh=True))
    p1.record_start()
    run_group(p1, "a", step=1)
    run_group(p1, "b")
    p1.yield_group("c", [0, 1], [SPEC])
    p1.dispatch("c", policy_version=1)
    p1.yield_group("d", [0, 1], [SPEC])
    save_ledger(p1, folder, trainer_step=1, policy_version=1, fingerprints=FP, loader_state=None, states=keep)
    # Work after the save: trained by process 1, then thrown away with it (SIGKILL).
    p1.finish("c", finished(0, n=6))
    p1.consume(["b", "c"], step=2)
    p1.events.close()

    p2 = WorkLedger(EventLog(path))
    p2.load(folder)
    p2.record_resume()
    for group in list(p2.groups(GroupState.PENDING)):
        p2.dispatch(group.group_id, policy_version=1)
    for group in list(p2.groups(GroupState.IN_FLIGHT)):
        p2.finish(group.group_id, finished(0, n=6), prefix_tokens=0)
    ids = [g.group_id for g in p2.groups(GroupState.READY)]
    p2.consume(ids[:2], step=2)
    run_group(p2, "e", step=3)
    p2.record_end(step=3)
    return path


def test_audit_rolls_back_work_after_the_save_it_resumes_from(tmp_path: Path) -> None:
    report = audit(kill_and_resume(tmp_path, keep=set(GroupState)))
    # b and c were consumed twice in the file (before the kill and after the resume): not duplication.
    assert report.duplicated == 0 and report.lost == 0
    assert (report.yielded, report.trained, report.outstanding_at_end) == (5, 4, 1)
    (resume,) = report.resumes
    assert resume["rolled_back_consumes"] == 2 and resume["lost"] == 0
    assert (
        resume["saved_by_state"] == resume["outstanding_at_save_by_state"] == {"pending": 1, "in_flight": 1, "ready": 1}
    )
    assert report.tokens_regenerated == 6  # c's 6 tokens were generated, rolled back, generated again


def test_audit_finds_what_a_ready_only_save_loses(tmp_path: Path) -> None:
    report = audit(kill_and_resume(tmp_path, keep={GroupState.READY}))
    assert report.lost_ids == ["c", "d"] and report.duplicated == 0
    resume = report.resumes[0]
    assert resume["lost_ids"] == ["c", "d"] and resume["outstanding_at_save"] == 3
    assert resume["saved_by_state"] == {"pending": 0, "in_flight": 0, "ready": 1}
    assert resume["outstanding_at_save_by_state"] == {"pending": 1, "in_flight": 1, "ready": 1}
    assert resume["samples_unfinished_at_save"] == 1


def test_audit_counts_real_duplicates_and_rejects_unknown_saves(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    ledger = WorkLedger(EventLog(path, fresh=True))
    run_group(ledger, "a", step=1)
    ledger.events.append(EventKind.CONSUME, prompt="a", step=2)  # a buggy trainer trains it again
    assert audit(path).duplicated_ids == ["a"]
    ledger.events.append(EventKind.RESUME, save_id="step9-nowhere")
    with pytest.raises(
        AuditError, match=rf"{path}: event 7: resume from save 'step9-nowhere', which the log does not hold"
    ):
        audit(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"seq":1,"event":"consume","prompt":"b","step":1}', r"event 1: consume of 'b', which was never yielded"),
        ('{"seq":1,"event":"yield","prompt":["a"]}', r"line 2: a yield event needs 'prompt' of type str, got \['a'\]"),
        ('{"event":"yield","prompt":"a"}', r"line 2: the event has no integer 'seq'"),
        ('{"seq":1,"event":"end","step":1,"outstanding":[1]}', r"line 2: 'outstanding' must list prompt ids"),
        ('{"seq":1,"event":"finish","prompt":"a","tokens":"many"}', r"line 2: 'tokens' must be a token count"),
    ],
)
def test_audit_names_the_file_and_event_of_a_log_it_cannot_read(tmp_path: Path, line: str, message: str) -> None:
    """Every audit error is a user-input error (the CLI prints one line and exits 3), never a KeyError or TypeError."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"seq":0,"event":"yield","prompt":"a"}\n' + line + "\n")
    with pytest.raises(AuditError, match=rf"{path}: {message}") as info:
        audit(path)
    assert isinstance(info.value, PartialRolloutError)


def test_event_kinds_are_the_strings_logs_hold(tmp_path: Path) -> None:
    """``events.jsonl`` files exist: the kinds are plain strings in them and compare equal to the constants."""
    ledger = WorkLedger(EventLog(tmp_path / "events.jsonl", fresh=True))
    ledger.record_start()
    ledger.log(TRAIN_STEP, step=1, reward=0.5)
    raw = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in raw] == ["start", "log"] and raw[1]["kind"] == "train_step"
    assert [e["event"] for e in read_events(tmp_path / "events.jsonl")] == [EventKind.START, EventKind.LOG]
    assert {k.value for k in EventKind} == {
        "start",
        "yield",
        "dispatch",
        "finish",
        "ready",
        "reopen",
        "consume",
        "evict",
        "regenerate",
        "save",
        "save_written",
        "save_failed",
        "resume",
        "end",
        "log",
    }
    assert audit(tmp_path / "events.jsonl").steps[0]["reward"] == 0.5


def test_audit_across_repeated_kills_and_a_save_that_never_committed(tmp_path: Path) -> None:
    """p1 saves S1 and dies; p2 resumes S1, logs a save S2 but dies before its checkpoint is committed;
    p3 resumes S1 again (the latest complete checkpoint) and finishes. Only p1-to-S1 plus p3 count."""
    path = tmp_path / "events.jsonl"
    s1 = tmp_path / "s1"
    s1.mkdir()
    p1 = WorkLedger(EventLog(path, fresh=True))
    p1.record_start()
    run_group(p1, "a", step=1)
    run_group(p1, "b")
    save_ledger(p1, s1, trainer_step=1, policy_version=1, fingerprints=FP, loader_state=None)
    p1.consume(["b"], step=2)
    p1.events.close()

    p2 = WorkLedger(EventLog(path))
    p2.load(s1)
    p2.record_resume()
    p2.consume(["b"], step=2)
    run_group(p2, "c")
    s2 = tmp_path / "s2.tmp"  # never renamed: no resume can use it
    s2.mkdir()
    save_ledger(p2, s2, trainer_step=2, policy_version=2, fingerprints=FP, loader_state=None)
    p2.consume(["c"], step=3)
    p2.events.close()

    p3 = WorkLedger(EventLog(path))
    p3.load(s1)
    p3.record_resume()
    p3.consume(["b"], step=2)
    run_group(p3, "c", step=3)
    p3.record_end(step=3)

    report = audit(path)
    assert (report.lost, report.duplicated, report.trained, report.yielded) == (0, 0, 3, 3)
    (resume,) = report.resumes  # p2's resume was itself rolled back by p3's
    assert resume["save_id"] == p3.last_save_id and resume["rolled_back_consumes"] == 2  # p2 redid b, then c
    assert report.tokens_regenerated == 3 * 2  # c's two samples (3 tokens each) were generated in vain by p2


def test_a_cut_is_a_copy_written_later_and_the_save_event_stands_where_it_was_taken(tmp_path: Path) -> None:
    ledger = busy_ledger(tmp_path)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    cut = ledger.cut(folder, trainer_step=4, policy_version=4, fingerprints=FP, loader_state={"cursor": 3})
    # After the cut (the engine runs again): the flying group finishes, a new prompt arrives.
    ledger.finish("flying", finished(0, n=7))
    ledger.finish("flying", finished(1))
    ledger.yield_group("later", [0, 7], [SPEC])
    ledger.record_save(cut, stall_ms=1.5)
    kinds = [e["event"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds[-5:] == ["save", "finish", "finish", "ready", "yield"]  # held back until the save event
    save = next(e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "save")
    assert save["stall_ms"] == 1.5 and save["in_flight"] == {"flying": [0, 1]}
    assert cut.write() > 0
    snapshot = load_snapshot(folder)
    flying = next(g for g in snapshot.groups if g.group_id == "flying")
    assert flying.state is GroupState.IN_FLIGHT and flying.samples[0].num_tokens == 5  # as cut, not as now
    assert [g.group_id for g in snapshot.groups] == ["ready", "flying", "pending2"]
    assert snapshot.loader_state == {"cursor": 3}
    assert ledger["flying"].state is GroupState.READY  # and the live ledger went on


def test_a_failed_write_names_the_previous_save_again_and_the_next_one_works(tmp_path: Path) -> None:
    ledger = busy_ledger(tmp_path)
    first = tmp_path / "first"
    first.mkdir()
    save_ledger(ledger, first, trainer_step=2, policy_version=2, fingerprints=FP, loader_state=None)
    kept = ledger.last_save_id
    cut = ledger.cut(
        tmp_path / "missing" / "x.safetensors", trainer_step=4, policy_version=4, fingerprints=FP, loader_state=None
    )
    ledger.record_save(cut)
    with pytest.raises(OSError):
        cut.write()  # the folder does not exist
    ledger.record_save_failed(cut, error="disk gone")
    assert ledger.last_save_id == kept and ledger.state_dict()["last_save_id"] == kept
    second = tmp_path / "second"
    second.mkdir()
    save_ledger(ledger, second, trainer_step=6, policy_version=6, fingerprints=FP, loader_state=None)
    assert load_snapshot(second).metadata["ledger"]["last_save_id"] == ledger.last_save_id != kept
    kinds = [e["event"] for e in read_events(tmp_path / "events.jsonl") if e["event"].startswith("save")]
    assert kinds == ["save", "save_written", "save", "save_failed", "save", "save_written"]
    ledger.cut(second, trainer_step=7, policy_version=7, fingerprints=FP, loader_state=None)
    with pytest.raises(RuntimeError, match="already open"):
        ledger.cut(second, trainer_step=8, policy_version=8, fingerprints=FP, loader_state=None)


def resumed_log(
    tmp_path: Path,
    *,
    finish_after_resume: bool,
    redo: list[str],
    running: tuple[str, ...] = (),
    end_step: int = 2,
    adopt: bool = False,
) -> Path:
    """p1 yields a, b; dispatches b with two samples, one finished; saves at step 1; yields c, d and dies.
    p2 resumes, yields ``redo`` (the loader's next prompts), finishes b if told to (or ``adopt``s it:
    the trainer's own checkpoint holds it finished) and trains it, ends at ``end_step`` with the
    engine still generating the requests ``running``."""
    path = tmp_path / "events.jsonl"
    folder = tmp_path / "step_1"
    folder.mkdir(parents=True)
    p1 = WorkLedger(EventLog(path, fresh=True))
    p1.record_start()
    run_group(p1, "a", step=1)
    p1.yield_group("b", [0, 1], [SPEC, SPEC])
    p1.dispatch("b", policy_version=1)
    p1.finish("b", finished(0))
    p1.capture({request_id("b", 1): dataclasses.replace(in_flight(4), index=1)})
    save_ledger(p1, folder, trainer_step=1, policy_version=1, fingerprints=FP, loader_state=None)
    for gid in ("c", "d"):
        p1.yield_group(gid, [0, 1], [SPEC])
    p1.events.close()
    p2 = WorkLedger(EventLog(path))
    p2.load(folder)
    p2.record_resume()
    for gid in redo:
        p2.yield_group(gid, [0, 1], [SPEC])
    if finish_after_resume:
        p2.finish("b", finished(1, n=6), prefix_tokens=4)
    if adopt:
        p2.adopt_ready("b", reason="committed_after_cut")
    if finish_after_resume or adopt:
        p2.consume(["b"], step=2)
    p2.record_end(step=end_step, running=running)
    return path


def test_audit_requires_groups_restored_in_flight_to_finish(tmp_path: Path) -> None:
    good = audit(resumed_log(tmp_path / "good", finish_after_resume=True, redo=["c", "d"]))
    assert good.stranded == 0 and good.clean and good.tokens_continued == 4
    assert good.resumes[0]["restored_in_flight"] == 1
    # The resume restored b in flight, but its continuation never came back: untrained at the end, not lost,
    # and before this rule the audit called that clean.
    bad = audit(resumed_log(tmp_path / "bad", finish_after_resume=False, redo=["c", "d"]))
    assert bad.lost == 0 and bad.duplicated == 0 and bad.outstanding_at_end == 3
    assert bad.stranded_ids == ["b"] and bad.resumes[0]["stranded_ids"] == ["b"] and not bad.clean


def test_audit_a_restored_group_the_trainer_holds_finished_is_not_stranded(tmp_path: Path) -> None:
    """NeMo RL's checkpoint can hold a group finished that our cut holds in flight: it is trained
    from there, without a finish event here; the ``ready`` event with its reason says so."""
    report = audit(resumed_log(tmp_path, finish_after_resume=False, redo=["c", "d"], adopt=True))
    assert report.stranded == 0 and report.clean and report.trained == 2 and report.tokens_continued == 0


def test_a_save_refuses_a_ready_group_with_unfinished_samples_and_keeps_the_last_one(tmp_path: Path) -> None:
    """The reader refuses such a group, so writing it would leave a checkpoint that cannot be resumed;
    the Session once made one by setting a restored group's state by hand."""
    ledger = WorkLedger(EventLog(tmp_path / "events.jsonl", fresh=True))
    ledger.yield_group("g", [0, 1], [SPEC, SPEC])
    ledger.dispatch("g", policy_version=1)
    save_ledger(ledger, tmp_path, trainer_step=1, policy_version=1, fingerprints=FP, loader_state=None)
    kept = (tmp_path / SNAPSHOT_FILENAME).read_bytes()
    ledger["g"].state = GroupState.READY
    with pytest.raises(ValueError, match="group 'g': every sample of a ready group must be finished"):
        save_ledger(ledger, tmp_path, trainer_step=2, policy_version=2, fingerprints=FP, loader_state=None)
    assert (tmp_path / SNAPSHOT_FILENAME).read_bytes() == kept
    assert [e["event"] for e in read_events(tmp_path / "events.jsonl")][-1] == "save_failed"


def test_adopted_groups_are_saved_as_their_records_are_and_reopened_ones_settle_again(tmp_path: Path) -> None:
    ledger = WorkLedger(EventLog(tmp_path / "events.jsonl", fresh=True))
    for gid in ("pending", "flying", "done"):
        ledger.yield_group(gid, [0, 1], [SPEC])
    for gid in ("flying", "done"):
        ledger.dispatch(gid, policy_version=1)
    ledger.finish("done", finished(0))
    for gid in ("pending", "flying"):
        ledger.adopt_ready(gid, reason="committed_after_cut")
    assert {g.group_id for g in ledger.groups(GroupState.READY)} == {"pending", "flying", "done"}
    snapshot = save_ledger(ledger, tmp_path, trainer_step=2, policy_version=2, fingerprints=FP, loader_state=None)
    assert [(g.group_id, g.state) for g in snapshot.groups] == [
        ("pending", GroupState.PENDING),
        ("flying", GroupState.IN_FLIGHT),
        ("done", GroupState.READY),
    ]
    save = next(e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "save")
    assert save["in_flight"] == {"flying": [0]}
    assert save["outstanding"] == save["groups"] == {"pending": 1, "in_flight": 1, "ready": 1}
    with pytest.raises(ValueError, match="'flying' is the trainer's to train"):
        ledger.reopen("flying")  # its finished copy is the trainer's, not ours to commit again
    ledger.consume(["flying"], step=3)
    ledger.regenerate("pending", reason="test")  # back to pending: saved as it is again
    ledger.reopen("done")
    assert ledger.settle("done")  # its sample is finished: ready again at once
    with pytest.raises(ValueError, match="'pending' is pending, expected ready"):
        ledger.reopen("pending")
    snapshot = save_ledger(ledger, tmp_path, trainer_step=3, policy_version=3, fingerprints=FP, loader_state=None)
    assert [(g.group_id, g.state) for g in snapshot.groups] == [
        ("pending", GroupState.PENDING),
        ("done", GroupState.READY),
    ]


def test_audit_an_evicted_or_regenerated_restored_group_is_not_stranded(tmp_path: Path) -> None:
    path = resumed_log(tmp_path, finish_after_resume=False, redo=["c", "d"])
    lines = path.read_text().splitlines()
    end = lines.pop()
    seq = json.loads(end)["seq"]
    lines.append(json.dumps({"seq": seq, "event": "evict", "prompt": "b", "reason": "stale_at_resume"}))
    lines.append(json.dumps({**json.loads(end), "seq": seq + 1, "outstanding": ["c", "d"]}))
    path.write_text("\n".join(lines) + "\n")
    assert audit(path).stranded == 0


def test_audit_a_continuation_the_last_step_cut_short_is_not_stranded(tmp_path: Path) -> None:
    """A CI run resumed with a long sample in flight, reached its last step on shorter groups first and
    ended with that sample still generating: the audit called it stranded. The end event now says which
    samples the engine was still generating; only those are excused."""
    path = resumed_log(tmp_path / "cut_short", finish_after_resume=False, redo=["c", "d"], running=("b/1", "c/0"))
    end = next(e for e in read_events(path) if e["event"] == "end")
    assert end["in_flight"] == {"b": [1]}  # c is pending: no request of it can be running
    report = audit(path)
    assert report.stranded == 0 and report.clean and report.outstanding_at_end == 3
    # Nothing more: the engine generating another sample of b, or nothing at all, leaves b stranded.
    for name, running in (("other", ("b/0",)), ("none", ())):
        report = audit(resumed_log(tmp_path / name, finish_after_resume=False, redo=["c", "d"], running=running))
        assert report.stranded_ids == ["b"] and not report.clean, name
    # A damaged list is refused by name, as in a save event.
    path = resumed_log(tmp_path / "bad_field", finish_after_resume=False, redo=[], running=("b/1",))
    path.write_text(path.read_text().replace('"in_flight":{"b":[1]}', '"in_flight":{"b":"1"}'))
    with pytest.raises(AuditError, match="'in_flight' must map prompt ids to lists of sample indices"):
        audit(path)


def test_audit_a_run_resumed_from_its_last_steps_checkpoint_strands_nothing(tmp_path: Path) -> None:
    """A CI kill landed after the run's last save; the resumed run had nothing left to train, so it
    ended at once without continuing b, and the audit called b stranded. Ending at the saved step is
    what tells this resume apart from one that dropped b and trained on (the ``bad`` log above)."""
    report = audit(resumed_log(tmp_path, finish_after_resume=False, redo=[], end_step=1))
    assert report.stranded == 0 and report.clean and report.lost == 0 and report.outstanding_at_end == 1
    assert report.resumes[0]["restored_in_flight"] == 1


def test_audit_checks_the_loader_cursor_against_the_killed_process(tmp_path: Path) -> None:
    # The resumed loader skipped c (a cursor saved one prompt too far): c is never yielded on the effective
    # timeline, so it cannot be lost; only comparing with what the killed process yielded shows it.
    report = audit(resumed_log(tmp_path, finish_after_resume=True, redo=["d", "e"]))
    assert report.lost == 0 and report.duplicated == 0
    assert report.cursor_mismatches == [
        {"save_id": report.resumes[0]["save_id"], "position": 0, "before_kill": "c", "after_resume": "d"}
    ]
    assert not report.clean


def test_audit_compares_the_yield_order_with_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    ledger = WorkLedger(EventLog(whole, fresh=True))
    ledger.record_start()
    for gid in ("a", "b", "c", "x"):
        ledger.yield_group(gid, [0, 1], [SPEC])
    ledger.record_end(step=0)
    same = audit(resumed_log(tmp_path / "same", finish_after_resume=True, redo=["c"]), reference=whole)
    assert same.yield_order == ["a", "b", "c"] and same.yield_divergence is None and same.clean
    other = audit(resumed_log(tmp_path / "other", finish_after_resume=True, redo=["c", "d"]), reference=whole)
    assert other.yield_divergence == {"position": 3, "expected": "x", "got": "d"} and not other.clean
