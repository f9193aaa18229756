"""Cutting the requests in flight on a paused engine into records a snapshot can hold.

The engine is frozen first (keep mode: nothing aborted, the KV cache kept). Tokens it produced
before the freeze may still be on their way to this process, so the cut waits for them
(:func:`drain`) before it reads anything: with a verified cut it knows from the workers exactly
how many tokens each request has; without, it relies on vLLM's public pause, which waits a fixed
time. Then every request becomes a :class:`~partial_rollout.snapshot.SampleRecord`: finished ones
as they are, the others as a prefix with its logprobs, versions and (for seeded sampling, where the
engine allows) the sampler state to continue it exactly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from partial_rollout.engine import exactness
from partial_rollout.engine.live import LiveRequest
from partial_rollout.engine.protocol import Capabilities
from partial_rollout.snapshot import SampleRecord, SampleState

DRAIN_TIMEOUT_S = 30.0
"""How long a cut waits for outputs already produced by the engine to reach this process."""

WorkerView = Mapping[str, tuple[int, bytes | None]]
"""What the workers hold, by our request id: (tokens sampled, generator state or None)."""


async def drain(live: Mapping[str, LiveRequest], worker: WorkerView) -> None:
    """Wait until every output the engine produced before the pause has reached ``live``."""
    deadline = time.perf_counter() + DRAIN_TIMEOUT_S
    while True:
        behind = [
            rid
            for rid, req in live.items()
            if req.finished is None
            and (
                len(req.token_ids) < worker.get(rid, (0, None))[0] or (rid not in worker and req.token_ids)
            )  # finished in the engine, final output in transit
        ]
        if not behind:
            return
        if time.perf_counter() > deadline:
            raise RuntimeError(f"engine outputs for {behind[:5]} did not arrive within {DRAIN_TIMEOUT_S} s")
        await asyncio.sleep(0.001)


def in_flight_record(
    req: LiveRequest,
    count: int,
    sampler_state: bytes | None,
    capabilities: Capabilities,
) -> SampleRecord:
    """The record of a request cut after ``count`` tokens of its own, with why it cannot continue exactly, if so.

    It runs once per live request while the engine stands still, and the record checks every token
    as it is built: about 10 us a sample of 2,000 tokens (``benchmarks/snapshot_io.py --cut-only``).
    """
    consumed = count + (0 if req.base is None else req.base.num_tokens)
    if consumed == 0:
        reason = exactness.inexact_reason(
            req.sampling, num_tokens=0, sampler_state=None, capture_unsupported=capabilities.reason
        )
        return SampleRecord(index=req.index, state=SampleState.NOT_STARTED, sampling=req.sampling, inexact=reason)
    if count == 0 and req.base is not None:
        sampler_state = req.base.sampler_state  # resumed but not yet scheduled: nothing drawn since
    if req.sampling.is_greedy or req.sampling.seed is None or not capabilities.exact:
        sampler_state = None
    reason = (
        req.prefix_inexact()
        or req.inexact(count, sampler_state=sampler_state, why_no_state=capabilities.reason)
        or _spanned_update(req)
    )
    return req.record(SampleState.IN_FLIGHT, count, inexact=reason, sampler_state=sampler_state)


def _spanned_update(req: LiveRequest) -> str | None:
    """The version mix of a request that ran across a weight update: its KV was computed under more than
    one policy (its prompt's under the first, which no token's version shows), and a resume re-prefills
    all of it under one."""
    if len(req.weights) < 2:
        return None
    lo, hi = min(req.weights), max(req.weights)
    if lo == hi:
        return None
    prefix = req.base.versions if req.base is not None else None
    if prefix is not None and len(prefix):  # this engine's own tokens carry versions among ``weights``
        lo, hi = min(lo, int(prefix.min())), max(hi, int(prefix.max()))
    return exactness.version_mix(lo, hi, req.weights[-1])
