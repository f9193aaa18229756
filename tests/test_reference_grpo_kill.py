"""The mission end to end: real trainer processes, real vLLM engines, SIGKILL, resume, audit from events.jsonl.

Every verdict here is recomputed from the raw event log by :func:`partial_rollout.ledger.audit`,
never taken from the trainer's summary. The fast config is the seed's timeline: 2 prompts per
step, a buffer of 4, 2 in flight, a windowed sampler, a save every 2 steps, long-tailed lengths.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from partial_rollout.ledger import EVENTS_FILENAME, AuditReport, audit, effective_timeline, read_events
from partial_rollout.snapshot import load_snapshot
from partial_rollout_integrations.reference_grpo import CONFIG_DIR, load_config
from partial_rollout_integrations.reference_grpo.kill_resume import KillPlan, KillResumeRun, kill_and_resume

pytestmark = pytest.mark.engine

FAST = CONFIG_DIR / "fast.yaml"
CFG = load_config(FAST)


SCENARIOS = {
    # name: (partial rollouts on, kill plan, extra overrides)
    "on_1": (
        True,
        KillPlan.draw(
            random.Random(11), save_period=CFG.checkpointing.save_period, max_num_steps=CFG.grpo.max_num_steps
        ),
        (),
    ),
    "on_2": (
        True,
        KillPlan.draw(
            random.Random(12), save_period=CFG.checkpointing.save_period, max_num_steps=CFG.grpo.max_num_steps
        ),
        (),
    ),
    "off": (False, KillPlan(after_save_step=4, after_events=0), ()),
    # One group in flight at a time and no staleness eviction make the trained order a function of the seed.
    "serial_whole": (
        True,
        None,
        ("async_rl.max_inflight_prompts=1", "async_rl.sampler.max_staleness_versions=1000", "data.max_tokens=64"),
    ),
    "serial_killed": (
        True,
        KillPlan.draw(
            random.Random(13), save_period=CFG.checkpointing.save_period, max_num_steps=CFG.grpo.max_num_steps
        ),
        ("async_rl.max_inflight_prompts=1", "async_rl.sampler.max_staleness_versions=1000", "data.max_tokens=64"),
    ),
}
PARALLEL = 3
CHILD_TIMEOUT_S = 360
"""A trainer process of the fast config takes well under a minute on an idle 2-core machine; a hang fails fast."""
"""Scenarios run side by side: each process spends much of its life starting vLLM or waiting on a long sample."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, KillResumeRun, AuditReport]]:
    root = tmp_path_factory.mktemp("kill_resume")

    def one(name: str) -> tuple[Path, KillResumeRun, AuditReport]:
        enabled, plan, extra = SCENARIOS[name]
        folder = root / name
        overrides = [
            f"checkpointing.checkpoint_dir={folder / 'checkpoints'}",
            f"logger.log_dir={folder}",
            f"checkpointing.partial_rollouts.enabled={str(enabled).lower()}",
            *extra,
        ]
        run = kill_and_resume(FAST, overrides, log_dir=folder, plan=plan, timeout_s=CHILD_TIMEOUT_S)
        return folder, run, audit(folder / EVENTS_FILENAME)

    with ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(SCENARIOS, pool.map(one, SCENARIOS), strict=True))


def _save_event(folder: Path, save_id: str) -> dict:
    return next(e for e in read_events(folder / EVENTS_FILENAME) if e["event"] == "save" and e["save_id"] == save_id)


def trained_groups(folder: Path) -> dict[int, list[str]]:
    """Step -> prompt groups it trained on, on the effective timeline (rolled-back work excluded)."""
    timeline, _ = effective_timeline(list(read_events(folder / EVENTS_FILENAME)))
    steps: dict[int, list[str]] = {}
    for event in timeline:
        if event["event"] == "consume":
            steps.setdefault(event["step"], []).append(event["prompt"])
    return steps


@pytest.mark.parametrize("name", ["on_1", "on_2", "serial_killed"])
def test_partial_rollouts_on_lose_and_duplicate_nothing_at_random_kill_points(runs, name: str) -> None:
    folder, run, report = runs[name]
    plan = SCENARIOS[name][1]
    assert [a.killed for a in run.attempts] == [True, False]
    assert report.complete and report.lost == 0 and report.duplicated == 0, report.lost_ids + report.duplicated_ids
    assert report.trained == CFG.grpo.max_num_steps * CFG.grpo.num_prompts_per_step
    (resume,) = report.resumes
    assert resume["step"] >= plan.after_save_step
    assert resume["saved_by_state"] == resume["outstanding_at_save_by_state"]  # the whole cut was saved
    # Saved prefixes are continued, never counted twice.
    assert report.tokens_continued <= resume["prefix_tokens_at_save"]
    assert report.yielded == report.trained + report.evicted + report.outstanding_at_end
    # The checkpoint resumed from holds what its save event says, with per-token policy versions.
    snapshot = load_snapshot(folder / "checkpoints" / f"step_{resume['step']}")
    counts = snapshot.counts()
    assert counts["tokens_in_flight"] == resume["prefix_tokens_at_save"]
    assert [g.group_id for g in snapshot.groups] == _save_event(folder, resume["save_id"])["saved"]
    assert all(s.versions.max() <= snapshot.policy_version for _, s in snapshot.iter_samples() if s.num_tokens)


def test_partial_rollouts_off_lose_what_the_seed_predicts(runs) -> None:
    _, run, report = runs["off"]
    assert run.attempts[0].killed
    (resume,) = report.resumes
    outstanding, saved = resume["outstanding_at_save_by_state"], resume["saved_by_state"]
    # NeMo RL's save: ready groups only. Pending and in-flight prompts are behind the cursor and gone.
    assert saved == {"pending": 0, "in_flight": 0, "ready": outstanding["ready"]}
    assert report.lost == resume["lost"] == outstanding["pending"] + outstanding["in_flight"] > 0
    bound = CFG.grpo.num_prompts_per_step + CFG.async_rl.max_inflight_prompts
    assert report.lost <= bound  # "one prompt batch + max_inflight_prompts per save"
    assert report.duplicated == 0 and report.tokens_continued == 0


def test_a_resumed_run_trains_on_the_same_groups_as_an_uninterrupted_one(runs) -> None:
    whole_dir, whole_run, _ = runs["serial_whole"]
    killed_dir, killed_run, _ = runs["serial_killed"]
    assert [a.killed for a in whole_run.attempts] == [False] and killed_run.attempts[0].killed
    expected = trained_groups(whole_dir)
    assert len(expected) == CFG.grpo.max_num_steps
    assert trained_groups(killed_dir) == expected
