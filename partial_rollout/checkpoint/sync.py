"""The checkpointer for a synchronous trainer: its coroutines run on an event loop of its own.

The checkpointer is asynchronous (its cut waits on the engine; generation streams), while some
trainers' loops are plain functions (verl's ``fit``). :class:`SyncCheckpointer` keeps one event
loop in a daemon thread, makes the checkpointer on it, and runs any coroutine there for the
calling thread, so that the gate, the ledger and the engine's calls all stay on that one loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from partial_rollout.checkpoint.checkpointer import Restored, RolloutCheckpointer
from partial_rollout.checkpoint.window import PendingSnapshot

T = TypeVar("T")


class SyncCheckpointer:
    """A :class:`RolloutCheckpointer` driven from synchronous code (see the module docstring)."""

    def __init__(self, make: Callable[[], RolloutCheckpointer], *, name: str = "partial-rollout") -> None:
        """``make`` builds the checkpointer; it is called on the loop, as its engine's calls will be.
        ``name``: the loop thread's name, as a stack dump shows it."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self.checkpointer: RolloutCheckpointer = self.run(self._make(make))

    @staticmethod
    async def _make(make: Callable[[], RolloutCheckpointer]) -> RolloutCheckpointer:
        return make()

    def run(self, coro: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
        """Run ``coro`` on the checkpointer's loop and return its result (its exception raised here).
        Any coroutine that touches the checkpointer, its ledger or its engine belongs there."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def restore(self, folder: Any, **kwargs: Any) -> Restored:
        """:meth:`RolloutCheckpointer.restore`, waited for."""
        return self.run(self.checkpointer.restore(folder, **kwargs))

    def save(self, folder: Any, **kwargs: Any) -> PendingSnapshot:
        """:meth:`RolloutCheckpointer.save`, waited for; write the result (``write()``) from any thread."""
        return self.run(self.checkpointer.save(folder, **kwargs))

    def close(self) -> None:
        """Close the checkpointer's event log and stop its loop (the engine is the caller's)."""
        self.checkpointer.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
