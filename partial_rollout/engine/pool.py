"""One interface over N engines: in-process, or each inside a Ray actor. Trainers use this.

NeMo RL and verl run vLLM engines as Ray actors; a laptop runs one engine in-process. Both are the
same code path here: every engine is a :class:`~partial_rollout.engine.adapter.ResumableEngine`
(inside the actor, the actor only forwards calls to it), and the pool spreads requests over the
engines by least outstanding work. A cut is a cut of every engine; its samples are engine-agnostic
(prefix, logprobs, versions, sampler state), so a resume may use any number of engines: N at the
save, M at the resume.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from partial_rollout.engine.adapter import Cut, ResumableEngine
from partial_rollout.engine.factory import EngineConfig
from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec


class _EngineHost:
    """The body of a Ray actor holding one engine; every call is forwarded unchanged."""

    async def start(self, config: EngineConfig, policy_version: int, require_exact: bool) -> dict[str, Any]:
        self.engine = await ResumableEngine.start(config, policy_version=policy_version, require_exact=require_exact)
        return dataclasses.asdict(self.engine.support)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.engine, method)(*args, **kwargs)
        return await result if asyncio.iscoroutine(result) else result


class RemoteEngine:
    """A Ray actor's engine, with the same async methods as :class:`ResumableEngine`."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    def __getattr__(self, method: str) -> Any:
        async def forward(*args: Any, **kwargs: Any) -> Any:
            return await self._actor.call.remote(method, *args, **kwargs)

        return forward


class EnginePool:
    """Requests spread over engines; cuts, resumes and weight updates applied to all of them."""

    def __init__(self, engines: Sequence[Any]) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.engines = list(engines)
        self._outstanding = [0] * len(self.engines)

    @classmethod
    async def local(cls, config: EngineConfig, *, policy_version: int = 0, require_exact: bool = False) -> EnginePool:
        """One engine in this process (its engine core in a child process, as vLLM does)."""
        return cls([await ResumableEngine.start(config, policy_version=policy_version, require_exact=require_exact)])

    @classmethod
    async def ray(
        cls,
        config: EngineConfig,
        num_engines: int,
        *,
        policy_version: int = 0,
        require_exact: bool = False,
        actor_options: dict[str, Any] | None = None,
    ) -> EnginePool:
        """``num_engines`` engines, each in its own Ray actor (``ray.init`` must have run)."""
        import ray

        host = ray.remote(_EngineHost)
        options = {"num_cpus": 0, **(actor_options or {})}
        actors = [host.options(**options).remote() for _ in range(num_engines)]
        await asyncio.gather(*[a.start.remote(config, policy_version, require_exact) for a in actors])
        return cls([RemoteEngine(a) for a in actors])

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        """Run one sample on the least busy engine (see :meth:`ResumableEngine.generate`)."""
        i = min(range(len(self.engines)), key=self._outstanding.__getitem__)
        self._outstanding[i] += 1
        try:
            return await self.engines[i].generate(request_id, list(prompt_token_ids), sampling, resume_from=resume_from)
        finally:
            self._outstanding[i] -= 1

    async def pause_and_capture(self) -> Cut:
        """Pause every engine and merge their cuts; call :meth:`resume` after."""
        cuts = await asyncio.gather(*[e.pause_and_capture() for e in self.engines], return_exceptions=True)
        errors = [c for c in cuts if isinstance(c, BaseException)]
        if errors:
            await self.resume()
            raise errors[0]
        samples: dict[str, SampleRecord] = {}
        for cut in cuts:
            samples.update(cut.samples)
        # The slowest engine's pause and the first engine's stop bound every engine's idle time.
        return Cut(samples=samples, pause_s=max(c.pause_s for c in cuts), stop_s=min(c.stop_s for c in cuts),
                   engine_tokens=sum(c.engine_tokens for c in cuts))

    async def resume(self) -> None:
        await asyncio.gather(*[e.resume() for e in self.engines])

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        await asyncio.gather(*[e.update_weights(weights_dir, policy_version) for e in self.engines])

    async def fingerprints(self) -> Fingerprints:
        prints = [await _maybe_await(e.fingerprints()) for e in self.engines]
        assert all(p == prints[0] for p in prints), "engines of one pool serve one model"
        return prints[0]

    async def shutdown(self) -> None:
        await asyncio.gather(*[e.shutdown() for e in self.engines])


async def _maybe_await(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value
