"""Run NeMo RL's controller in a child process tree, SIGKILL all of it after a checkpoint, and resume it.

What a preempted node looks like: the launcher, the Ray cluster it started, the controller actor
and the engines die together, without a handler running or a file being closed. The launcher runs
in a session of its own; the kill is SIGKILL to every process of that session (Ray's raylet, its
workers and vLLM's engine cores included). Then the same command resumes from NeMo RL's latest
checkpoint, as a user would rerun it, until a run ends on its own.

The moment is drawn as a number of events after the ``save`` event of a chosen step, so a busy
machine cannot let the run finish before the kill.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from partial_rollout.ledger import EventKind, read_events

POLL_S = 0.2


@dataclass(kw_only=True, frozen=True)
class KillPlan:
    """Kill once ``after_events`` more events follow the first ``save`` event whose field ``holding`` is > 0.

    A checkpoint with nothing in flight would prove nothing, so the kill waits for one that holds
    work: ``prefix_tokens`` (partial rollouts on: the cut holds prefixes to continue) or
    ``samples_unfinished`` (off: the work NeMo RL's checkpoint leaves out).
    """

    after_events: int
    holding: str

    @classmethod
    def draw(cls, seed: int, *, holding: str, max_events: int = 30) -> KillPlan:
        return cls(after_events=random.Random(seed).randint(0, max_events), holding=holding)


@dataclass(kw_only=True)
class Attempt:
    returncode: int
    killed: bool
    wall_s: float


@dataclass(kw_only=True)
class KillResumeRun:
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return sum(a.wall_s for a in self.attempts)


def _session_members(sid: int) -> list[int]:
    """Processes of session ``sid`` (Linux ``/proc``): the launcher's whole tree, Ray's daemons included."""
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
    env: dict[str, str],
    cwd: Path,
    events: Path,
    log: Path,
    plan: KillPlan | None,
    timeout_s: float,
) -> Attempt:
    """Run one launcher to its end, or kill its whole session as ``plan`` says."""
    started = time.perf_counter()
    with open(log, "ab") as out:
        child = subprocess.Popen(
            list(command), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        seen, after_save, killed = 0, None, False
        try:
            while child.poll() is None:
                time.sleep(POLL_S)
                if time.perf_counter() - started > timeout_s:
                    raise TimeoutError(f"the NeMo RL run took longer than {timeout_s:.0f} s; see {log}")
                if plan is None or not events.exists():
                    continue
                new = list(read_events(events))[seen:]
                seen += len(new)
                for event in new:
                    if after_save is not None:
                        after_save += 1
                    elif event["event"] == EventKind.SAVE and event.get(plan.holding, 0) > 0:
                        after_save = 0
                if after_save is not None and after_save >= plan.after_events:
                    killed = True
                    break
        finally:
            kill_session(child.pid)
            child.wait()
    return Attempt(returncode=child.returncode, killed=killed, wall_s=time.perf_counter() - started)


def kill_and_resume(
    command: Sequence[str],
    *,
    env: dict[str, str],
    cwd: Path,
    events: Path,
    plan: KillPlan | None,
    timeout_s: float = 1800.0,
) -> KillResumeRun:
    """Run, kill per ``plan`` (None: never), and rerun the same command until a run ends on its own.

    Raises:
        RuntimeError: a run failed (non-zero exit without being killed); its log names the cause.
    """
    log = cwd / "nemo_rl.log"
    run = KillResumeRun()
    while True:
        attempt = run_child(
            command, env=env, cwd=cwd, events=events, log=log, plan=None if run.attempts else plan, timeout_s=timeout_s
        )
        run.attempts.append(attempt)
        if not attempt.killed:
            if attempt.returncode != 0:
                raise RuntimeError(f"the NeMo RL run exited with {attempt.returncode}; see {log}")
            return run
