"""A request in flight on one engine: what it has produced so far, and under which policy versions.

The engine adapter appends each streamed delta here. The same buffers answer three questions: the
finished record at the end of a generation, the in-flight record at a cut, and the progress
counters. Policy versions are tracked here rather than read from vLLM: every weight update pauses
the engine and waits until all outputs produced before it have arrived, so the number of tokens a
request holds at that moment is exactly where the new version starts.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from partial_rollout.engine import exactness
from partial_rollout.engine.stops import StopScan
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec


@dataclass
class LiveRequest:
    """One request this engine was asked to generate and has not yet returned."""

    index: int
    """Position of the sample in its group; every record built from this request carries it."""
    sampling: SamplingSpec
    base: SampleRecord | None
    """The saved prefix this request continues, if it is a resume."""
    version_starts: list[tuple[int, int]]
    """``(policy version, first token index)`` of each stretch of this engine's tokens, oldest first."""
    token_ids: array[int] = field(default_factory=lambda: array("i"))
    """Typed buffers (int32, float32), not lists: a cut copies them into numpy without a per-token
    conversion, which keeps the engine's pause short when hundreds of long samples are in flight."""
    logprobs: array[float] = field(default_factory=lambda: array("f"))
    finished: SampleRecord | None = None
    scan: StopScan | None = None
    """For a resumed request with stop strings: the stop scan of the whole completion, already past
    the prefix. vLLM matches stop strings within this request's output only, so one that began in
    the prefix is found here."""

    def mark_version(self, version: int) -> None:
        """Tokens from now on are sampled by ``version`` (called while the engine is paused and drained)."""
        self.version_starts.append((version, len(self.token_ids)))

    def stitched_end(self, new: int) -> SampleRecord | None:
        """The finished record if one of the ``new`` tokens just appended ends the stitched completion."""
        if self.scan is None:
            return None
        first = len(self.token_ids) - new
        for i in range(first, len(self.token_ids)):
            end = self.scan.push(self.token_ids[i])
            if end is not None:
                return self.record(SampleState.FINISHED, i + 1, finish_reason=end[0], stop_reason=end[1])
        return None

    def versions(self, n: int) -> np.ndarray:
        """Policy version of each of the first ``n`` tokens this engine generated."""
        out = np.empty(n, dtype=np.int32)
        if len(self.version_starts) == 1:
            out.fill(self.version_starts[0][0])
            return out
        ends = [start for _, start in self.version_starts[1:]] + [n]
        for (version, start), end in zip(self.version_starts, ends, strict=True):
            out[min(start, n) : min(end, n)] = version
        return out

    def stitched(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, str | None]:
        """Token ids, logprobs and versions of the saved prefix (if any) followed by the first ``n``
        tokens this engine generated (copies: the buffers go on growing), and why the prefix cannot
        continue exactly, if so."""
        tokens = np.frombuffer(self.token_ids, dtype=np.int32, count=n).copy()
        logprobs = np.frombuffer(self.logprobs, dtype=np.float32, count=n).copy()
        versions = self.versions(n)
        inexact = None
        if self.base is not None:
            prefix = self.base.versions
            inexact = self.base.inexact
            now = self.version_starts[0][0]
            if inexact is None and len(prefix) and (prefix.min() != prefix.max() or int(prefix[-1]) != now):
                inexact = exactness.version_mix(int(prefix.min()), int(prefix.max()), now)
            tokens = np.concatenate([self.base.token_ids, tokens])
            logprobs = np.concatenate([self.base.logprobs, logprobs])
            versions = np.concatenate([prefix, versions])
        return tokens, logprobs, versions, inexact

    def record(
        self,
        state: SampleState,
        n: int,
        *,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        sampler_state: bytes | None = None,
    ) -> SampleRecord:
        """The saved prefix (if any) stitched with the first ``n`` tokens this engine generated."""
        tokens, logprobs, versions, inexact = self.stitched(n)
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
            sampler_state=sampler_state,
        )
