"""One sample as its holder has it so far: the saved prefix it continues, if any, and the tokens received after it.

An engine builds a request's finished record and its cut record from this; a pool builds from it the
record of a request whose engine died, from the tokens that engine had streamed to it. All of them
stitch the same way (the prefix first, then the first ``n`` tokens received, copied out of buffers
that go on growing) into a :class:`~partial_rollout.snapshot.SampleRecord`; what differs between
them is the record's state and why it cannot continue exactly, which each holder decides and
:meth:`Accumulated.inexact` helps it say.
"""

from __future__ import annotations

from array import array

import numpy as np

from partial_rollout.engine import exactness
from partial_rollout.engine.protocol import Delta
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec


class Accumulated:
    """A saved prefix (or none) and every token received since, with its behaviour logprob and policy version."""

    def __init__(self, *, index: int, sampling: SamplingSpec, base: SampleRecord | None) -> None:
        self.index = index
        """Position of the sample in its group; every record built from this carries it."""
        self.sampling = sampling
        self.base = base
        """The saved prefix these tokens continue, if the request is a resume."""
        self.token_ids = array("i")
        """Typed buffers (int32, float32, int32: 12 bytes a token), not lists: a record copies them into
        numpy without a per-token conversion, which keeps an engine's pause short when hundreds of long
        samples are in flight."""
        self.logprobs = array("f")
        self.versions = array("i")

    def add(self, delta: Delta) -> None:
        """Append the tokens of one delta."""
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        self.versions.extend(delta.versions)

    @property
    def num_tokens(self) -> int:
        """Tokens received (the saved prefix not counted)."""
        return len(self.token_ids)

    def inexact(self, n: int | None = None, *, seeded: str | None) -> str | None:
        """Why continuing from the prefix and the first ``n`` tokens received (default: all) cannot be exact.

        The prefix's own reason first, then :func:`~partial_rollout.engine.exactness.inexact_reason`
        of the whole; ``seeded`` is why the engine that continues it cannot continue a seeded sample
        exactly (``None``: it can).
        """
        if self.base is not None and self.base.inexact:
            return self.base.inexact
        prefix = 0 if self.base is None else self.base.num_tokens
        return exactness.inexact_reason(
            self.sampling, num_tokens=prefix + (self.num_tokens if n is None else n), seeded=seeded
        )

    def record(
        self,
        state: SampleState,
        n: int | None = None,
        *,
        inexact: str | None,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
    ) -> SampleRecord:
        """The saved prefix (if any) stitched with the first ``n`` tokens received (default: all), as ``state``.

        The arrays are copies: the buffers go on growing.
        """
        n = self.num_tokens if n is None else n
        tokens = np.frombuffer(self.token_ids, dtype=np.int32, count=n).copy()
        logprobs = np.frombuffer(self.logprobs, dtype=np.float32, count=n).copy()
        versions = np.frombuffer(self.versions, dtype=np.int32, count=n).copy()
        if self.base is not None:
            tokens = np.concatenate([self.base.token_ids, tokens])
            logprobs = np.concatenate([self.base.logprobs, logprobs])
            versions = np.concatenate([self.base.versions, versions])
        return SampleRecord(
            index=self.index,
            state=state,
            sampling=self.sampling,
            token_ids=tokens,
            logprobs=logprobs,
            versions=versions,
            inexact=inexact,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
        )
