"""N engines behind one :class:`RolloutEngine`: in this process, or each inside a Ray actor.

NeMo RL and verl run vLLM engines as Ray actors; a laptop runs one engine in-process. Both are the
same code path here: every engine is a :class:`~partial_rollout.engine.resumable.ResumableEngine`
(inside an actor, :class:`RemoteEngine` forwards each declared method to it), and the pool spreads
requests over the engines by least outstanding work. A cut is a cut of every engine; its samples
are engine-agnostic (prefix, logprobs, versions, sampler state), so a resume may use any number of
engines: N at the save, M at the resume.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from partial_rollout.engine.factory import EngineConfig
from partial_rollout.engine.protocol import Capabilities, Cut, Progress, RolloutEngine
from partial_rollout.engine.resumable import ResumableEngine
from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec


class _EngineHost:
    """The body of a Ray actor holding one engine."""

    engine: ResumableEngine

    async def start(self, config: EngineConfig, options: dict[str, Any]) -> None:
        self.engine = await ResumableEngine.start(config, **options)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.engine, method)(*args, **kwargs)


class RemoteEngine:
    """An engine inside a Ray actor (this node or another), as a :class:`RolloutEngine`."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self._actor.call.remote(method, *args, **kwargs)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        record: SampleRecord = await self._call(
            "generate", request_id, list(prompt_token_ids), sampling, index=index, resume_from=resume_from
        )
        return record

    async def pause_and_capture(self) -> Cut:
        result: Cut = await self._call("pause_and_capture")
        return result

    async def resume(self) -> None:
        await self._call("resume")

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        await self._call("update_weights", weights_dir, policy_version)

    async def fingerprints(self) -> Fingerprints:
        result: Fingerprints = await self._call("fingerprints")
        return result

    async def capabilities(self) -> Capabilities:
        result: Capabilities = await self._call("capabilities")
        return result

    async def progress(self) -> Progress:
        result: Progress = await self._call("progress")
        return result

    async def reset_prefix_cache(self) -> None:
        await self._call("reset_prefix_cache")

    async def shutdown(self) -> None:
        await self._call("shutdown")


class EnginePool:
    """Requests spread over engines; cuts, resumes and weight updates applied to all of them."""

    def __init__(self, engines: Sequence[RolloutEngine]) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.engines: list[RolloutEngine] = list(engines)
        self._outstanding = [0] * len(self.engines)

    @classmethod
    async def local(cls, config: EngineConfig, **options: Any) -> EnginePool:
        """One engine in this process; ``options`` as :meth:`ResumableEngine.start` takes them."""
        return cls([await ResumableEngine.start(config, **options)])

    @classmethod
    async def ray(
        cls,
        config: EngineConfig,
        num_engines: int,
        *,
        actor_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> EnginePool:
        """``num_engines`` engines, each in its own Ray actor (``ray.init`` must have run)."""
        import ray

        host = ray.remote(_EngineHost)
        actors = [host.options(**{"num_cpus": 0, **(actor_options or {})}).remote() for _ in range(num_engines)]
        await asyncio.gather(*[a.start.remote(config, options) for a in actors])
        return cls([RemoteEngine(a) for a in actors])

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        """Run one sample on the least busy engine."""
        i = min(range(len(self.engines)), key=self._outstanding.__getitem__)
        self._outstanding[i] += 1
        try:
            return await self.engines[i].generate(
                request_id, prompt_token_ids, sampling, index=index, resume_from=resume_from
            )
        finally:
            self._outstanding[i] -= 1

    async def pause_and_capture(self) -> Cut:
        """Pause every engine concurrently and merge their cuts; call :meth:`resume` after."""
        cuts = await asyncio.gather(*[e.pause_and_capture() for e in self.engines], return_exceptions=True)
        errors = [c for c in cuts if isinstance(c, BaseException)]
        if errors:
            await self.resume()
            raise errors[0]
        done = [c for c in cuts if isinstance(c, Cut)]
        samples: dict[str, SampleRecord] = {}
        for c in done:
            samples.update(c.samples)
        # The slowest engine's pause and the first engine's stop bound every engine's idle time.
        return Cut(
            samples=samples,
            pause_s=max(c.pause_s for c in done),
            stop_s=min(c.stop_s for c in done),
            engine_tokens=sum(c.engine_tokens for c in done),
        )

    async def resume(self) -> None:
        await asyncio.gather(*[e.resume() for e in self.engines])

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        await asyncio.gather(*[e.update_weights(weights_dir, policy_version) for e in self.engines])

    async def fingerprints(self) -> Fingerprints:
        prints = await asyncio.gather(*[e.fingerprints() for e in self.engines])
        if any(p != prints[0] for p in prints):
            raise ValueError(f"the engines of one pool serve different models: {sorted({str(p) for p in prints})}")
        return prints[0]

    async def capabilities(self) -> Capabilities:
        """The weakest engine's: a cut is only as exact as its least capable engine."""
        caps = await asyncio.gather(*[e.capabilities() for e in self.engines])
        return min(caps, key=lambda c: (c.exact, c.verified_cut))

    async def progress(self) -> Progress:
        parts = await asyncio.gather(*[e.progress() for e in self.engines])
        live: dict[str, int] = {}
        for p in parts:
            live.update(p.live_tokens)
        steps = [p.steps for p in parts]
        gen = [p.generation_tokens for p in parts]
        return Progress(
            tokens_received=sum(p.tokens_received for p in parts),
            live_tokens=live,
            steps=None if None in steps else sum(s for s in steps if s is not None),
            generation_tokens=None if None in gen else sum(g for g in gen if g is not None),
        )

    async def reset_prefix_cache(self) -> None:
        await asyncio.gather(*[e.reset_prefix_cache() for e in self.engines])

    async def shutdown(self) -> None:
        await asyncio.gather(*[e.shutdown() for e in self.engines])
