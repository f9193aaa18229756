"""Shared fixtures: tiny models built once per session, and real vLLM engines shared across tests.

Engine start-up costs 10-25 s on CPU, so each engine is session-scoped. ``AsyncLLM`` binds to the
event loop it first runs in, so session engines live on one loop in a background thread
(:class:`LoopThread`) and tests submit coroutines to it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# One setting for every engine of the test process: the worker runs inside the engine-core
# process (cheaper), and vLLM caches its environment once an engine has started.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

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
