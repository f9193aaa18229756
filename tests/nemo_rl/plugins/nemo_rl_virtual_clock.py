"""A pytest plugin for NeMo RL's own unit tests that time their event loop: those loops keep virtual time.

Why: ``test_watchdog_pump.py`` runs NeMo RL's watchdog, which ticks every 1 ms, for a wall-clock
budget of 5 ms a tick (``_run_pump``: ``asyncio.sleep(0.005 * ticks)``, then cancel). When the
process is descheduled for longer than that budget (a fresh-clone run here at a load of about 10),
the budget's timer and the first tick's come due together, the pump is cancelled after one tick,
and ``test_a_wedged_environment_does_not_stop_the_pump`` fails its "at least 2 ticks" (it passed
alone, 2 of 2). On a loop whose clock advances only when it would otherwise wait, each timer fires
in the order its deadline gives whatever the machine's load: the test runs as its author meant,
its assertions untouched. ``time.monotonic()`` (the watchdog's idle clock) stays real.

Loaded into NeMo RL's pytest with ``-p nemo_rl_virtual_clock`` (``nemo_rl_harness.run_unit_tests``);
it changes only the loops that ``asyncio.run`` makes in the modules of :data:`MODULES`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Generator
from typing import Any

import pytest

MODULES = frozenset({"test_watchdog_pump"})
"""NeMo RL test modules whose loops run on virtual time: they only await timers and their own futures
(no thread or subprocess finishes work for them), so skipping the waits changes nothing but timing."""


class _VirtualSelector(selectors.DefaultSelector):
    """A selector that, where the loop would block until its next timer with no I/O ready, moves the clock there."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer pending: only I/O (another thread's call_soon_threadsafe) can wake it
            return super().select(None)
        self.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is virtual: it jumps to the next timer instead of sleeping."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


class _Policy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return VirtualClockLoop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    module = getattr(item, "module", None)
    if module is None or module.__name__.rsplit(".", 1)[-1] not in MODULES:
        return (yield)
    before = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_Policy())
    try:
        return (yield)
    finally:
        asyncio.set_event_loop_policy(before)
