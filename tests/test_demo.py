"""The demo itself, on the short config: real trainer processes, SIGKILL, resume, audits of their own event logs.

``partial-rollout demo --config configs/fast.yaml`` trains the tiny model twice side by side
(partial rollouts on and off), kills each run after a save and resumes it. Every assertion reads
what the demo wrote (``audit.json``, ``events.jsonl``, the plots); nothing here is scripted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from partial_rollout.cli import main
from partial_rollout.errors import EXIT_OK
from partial_rollout.ledger import EVENTS_FILENAME, audit
from partial_rollout.snapshot import load_snapshot
from partial_rollout_integrations import demo, train
from partial_rollout_integrations.reference_grpo import CONFIG_DIR, load_config

FAST = CONFIG_DIR / "fast.yaml"
CFG = load_config(FAST)
SEED = 3


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo")
    args = argparse.Namespace(out=str(out), seed=SEED, steps=None, config=str(FAST), trainer="reference")
    code = demo.run(args)
    return {"code": code, "out": out, "results": json.loads((out / "audit.json").read_text())}


@pytest.mark.engine
def test_the_demo_passes_and_its_numbers_are_the_audits_of_its_own_logs(ran: dict[str, Any]) -> None:
    assert ran["code"] == 0
    for name in ("on", "off"):
        run_dir = ran["out"] / f"partial_rollouts_{name}"
        written = json.loads((run_dir / "audit.json").read_text())
        assert written == ran["results"][name]
        recomputed = audit(run_dir / EVENTS_FILENAME).to_json()
        assert {k: v for k, v in written.items() if k in recomputed} == recomputed
        assert [p["killed"] for p in written["processes"]] == [True, False]
        assert (run_dir / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.engine
def test_partial_rollouts_on_lose_nothing_and_continue_saved_prefixes(ran: dict[str, Any]) -> None:
    on = ran["results"]["on"]
    assert demo.verdict(on) is None
    assert on["complete"] and on["lost"] == 0 and on["duplicated"] == 0 and on["stranded"] == 0
    assert on["cursor_mismatches"] == []
    (resume,) = on["resumes"]
    assert resume["saved_by_state"] == resume["outstanding_at_save_by_state"]  # the whole cut was saved
    assert 0 < on["tokens_continued"] <= resume["prefix_tokens_at_save"]
    assert on["trained"] == CFG.grpo.max_num_steps * CFG.grpo.num_prompts_per_step


@pytest.mark.engine
def test_partial_rollouts_off_lose_what_was_pending_and_in_flight(ran: dict[str, Any]) -> None:
    off = ran["results"]["off"]
    (resume,) = off["resumes"]
    outstanding, saved = resume["outstanding_at_save_by_state"], resume["saved_by_state"]
    # NeMo RL's save: ready groups only. Pending and in-flight prompts are behind the cursor and gone.
    assert saved == {"pending": 0, "in_flight": 0, "ready": outstanding["ready"]}
    assert off["lost"] == resume["lost"] == outstanding["pending"] + outstanding["in_flight"] > 0
    assert off["lost"] <= CFG.grpo.num_prompts_per_step + CFG.async_rl.max_inflight_prompts  # one batch + in flight
    assert off["duplicated"] == 0 and off["tokens_continued"] == 0
    assert demo.verdict(off) is not None


@pytest.mark.engine
def test_the_table_shows_each_run_from_its_audit(ran: dict[str, Any]) -> None:
    results = ran["results"]
    table = demo.format_table({"on": results["on"], "off": results["off"]})
    lines = {line[:38].strip(): line[38:].split() for line in table.splitlines() if line[:38].strip()}
    assert lines["LOST"] == ["0", str(results["off"]["lost"])]
    assert lines["STRANDED (restored, never finished)"][0] == "0"
    assert lines["tokens continued from prefixes"] == [str(results["on"]["tokens_continued"]), "0"]
    assert lines["prompts trained"] == [str(results["on"]["trained"]), str(results["off"]["trained"])]


@pytest.mark.engine
def test_dump_plots_the_snapshot_a_resume_continued(
    ran: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``dump --plot`` on a real snapshot: the checkpoint the killed run with partial rollouts on resumed from."""
    (resume,) = ran["results"]["on"]["resumes"]
    folder = ran["out"] / "partial_rollouts_on" / "checkpoints" / f"step_{resume['step']}"
    snapshot = load_snapshot(folder)
    c = snapshot.counts()
    assert c["samples_in_flight"] > 0, "the kill plan picks a save that holds prefixes"
    png = tmp_path / "snapshot.png"
    status = main(["dump", str(folder), "--plot", str(png)])
    out = capsys.readouterr().out
    assert status == EXIT_OK
    groups, samples = len(snapshot.groups), sum(len(g.samples) for g in snapshot.groups)
    assert (
        f"groups        {groups}: {c['groups_pending']} pending prompts, {c['groups_in_flight']} in flight"
        f" ({c['groups_partial']} partial), {c['groups_ready']} ready" in out
    )
    assert (
        f"samples       {samples}: {c['samples_not_started']} not started, {c['samples_in_flight']} in flight,"
        f" {c['samples_finished']} finished" in out
    )
    assert f"{c['tokens_in_flight']} prefix tokens in flight" in out
    assert out.splitlines()[-1] == f"wrote {png}: {groups} groups, {samples} samples drawn"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_subcommands_register_with_a_run_function() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    demo.register(sub)
    train.register(sub)
    args = parser.parse_args(["demo", "--out", "x", "--seed", "3", "--config", "c.yaml"])
    assert args.func is demo.run and (args.out, args.seed, args.config) == ("x", 3, "c.yaml")
    args = parser.parse_args(["train", "c.yaml", "grpo.max_num_steps=3", "--resume"])
    assert args.func is train.run and args.overrides == ["grpo.max_num_steps=3"] and args.resume


def test_the_library_command_finds_the_trainers_subcommands_through_entry_points() -> None:
    from partial_rollout.cli import ENTRY_POINT_GROUP, build_parser, plugin_modules

    assert dict(plugin_modules()) == {"demo": demo, "train": train}, f"registered under {ENTRY_POINT_GROUP}"
    parser = build_parser()
    args = parser.parse_args(["demo", "--trainer", "reference", "--out", "x"])
    assert args.func is demo.run
    args = parser.parse_args(["dump", "some/folder"])
    assert args.command == "dump"
