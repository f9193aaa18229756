"""Restoring the trainer's cut, without an engine: permits re-taken, on_stale applied and accounted."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from snapshot_helpers import save_ledger

from partial_rollout.errors import ConfigError
from partial_rollout.ledger import EventLog, WorkLedger, audit, read_events, request_id
from partial_rollout.snapshot import Fingerprints, SampleRecord, SampleState, SamplingSpec
from partial_rollout_integrations.reference_grpo import CONFIG_DIR, GRPOLoop, load_config

FP = Fingerprints(model="sha256:m", tokenizer="sha256:t", vocab_size=512, vllm_version="0.32.0")
SPEC = SamplingSpec(max_tokens=16, seed=3)


def _saved_cut(tmp_path: Path) -> Path:
    """A cut at step 10 with: a ready group from version 9, one from version 2 (stale), an in-flight
    group from version 9 (one sample finished, one with a prefix), one in flight since version 3
    (stale), and a pending group."""
    ledger = WorkLedger(EventLog(tmp_path / "events.jsonl", fresh=True))
    ledger.record_start()
    done = SampleRecord(
        index=0,
        state=SampleState.FINISHED,
        sampling=SPEC,
        token_ids=[5, 6],
        logprobs=[-1.0, -1.0],
        versions=[9, 9],
        finish_reason="length",
        reward=1.0,
    )
    prefix = SampleRecord(
        index=0,
        state=SampleState.IN_FLIGHT,
        sampling=SPEC,
        token_ids=[7, 8, 9],
        logprobs=[-1.0] * 3,
        versions=[9, 9, 9],
    )
    for gid, version in (("fresh_ready", 9), ("stale_ready", 2)):
        ledger.yield_group(gid, [0, 401], [SPEC, SPEC])
        ledger.dispatch(gid, version)
        ledger.finish(gid, done)
        ledger.finish(gid, dataclasses.replace(done, index=1))
    for gid, version in (("fresh_flight", 9), ("stale_flight", 3)):
        ledger.yield_group(gid, [0, 402], [SPEC, SPEC])
        ledger.dispatch(gid, version)
        ledger.finish(gid, done)
    ledger.yield_group("pending", [0, 403], [SPEC, SPEC])
    ledger.capture({request_id("fresh_flight", 1): prefix, request_id("stale_flight", 1): prefix})
    folder = tmp_path / "step_10"
    folder.mkdir()
    save_ledger(
        ledger, folder, trainer_step=10, policy_version=10, fingerprints=FP, loader_state=None, metadata={"epoch": 0}
    )
    ledger.events.close()
    return folder


def _restore(tmp_path: Path, on_stale: str, *overrides: str) -> tuple[GRPOLoop, WorkLedger]:
    folder = _saved_cut(tmp_path)
    cfg = load_config(
        CONFIG_DIR / "fast.yaml",
        [
            f"checkpointing.partial_rollouts.on_stale={on_stale}",
            "async_rl.sampler.max_staleness_versions=4",
            "async_rl.max_buffered_rollouts=4",
            *overrides,
        ],
    )
    ledger = WorkLedger(EventLog(tmp_path / "events.jsonl"))
    loop = GRPOLoop(cfg, engine=Any, policy=None, ledger=ledger, fingerprints=FP, step=10, progress=False)  # type: ignore[arg-type]

    async def restore() -> None:
        await loop.restore(folder)

    asyncio.run(restore())
    return loop, ledger


def _states(ledger: WorkLedger) -> dict[str, str]:
    return {g.group_id: g.state.value for g in ledger.groups()}


def test_continue_restores_everything_and_retakes_each_permit(tmp_path: Path) -> None:
    loop, ledger = _restore(tmp_path, "continue")
    assert _states(ledger) == {
        "fresh_ready": "ready",
        "stale_ready": "ready",
        "fresh_flight": "in_flight",
        "stale_flight": "in_flight",
        "pending": "pending",
    }
    assert loop.restored_in_flight == ["fresh_flight", "stale_flight"] and loop.restored_pending == ["pending"]
    # 4 dispatched groups hold the whole buffer; the 2 in flight hold both in-flight permits.
    assert loop.buffer_permits.locked() and loop.inflight_permits.locked()
    sample = ledger["fresh_flight"].samples[1]
    assert sample.state is SampleState.IN_FLIGHT and sample.token_ids.tolist() == [7, 8, 9]  # the prefix to continue
    kinds = [e["event"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds[-1] == "resume"  # the resume is logged before anything the resumed process does


def test_regenerate_discards_stale_prefixes_and_redispatches_first(tmp_path: Path) -> None:
    loop, ledger = _restore(tmp_path, "regenerate")
    assert _states(ledger)["stale_flight"] == "pending" and _states(ledger)["stale_ready"] == "pending"
    assert all(s.state is SampleState.NOT_STARTED for s in ledger["stale_flight"].samples)
    assert loop.restored_pending == ["stale_ready", "stale_flight", "pending"]  # in yield order, before any new batch
    assert loop.restored_in_flight == ["fresh_flight"]
    regen = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "regenerate"]
    assert {e["prompt"]: e["discarded_tokens"] for e in regen} == {"stale_ready": 4, "stale_flight": 5}
    assert audit(tmp_path / "events.jsonl").tokens_regenerated == 9


def test_drop_evicts_stale_work_on_purpose_and_frees_its_permits(tmp_path: Path) -> None:
    loop, ledger = _restore(tmp_path, "drop")
    assert set(_states(ledger)) == {"fresh_ready", "fresh_flight", "pending"}
    assert ledger.evicted_by_reason == {"stale_at_resume": 2}
    assert not loop.buffer_permits.locked()  # 2 of 4 buffer permits taken, 2 free for the pending prompt and one more
    ledger.record_end(step=10)
    report = audit(tmp_path / "events.jsonl")
    assert report.evicted_by_reason == {"stale_at_resume": 2} and report.lost == 0


def test_a_smaller_buffer_than_the_saved_run_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds 4 dispatched groups, more than max_buffered_rollouts 3"):
        _restore(tmp_path, "continue", "async_rl.max_buffered_rollouts=3")
