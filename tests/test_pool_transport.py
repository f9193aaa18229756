"""The channel between an engine's Ray actor and its pool keeps a stream per request's guarantees.

The actor side is the real :class:`~partial_rollout.pool.transport.Host`, the pool side the real
:class:`~partial_rollout.pool.transport.Channel`; between them a stand-in for a Ray actor handle that
runs the host's methods in this loop and pickles every argument and answer (as Ray does), and that
can die. The engine is a stand-in too (a token per turn of the loop), so each property is checked
exactly: tokens in order, each once, then the end; an error raised in the actor raised in the pool;
a cancelled consumer aborting its request in the actor; the actor's death failing every request it
held after every token received before it; two channels on one actor kept apart. Real actors and
engines run the same code in ``tests/test_engine_failover.py`` and ``tests/test_many_engines.py``.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import numpy as np
import pytest
from ray.exceptions import ActorDiedError

from partial_rollout.engine import Delta
from partial_rollout.engine.accumulated import Accumulated
from partial_rollout.pool import EngineDiedError, transport
from partial_rollout.pool.failover import follow
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec

SPEC = SamplingSpec(max_tokens=40, temperature=0.0, ignore_eos=True)


class _PickyError(Exception):
    """An exception that pickles but does not unpickle (a required argument not in ``args``)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class FakeEngine:
    """Generates ``max_tokens`` tokens (``prompt[0] * 1000 + i``), one per turn of the event loop."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.running: set[str] = set()

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
        on_delta: Callable[[Delta], None] | None = None,
    ) -> SampleRecord:
        assert on_delta is not None
        self.running.add(request_id)
        try:
            tokens = []
            for i in range(sampling.max_tokens):
                await asyncio.sleep(0)
                if prompt_token_ids[0] < 0 and i == 3:
                    if prompt_token_ids[0] == -1:
                        raise ValueError(f"{request_id}: bad request")
                    raise _PickyError(f"{request_id}: picky", 7)
                token = prompt_token_ids[0] * 1000 + i
                tokens.append(token)
                on_delta(Delta(token_ids=[token], logprobs=[-0.5], versions=[0]))
            return SampleRecord(
                index=index,
                state=SampleState.FINISHED,
                sampling=sampling,
                token_ids=tokens,
                logprobs=[-0.5] * len(tokens),
                versions=[0] * len(tokens),
                finish_reason="length",
            )
        except asyncio.CancelledError:
            self.aborted.append(request_id)
            raise
        finally:
            self.running.discard(request_id)


class _Host(transport.Host):
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def hosted_engine(self) -> Any:
        return self.engine


class _Method:
    def __init__(self, actor: FakeActor, name: str) -> None:
        self._actor, self._name = actor, name

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self._actor.run(self._name, args, kwargs))


class FakeActor:
    """A Ray actor handle's stand-in: methods with ``.remote``, pickled both ways, a death that fails every call."""

    def __init__(self, engine: FakeEngine) -> None:
        self.host = _Host(engine)
        self.dead = asyncio.get_running_loop().create_future()
        self.calls: list[str] = []
        self.answered: list[transport.Batch] = []
        """Every poll's answer, as the pool received it."""
        for name in ("submit", "poll", "abort"):
            setattr(self, name, _Method(self, name))

    async def run(self, name: str, args: Any, kwargs: Any) -> Any:
        self.calls.append(name)
        if self.dead.done():
            raise ActorDiedError()
        args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))
        call = asyncio.ensure_future(getattr(self.host, name)(*args, **kwargs))
        await asyncio.wait([call, self.dead], return_when=asyncio.FIRST_COMPLETED)
        if not call.done():
            call.cancel()
            raise ActorDiedError()
        answer = pickle.loads(pickle.dumps(call.result()))
        if name == "poll":
            self.answered.append(answer)
        return answer

    def kill(self) -> None:
        self.dead.set_result(None)


def run(coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(coro())


VIAS = ("into", "iteration")
"""The pool's own path (each delta appended to its ``Accumulated`` by the channel), and any other reader's."""


def consume(items: transport.Followed, received: Accumulated, via: str) -> Coroutine[Any, Any, SampleRecord]:
    """:func:`follow` of one request, the pool's way or, through a generator of our own, any reader's way."""
    if via == "into":
        return follow(items, received)

    async def each() -> Any:
        async for item in items:
            yield item

    return follow(each(), received)


def _prompt(i: int) -> list[int]:
    return [i + 1, 5, 6]


def test_channel_supports_only_actors_with_the_host_methods() -> None:
    class Legacy:
        stream = call = None

    async def main() -> tuple[bool, bool]:
        return transport.Channel.supported(FakeActor(FakeEngine())), transport.Channel.supported(Legacy())

    assert run(main) == (True, False)


@pytest.mark.parametrize("via", VIAS)
def test_every_request_receives_its_tokens_in_order_once_then_its_record(via: str) -> None:
    async def main() -> tuple[dict[str, Accumulated], dict[str, SampleRecord], list[str]]:
        engine = FakeEngine()
        actor = FakeActor(engine)
        channel = transport.Channel(actor, interval_s=0.0)
        received = {f"r{i}": Accumulated(index=0, sampling=SPEC, base=None) for i in range(20)}
        tasks = {
            rid: asyncio.ensure_future(consume(channel.stream(rid, _prompt(i), SPEC, index=0), received[rid], via))
            for i, rid in enumerate(received)
        }
        done = {rid: await t for rid, t in tasks.items()}
        return received, done, actor.calls

    received, done, calls = run(main)
    for i, (rid, record) in enumerate(done.items()):
        expected = [(i + 1) * 1000 + k for k in range(SPEC.max_tokens)]
        assert record.token_ids.tolist() == expected, rid
        assert received[rid].token_ids.tolist() == expected, rid  # every delta, in order, once
    # the 20 requests opened in one turn of the loop went in one call; far fewer polls than deltas (20 x 40)
    assert calls.count("submit") == 1 and calls.count("poll") < 20 * SPEC.max_tokens / 4, calls.count("poll")


@pytest.mark.parametrize("via", VIAS)
def test_an_error_raised_in_the_actor_is_raised_in_the_pool_and_leaves_the_others_alone(via: str) -> None:
    async def main() -> tuple[list[Any], Accumulated]:
        engine = FakeEngine()
        channel = transport.Channel(FakeActor(engine), interval_s=0.0)
        bad = Accumulated(index=0, sampling=SPEC, base=None)
        tasks = [
            consume(channel.stream("bad", [-1, 5], SPEC, index=0), bad, via),
            consume(
                channel.stream("picky", [-2, 5], SPEC, index=0), Accumulated(index=0, sampling=SPEC, base=None), via
            ),
            consume(channel.stream("good", [3, 5], SPEC, index=0), Accumulated(index=0, sampling=SPEC, base=None), via),
        ]
        out = await asyncio.gather(*tasks, return_exceptions=True)
        return out, bad

    (bad, picky, good), received = run(main)
    assert isinstance(bad, ValueError) and str(bad) == "bad: bad request"
    assert any("raised in the engine's Ray actor" in note for note in bad.__notes__)
    assert received.token_ids.tolist() == [-1000, -999, -998]  # what it delivered before the error
    assert isinstance(picky, RuntimeError) and str(picky) == "_PickyError: picky: picky"  # it could not cross as itself
    assert isinstance(good, SampleRecord) and good.num_tokens == SPEC.max_tokens


@pytest.mark.parametrize("via", VIAS)
def test_a_cancelled_consumer_aborts_its_request_in_the_actor(via: str) -> None:
    async def main() -> tuple[list[str], set[str], SampleRecord]:
        engine = FakeEngine()
        channel = transport.Channel(FakeActor(engine), interval_s=0.0)
        doomed = asyncio.ensure_future(
            consume(channel.stream("doomed", [1], SPEC, index=0), Accumulated(index=0, sampling=SPEC, base=None), via)
        )
        kept = asyncio.ensure_future(
            consume(channel.stream("kept", [2], SPEC, index=0), Accumulated(index=0, sampling=SPEC, base=None), via)
        )
        while "doomed" not in engine.running:  # noqa: ASYNC110 - the fake engine has no event for it
            await asyncio.sleep(0)
        doomed.cancel()
        record = await kept
        return engine.aborted, engine.running, record

    aborted, running, record = run(main)
    assert aborted == ["doomed"] and not running and record.num_tokens == SPEC.max_tokens


@pytest.mark.parametrize("via", VIAS)
def test_the_actors_death_fails_every_request_after_every_token_received(via: str) -> None:
    async def main() -> tuple[list[Any], list[Accumulated], list[transport.Batch], Any]:
        engine = FakeEngine()
        actor = FakeActor(engine)
        channel = transport.Channel(actor, interval_s=0.0)
        received = [Accumulated(index=0, sampling=SPEC, base=None) for _ in range(2)]
        tasks = [
            asyncio.ensure_future(consume(channel.stream(f"r{i}", _prompt(i), SPEC, index=0), received[i], via))
            for i in range(2)
        ]
        while min(r.num_tokens for r in received) < 5:  # noqa: ASYNC110
            await asyncio.sleep(0)
        actor.kill()
        out = await asyncio.gather(*tasks, return_exceptions=True)
        late = await asyncio.gather(
            consume(channel.stream("late", [9], SPEC, index=0), Accumulated(index=0, sampling=SPEC, base=None), via),
            return_exceptions=True,
        )
        return out, received, actor.answered, late[0]

    errors, received, answered, late = run(main)
    for i, (error, got) in enumerate(zip(errors, received, strict=True)):
        assert isinstance(error, EngineDiedError) and str(error).startswith(f"r{i}: the engine's Ray actor died")
        # every token the actor's answers carried for this request (its tokens are (i + 1) * 1000 + k), in order
        delivered = [t for batch in answered for d in batch.deltas.values() for t in d.token_ids if t // 1000 == i + 1]
        assert got.num_tokens >= 5 and got.token_ids.tolist() == delivered  # nothing received was dropped
        np.testing.assert_array_equal(got.token_ids, [(i + 1) * 1000 + k for k in range(got.num_tokens)])
    assert isinstance(late, EngineDiedError) and str(late).startswith("late: the engine's Ray actor died")


@pytest.mark.parametrize("via", VIAS)
def test_two_channels_on_one_actor_never_read_each_others_batches(via: str) -> None:
    async def main() -> list[SampleRecord]:
        engine = FakeEngine()
        actor = FakeActor(engine)
        one, two = transport.Channel(actor, interval_s=0.0), transport.Channel(actor, interval_s=0.0)
        tasks = [
            consume(c.stream(f"{n}{i}", _prompt(i), SPEC, index=0), Accumulated(index=0, sampling=SPEC, base=None), via)
            for n, c in (("a", one), ("b", two))
            for i in range(3)
        ]
        out = await asyncio.gather(*tasks)
        return out

    for k, record in enumerate(run(main)):
        assert record.token_ids.tolist() == [(k % 3 + 1) * 1000 + t for t in range(SPEC.max_tokens)]


def test_an_abort_that_overtakes_its_submission_keeps_the_request_from_starting() -> None:
    async def main() -> list[str]:
        box, started = transport.Outbox(), []

        async def generate(on_delta: Callable[[Delta], None]) -> SampleRecord:
            started.append("yes")
            raise AssertionError("aborted before it started")

        box.abort([7])
        box.start(7, generate)
        await asyncio.sleep(0)
        return started

    assert run(main) == []


def test_an_answer_waits_for_the_interval_unless_a_request_ended() -> None:
    async def main() -> tuple[bool, transport.Batch]:
        box = transport.Outbox()
        gate = asyncio.Event()

        async def generate(on_delta: Callable[[Delta], None]) -> SampleRecord:
            on_delta(Delta(token_ids=[1], logprobs=[-0.5], versions=[0]))
            await gate.wait()
            return SampleRecord(
                index=0, state=SampleState.FINISHED, sampling=SPEC, token_ids=[1], logprobs=[-0.5], versions=[0]
            )

        box.start(1, generate)
        first = await box.take(0.0)
        box.start(2, generate)
        waiting = asyncio.ensure_future(box.take(3600.0))  # a delta is pending, the interval is not over
        await asyncio.sleep(0.05)
        early = waiting.done()
        gate.set()  # both requests end: the answer goes at once
        return early or not first.deltas, await asyncio.wait_for(waiting, 5)

    answered_early, batch = run(main)
    assert not answered_early
    assert set(batch.ends) == {1, 2} and batch.deltas[2].token_ids == [1]
