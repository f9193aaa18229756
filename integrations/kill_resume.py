"""Run a trainer in a child session, SIGKILL all of it after a checkpoint, and rerun it to the end.

This is how the demos and the tests prove the mission on every trainer. What a preempted node looks
like: the trainer, the Ray cluster it started, its actors and vLLM's engine cores die together,
without a handler running or a file being closed. The child runs in a session of its own and the
kill is SIGKILL to every process of that session. Then the resume command runs, as a user would
rerun the job, until a run ends on its own.

The moment is counted in events after a matching ``save`` event in ``events.jsonl``, not in
seconds: there is always a checkpoint to resume from, and a busy machine cannot let the run finish
before the kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from partial_rollout.ledger import TRAIN_STEP, EventKind, EventTail

T = TypeVar("T")

POLL_S = 0.05
_interrupted = threading.Event()
"""Set on Ctrl-C by :func:`side_by_side`: every run under way kills its session and stops."""


@dataclass(kw_only=True, frozen=True)
class KillPlan:
    """Kill once ``after_events`` more events follow the first ``save`` event that matches, or at the
    first step trained after the saved one if it comes first, so that the run resumes from that save
    (for a save period of 2 steps or more).

    Counting on past the next step would let the run reach its next save, which may hold nothing,
    or its end: a CI run killed 35 events after its step-10 save had already saved its last step,
    so its resume had nothing left to continue.
    """

    after_events: int
    """Events to let pass after the matching save (0: kill right after it)."""
    from_step: int = 0
    """Only saves of this training step or later match."""
    before_step: int | None = None
    """Only saves before this training step match (None: no bound). Give the run's last step: a
    resume from its save has nothing left to train."""
    holding: str | None = None
    """Only a save whose event field of this name is > 0 matches (None: any save). A checkpoint with
    nothing in flight proves nothing: ``prefix_tokens`` waits for one holding prefixes to continue."""

    def __post_init__(self) -> None:
        if self.after_events < 0:
            raise ValueError(f"KillPlan.after_events: is {self.after_events}; it counts events, so it must be >= 0")

    def matches(self, event: Mapping[str, Any]) -> bool:
        step = event.get("step", 0)
        return (
            event["event"] == EventKind.SAVE
            and step >= self.from_step
            and (self.before_step is None or step < self.before_step)
            and (self.holding is None or event.get(self.holding, 0) > 0)
        )


@dataclass(kw_only=True)
class Attempt:
    """One run of the child: a resume or not, how it ended, how long it took."""

    resume: bool
    returncode: int
    killed: bool
    wall_s: float


@dataclass(kw_only=True)
class KillResumeRun:
    plans: list[KillPlan]
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return sum(a.wall_s for a in self.attempts)


def _session_members(sid: int) -> list[int]:
    """Processes of session ``sid`` (Linux ``/proc``): the child's whole tree, Ray's daemons included."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # after "pid (comm)": state ppid pgrp session; zombies are dead
            members.append(int(entry))
    return members


def kill_session(sid: int, *, timeout_s: float = 30.0) -> None:
    """SIGKILL every process of session ``sid`` until none is left."""
    deadline = time.monotonic() + timeout_s
    while members := _session_members(sid):
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {members[:5]} of the killed run survive SIGKILL")
        time.sleep(0.1)


def run_child(
    command: Sequence[str],
    *,
    events: Path,
    log: Path,
    plan: KillPlan | None,
    resume: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    on_step: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> Attempt:
    """Run ``command`` to its end, or kill its whole session as ``plan`` says; ``on_step`` sees each trained step.

    Only events written after the child starts count. Whatever the child leaves running in its
    session when it ends (a Ray cluster it did not stop) is killed with it.

    Raises:
        TimeoutError: the child ran longer than ``timeout_s`` (its session is killed first).
    """
    started = time.perf_counter()
    tail = EventTail(events)  # what the child appends
    after_save: int | None = None
    saved_step = 0
    killed = False
    with open(log, "ab") as out:
        child = subprocess.Popen(
            list(command), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while child.poll() is None and not killed:
                time.sleep(POLL_S)
                if _interrupted.is_set():
                    raise KeyboardInterrupt(f"{command[0]}: interrupted; its session was killed")
                if timeout_s is not None and time.perf_counter() - started > timeout_s:
                    raise TimeoutError(f"{command[0]} ran longer than {timeout_s:.0f} s; see {log}")
                for event in tail.read():
                    if killed:
                        break  # what the child wrote after the kill point is not seen
                    trained = event["event"] == EventKind.LOG and event.get("kind") == TRAIN_STEP
                    if on_step and trained:
                        on_step(event["step"])
                    if plan is None:
                        continue
                    if after_save is None:
                        if plan.matches(event):
                            after_save, saved_step = 0, event.get("step", 0)
                            killed = plan.after_events == 0
                    else:
                        after_save += 1
                        # NeMo RL logs a step after its save, the reference trainer before: either way
                        # the next save comes after the first step logged past the saved one
                        killed = after_save >= plan.after_events or (trained and event["step"] > saved_step)
        finally:
            kill_session(child.pid)
            child.wait()
    return Attempt(resume=resume, returncode=child.returncode, killed=killed, wall_s=time.perf_counter() - started)


def kill_and_resume(
    command: Sequence[str],
    *,
    events: Path,
    log: Path,
    plans: Sequence[KillPlan],
    resume_command: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    on_step: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> KillResumeRun:
    """Run ``command``, then ``resume_command`` until a run ends on its own; run ``i`` is killed per
    ``plans[i]``, and the runs after the last plan are not killed (a job preempted again after its
    resume has two plans).

    ``resume_command`` defaults to ``command`` itself, for trainers that resume from their latest
    checkpoint on their own (NeMo RL does).

    Raises:
        RuntimeError: a run failed (non-zero exit without being killed); ``log`` names the cause.
        TimeoutError: a run took longer than ``timeout_s``.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    run = KillResumeRun(plans=list(plans))
    while True:
        resume = bool(run.attempts)
        attempt = run_child(
            (resume_command or command) if resume else command,
            events=events,
            log=log,
            plan=plans[len(run.attempts)] if len(run.attempts) < len(plans) else None,
            resume=resume,
            env=env,
            cwd=cwd,
            on_step=on_step,
            timeout_s=timeout_s,
        )
        run.attempts.append(attempt)
        if not attempt.killed:
            if attempt.returncode != 0:
                raise RuntimeError(f"{command[0]} exited with {attempt.returncode}; see {log}")
            return run


def side_by_side(jobs: Mapping[str, Callable[[], T]]) -> dict[str, T]:
    """Run ``jobs`` in threads side by side (each trainer spends much of its time starting vLLM or
    waiting on a long sample); their results by name.

    The children run in sessions of their own, so the terminal's Ctrl-C does not reach them: on
    Ctrl-C every run under way kills its session before this re-raises.
    """
    try:
        with ThreadPoolExecutor(len(jobs)) as pool:
            futures = {name: pool.submit(job) for name, job in jobs.items()}
            try:
                pending = set(futures.values())
                while pending:  # a timed wait: Python raises a Ctrl-C only in the main thread, between
                    # bytecodes, and the kernel may hand the signal to another thread, which leaves a
                    # main thread blocked on a future asleep until the runs end (seen once in CI: 300 s)
                    _, pending = wait(pending, timeout=0.5)
                return {name: f.result() for name, f in futures.items()}
            except KeyboardInterrupt:
                _interrupted.set()
                raise
    finally:  # the pool has waited for every run to stop
        _interrupted.clear()
