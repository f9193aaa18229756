"""Cutting the requests in flight into records a snapshot can hold, from what this process has received.

A cut reads nothing from the engine and pauses nothing: each request's record is its saved prefix
(if it is a resume) stitched with the tokens, behaviour logprobs and policy versions that vLLM's
output stream has delivered to this process so far. Tokens the engine has sampled and not yet
delivered are not in the cut; a resume from it samples them again, which on a sampler family that
continues seeded samples (:mod:`~partial_rollout.engine.samplers`) gives the same tokens. A run
that does not resume keeps them: its request goes on and its finished record holds them. So no
token is ever both in a saved prefix and in what continues it, or in neither.
"""

from __future__ import annotations

from partial_rollout.engine import exactness
from partial_rollout.engine.live import LiveRequest
from partial_rollout.snapshot import SampleRecord, SampleState


def in_flight_record(req: LiveRequest, *, seeded: str | None) -> SampleRecord:
    """The record of ``req`` as received so far, with why it cannot continue exactly, if so.

    ``seeded`` is why the engine cannot continue a seeded sample exactly (``None``: it can). It runs
    once per live request in the caller's cut, and the record checks every token as it is built:
    about 10 us a sample of 2,000 tokens (``benchmarks/snapshot_io.py --cut-only``).
    """
    if req.finished is not None:
        return req.finished
    count = len(req.token_ids)
    if count == 0 and req.base is None:
        reason = exactness.inexact_reason(req.sampling, num_tokens=0, seeded=seeded)
        return SampleRecord(index=req.index, state=SampleState.NOT_STARTED, sampling=req.sampling, inexact=reason)
    reason = req.prefix_inexact() or req.inexact(count, seeded=seeded) or _spanned_update(req)
    return req.record(SampleState.IN_FLIGHT, count, inexact=reason)


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
