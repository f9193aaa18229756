"""The checkpointer's own contract, on real files and a real loader: what a trainer's checkpoint holds,
how a write reports its outcome, and what it refuses.

The engine-side behaviour (a cut of live requests, continued prefixes) is tested on the real engine
by tests/test_readme_example.py and the reference trainer's tests; here the saves keep no in-flight
work, so no engine is frozen, except for one stand-in engine that fails to capture on purpose.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.checkpoint as dcp
from snapshot_helpers import fingerprints, sample
from torch.distributed.checkpoint.stateful import Stateful
from torchdata.stateful_dataloader import StatefulDataLoader

from partial_rollout.checkpoint import (
    RECORD_ONLY,
    STALE_AT_RESUME,
    RestorePolicy,
    RolloutCheckpointer,
    SyncCheckpointer,
    apply_on_stale,
)
from partial_rollout.engine import Cut
from partial_rollout.errors import BadInputError, SnapshotError
from partial_rollout.ledger import audit, read_events
from partial_rollout.snapshot import GroupState, SampleRecord, SampleState, SamplingSpec, find_snapshot

FP = fingerprints()
SPEC = SamplingSpec(max_tokens=8, seed=1)
KEEP = {GroupState.PENDING, GroupState.READY}


def _loader() -> StatefulDataLoader:
    return StatefulDataLoader([[5, 6, 7 + i] for i in range(8)], batch_size=None)


def _checkpointer(run: Path, *, loader: Any = None, fresh: bool = False) -> RolloutCheckpointer:
    return RolloutCheckpointer(None, events=run / "events.jsonl", fresh=fresh, loader=loader, fingerprints=FP)


async def _first_run(run: Path, loader: StatefulDataLoader) -> tuple[RolloutCheckpointer, dict[str, Any]]:
    """Yield 3 prompts, finish one, save into ``step_1``; then the loader runs on past the cut."""
    ckpt = _checkpointer(run, loader=loader, fresh=True)
    await ckpt.restore(None)
    prompts = iter(loader)
    for i in range(3):
        ckpt.yield_group(f"e0:{i}", next(prompts), [SPEC])
    ckpt.ledger.dispatch("e0:0", policy_version=0)
    ckpt.ledger.finish("e0:0", sample(0, SampleState.FINISHED, 3, version=0, sampling=SPEC, reward=1.0))
    at_cut = loader.state_dict()
    pending = await ckpt.save(run / "step_1", trainer_step=1, policy_version=0, states=KEEP)
    next(prompts)  # the live cursor moves past the cut
    await asyncio.to_thread(pending.write)
    return ckpt, at_cut


def test_the_trainer_checkpoint_holds_the_cuts_cursor_and_drops_into_dcp(tmp_path: Path) -> None:
    run = tmp_path / "run"

    async def scenario() -> dict[str, Any]:
        ckpt, at_cut = await _first_run(run, _loader())
        assert isinstance(ckpt, Stateful)
        state = ckpt.state_dict()
        assert state["loader"] == at_cut, "the cursor of the cut, not the live one"
        with warnings.catch_warnings():  # DCP warns that no process group is initialised
            warnings.simplefilter("ignore")
            dcp.save({"rollouts": ckpt}, checkpoint_id=tmp_path / "dcp")
        ckpt.close()

        # The restarted process: DCP hands the state back, then one restore brings the groups.
        loader = _loader()
        resumed = _checkpointer(run, loader=loader)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load({"rollouts": resumed}, checkpoint_id=tmp_path / "dcp")
        assert loader.state_dict() == at_cut
        restored = await resumed.restore(run / "step_1", step=1)
        assert (restored.ready, restored.pending, restored.in_flight) == (["e0:0"], ["e0:1", "e0:2"], [])
        assert next(iter(loader)) == [5, 6, 10], "the loader yields the prompt after the cut's"
        resumed.ledger.consume(restored.ready, step=2)
        for group_id in restored.pending:
            resumed.ledger.evict(group_id, reason="test_done")
        resumed.ledger.record_end(step=2)
        resumed.close()
        return at_cut

    asyncio.run(scenario())
    report = audit(run / "events.jsonl")
    assert report.complete and report.clean and report.trained == 1 and len(report.resumes) == 1
    events = list(read_events(run / "events.jsonl"))
    kinds = [e["event"] for e in events]
    assert kinds.index("save") < kinds.index("save_written") < kinds.index("resume")
    (written,) = [e for e in events if e["event"] == "save_written"]
    assert written["bytes"] == find_snapshot(run / "step_1").stat().st_size and written["write_ms"] >= 0


def test_a_snapshot_of_another_save_than_the_trainer_state_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"

    async def scenario() -> None:
        ckpt, _ = await _first_run(run, _loader())
        state = ckpt.state_dict()  # the trainer's checkpoint of step 1 ...
        pending = await ckpt.save(run / "step_2", trainer_step=2, policy_version=0, states=KEEP)
        pending.write()  # ... and a later snapshot
        ckpt.close()
        resumed = _checkpointer(run, loader=_loader())
        resumed.load_state_dict(state)
        with pytest.raises(SnapshotError, match=r"step_2: metadata\.ledger\.last_save_id: is save 'step2-.*'step1-"):
            await resumed.restore(run / "step_2")

    asyncio.run(scenario())


def test_the_trainers_check_sees_the_snapshot_once_and_its_refusal_restores_nothing(tmp_path: Path) -> None:
    """A trainer's own test of a snapshot (another run's, other sampling) runs inside ``restore`` on
    the snapshot the library read and checked, before the ledger, the loader or the event log change."""
    run = tmp_path / "run"

    async def scenario() -> None:
        ckpt, at_cut = await _first_run(run, _loader())
        ckpt.close()
        seen: list[tuple[list[str], Path]] = []

        def refuse(snapshot: Any, path: Path) -> None:
            seen.append(([g.group_id for g in snapshot.groups], path))
            raise SnapshotError("is not of this run", path=path, field="groups[0].group_id")

        loader = _loader()
        next(iter(loader))
        moved = loader.state_dict()
        resumed = _checkpointer(run, loader=loader)
        events_before = (run / "events.jsonl").read_bytes()
        refused = r"step_1/partial_rollouts\.safetensors: groups\[0\]\.group_id: is not of"
        with pytest.raises(SnapshotError, match=refused):
            await resumed.restore(run / "step_1", check=refuse, step=1)
        assert seen == [(["e0:0", "e0:1", "e0:2"], find_snapshot(run / "step_1"))]
        assert list(resumed.ledger.groups()) == [] and resumed.ledger.last_save_id is None
        assert loader.state_dict() == moved != at_cut, "the loader was not put back"
        assert (run / "events.jsonl").read_bytes() == events_before, "no resume was logged"

        accepted: list[Path] = []
        restored = await resumed.restore(run / "step_1", check=lambda _, path: accepted.append(path), step=1)
        assert accepted == [find_snapshot(run / "step_1")] and restored.ready == ["e0:0"]
        resumed.close()

    asyncio.run(scenario())


def test_a_bad_trainer_state_is_refused_naming_the_key(tmp_path: Path) -> None:
    ckpt = _checkpointer(tmp_path, loader=_loader(), fresh=True)
    good = ckpt.state_dict()
    for bad, match in (
        ({**good, "version": 7}, r"rollout checkpointer state\.version: version 7, expected 1"),
        ({k: v for k, v in good.items() if k != "loader"}, r"missing keys \['loader'\]"),
        ({**good, "extra": 1}, r"unknown keys \['extra'\]"),
        ({**good, "ledger": "{not json"}, r"rollout checkpointer state\.ledger: must be the ledger's manifest"),
        ({**good, "loader": [1]}, r"rollout checkpointer state\.loader: must be the loader's state_dict"),
    ):
        with pytest.raises(BadInputError, match=match):
            ckpt.load_state_dict(bad)


def test_a_failed_write_logs_save_failed_and_keeps_the_previous_snapshot(tmp_path: Path) -> None:
    async def scenario() -> None:
        ckpt, _ = await _first_run(tmp_path, _loader())
        before = find_snapshot(tmp_path / "step_1").read_bytes()
        pending = await ckpt.save(tmp_path / "step_2", trainer_step=2, policy_version=0, states=KEEP)

        def commit() -> None:
            raise OSError(28, "No space left on device (injected)")

        with pytest.raises(OSError, match="injected"):
            await asyncio.to_thread(pending.write, commit=commit)  # the outcome is logged on the loop
        assert find_snapshot(tmp_path / "step_1").read_bytes() == before
        assert ckpt.ledger.last_save_id != pending.save_id, "the manifest names the save that exists again"
        with pytest.raises(RuntimeError, match="already written"):
            pending.write()
        ckpt.close()

    asyncio.run(scenario())
    events = list(read_events(tmp_path / "events.jsonl"))
    (failed,) = [e for e in events if e["event"] == "save_failed"]
    assert "injected" in failed["error"]
    assert events[-1]["event"] == "save_failed", "logged once the thread's write failed, on the event loop"


def test_a_window_is_written_only_after_its_thaw(tmp_path: Path) -> None:
    async def scenario() -> None:
        ckpt = _checkpointer(tmp_path, fresh=True)
        ckpt.ledger.yield_group("e0:0", [5, 6], [SPEC])
        window = await ckpt.freeze(engine=False)
        pending = window.cut(tmp_path / "step_1", trainer_step=1, policy_version=0, states=KEEP)
        with pytest.raises(RuntimeError, match="thaw\\(\\) its window before writing"):
            pending.write()  # on the loop, it would wait for its own save event forever
        with pytest.raises(RuntimeError, match="one cut"):
            window.cut(tmp_path / "step_1", trainer_step=1, policy_version=0)
        await window.thaw()
        pending.write()
        ckpt.close()

    asyncio.run(scenario())
    kinds = [e["event"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds[-2:] == ["save", "save_written"]


class _Forgetful:
    """Stands for a faulty engine: it holds a request it was given but leaves it out of its cut."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def generate(
        self, request_id: str, prompt: Sequence[int], sampling: SamplingSpec, *, index: int, resume_from: Any = None
    ) -> SampleRecord:
        self.started.set()
        await self.release.wait()
        return sample(index, SampleState.FINISHED, 2, sampling=sampling)

    async def cut(self) -> Cut:
        self.release.set()  # the engine goes on; its cut forgets the request
        return Cut(samples={})

    async def fingerprints(self) -> Any:
        return FP


def test_a_cut_that_misses_a_running_request_fails_instead_of_losing_its_tokens(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = _Forgetful()
        ckpt = RolloutCheckpointer(engine, events=tmp_path / "events.jsonl", fresh=True)  # type: ignore[arg-type]
        ckpt.ledger.yield_group("e0:0", [5, 6], [SPEC])
        rollout = asyncio.create_task(ckpt.rollout("e0:0", policy_version=0))
        await engine.started.wait()
        with pytest.raises(RuntimeError, match=r"lacks 1 running request\(s\) \['e0:0/0'\]"):
            await ckpt.save(tmp_path / "step_1", trainer_step=1, policy_version=0)
        assert engine.release.is_set(), "the engine went on"
        (outcome,) = await rollout
        assert outcome.generated_tokens == 2 and ckpt.ledger["e0:0"].state is GroupState.READY
        ckpt.close()

    asyncio.run(scenario())
    assert "save" not in [e["event"] for e in read_events(tmp_path / "events.jsonl")]


def test_the_staleness_policy_is_one_definition(tmp_path: Path) -> None:
    ckpt = _checkpointer(tmp_path, fresh=True)
    for group_id, version in (("old", 1), ("new", 5)):
        ckpt.ledger.yield_group(group_id, [5], [SPEC])
        ckpt.ledger.dispatch(group_id, policy_version=version)
    groups = list(ckpt.ledger.groups())

    def stale(group: Any) -> bool:
        return bool(group.dispatch_version < 3)

    assert apply_on_stale(ckpt.ledger, groups, is_stale=stale, policy="continue") == {}
    assert apply_on_stale(ckpt.ledger, groups, is_stale=stale, policy="regenerate") == {"old": "regenerate"}
    assert ckpt.ledger["old"].state is GroupState.PENDING
    assert apply_on_stale(ckpt.ledger, list(ckpt.ledger.groups()), is_stale=lambda g: True, policy="drop") == {
        "old": "drop",
        "new": "drop",
    }
    assert ckpt.ledger.evicted_by_reason == {STALE_AT_RESUME: 2}
    with pytest.raises(ValueError, match="on_stale: must be one of continue, regenerate, drop, got 'keep'"):
        apply_on_stale(ckpt.ledger, [], is_stale=stale, policy="keep")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one of ledger= .* or events="):
        RolloutCheckpointer(None, fingerprints=FP)
    with pytest.raises(ValueError, match="needs fingerprints="):
        RolloutCheckpointer(None, events=tmp_path / "other.jsonl")


def test_a_trainer_drives_the_run_through_the_checkpointer_alone(tmp_path: Path) -> None:
    """Start, yield, train, evict and end on the checkpointer (no ``.ledger``): the audit reads a whole
    run. A restart with nothing to resume is logged as a resume from nothing: the audit rolls the
    earlier attempt back whole (none of its work was saved), rather than forgetting it as a start would."""
    log = tmp_path / "events.jsonl"

    async def first() -> None:
        ckpt = _checkpointer(tmp_path, fresh=True)
        assert (await ckpt.restore(None, step=0)).snapshot is None
        for i in range(3):
            ckpt.yield_group(f"e0:{i}", [5, i], [SPEC])
        for i in range(2):
            ckpt.dispatch(f"e0:{i}", policy_version=0)
            ckpt.ledger.finish(f"e0:{i}", sample(0, SampleState.FINISHED, 3, version=0, sampling=SPEC))  # rollout()'s
        assert [g.group_id for g in ckpt.consume(["e0:0"], step=1)] == ["e0:0"]
        assert ckpt.evict("e0:1", reason="too_stale").group_id == "e0:1"
        ckpt.end(step=1)
        ckpt.close()

    async def restart() -> None:
        again = _checkpointer(tmp_path)  # the same log, appended: it holds a run already
        restored = await again.restore(None, step=0)
        assert (restored.snapshot, restored.in_flight, restored.pending, restored.ready) == (None, [], [], [])
        again.close()

    asyncio.run(first())
    report = audit(log)
    assert report.complete and (report.yielded, report.trained, report.evicted) == (3, 1, 1)
    assert (report.outstanding_at_end, report.lost, report.duplicated) == (1, 0, 0)
    logged = len(list(read_events(log)))

    asyncio.run(restart())
    events = list(read_events(log))
    assert [e["event"] for e in events if e["event"] in ("start", "resume", "end")] == ["start", "end", "resume"]
    assert events[-1]["checkpoint"] is None and events[-1]["step"] == 0
    (resume,) = audit(log).resumes
    assert resume["save_id"] is None and resume["rolled_back_events"] == logged


def test_a_frozen_window_thaws_when_its_body_raises(tmp_path: Path) -> None:
    async def scenario() -> None:
        ckpt = _checkpointer(tmp_path, fresh=True)
        ckpt.yield_group("e0:0", [5, 6], [SPEC])
        with pytest.raises(ValueError, match="the trainer's own failure"):
            async with ckpt.frozen(engine=False) as window:
                window.cut(tmp_path / "step_1", trainer_step=1, policy_version=0, states=KEEP)
                raise ValueError("the trainer's own failure")
        assert ckpt._open.is_set(), "the gate to the engine is open again"
        async with ckpt.frozen(engine=False) as window:  # and the next checkpoint goes ahead
            pending = window.cut(tmp_path / "step_2", trainer_step=2, policy_version=0, states=KEEP)
        pending.write()
        ckpt.close()

    asyncio.run(scenario())
    assert find_snapshot(tmp_path / "step_2").is_file()


def test_a_record_only_checkpointer_binds_its_snapshots_to_no_model(tmp_path: Path) -> None:
    """A run that only records (partial rollouts off) saves snapshots bound to RECORD_ONLY: a checkpointer
    of a model refuses them naming the field, a record-only one takes them back."""
    folder = tmp_path / "run" / "step_1"

    async def scenario() -> None:
        recorder = RolloutCheckpointer.record_only(None, events=tmp_path / "run" / "events.jsonl", fresh=True)
        await recorder.restore(None)
        recorder.yield_group("e0:0", [5, 6], [SPEC])
        await asyncio.to_thread((await recorder.save(folder, trainer_step=1, policy_version=0, states=KEEP)).write)
        recorder.close()

        of_a_model = _checkpointer(tmp_path / "other", fresh=True)
        with pytest.raises(SnapshotError, match="fingerprints.model: the snapshot was saved with 'record-only'"):
            await of_a_model.restore(folder)
        of_a_model.close()

        again = RolloutCheckpointer.record_only(None, events=tmp_path / "run" / "events.jsonl")
        restored = await again.restore(folder, step=1)
        assert restored.snapshot is not None and restored.snapshot.fingerprints == RECORD_ONLY
        assert restored.pending == ["e0:0"]
        again.close()

    asyncio.run(scenario())


def test_a_restored_group_whose_samples_all_finished_is_settled_by_its_rollout(tmp_path: Path) -> None:
    """The cut caught a group in flight whose last sample had finished: the restore hands it back in flight
    (settling is the trainer's pump's), and rollout() settles it without generating anything."""
    run = tmp_path / "run"

    class _Idle:
        """An engine holding no request when the cut is taken (both samples had returned)."""

        async def cut(self) -> Cut:
            return Cut(samples={})

        async def fingerprints(self) -> Any:
            return FP

    async def scenario() -> list[str]:
        ckpt = RolloutCheckpointer(_Idle(), events=run / "events.jsonl", fresh=True)  # type: ignore[arg-type]
        await ckpt.restore(None)
        ckpt.yield_group("e0:0", [5, 6], [SPEC, SPEC])
        ckpt.dispatch("e0:0", policy_version=0)
        for index in (0, 1):
            done = sample(index, SampleState.FINISHED, 3, version=0, sampling=SPEC)
            ckpt.ledger.finish("e0:0", done, settle=False)  # as sample() reports, before rollout() settles
        await asyncio.to_thread((await ckpt.save(run / "step_1", trainer_step=1, policy_version=0)).write)
        ckpt.close()

        resumed = _checkpointer(run)  # no engine: a rollout that generated would raise
        restored = await resumed.restore(run / "step_1", policy=RestorePolicy(on_stale="drop"), step=1)
        assert (restored.in_flight, restored.ready) == (["e0:0"], [])
        assert await resumed.rollout("e0:0") == []
        state = resumed.ledger["e0:0"].state
        resumed.close()
        return [state.value]

    assert asyncio.run(scenario()) == [GroupState.READY.value]


def test_a_restore_policy_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="on_stale: must be one of continue, regenerate, drop, got 'later'"):
        RestorePolicy(on_stale="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allow_vllm_change: must be true or false, got 'yes'"):
        RestorePolicy(allow_vllm_change="yes")  # type: ignore[arg-type]


def test_a_synchronous_trainer_drives_the_checkpointer_through_its_facade(tmp_path: Path) -> None:
    """verl's loop is synchronous: the facade runs the checkpointer on a loop thread of its own, raises its
    refusals in the calling thread, and stops that thread when closed."""
    run = tmp_path / "run"
    sync = SyncCheckpointer(lambda: _checkpointer(run, fresh=True), name="checkpointer-loop")
    try:
        assert sync.restore(None, step=0).snapshot is None

        async def yield_one() -> None:  # the ledger is the loop's: touched there
            sync.checkpointer.yield_group("e0:0", [5, 6], [SPEC])

        sync.run(yield_one())
        sync.save(run / "step_1", trainer_step=1, policy_version=0, states=KEEP).write()
        (tmp_path / "empty").mkdir()
        with pytest.raises(SnapshotError, match="no partial_rollouts.safetensors in this folder"):
            sync.restore(tmp_path / "empty")
    finally:
        sync.close()
    assert "checkpointer-loop" not in {t.name for t in threading.enumerate()}

    again = SyncCheckpointer(lambda: _checkpointer(run))
    try:
        assert again.restore(run / "step_1", step=1).pending == ["e0:0"]
    finally:
        again.close()
