"""Engines SIGKILLed at moments drawn from a seed, the trainer SIGKILLed once and resumed on more engines.

The reference trainer runs on 3 Ray engines (tests/fault_injection_driver.py); one engine dies while
the pool starts and another once one of its requests delivered its first token. The whole trainer
session is SIGKILLed after a save that holds prefixes, and resumed on 4 engines, where one engine
dies during a checkpoint's freeze and another during a weight update. The event log must show
nothing lost, duplicated or stranded, exactly one failover per engine death, and no token generated
twice: the seed is printed (and can be set with PARTIAL_ROLLOUT_FAULT_SEED) so a failure replays.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest

from partial_rollout.ledger import ENGINE_FAILOVER, EventKind, audit, effective_timeline, read_events
from partial_rollout_integrations.kill_resume import KillPlan, kill_and_resume

pytestmark = [pytest.mark.engine, pytest.mark.ray]

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "fault_injection_driver.py"
STEPS = 10


def test_engines_killed_at_every_moment_and_the_trainer_killed_once_lose_nothing(
    tmp_path: Path, tiny_llama: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = int(os.environ.get("PARTIAL_ROLLOUT_FAULT_SEED", random.SystemRandom().randrange(10_000)))
    with capsys.disabled():  # in the run's output whatever happens: what replays it
        print(f"\nfault-injection seed {seed} (replay with PARTIAL_ROLLOUT_FAULT_SEED={seed})")
    base = [sys.executable, str(DRIVER), str(tmp_path), "--model", str(tiny_llama), "--seed", str(seed)]
    events_path = tmp_path / "logs" / "events.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = kill_and_resume(
        [*base, "--engines", "3", "--moments", "start,first_token"],
        resume_command=[*base, "--engines", "4", "--moments", "cut,weight_update", "--resume"],
        events=events_path,
        log=tmp_path / "driver.log",
        plans=[KillPlan(after_events=3, from_step=2, before_step=STEPS - 2, holding="prefix_tokens")],
        cwd=ROOT,
        env=env,
        timeout_s=1200,
    )
    where = f"seed {seed}; log {tmp_path / 'driver.log'}"
    assert [a.killed for a in run.attempts] == [True, False], where

    kills = [json.loads(line) for line in (tmp_path / "kills.jsonl").read_text().splitlines()]
    assert sorted(k["moment"] for k in kills) == sorted(["start", "first_token", "cut", "weight_update"]), kills
    events = list(read_events(events_path))
    (resume_at,) = [i for i, e in enumerate(events) if e["event"] == EventKind.RESUME]
    segments = (events[:resume_at], events[resume_at:])
    for k in kills:
        failovers = [e for e in segments[k["run"]] if e.get("kind") == ENGINE_FAILOVER and e["engine"] == k["engine"]]
        assert len(failovers) == 1, (k, failovers, where)
    for run_events in segments:
        logged = [e for e in run_events if e.get("kind") == ENGINE_FAILOVER]
        assert len(logged) == len({e["engine"] for e in logged}), (logged, where)  # one event per death
    (start_failover,) = [e for e in segments[0] if e.get("kind") == ENGINE_FAILOVER and e["error"].count("start:")]
    assert start_failover["requests"] == [], start_failover
    (end,) = [e for e in events if e["event"] == EventKind.END]
    assert end["engines_left"] == 2, (end, where)

    report = audit(events_path)
    assert report.complete, where
    assert (report.lost, report.duplicated, report.stranded) == (0, 0, 0), (report.lost_ids, report.stranded_ids, where)
    assert report.trained == STEPS * 2, where  # fast.yaml: 2 prompts a step
    # Nothing is generated twice but the work the trainer kill threw away (finished after the save, before
    # the kill): no group regenerated, a moved request continued from the tokens received, a resumed one
    # from its saved prefix.
    (resume,) = effective_timeline(events)[1]
    thrown_away = sum(e["tokens"] - e["prefix_tokens"] for e in resume["rolled_back"] if e["event"] == "finish")
    assert not [e for e in events if e["event"] == EventKind.REGENERATE], where
    assert report.tokens_regenerated == thrown_away and report.tokens_continued > 0, where
    for segment in segments:
        finished = {f"{e['prompt']}/{e['sample']}": e["tokens"] for e in segment if e["event"] == "finish"}
        for failover in (e for e in segment if e.get("kind") == ENGINE_FAILOVER):
            for rid, carried in failover["carried"].items():
                assert finished.get(rid, carried) >= carried, (rid, carried, finished.get(rid), where)
    with capsys.disabled():
        print(
            f"fault-injection seed {seed}: kills {len(kills)} ({', '.join(k['moment'] for k in kills)}); audit: lost"
            f" {report.lost}, duplicated {report.duplicated}, stranded {report.stranded}, failovers"
            f" {sum(e.get('kind') == ENGINE_FAILOVER for e in events)}, tokens continued {report.tokens_continued}"
        )
