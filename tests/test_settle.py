"""The wait after a weight update's pause: it returns only once every queued output has reached its stream.

A stand-in for vLLM's front end (no engine): output batches wait in an ``asyncio.Queue``, a handler
task takes one batch at a time and pushes it in chunks with one event-loop turn between them, as
``AsyncLLM``'s output handler does, and each stream's consumer takes what was pushed in a turn of its
own. The settle must not return while anything is in any of those places, however many chunks the
last batch has; a settle that only waited for the queue to empty returns too early here.
"""

from __future__ import annotations

import asyncio

import pytest

from partial_rollout.engine import settle


async def _front_end(
    batches: list[int], chunk: int
) -> tuple[asyncio.Queue[int], list[int], list[asyncio.Future[None]]]:
    """A queue holding ``batches`` (outputs per batch), a handler chunking them, and a received counter."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for outputs in batches:
        queue.put_nowait(outputs)
    received = [0]
    pushed: asyncio.Queue[int] = asyncio.Queue()

    async def handler() -> None:
        while True:
            outputs = await queue.get()
            for start in range(0, outputs, chunk):
                pushed.put_nowait(min(chunk, outputs - start))
                if start + chunk < outputs:
                    await asyncio.sleep(0)

    async def consumer() -> None:
        while True:
            received[0] += await pushed.get()

    return queue, received, [asyncio.ensure_future(consumer()), asyncio.ensure_future(handler())]


@pytest.mark.parametrize("batches", [[5], [300], [300, 1, 257], [64] * 10])
def test_settle_waits_for_every_queued_output_to_reach_its_stream(
    batches: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settle, "_chunk_size", lambda: 128)

    async def run() -> tuple[int, int]:
        queue, received, _ = await _front_end(batches, 128)
        await settle.settle(queue, lambda: received[0], outputs=max(batches))
        return received[0], sum(batches)

    got, want = asyncio.run(run())
    assert got == want


def test_waiting_for_the_queue_alone_returns_with_outputs_still_in_transit() -> None:
    """The negative control: the queue empties before the handler has pushed the last batch's chunks."""

    async def run() -> tuple[int, int]:
        queue, received, _ = await _front_end([300, 300], 128)
        while queue.qsize():  # noqa: ASYNC110 - the queue-only wait this test shows is not enough
            await asyncio.sleep(0)
        return received[0], 600

    got, want = asyncio.run(run())
    assert got < want
