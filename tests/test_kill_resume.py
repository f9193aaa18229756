"""The kill-and-resume harness every trainer's demo and kill tests run through, on real child processes.

The child here is a small script that writes the ledger's own events (no engine), so the harness's
rules are checked on their own: the kill lands a counted number of events after the first matching
save, takes the child's whole session with it, and the resume command then runs to the end.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from partial_rollout_integrations.kill_resume import KillPlan, kill_and_resume, run_child, side_by_side

CHILD = textwrap.dedent(
    """
    import subprocess, sys, time
    from partial_rollout.ledger import EventKind, EventLog
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(grandchild.pid, flush=True)
    log = EventLog(sys.argv[1])
    log.append(EventKind.SAVE, step=1, prefix_tokens=0)  # holds nothing: does not match
    log.append(EventKind.SAVE, step=2, prefix_tokens=5)
    log.append(EventKind.LOG, kind="train_step", step=2)  # logged after its save, as NeMo RL does
    for step in range(3, int(sys.argv[2]) if len(sys.argv) > 2 else 100_000):
        for sample in range(4):  # four events, then a trained step
            log.append(EventKind.FINISH, prompt="p", sample=sample)
            time.sleep(0.01)
        log.append(EventKind.LOG, kind="train_step", step=step)
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(("after_events", "steps_seen"), [(3, [2]), (12, [2, 3])])
def test_the_kill_lands_the_planned_number_of_events_after_the_matching_save_and_takes_the_whole_session(
    tmp_path: Path, after_events: int, steps_seen: list[int]
) -> None:
    """3 events: before step 3; 12: at step 3 (the 6th event), the first step past the saved one, so that
    the resume is from that save."""
    script, events, log = tmp_path / "child.py", tmp_path / "events.jsonl", tmp_path / "child.log"
    script.write_text(CHILD)
    steps: list[int] = []
    attempt = run_child(
        [sys.executable, str(script), str(events)],
        events=events,
        log=log,
        plan=KillPlan(after_events=after_events, holding="prefix_tokens"),
        on_step=steps.append,
        timeout_s=120,
    )
    assert attempt.killed and attempt.returncode == -9 and not attempt.resume
    assert steps == steps_seen
    grandchild = int(log.read_text().split()[0])
    assert not _alive(grandchild), "a process the child started survived the kill"


def test_a_killed_run_resumes_with_the_resume_command_and_a_failed_resume_names_its_log(tmp_path: Path) -> None:
    script, events, log = tmp_path / "child.py", tmp_path / "events.jsonl", tmp_path / "child.log"
    script.write_text(CHILD)
    command = [sys.executable, str(script), str(events)]
    plan = KillPlan(after_events=0, from_step=2)
    run = kill_and_resume(command, resume_command=[sys.executable, "-c", "pass"], events=events, log=log, plans=[plan])
    assert [(a.resume, a.killed, a.returncode) for a in run.attempts] == [(False, True, -9), (True, False, 0)]
    assert run.plans == [plan] and run.wall_s > 0

    fails = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with pytest.raises(RuntimeError, match=f"exited with 3; see {log}"):
        kill_and_resume(command, resume_command=fails, events=events, log=log, plans=[plan])


def test_each_run_is_killed_per_its_own_plan_and_the_run_after_the_last_plan_ends(tmp_path: Path) -> None:
    """A job preempted again after its resume."""
    script, events, log = tmp_path / "child.py", tmp_path / "events.jsonl", tmp_path / "child.log"
    script.write_text(CHILD)
    plans = [KillPlan(after_events=3, holding="prefix_tokens"), KillPlan(after_events=0, from_step=2)]
    run = kill_and_resume([sys.executable, str(script), str(events), "12"], events=events, log=log, plans=plans)
    assert [(a.resume, a.killed) for a in run.attempts] == [(False, True), (True, True), (True, False)]
    assert run.attempts[-1].returncode == 0


def test_a_plan_counts_events_so_it_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="KillPlan.after_events: is -1"):
        KillPlan(after_events=-1)
    assert KillPlan(after_events=0, from_step=4).matches({"event": "save", "step": 4})
    assert KillPlan(after_events=0, from_step=4).matches({"event": "save", "step": 6})
    assert not KillPlan(after_events=0, from_step=4).matches({"event": "save", "step": 2})
    assert not KillPlan(after_events=0).matches({"event": "log", "step": 4})
    assert KillPlan(after_events=0, before_step=12).matches({"event": "save", "step": 10})
    assert not KillPlan(after_events=0, before_step=12).matches({"event": "save", "step": 12})


def test_environment_and_folder_reach_the_child(tmp_path: Path) -> None:
    events, log = tmp_path / "events.jsonl", tmp_path / "child.log"
    code = "import os; print(os.getcwd(), os.environ['KILL_RESUME_PROBE'])"
    env = {**os.environ, "KILL_RESUME_PROBE": "here"}
    run = kill_and_resume([sys.executable, "-c", code], events=events, log=log, plans=[], env=env, cwd=tmp_path)
    assert [a.killed for a in run.attempts] == [False]
    assert log.read_text().split() == [str(tmp_path), "here"]


def test_ctrl_c_while_runs_go_side_by_side_kills_every_session(tmp_path: Path) -> None:
    """The children do not get the terminal's SIGINT (sessions of their own): the harness kills them."""
    script, events = tmp_path / "child.py", tmp_path / "events.jsonl"
    script.write_text(CHILD)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]

    def long_run(log: Path) -> object:
        return run_child([sys.executable, str(script), str(events)], events=events, log=log, plan=None, timeout_s=300)

    def ctrl_c() -> None:  # as the terminal sends it: to this process, once both children are up
        while not all(log.exists() and log.read_text() for log in logs):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    started = time.monotonic()
    # The kernel may hand a process's SIGINT to any thread not blocking it, and Python raises it only in
    # the main thread, which must therefore not sleep on a future unwoken. Blocked here (the pool's
    # threads inherit the mask), it can only go to the thread that sends it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    # A process started in the background by a non-interactive shell (as a CI runner may start this
    # suite) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the
    # signal was dropped and the runs went on until their timeout. A terminal's Ctrl-C is what is tested.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            side_by_side({log.name: functools.partial(long_run, log) for log in logs})
    finally:
        signal.signal(signal.SIGINT, ignored)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    assert time.monotonic() - started < 60
    assert not any(_alive(int(log.read_text().split()[0])) for log in logs)
    # the harness is usable again afterwards
    run = kill_and_resume([sys.executable, "-c", "pass"], events=events, log=logs[0], plans=[])
    assert [a.killed for a in run.attempts] == [False]
