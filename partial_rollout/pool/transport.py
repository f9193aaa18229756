"""The wire between an engine in a Ray actor and its pool: one channel per actor, not one Ray stream per request.

Why: the pool must hold every request's tokens as they come (a cut reads them without asking any
actor; a failover continues a dead actor's requests from them). Streaming each request as its own
Ray streaming generator costs a Ray item per request per engine step, and on a 2-core machine that
ran ``EnginePool.ray(config, 1)`` at 0.32x the rate of plain vLLM in a Ray actor (issue 33). Here
the requests a pool submits in one turn of its event loop go to the actor in one call
(:meth:`Host.submit`), and the tokens of all the requests one pool has on an actor come back
through one long poll (:meth:`Host.poll`): each answer holds everything the engine delivered since
the previous answer, one delta per request. An answer waits until :data:`INTERVAL_S` after the
previous one unless a request ended (a Ray round trip cost 1-2 ms of CPU on each side here, against
engine steps of 15-40 ms for 64 requests), so the pool's copy lags the engine by about that much;
tokens sampled and not yet delivered are what a cut or a failover would generate again, as before.

What a stream per request guaranteed still holds, per request: its tokens arrive in order, each
once, then its end (the finished record, or the error its ``generate`` raised, raised again in the
pool); a request whose consumer stops (a cancelled ``generate``) is aborted in the actor; and when
the actor dies, every request it held gets :class:`~partial_rollout.pool.failover.EngineDiedError`
after every token that reached the pool before the death. The actor side is a mixin
(:class:`Host`) for any Ray actor class that holds a :class:`~partial_rollout.engine.ResumableEngine`;
an actor without it is driven with a Ray stream per request, as before (:meth:`Host.poll` absent).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pickle
import traceback
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from partial_rollout.engine import Delta, ResumableEngine
from partial_rollout.engine.accumulated import Accumulated
from partial_rollout.pool.failover import EngineDiedError
from partial_rollout.snapshot import SampleRecord, SamplingSpec

INTERVAL_S = 0.1
"""Least time between two answers to a channel's polls (unless a request ended): what the pool's copy of a
request may lag behind the engine, for a Ray round trip per interval instead of per engine step."""

End = SampleRecord | BaseException
"""How a request ended in the actor: its finished record, or what its ``generate`` raised."""


class Submission(NamedTuple):
    """One request as a channel sends it to its actor."""

    ticket: int
    """The request's number on its channel (request ids may repeat: a request moved back after a failover)."""
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    sample_index: int
    resume_from: SampleRecord | None


class Batch(NamedTuple):
    """What an actor delivered to one channel since its previous answer."""

    deltas: dict[int, Delta]
    """Each request's new tokens (several deltas of one request joined into one), by ticket."""
    ends: dict[int, End]
    """Requests that ended, by ticket; a request's deltas in the same batch come before its end."""


def one_line(exc: BaseException) -> str:
    """An error of several lines (Ray's) as one: its kind and its last line, which says why."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else 'no reason given'}"


def why_died(exc: BaseException) -> str:
    """Why an engine's actor call failed: its actor died."""
    return f"the engine's Ray actor died ({one_line(exc)})"


def _portable(exc: BaseException) -> BaseException:
    """``exc`` as it can cross to the pool: itself with the actor's traceback as a note, or, when it does not
    survive pickling (an exception class with required arguments), a RuntimeError naming it.

    Checked here because one exception that fails to unpickle in the pool would lose the whole batch.
    """
    where = "raised in the engine's Ray actor:\n" + "".join(traceback.format_exception(exc)).rstrip()
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    exc.add_note(where)
    return exc


class Outbox:
    """The actor side of one channel: the requests submitted through it and what they delivered, not yet polled."""

    def __init__(self) -> None:
        self._deltas: dict[int, list[Delta]] = {}
        self._ends: dict[int, End] = {}
        self._running: dict[int, asyncio.Future[SampleRecord]] = {}
        self._aborted: set[int] = set()
        """Tickets aborted before they started (the abort overtook the submission)."""
        self._last_started = -1
        """The highest ticket started: a channel numbers its requests in the order it submits them."""
        self._ready = asyncio.Event()
        self._ended = asyncio.Event()
        self._answered = -float("inf")

    def start(self, ticket: int, generate: Callable[[Callable[[Delta], None]], Awaitable[SampleRecord]]) -> None:
        """Run ``generate(on_delta)`` as request ``ticket``; its deltas and its end go out with the next polls."""
        if ticket in self._aborted:
            self._aborted.discard(ticket)
            return
        if ticket in self._running:
            raise ValueError(f"ticket {ticket} is already running on this channel")
        self._last_started = max(self._last_started, ticket)

        def push(delta: Delta) -> None:
            pending = self._deltas.get(ticket)
            if pending is None:
                self._deltas[ticket] = [delta]
            else:
                pending.append(delta)
            self._ready.set()

        task = asyncio.ensure_future(generate(push))
        self._running[ticket] = task
        task.add_done_callback(lambda done: self._end(ticket, done))

    def _end(self, ticket: int, task: asyncio.Future[SampleRecord]) -> None:
        del self._running[ticket]
        if task.cancelled():  # aborted by the pool, which no longer waits for it: nothing more to send
            self._deltas.pop(ticket, None)
            return
        error = task.exception()
        self._ends[ticket] = task.result() if error is None else _portable(error)
        self._ready.set()
        self._ended.set()

    def abort(self, tickets: Sequence[int]) -> None:
        """Cancel these requests (their ``generate`` aborts them in vLLM); one not started yet never starts."""
        for ticket in tickets:
            task = self._running.get(ticket)
            if task is not None:
                task.cancel()
            elif ticket > self._last_started:  # not submitted yet (else it ended: its end is not wanted)
                self._aborted.add(ticket)
            self._ends.pop(ticket, None)
            self._deltas.pop(ticket, None)

    async def take(self, interval_s: float) -> Batch:
        """Everything delivered since the last call, once there is something and ``interval_s`` has passed
        since the previous answer (at once when a request ended)."""
        loop = asyncio.get_running_loop()
        while not self._deltas and not self._ends:
            self._ready.clear()
            await self._ready.wait()
        wait = self._answered + interval_s - loop.time()
        if wait > 0 and not self._ends:
            self._ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), wait)
        deltas = {t: ds[0] if len(ds) == 1 else Delta.join(ds) for t, ds in self._deltas.items()}
        ends, self._deltas, self._ends = self._ends, {}, {}
        self._answered = loop.time()
        return Batch(deltas, ends)


def _generator(engine: ResumableEngine, s: Submission) -> Callable[[Callable[[Delta], None]], Awaitable[SampleRecord]]:
    """``generate(on_delta)`` of one submitted request on ``engine``."""

    def generate(on_delta: Callable[[Delta], None]) -> Awaitable[SampleRecord]:
        return engine.generate(
            s.request_id,
            s.prompt_token_ids,
            s.sampling,
            index=s.sample_index,
            resume_from=s.resume_from,
            on_delta=on_delta,
        )

    return generate


class Host:
    """Mixin for a Ray actor class that holds a :class:`~partial_rollout.engine.ResumableEngine`: the actor
    side of :class:`Channel`. The class says where its engine is (:meth:`hosted_engine`); a
    :class:`~partial_rollout.pool.RemoteEngine` of an actor with these methods uses them."""

    _outboxes: dict[str, Outbox]

    def hosted_engine(self) -> ResumableEngine:
        raise NotImplementedError

    def _outbox(self, channel: str) -> Outbox:
        boxes: dict[str, Outbox] | None = getattr(self, "_outboxes", None)
        if boxes is None:
            boxes = self._outboxes = {}
        box = boxes.get(channel)
        if box is None:
            box = boxes[channel] = Outbox()
        return box

    async def submit(self, channel: str, submissions: list[Submission]) -> None:
        """Start ``generate`` for each request; returns at once (they report through :meth:`poll`)."""
        engine, box = self.hosted_engine(), self._outbox(channel)
        for submission in submissions:
            box.start(submission.ticket, _generator(engine, submission))

    async def abort(self, channel: str, tickets: list[int]) -> None:
        self._outbox(channel).abort(tickets)

    async def poll(self, channel: str, interval_s: float = 0.0) -> Batch:
        """What ``channel``'s requests delivered since its previous poll; waits until there is something, and
        until ``interval_s`` after the previous answer unless a request ended."""
        return await self._outbox(channel).take(interval_s)


class _Inbox:
    """The pool side of one request: where its deltas go, and its end once it came."""

    __slots__ = ("deltas", "end", "request_id", "sink", "waiter")

    def __init__(self, request_id: str, sink: Accumulated | None) -> None:
        self.request_id = request_id
        self.sink = sink
        """Where each delta goes as its batch arrives (the pool's own path); ``None``: queued in ``deltas``."""
        self.deltas: list[Delta] = []
        self.end: End | None = None
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def finish(self, end: End) -> None:
        self.end = end
        self.wake()


class Followed:
    """One request on a channel, submitted when first read: iterate it for its deltas, then its finished record
    (what any caller of :meth:`RemoteEngine.stream` sees), or :meth:`into` (the pool's own path).

    Deltas that piled up since the last read come as one. Raises what the request's ``generate``
    raised in the actor, or ``EngineDiedError`` once every delta received before the actor's death has come.
    """

    def __init__(self, channel: Channel, request: Submission) -> None:
        self._channel = channel
        self._request = request
        self._items: AsyncGenerator[Delta | SampleRecord, None] | None = None

    def __aiter__(self) -> Followed:
        return self

    async def __anext__(self) -> Delta | SampleRecord:
        if self._items is None:
            self._items = self._channel._items(self._request)
        return await anext(self._items)

    async def aclose(self) -> None:
        """Stop following (aborts the request in the actor if it has not ended)."""
        if self._items is not None:
            await self._items.aclose()

    async def into(self, received: Accumulated) -> SampleRecord:
        """Append every delta to ``received`` as its batch arrives (no wakeup per delta); the finished record."""
        if self._items is not None:
            raise RuntimeError(f"{self._request.request_id}: already being read")
        return await self._channel._into(self._request, received)


class Channel:
    """The pool side of one actor's channel: submits requests, polls their deltas, hands each to its reader.

    One poll is in flight while any request is followed (none while the actor is idle: an idle
    actor's death is noticed by the next call to it, as before). Each channel has its own id, so two
    pools (or two :class:`~partial_rollout.pool.RemoteEngine` of one actor) never read each other's batches.
    """

    def __init__(self, actor: Any, *, interval_s: float = INTERVAL_S) -> None:
        self._actor = actor
        self._id = uuid.uuid4().hex
        self._interval_s = interval_s
        self._tickets = itertools.count()
        self._inboxes: dict[int, _Inbox] = {}
        self._outgoing: dict[int, Submission] | None = None
        """Requests opened in this turn of the loop, sent together at its end."""
        self._pump: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Future[Any]] = set()
        """Submissions and aborts in flight (held so that they are not collected before they are answered)."""

    @staticmethod
    def supported(actor: Any) -> bool:
        """Whether ``actor``'s class is a :class:`Host` (Ray handles answer ``hasattr`` for their methods)."""
        return hasattr(actor, "poll") and hasattr(actor, "submit")

    def stream(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> Followed:
        """One request, submitted when first read (:class:`Followed`)."""
        ticket = next(self._tickets)
        return Followed(self, Submission(ticket, request_id, list(prompt_token_ids), sampling, index, resume_from))

    def _open(self, request: Submission, sink: Accumulated | None) -> _Inbox:
        """Register the request and queue it for this turn's submission; its end, a failed submission's too,
        comes to its inbox."""
        inbox = self._inboxes[request.ticket] = _Inbox(request.request_id, sink)
        if self._outgoing is None:
            self._outgoing = {}
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing[request.ticket] = request
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._run())
        return inbox

    def _close(self, ticket: int) -> None:
        """The reader left: abort the request in the actor unless its end came (or it was never sent)."""
        if self._inboxes.pop(ticket, None) is None:
            return
        if self._outgoing is not None and self._outgoing.pop(ticket, None) is not None:
            return
        self._send(self._actor.abort, [ticket])

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing or {}, None
        if outgoing:
            self._submit(list(outgoing.values()))

    def _submit(self, batch: list[Submission]) -> None:
        try:
            self._send(self._actor.submit, batch, failed=[s.ticket for s in batch])
        except Exception as exc:  # the arguments did not serialize: each request on its own, so one fails alone
            if len(batch) > 1:
                for one in batch:
                    self._submit([one])
            else:
                inbox = self._inboxes.pop(batch[0].ticket, None)
                if inbox is not None:
                    inbox.finish(exc)

    def _send(self, method: Any, argument: list[Any], *, failed: list[int] | None = None) -> None:
        """Call ``method(channel, argument)`` without waiting; if it fails, the requests ``failed`` end with its error
        (an abort's failure is dropped: its actor is dead or going)."""
        call = asyncio.ensure_future(method.remote(self._id, argument))
        self._calls.add(call)
        call.add_done_callback(lambda done: self._sent(done, failed or []))

    def _sent(self, call: asyncio.Future[Any], failed: list[int]) -> None:
        from ray.exceptions import RayActorError

        self._calls.discard(call)
        error = (
            None if call.cancelled() else call.exception()
        )  # retrieved: a dead actor's refusal is no unhandled error
        if error is None:
            return
        for ticket in failed:
            inbox = self._inboxes.pop(ticket, None)
            if inbox is None:
                continue
            if isinstance(error, RayActorError):
                died = EngineDiedError(f"{inbox.request_id}: {why_died(error)}")
                died.__cause__ = error
                inbox.finish(died)
            else:
                inbox.finish(error)

    async def _items(self, request: Submission) -> AsyncGenerator[Delta | SampleRecord, None]:
        inbox = self._open(request, None)
        try:
            while True:
                if inbox.deltas:
                    deltas, inbox.deltas = inbox.deltas, []
                    yield deltas[0] if len(deltas) == 1 else Delta.join(deltas)
                    continue
                if inbox.end is not None:
                    if isinstance(inbox.end, BaseException):
                        raise inbox.end
                    yield inbox.end
                    return
                await self._wait(inbox)
        finally:
            self._close(request.ticket)

    async def _into(self, request: Submission, received: Accumulated) -> SampleRecord:
        inbox = self._open(request, received)
        try:
            while inbox.end is None:
                await self._wait(inbox)
            if isinstance(inbox.end, BaseException):
                raise inbox.end
            return inbox.end
        finally:
            self._close(request.ticket)

    @staticmethod
    async def _wait(inbox: _Inbox) -> None:
        inbox.waiter = asyncio.get_running_loop().create_future()
        try:
            await inbox.waiter
        finally:
            inbox.waiter = None

    async def _run(self) -> None:
        """Poll while any request is followed; hand each batch out; on the actor's death fail every request."""
        from ray.exceptions import RayActorError

        try:
            while self._inboxes:
                try:
                    deltas, ends = await self._actor.poll.remote(self._id, self._interval_s)
                except RayActorError as exc:
                    self._fail_all(EngineDiedError, why_died(exc), exc)
                    return
                except Exception as exc:  # a batch that could not be read: no request may wait forever
                    self._fail_all(RuntimeError, f"the engine's channel failed: {one_line(exc)}", exc)
                    return
                inboxes = self._inboxes
                for ticket, delta in deltas.items():
                    inbox = inboxes.get(ticket)
                    if inbox is None:  # its reader left meanwhile
                        continue
                    if inbox.sink is not None:
                        inbox.sink.add(delta)
                    else:
                        inbox.deltas.append(delta)
                        inbox.wake()
                for ticket, end in ends.items():
                    inbox = inboxes.pop(ticket, None)
                    if inbox is not None:
                        inbox.finish(end)
        finally:
            self._pump = None

    def _fail_all(self, kind: type[Exception], why: str, cause: BaseException) -> None:
        inboxes, self._inboxes = self._inboxes, {}
        for inbox in inboxes.values():
            error = kind(f"{inbox.request_id}: {why}")
            error.__cause__ = cause
            inbox.finish(error)
