"""After a pause, wait until every token the engine sampled before it has reached this process.

A weight update labels each token with the policy that sampled it: tokens received before the new
weights load are the old version's, every later one the new version's. That is true only once the
tokens sampled before the pause have all been received. vLLM's keep-mode pause completes when the
engine core is idle, and the engine core sends that completion on the same socket as its outputs,
after them, so when the pause returns every earlier output batch is in the engine-core client's
output queue or past it. Past it, ``AsyncLLM``'s output handler takes one batch at a time, pushes
it to the requests' streams in chunks of ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` outputs with one
event-loop turn between chunks, and each stream's consumer takes what was pushed in one more turn.
So once the queue is empty and the received counts have stood still for more turns than the last
batch has chunks, plus two, nothing sampled before the pause is still on its way: asyncio runs
ready callbacks first in, first out.

Nothing here runs at a cut, which never pauses.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Hashable
from typing import Any

SETTLE_TIMEOUT_S = 30.0
"""How long a settle waits for outputs already sampled to reach this process."""


def _chunk_size() -> int:
    import vllm.envs as envs

    return max(1, int(getattr(envs, "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE", 128)))


async def settle(queue: Any, received: Callable[[], Hashable], *, outputs: int) -> None:
    """Return once every output batch of ``queue`` has been delivered to the streams and taken from them.

    Args:
        queue: the engine-core client's output queue (``asyncio.Queue``), read by ``qsize`` only.
        received: what this process has received so far (any value that changes with each token).
        outputs: at most how many requests one batch can hold (the requests in flight).

    Raises:
        RuntimeError: the outputs did not arrive within :data:`SETTLE_TIMEOUT_S`.
    """
    deadline = time.perf_counter() + SETTLE_TIMEOUT_S
    turns = math.ceil(max(outputs, 1) / _chunk_size()) + 2
    still, last = 0, received()
    while still < turns or queue.qsize():
        if time.perf_counter() > deadline:
            raise RuntimeError(
                f"outputs sampled before the pause did not arrive within {SETTLE_TIMEOUT_S} s "
                f"({queue.qsize()} batches still queued)"
            )
        await asyncio.sleep(0)
        now = received()
        still = still + 1 if now == last and not queue.qsize() else 0
        last = now
