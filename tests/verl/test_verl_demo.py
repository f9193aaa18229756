"""``partial-rollout demo --trainer verl``: its arguments, its refusal without ``.venv-verl``, and its report.

No verl runs here (the fast loop): the demo's runs are the kill test's own (``test_verl_kill_resume``
prints the demo's table from its two runs' event logs, and checks it against their audits). Here
the command is wired to :mod:`partial_rollout_integrations.verl.demo`, whose ``run_demo`` is replaced
by the reports of two small event logs written through the work ledger.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from partial_rollout.cli import main
from partial_rollout.errors import EXIT_BAD_INPUT
from partial_rollout.ledger import EventLog, WorkLedger
from partial_rollout.snapshot import Fingerprints, SampleRecord, SampleState, SamplingSpec
from partial_rollout_integrations import demo
from partial_rollout_integrations.verl import demo as verl_demo

SPEC = SamplingSpec(max_tokens=8)
PRINTS = Fingerprints(model="m", tokenizer="t", vocab_size=16, vllm_version="v")


def _sample(index: int, state: SampleState, tokens: int) -> SampleRecord:
    finished = state is SampleState.FINISHED
    return SampleRecord(
        index=index,
        state=state,
        sampling=SPEC,
        token_ids=[3] * tokens,
        logprobs=[0.0] * tokens,
        versions=[0] * tokens,
        finish_reason="stop" if finished else None,
    )


def _events(path: Path, *, regenerate: bool) -> Path:
    """A run of one group of two samples, killed after a save and resumed; off, verl regenerates it."""
    ledger = WorkLedger(EventLog(path, fresh=True))
    ledger.record_start(trainer="verl")
    ledger.yield_group("g", [1, 2], [SPEC, SPEC])
    ledger.dispatch("g", 0)
    done = _sample(0, SampleState.FINISHED, 5)
    ledger.finish("g", done, settle=False)
    ledger.capture({"g/1": _sample(1, SampleState.IN_FLIGHT, 3)})
    cut = ledger.cut(path.parent / "c", trainer_step=2, policy_version=2, fingerprints=PRINTS, loader_state=None)
    ledger.record_save(cut)
    ledger.record_resume(step=2)
    if regenerate:
        ledger.regenerate("g", reason="reissued_by_verl")
        ledger.dispatch("g", 3)
        ledger.finish("g", done, settle=False)
    ledger.finish("g", _sample(1, SampleState.FINISHED, 4), prefix_tokens=0 if regenerate else 3)
    ledger.consume(["g"], step=3)
    ledger.record_end(step=3)
    assert ledger.events is not None
    ledger.events.close()
    return path


def test_the_verl_demo_is_a_choice_of_the_demo_command() -> None:
    from partial_rollout.cli import build_parser

    args = build_parser().parse_args(["demo", "--trainer", "verl", "--out", "x", "--seed", "2"])
    assert (args.func, args.trainer, args.out, args.seed) == (demo.run, "verl", "x", 2)


def test_without_verls_environment_the_demo_fails_in_one_line_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VERL_PYTHON", str(tmp_path / "no-venv-verl" / "python"))
    assert main(["demo", "--trainer", "verl", "--out", str(tmp_path / "out")]) == EXIT_BAD_INPUT
    (line,) = capsys.readouterr().err.splitlines()
    assert "VERL_PYTHON" in line and "no interpreter for verl's controller" in line
    assert "bash scripts/setup_verl.sh" in line
    assert not (tmp_path / "out").exists(), "refused before anything ran"


def test_the_demo_prints_the_table_of_both_runs_audits_and_verls_own_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    off_log = "INFO: Re-issued 1 in-flight prompts for step 3; cleared 1 old trajectories from partition train\n"
    results = {
        "on": verl_demo.report(_events(tmp_path / "on.jsonl", regenerate=False), log="", wall_s=1.0),
        "off": verl_demo.report(_events(tmp_path / "off.jsonl", regenerate=True), log=off_log, wall_s=2.0),
    }
    seen: dict[str, Any] = {}

    def run_demo(out: Path, *, seed: int) -> dict[str, dict[str, Any]]:
        seen.update(out=out, seed=seed)
        return results

    monkeypatch.setenv("VERL_PYTHON", sys.executable)
    monkeypatch.setattr(verl_demo, "run_demo", run_demo)
    out = tmp_path / "out"
    assert main(["demo", "--trainer", "verl", "--out", str(out), "--seed", "4"]) == 0
    assert seen == {"out": out, "seed": 4}
    printed = capsys.readouterr().out
    rows = {line[:38].strip(): line[38:].split() for line in printed.splitlines() if line[:38].strip()}
    assert rows["LOST"] == ["0", "0"]
    assert rows["tokens continued from prefixes"] == ["3", "0"]
    assert rows["tokens regenerated (rolled back)"] == ["0", "8"]  # the in-flight prefix (3) and the sibling (5)
    assert "verl's own log (off): re-issued 1 in-flight groups from scratch, deleting 1 finished" in printed
    written = json.loads((out / "audit.json").read_text())
    assert written["trainer"] == "verl" and written["off"] == results["off"]
