"""A request in flight on one engine: what it has produced so far, and under which policy versions.

The engine adapter appends each streamed delta here (an :class:`~partial_rollout.engine.accumulated.Accumulated`
of the request's saved prefix and its own tokens). The same buffers answer three questions: the
finished record at the end of a generation, the in-flight record at a cut, and the progress
counters. Policy versions are tracked here rather than read from vLLM: every weight update pauses
the engine and waits until all outputs produced before it have arrived, so every token appended
after an update is the new version's.
"""

from __future__ import annotations

from partial_rollout.engine import exactness
from partial_rollout.engine.accumulated import Accumulated
from partial_rollout.engine.stops import StopScan
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec


class LiveRequest(Accumulated):
    """One request this engine was asked to generate and has not yet returned."""

    def __init__(
        self,
        *,
        index: int,
        sampling: SamplingSpec,
        base: SampleRecord | None,
        policy_version: int,
        scan: StopScan | None = None,
    ) -> None:
        super().__init__(index=index, sampling=sampling, base=base)
        self.weights = [policy_version]
        """Policy versions this engine ran the request under, oldest first: the one it was submitted
        under, then one per weight update since (an update may come before any token of its own)."""
        self.finished: SampleRecord | None = None
        self.scan = scan
        """For a resumed request with stop strings: the stop scan of the whole completion, already past
        the prefix. vLLM matches stop strings within this request's output only, so one that began in
        the prefix is found here."""

    @property
    def policy_version(self) -> int:
        """The version that samples this request's next tokens."""
        return self.weights[-1]

    def mark_version(self, version: int) -> None:
        """Tokens from now on are sampled by ``version`` (called while the engine is paused and drained)."""
        self.weights.append(version)

    def prefix_inexact(self) -> str | None:
        """Why the saved prefix cannot continue exactly: its own reason, or the policy versions it mixes
        when this engine re-prefilled it under another."""
        if self.base is None:
            return None
        prefix, now = self.base.versions, self.weights[0]
        if self.base.inexact is None and len(prefix) and (prefix.min() != prefix.max() or int(prefix[-1]) != now):
            return exactness.version_mix(int(prefix.min()), int(prefix.max()), now)
        return self.base.inexact

    def finish(self, n: int, *, finish_reason: str, stop_reason: int | str | None) -> SampleRecord:
        """The finished record: the saved prefix stitched with the first ``n`` tokens this engine generated."""
        return self.record(
            SampleState.FINISHED, n, inexact=self.prefix_inexact(), finish_reason=finish_reason, stop_reason=stop_reason
        )

    def stitched_end(self, new: int) -> SampleRecord | None:
        """The finished record if one of the ``new`` tokens just appended ends the stitched completion."""
        if self.scan is None:
            return None
        first = len(self.token_ids) - new
        for i in range(first, len(self.token_ids)):
            end = self.scan.push(self.token_ids[i])
            if end is not None:
                return self.finish(i + 1, finish_reason=end[0], stop_reason=end[1])
        return None
