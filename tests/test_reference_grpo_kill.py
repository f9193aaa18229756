"""The mission end to end: real trainer processes, real vLLM engines, SIGKILL, resume, audit from events.jsonl.

Every verdict here is recomputed from the raw event log by :func:`partial_rollout.ledger.audit`,
never taken from the trainer's summary. The fast config is the seed's timeline: 2 prompts per
step, a buffer of 4, 2 in flight, a windowed sampler, a save every 2 steps, long-tailed lengths.
What a save with partial rollouts off loses is checked on the demo's own run (``tests/test_demo.py``).
"""

from __future__ import annotations

import dataclasses
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from snapshot_helpers import replace_samples

from partial_rollout.ledger import EVENTS_FILENAME, AuditReport, audit, effective_timeline, read_events, request_id
from partial_rollout.snapshot import Snapshot, load_snapshot
from partial_rollout_integrations.kill_resume import KillPlan, KillResumeRun
from partial_rollout_integrations.reference_grpo import CONFIG_DIR, load_config
from partial_rollout_integrations.reference_grpo.controller import ENGINE_PROGRESS, WEIGHT_UPDATE
from partial_rollout_integrations.reference_grpo.kill_resume import draw_plan, kill_and_resume

pytestmark = pytest.mark.engine

FAST = CONFIG_DIR / "fast.yaml"
CFG = load_config(FAST)


def _plan(seed: int) -> list[KillPlan]:
    """Kill after a save that holds prefixes: the resumed run must continue some (``tokens_continued > 0``)."""
    return [
        draw_plan(
            random.Random(seed),
            save_period=CFG.checkpointing.save_period,
            max_num_steps=CFG.grpo.max_num_steps,
            holding="prefix_tokens",
        )
    ]


def _twice(seed: int) -> list[KillPlan]:
    """Kill after a save holding prefixes at step 2 or 4, then the resumed run after one of its own at
    step 6 or 8 (leaving steps to finish what it restores: :func:`draw_plan`)."""
    rng = random.Random(seed)
    return [
        KillPlan(from_step=2, before_step=5, holding="prefix_tokens", after_events=rng.randint(0, 40)),
        KillPlan(from_step=6, before_step=9, holding="prefix_tokens", after_events=rng.randint(0, 40)),
    ]


SCENARIOS = {
    # name: (partial rollouts on, kill plans, extra overrides)
    "on_twice": (
        True,
        _twice(14),
        (),
    ),
    # One group in flight at a time and no staleness eviction make the trained order a function of the seed.
    "serial_whole": (
        True,
        [],
        ("async_rl.max_inflight_prompts=1", "async_rl.sampler.max_staleness_versions=1000", "data.max_tokens=64"),
    ),
    "serial_killed": (
        True,
        _plan(13),
        ("async_rl.max_inflight_prompts=1", "async_rl.sampler.max_staleness_versions=1000", "data.max_tokens=64"),
    ),
}
PARALLEL = 3
"""Scenarios run side by side: each process spends much of its life starting vLLM or waiting on a long sample."""
CHILD_TIMEOUT_S = 900
"""A trainer process of the fast config takes well under a minute on an idle 2-core machine, but several
minutes when other jobs load it 20-fold (engine start-up alone); past this it is taken for hung."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, KillResumeRun, AuditReport]]:
    root = tmp_path_factory.mktemp("kill_resume")

    def one(name: str) -> tuple[Path, KillResumeRun, AuditReport]:
        enabled, plans, extra = SCENARIOS[name]
        folder = root / name
        overrides = [
            f"checkpointing.checkpoint_dir={folder / 'checkpoints'}",
            f"logger.log_dir={folder}",
            f"checkpointing.partial_rollouts.enabled={str(enabled).lower()}",
            *extra,
        ]
        run = kill_and_resume(FAST, overrides, log_dir=folder, plans=plans, timeout_s=CHILD_TIMEOUT_S)
        return folder, run, audit(folder / EVENTS_FILENAME)

    with ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(SCENARIOS, pool.map(one, SCENARIOS), strict=True))


def _save_event(folder: Path, save_id: str) -> dict:
    return next(e for e in read_events(folder / EVENTS_FILENAME) if e["event"] == "save" and e["save_id"] == save_id)


def _pid_of_resume(events: list[dict[str, Any]], save_id: str) -> int:
    return next(e["pid"] for e in events if e["event"] == "resume" and e["save_id"] == save_id)


def continued_by_engine(events: list[dict[str, Any]], *, pid: int) -> tuple[int, int]:
    """Tokens process ``pid`` returned in finished samples without its engine generating them, and the
    prefix tokens its trainer claimed to continue, over the samples finished when training ended.

    The engine counts every token it produced (``tokens_received``) and those of requests still
    running (``live_tokens``); the samples it returned hold their tokens, saved prefixes included.
    """
    progress = next(e for e in reversed(events) if e["pid"] == pid and e.get("kind") == ENGINE_PROGRESS)
    live = progress["live_tokens"]
    finished = [
        e
        for e in events
        if e["pid"] == pid
        and e["event"] == "finish"
        and e["seq"] < progress["seq"]
        and request_id(e["prompt"], e["sample"]) not in live
    ]
    generated = progress["tokens_received"] - sum(live.values())
    return sum(e["tokens"] for e in finished) - generated, sum(e["prefix_tokens"] for e in finished)


def versions_match_updates(events: list[dict[str, Any]], save: dict[str, Any], snapshot: Snapshot) -> int:
    """Check every saved token's policy version against the weight updates of the process that saved.

    At each update to version v the trainer logged each running request's token count just before
    asking for it and just after it returned: tokens below the first count were sampled by older
    weights (version < v), tokens from the second count on by v or later. Returns how many tokens
    were pinned below an update that came after them: labelling them with the save's version fails.
    """
    updates = [
        e
        for e in events
        if e["pid"] == save["pid"] and e["seq"] < save["seq"] and e["event"] == "log" and e["kind"] == WEIGHT_UPDATE
    ]
    pinned = 0
    for group, sample in snapshot.iter_samples():
        versions = sample.versions
        if not len(versions):
            continue
        where = f"{group.group_id}/{sample.index}: versions {versions.tolist()}"
        assert (np.diff(versions) >= 0).all(), where
        assert group.dispatch_version <= versions[0] and versions[-1] <= snapshot.policy_version, where
        rid = request_id(group.group_id, sample.index)
        for update in updates:
            before, after = update["tokens_before"].get(rid), update["tokens_after"].get(rid)
            if before is None or after is None:
                continue  # not running across this update
            assert (versions[:before] < update["version"]).all(), (where, update)
            assert (versions[after:] >= update["version"]).all(), (where, update)
            pinned += min(before, len(versions))
    return pinned


def trained_groups(folder: Path) -> dict[int, list[str]]:
    """Step -> prompt groups it trained on, on the effective timeline (rolled-back work excluded)."""
    timeline, _ = effective_timeline(list(read_events(folder / EVENTS_FILENAME)))
    steps: dict[int, list[str]] = {}
    for event in timeline:
        if event["event"] == "consume":
            steps.setdefault(event["step"], []).append(event["prompt"])
    return steps


def _assert_resumed_cleanly(folder: Path, report: AuditReport, plans: list[KillPlan]) -> None:
    """A run killed after each of ``plans``' saves and resumed each time: nothing lost or duplicated,
    each checkpoint holding its whole cut with prefixes, and the last process's engine counting the
    prefixes its trainer claims to continue as tokens it never generated."""
    assert report.complete and report.clean, (report.lost_ids, report.duplicated_ids, report.stranded_ids)
    assert report.trained == CFG.grpo.max_num_steps * CFG.grpo.num_prompts_per_step
    assert report.yielded == report.trained + report.evicted + report.outstanding_at_end
    # Saved prefixes are continued, never counted twice.
    assert 0 < report.tokens_continued <= sum(r["prefix_tokens_at_save"] for r in report.resumes)
    # The resumed loader went on where the killed one did.
    assert report.cursor_mismatches == []
    for resume, plan in zip(report.resumes, plans, strict=True):
        assert plan.from_step <= resume["step"] < plan.before_step
        assert resume["saved_by_state"] == resume["outstanding_at_save_by_state"]  # the whole cut was saved
        assert resume["restored_in_flight"] > 0
        # The checkpoint resumed from holds what its save event says, captured against the engine workers' counts.
        save = _save_event(folder, resume["save_id"])
        snapshot = load_snapshot(folder / "checkpoints" / f"step_{resume['step']}")
        assert snapshot.counts()["tokens_in_flight"] == resume["prefix_tokens_at_save"] == save["engine_tokens"]
        assert [g.group_id for g in snapshot.groups] == save["saved"]
    # The engine's own count (logged when training ends, so by the last process only): it generated
    # fewer tokens than the samples it returned hold, by exactly the saved prefixes its trainer continued.
    events = list(read_events(folder / EVENTS_FILENAME))
    continued, claimed = continued_by_engine(events, pid=_pid_of_resume(events, report.resumes[-1]["save_id"]))
    assert continued == claimed > 0


def test_partial_rollouts_on_lose_and_duplicate_nothing_at_a_random_kill_point(runs) -> None:
    """One group in flight at a time (the serial config), killed after a save holding a prefix."""
    folder, run, report = runs["serial_killed"]
    assert [a.killed for a in run.attempts] == [True, False]
    _assert_resumed_cleanly(folder, report, SCENARIOS["serial_killed"][1])


def test_a_run_killed_again_after_its_resume_loses_and_duplicates_nothing(runs) -> None:
    """A job preempted again: the second checkpoint is one the resumed process wrote, holding what it
    restored and continued; it must resume as cleanly as the first."""
    folder, run, report = runs["on_twice"]
    assert [a.killed for a in run.attempts] == [True, True, False]
    _assert_resumed_cleanly(folder, report, SCENARIOS["on_twice"][1])
    events = list(read_events(folder / EVENTS_FILENAME))
    first, second = report.resumes
    assert _save_event(folder, second["save_id"])["pid"] == _pid_of_resume(events, first["save_id"])


def test_each_saved_token_carries_the_version_live_when_it_was_sampled(runs) -> None:
    """Per the weight-update log; labelling the same tokens with one constant version (what
    ``versions.max() <= policy_version`` let pass) fails wherever a saved sample spans an update."""
    pinned = 0
    for name in ("on_twice", "serial_killed"):
        folder, _, report = runs[name]
        events = list(read_events(folder / EVENTS_FILENAME))
        for resume in report.resumes:
            save = _save_event(folder, resume["save_id"])
            snapshot = load_snapshot(folder / "checkpoints" / f"step_{resume['step']}")
            here = versions_match_updates(events, save, snapshot)
            if here:
                version = snapshot.policy_version
                pinned_snapshot = replace_samples(
                    snapshot, lambda s, v=version: dataclasses.replace(s, versions=np.full_like(s.versions, v))
                )
                with pytest.raises(AssertionError):
                    versions_match_updates(events, save, pinned_snapshot)
            pinned += here
    assert pinned > 0  # some saved sample spanned an update, so the check was not vacuous


def test_a_resumed_run_trains_on_the_same_groups_as_an_uninterrupted_one(runs) -> None:
    whole_dir, whole_run, _ = runs["serial_whole"]
    killed_dir, killed_run, _ = runs["serial_killed"]
    assert [a.killed for a in whole_run.attempts] == [False] and killed_run.attempts[0].killed
    expected = trained_groups(whole_dir)
    assert len(expected) == CFG.grpo.max_num_steps
    assert trained_groups(killed_dir) == expected
    # The loader yielded the same prompts in the same order as the uninterrupted run with the same seed.
    report = audit(killed_dir / EVENTS_FILENAME, reference=whole_dir / EVENTS_FILENAME)
    assert report.yield_divergence is None and report.clean
    assert len(report.yield_order) >= CFG.grpo.max_num_steps * CFG.grpo.num_prompts_per_step
