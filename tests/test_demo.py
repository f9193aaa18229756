"""The demo's report: the side-by-side table and the plot, from audits of real event logs.

The demo itself (four trainer processes, ~4 minutes) is what the README's main job runs; these
tests check what it prints and writes from an audit, and that the subcommands register.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from partial_rollout.cli import demo, train
from partial_rollout.ledger import EventLog, WorkLedger, audit
from partial_rollout.snapshot import Fingerprints, GroupState, SampleRecord, SampleState, SamplingSpec

FP = Fingerprints(model="sha256:m", tokenizer="sha256:t", vocab_size=512, vllm_version="0.32.0")
SPEC = SamplingSpec(max_tokens=8, seed=1)


def _log(folder: Path, *, keep: set[GroupState]) -> dict:
    """Train 8 steps with a kill after step 4's save; the resumed process restores what ``keep`` saved."""
    folder.mkdir()
    path = folder / "events.jsonl"
    ledger = WorkLedger(EventLog(path, fresh=True))
    ledger.record_start()
    done = SampleRecord(
        index=0,
        state=SampleState.FINISHED,
        sampling=SPEC,
        token_ids=[5] * 8,
        logprobs=[-1.0] * 8,
        versions=[0] * 8,
        finish_reason="length",
        reward=0.5,
    )
    ids = iter(range(100))

    def step(ledger: WorkLedger, n: int) -> None:
        for _ in range(2):
            gid = f"e0:{next(ids)}"
            ledger.yield_group(gid, [0, 401], [SPEC])
            ledger.dispatch(gid, n)
            ledger.finish(gid, done)
            ledger.consume([gid], step=n)
        ledger.log("train_step", step=n, reward=0.2 + 0.05 * n, tokens_per_s=1000.0)

    for n in range(1, 5):
        step(ledger, n)
    ledger.yield_group("e0:flying", [0, 401], [SPEC])
    ledger.dispatch("e0:flying", 4)
    ledger.capture(
        {
            "e0:flying/0": SampleRecord(
                index=0,
                state=SampleState.IN_FLIGHT,
                sampling=SPEC,
                token_ids=[5, 6, 7],
                logprobs=[-1.0] * 3,
                versions=[4] * 3,
            )
        }
    )
    (folder / "step_4").mkdir()
    ledger.save(folder / "step_4", trainer_step=4, policy_version=4, fingerprints=FP, loader_state=None, states=keep)
    step(ledger, 5)  # rolled back by the kill
    ledger.events.close()
    resumed = WorkLedger(EventLog(path))
    resumed.load(folder / "step_4")
    resumed.record_resume(step=4)
    for group in list(resumed.groups(GroupState.IN_FLIGHT)):
        resumed.finish(group.group_id, done, prefix_tokens=3)
    for n in range(5, 9):
        step(resumed, n)
    resumed.record_end(step=8)
    report = audit(path).to_json()
    report["wall_s"] = 1.0
    return report


def test_table_shows_each_column_from_its_own_audit(tmp_path: Path) -> None:
    results = {
        "on": _log(tmp_path / "on", keep=set(GroupState)),
        "off": _log(tmp_path / "off", keep={GroupState.READY}),
    }
    table = demo.format_table(results)
    lines = {line[:38].strip(): line[38:].split() for line in table.splitlines() if line[:38].strip()}
    assert lines["LOST"] == ["0", "1"]
    assert lines["DUPLICATED"] == ["0", "0"]
    assert lines["prompts yielded"] == ["17", "17"]  # 8 + 1 before the save, 8 after; the rolled-back 2 do not count
    assert lines["tokens continued from prefixes"] == ["3", "0"]
    assert lines["of which saved  pend/fly/ready"] == ["0/1/0", "0/0/0"]
    assert lines["reward first 4 -> last 4 steps"] == ["0.33", "->", "0.53", "0.33", "->", "0.53"]
    assert "reward curve (on, mean of 4 steps): 0.33 0.53" in table


def test_plot_writes_a_png(tmp_path: Path) -> None:
    report = _log(tmp_path / "on", keep=set(GroupState))
    demo._plot(report, tmp_path / "reward.png", title="t")
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_subcommands_register_with_a_run_function() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    demo.register(sub)
    train.register(sub)
    args = parser.parse_args(["demo", "--out", "x", "--seed", "3"])
    assert args.func is demo.run and (args.out, args.seed) == ("x", 3)
    args = parser.parse_args(["train", "c.yaml", "grpo.max_num_steps=3", "--resume"])
    assert args.func is train.run and args.overrides == ["grpo.max_num_steps=3"] and args.resume
