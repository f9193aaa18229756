"""Run the trainer in a child process, SIGKILL it at a random moment after a save, and resume it.

This is how the demo and the tests prove the mission: a real process killed without warning (no
handler runs, no file is closed), then ``--resume`` from the latest complete checkpoint to the end.
The kill moment is drawn as a number of further events after the child's ``save`` event for a
chosen step appears in ``events.jsonl``: there is always a checkpoint to resume from, and the
moment is measured in the child's progress rather than in seconds, so a busy machine cannot let the
run finish before the kill.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from partial_rollout.ledger import EVENTS_FILENAME, TRAIN_STEP, EventKind, read_events

POLL_S = 0.05


@dataclass(kw_only=True)
class Attempt:
    """One child process."""

    resume: bool
    returncode: int
    killed: bool
    wall_s: float
    kill_after_save_step: int | None = None
    kill_after_events: int | None = None


@dataclass(kw_only=True)
class KillPlan:
    """When to kill: once ``after_events`` more events follow the ``save`` event of step ``after_save_step``."""

    after_save_step: int
    after_events: int

    @classmethod
    def draw(cls, rng: random.Random, *, save_period: int, max_num_steps: int, max_events: int = 40) -> KillPlan:
        """A random save that leaves at least two save periods of training, and a random number of events after it."""
        saves = list(range(save_period, max_num_steps - save_period, save_period)) or [save_period]
        return cls(after_save_step=rng.choice(saves), after_events=rng.randint(0, max_events))


@dataclass(kw_only=True)
class KillResumeRun:
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return sum(a.wall_s for a in self.attempts)


def trainer_command(config: str | os.PathLike[str], overrides: Sequence[str], *, resume: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "partial_rollout_integrations.reference_grpo",
        str(config),
        *overrides,
        "--no-progress",
        *(["--resume"] if resume else []),
    ]


def run_child(
    command: list[str],
    *,
    events: Path,
    log: Path,
    plan: KillPlan | None,
    on_step: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> Attempt:
    """Run one trainer process to its end, or kill it as ``plan`` says; ``on_step`` sees each trained step.

    Raises:
        TimeoutError: the process ran longer than ``timeout_s`` (it is killed first).
    """
    started = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "ab") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        after_save: int | None = None
        seen = 0
        killed = False
        while child.poll() is None:
            time.sleep(POLL_S)
            if timeout_s is not None and time.perf_counter() - started > timeout_s:
                child.kill()
                child.wait()
                raise TimeoutError(f"trainer ran longer than {timeout_s:.0f} s; see {log}")
            new = list(read_events(events))[seen:] if events.exists() else []
            seen += len(new)
            for event in new:
                if event.get("pid") != child.pid:
                    continue
                if after_save is not None:
                    after_save += 1
                if on_step and event["event"] == EventKind.LOG and event.get("kind") == TRAIN_STEP:
                    on_step(event["step"])
                if (
                    plan
                    and after_save is None
                    and event["event"] == EventKind.SAVE
                    and event["step"] == plan.after_save_step
                ):
                    after_save = 0
            if plan and after_save is not None and after_save >= plan.after_events:
                child.send_signal(signal.SIGKILL)
                child.wait()
                killed = True
                break
    return Attempt(
        resume="--resume" in command,
        returncode=child.returncode,
        killed=killed,
        wall_s=time.perf_counter() - started,
        kill_after_save_step=plan.after_save_step if plan else None,
        kill_after_events=plan.after_events if plan else None,
    )


def kill_and_resume(
    config: str | os.PathLike[str],
    overrides: Sequence[str],
    *,
    log_dir: Path,
    plan: KillPlan | None,
    on_step: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> KillResumeRun:
    """Train from scratch, kill per ``plan`` (None: no kill), and resume until a process ends on its own.

    Raises:
        RuntimeError: a child failed (non-zero exit without being killed); its log names the cause.
        TimeoutError: a child ran longer than ``timeout_s``.
    """
    events = log_dir / EVENTS_FILENAME
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "trainer.log"
    run = KillResumeRun()
    resume = False
    while True:
        attempt = run_child(
            trainer_command(config, overrides, resume=resume),
            events=events,
            log=log,
            plan=None if resume else plan,
            on_step=on_step,
            timeout_s=timeout_s,
        )
        run.attempts.append(attempt)
        if not attempt.killed:
            if attempt.returncode != 0:
                raise RuntimeError(f"trainer exited with {attempt.returncode}; see {log}")
            return run
        resume = True
