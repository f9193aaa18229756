"""Shared fixtures: tiny models built once per session, and real vLLM engines shared across tests.

Engine start-up costs 10-25 s on CPU, so each engine is session-scoped. ``AsyncLLM`` binds to the
event loop it first runs in, so session engines live on one loop in a background thread
(:class:`LoopThread`) and tests submit coroutines to it.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
import traceback
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

pytest_plugins = ["cpu_budget"]

# One setting for every engine of the test process: the worker runs inside the engine-core
# process (cheaper), and vLLM caches its environment once an engine has started.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A Ray call after a test's ``ray.shutdown`` (a task it left running) raises instead of silently
# starting a new local cluster that the next test's ``ray.init`` then trips over.
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
# One OpenMP thread per vLLM engine, unbound (vLLM's own default binds one thread per core of the
# machine). The suite runs two lanes at once on 2 cores (scripts/test.sh), and an engine whose threads
# span both cores waits, spinning, at every parallel region for the core the other lane holds: two engine
# test files side by side here took 314 s and 589 CPU-s with vLLM's default, 175 s and 358 CPU-s like
# this. Engines the pool pins to a core group (partial_rollout/pool/cluster.py) get their own settings.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ray starts an idle worker per CPU for a cluster's first driver, to hide a worker's start-up. The tests'
# actors mostly run in other interpreters (an engine's, verl's), where those workers go unused: measured
# here, 5 processes and about 4 CPU-s fewer per local cluster started with num_cpus=8.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With ``PARTIAL_ROLLOUT_NO_SKIPS=1`` (CI), a skipped test fails: no core test may silently not run."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and os.environ.get("PARTIAL_ROLLOUT_NO_SKIPS") == "1":
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (PARTIAL_ROLLOUT_NO_SKIPS=1): {report.longrepr}"


class LoopThread:
    """An asyncio loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 600) -> T:
        """``coro``'s result; past ``timeout``, where it was stuck, after cancelling it (it stops using Ray)."""

        async def start() -> asyncio.Task[T]:
            task = asyncio.ensure_future(coro)
            task.add_done_callback(lambda _: done.set())
            return task

        done = threading.Event()
        task = asyncio.run_coroutine_threadsafe(start(), self.loop).result()
        if not done.wait(timeout):
            stuck = self._stacks()
            self.loop.call_soon_threadsafe(task.cancel)
            done.wait(60)
            raise TimeoutError(f"the test's coroutine ran past {timeout} s; where the engine loop was:\n{stuck}")
        return task.result()

    def _stacks(self) -> str:
        """The loop thread's own stack (a blocking call shows here) and every task's."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        out = ["loop thread:\n" + "".join(traceback.format_stack(frame)) if frame else "loop thread: not running"]
        for task in asyncio.all_tasks(self.loop):
            buf = io.StringIO()
            task.print_stack(limit=8, file=buf)
            out.append(buf.getvalue())
        return "\n".join(out)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="session")
def tiny_llama() -> Path:
    from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model

    return build_tiny_model(TinyModelSpec(arch="llama"))


@pytest.fixture(scope="session")
def tiny_qwen2() -> Path:
    from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model

    return build_tiny_model(TinyModelSpec(arch="qwen2"))


@pytest.fixture(scope="session")
def async_engine(tiny_llama: Path, loop_thread: LoopThread) -> Iterator[Any]:
    """A plain ``AsyncLLM`` from the factory on the tiny Llama (max_model_len 2048)."""
    from partial_rollout.engine.factory import EngineConfig, make_async_engine

    async def start() -> Any:
        return make_async_engine(EngineConfig(model=str(tiny_llama), max_model_len=2048, multiprocessing=False))

    engine = loop_thread.run(start())
    yield engine
    engine.shutdown()
