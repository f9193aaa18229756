"""N engines behind one :class:`RolloutEngine`: in this process, or each inside a Ray actor.

NeMo RL and verl run vLLM engines as Ray actors; a laptop runs one engine in-process. Both are the
same code path here: every engine is a :class:`~partial_rollout.engine.ResumableEngine`
(inside an actor, :class:`RemoteEngine` forwards each declared method to it), and the pool spreads
requests over the engines by least outstanding work. A Ray-actor engine streams each request's
tokens to the pool as it generates them (all of an actor's requests through one channel,
:mod:`~partial_rollout.pool.transport`), so the pool itself holds every request's prefix: a cut
reads it here without a call to any actor (and takes an in-process engine's own cut), and when an
actor dies the pool continues its requests on the engines left from the tokens received
(:mod:`~partial_rollout.pool.failover`). A cut's samples are engine-agnostic (prefix, logprobs,
versions), so a resume may use any number of engines: N at the save, M at the resume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from partial_rollout.engine import (
    Capabilities,
    Cut,
    Delta,
    EngineConfig,
    Progress,
    ResumableEngine,
    RolloutEngine,
)
from partial_rollout.engine.accumulated import Accumulated
from partial_rollout.pool import cluster, failover, transport
from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec

T = TypeVar("T")
logger = logging.getLogger(__name__)


class _EngineHost(transport.Host):
    """The body of a Ray actor holding one engine: its methods by name (:meth:`call`), its requests through
    the pool's channel (:class:`transport.Host`), or one Ray stream per request (:meth:`stream`)."""

    engine: ResumableEngine

    async def start(self, config: EngineConfig, options: dict[str, Any]) -> None:
        cluster.pin()  # before vLLM starts: its engine core's processes inherit the core group
        self.engine = await ResumableEngine.start(config, **options)

    def hosted_engine(self) -> ResumableEngine:
        return self.engine

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.engine, method)(*args, **kwargs)

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Delta | SampleRecord]:
        """``generate`` streamed to the caller (a Ray streaming generator): see :meth:`ResumableEngine.stream`."""
        async for item in self.engine.stream(*args, **kwargs):
            yield item


def _start_failure(exc: Exception) -> str:
    """One line: an actor that died while starting, or what its start raised (a bad config on every engine)."""
    from ray.exceptions import RayActorError

    return transport.why_died(exc) if isinstance(exc, RayActorError) else transport.one_line(exc)


class RemoteEngine:
    """An engine inside a Ray actor (this node or another), as a :class:`RolloutEngine`."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor
        self._channel = transport.Channel(actor) if transport.Channel.supported(actor) else None
        """All requests of this engine through one channel, where the actor's class is a :class:`transport.Host`."""

    @property
    def actor(self) -> Any:
        """The Ray actor handle (to place work next to it, or to kill it in a failover test)."""
        return self._actor

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from ray.exceptions import RayActorError

        try:
            return await self._actor.call.remote(method, *args, **kwargs)
        except RayActorError as exc:
            raise failover.EngineDiedError(f"{method}: {transport.why_died(exc)}") from exc

    def stream(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> AsyncIterator[Delta | SampleRecord]:
        """:meth:`generate` with the request's new tokens delivered as they come (the pool holds the prefix).

        Deltas that piled up since the caller's last read come as one; the finished record comes last.
        Raises what the request raised in the actor, or ``EngineDiedError`` (after every delta
        received before the death) when the actor died.
        """
        if self._channel is not None:
            return self._channel.stream(request_id, prompt_token_ids, sampling, index=index, resume_from=resume_from)
        return self._ray_stream(request_id, prompt_token_ids, sampling, index=index, resume_from=resume_from)

    async def _ray_stream(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> AsyncIterator[Delta | SampleRecord]:
        """A Ray stream of its own for one request: for an actor that is no :class:`transport.Host`."""
        from ray.exceptions import RayActorError

        refs = self._actor.stream.remote(
            request_id, list(prompt_token_ids), sampling, index=index, resume_from=resume_from
        )
        try:
            async for ref in refs:
                yield await ref
        except RayActorError as exc:
            raise failover.EngineDiedError(f"{request_id}: {transport.why_died(exc)}") from exc

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

    async def cut(self) -> Cut:
        """The actor's engine's cut (one Ray call; a pool never makes it: it holds what was streamed)."""
        result: Cut = await self._call("cut")
        return result

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
        """Tokens still to generate (budget, not yet produced) of the requests placed on each engine."""
        self._placed: dict[str, int] = {}
        """Which engine each running request was placed on (the cut records it as a hint)."""
        self._requests: dict[str, Accumulated] = {}
        """Every request submitted and not returned, with what its Ray engine streamed of it so far."""
        self._capabilities: Capabilities | None = None
        self._asking: asyncio.Future[Capabilities] | None = None
        self.failover = failover.Tracker()
        """Requests on Ray-actor engines and what was received of them; set its ``on_failover`` to log failovers."""

    @property
    def live_engines(self) -> int:
        """Engines not known to have died (the run's ``end`` event records it)."""
        return len(self._alive())

    @property
    def placements(self) -> dict[str, int]:
        """Which engine each running request is on: set when the request is placed, before its first await."""
        return dict(self._placed)

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
        pin_cpus: bool = True,
        min_engines: int = 1,
        **options: Any,
    ) -> EnginePool:
        """``num_engines`` engines, each in its own Ray actor (``ray.init`` or :func:`connect_ray` must have run).

        On a cluster with GPUs each engine asks for ``tensor_parallel_size`` GPUs; on CPU each is
        pinned to its own group of this machine's cores unless ``pin_cpus`` is off
        (:func:`cluster.placements`). ``actor_options`` override those Ray options.

        An engine that dies while starting (its actor killed, its node lost) leaves the pool
        smaller: the pool goes on with the engines that started, warns, and reports the dead one's
        failover (nothing carried) to :attr:`failover`'s listener once there is one.

        Raises:
            EngineStartError: fewer than ``min_engines`` started (the engines that did are shut
                down); the one-line message names each engine that did not and why.
            ValueError: ``min_engines`` is not between 1 and ``num_engines``.
        """
        import ray

        if not 1 <= min_engines <= num_engines:
            raise ValueError(f"min_engines must be between 1 and num_engines {num_engines}, got {min_engines}")
        host = ray.remote(_EngineHost)
        placed = cluster.placements(
            num_engines, tensor_parallel_size=config.tensor_parallel_size, pin_cpus=pin_cpus, overrides=actor_options
        )
        actors = [host.options(**o).remote() for o in placed]
        pool = cls([RemoteEngine(a) for a in actors])
        started = await asyncio.gather(*[a.start.remote(config, options) for a in actors], return_exceptions=True)
        failed = {i: _start_failure(r) for i, r in enumerate(started) if isinstance(r, Exception)}
        if num_engines - len(failed) < min_engines:
            await asyncio.gather(
                *[pool.engines[i].shutdown() for i in range(num_engines) if i not in failed], return_exceptions=True
            )
            named = "; ".join(f"engine {i} failed to start: {why}" for i, why in failed.items())
            raise failover.EngineStartError(
                f"{named} ({num_engines - len(failed)} of {num_engines} started, the run needs at least {min_engines})"
            )
        for i, why in failed.items():
            pool.failover.died(i, failover.EngineDiedError(f"start: {why}"))
            logger.warning(
                "engine %d of %d failed to start (%s); the pool goes on with %d engines",
                i,
                num_engines,
                why,
                num_engines - len(failed),
            )
        return pool

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        """Run one sample on the engine with the fewest tokens still to generate; if it dies, continue on another.

        Work is counted in tokens, not requests: a resumed sample weighs what is left of its budget
        (``max_tokens`` minus its prefix), so restored requests spread evenly over however many
        engines the resume has, whatever their prefixes; so does a request moved off a dead engine
        (minus the tokens received from it).

        Raises:
            failover.NoEngineLeftError: every engine has died (the request's prefix is in the error,
                and in :meth:`cut`, as are those of requests cancelled since).
        """
        received = Accumulated(index=index, sampling=sampling, base=resume_from)
        self._requests[request_id] = received  # before any await: a cut from now on holds it
        try:
            return await self._generate(request_id, prompt_token_ids, sampling, received)
        finally:
            if self._alive():  # with no engine left, what was received stays for the cut a trainer saves
                del self._requests[request_id]

    async def _generate(
        self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingSpec, received: Accumulated
    ) -> SampleRecord:
        index, resume_from = received.index, received.base
        while True:
            # what is left of the budget: a request moved after a failover brings the tokens received
            work = sampling.max_tokens - (0 if resume_from is None else resume_from.num_tokens) - received.num_tokens
            alive = self._alive()
            if not alive:
                self.failover.strand()
                raise failover.NoEngineLeftError(
                    f"{request_id}: all {len(self.engines)} engines of the pool have died"
                    f" ({'; '.join(self.failover.dead.values())}); save a checkpoint and restart with working engines",
                    failover.held(received, seeded=self._seeded_known()),
                )
            i = min(alive, key=self._outstanding.__getitem__)
            engine = self.engines[i]
            self._outstanding[i] += work  # placed before the first await (``placements``)
            self._placed[request_id] = i
            try:
                if not isinstance(engine, RemoteEngine):
                    return await engine.generate(
                        request_id, prompt_token_ids, sampling, index=index, resume_from=resume_from
                    )
                self.failover.hold(i, request_id, received)
                seeded = await self._seeded()
                items = engine.stream(
                    request_id,
                    prompt_token_ids,
                    sampling,
                    index=index,
                    resume_from=failover.resume_from(received, seeded=seeded),
                )
                record = await failover.follow(items, received)
                self.failover.release(request_id)
                return record
            except failover.EngineDiedError as exc:
                self.failover.lost(i, request_id, exc)
            except BaseException as exc:
                if self._alive():
                    self.failover.release(request_id)
                else:  # no engine left (a trainer stops): what was received stays for the cut it saves
                    self.failover.lost(i, request_id, exc)
                raise
            finally:
                self._outstanding[i] -= work
                self._placed.pop(request_id, None)

    def _alive(self) -> list[int]:
        return [i for i in range(len(self.engines)) if i not in self.failover.dead]

    async def _each(self, call: Callable[[RolloutEngine], Awaitable[T]]) -> list[T]:
        """``call`` on every live engine, concurrently; an engine found dead is left out from then on."""
        alive = self._alive()
        results = await asyncio.gather(*[call(self.engines[i]) for i in alive], return_exceptions=True)
        for i, r in zip(alive, results, strict=True):
            if isinstance(r, failover.EngineDiedError):
                self.failover.died(i, r)
        errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, failover.EngineDiedError)]
        if errors:
            raise errors[0]
        return [r for r in results if not isinstance(r, BaseException)]

    async def _seeded(self) -> str | None:
        """Why the pool cannot continue a seeded sample exactly (``None``: it can), asked of the engines once
        (one question however many requests start together)."""
        if self._capabilities is None:
            if self._asking is None:
                self._asking = asyncio.ensure_future(self.capabilities())
                self._asking.add_done_callback(self._asked)
            await asyncio.shield(self._asking)  # its error, if it failed; a cancelled caller leaves it to the others
        return self._seeded_known()

    def _asked(self, asking: asyncio.Future[Capabilities]) -> None:
        self._asking = None  # a failed question is asked again by the next request
        if not asking.cancelled() and asking.exception() is None:
            self._capabilities = asking.result()

    def _seeded_known(self) -> str | None:
        """:meth:`_seeded` from what the engines said so far, without asking (a cut, no engine left)."""
        caps = self._capabilities
        if caps is None:
            return "the pool's engines were not asked whether they continue seeded samples exactly"
        return None if caps.exact else (caps.reason or "not exact on this pool")

    async def cut(self) -> Cut:
        """Every request in flight on every engine, as this process holds it; no engine pauses, no actor is asked.

        A Ray engine's requests are cut from what it streamed to the pool; an engine in this
        process answers its own cut (neither awaits anything). A request whose engine died, or
        that is moving to another, is cut with what was received of it; with every engine dead,
        the cut is all of those.
        """
        started = time.perf_counter()
        samples: dict[str, SampleRecord] = {}
        tokens = 0
        for i in self._alive():
            engine = self.engines[i]
            if not isinstance(engine, RemoteEngine):
                own = await engine.cut()
                samples.update(own.samples)
                tokens += own.engine_tokens
        seeded = self._seeded_known()
        for rid, received in self._requests.items():
            if rid not in samples:
                samples[rid] = failover.held(received, seeded=seeded)
                tokens += received.num_tokens
        return Cut(
            samples=samples,
            cut_s=time.perf_counter() - started,
            engine_tokens=tokens,
            engines={rid: self._placed[rid] for rid in samples if rid in self._placed},
        )

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        await self._each(lambda e: e.update_weights(weights_dir, policy_version))

    async def fingerprints(self) -> Fingerprints:
        prints = await self._each(lambda e: e.fingerprints())
        if any(p != prints[0] for p in prints):
            raise ValueError(f"the engines of one pool serve different models: {sorted({str(p) for p in prints})}")
        return prints[0]

    async def capabilities(self) -> Capabilities:
        """The weakest engine's: a cut is only as exact as its least capable engine."""
        caps = await self._each(lambda e: e.capabilities())
        if not caps:
            raise failover.EngineDiedError("capabilities: every engine of the pool has died")
        return min(caps, key=lambda c: (c.exact, c.verified_updates))

    async def progress(self) -> Progress:
        """The engines' counters; a request on a Ray-actor engine counts the tokens this process received of it
        (what a cut holds: the engine may be up to one poll of the channel ahead)."""
        parts = await self._each(lambda e: e.progress())
        live: dict[str, int] = {}
        for p in parts:
            live.update(p.live_tokens)
        for rid, received in self._requests.items():
            placed = self._placed.get(rid)
            if placed is not None and isinstance(self.engines[placed], RemoteEngine):
                live[rid] = received.num_tokens
        steps = [p.steps for p in parts]
        gen = [p.generation_tokens for p in parts]
        return Progress(
            tokens_received=sum(p.tokens_received for p in parts),
            live_tokens=live,
            steps=None if None in steps else sum(s for s in steps if s is not None),
            generation_tokens=None if None in gen else sum(g for g in gen if g is not None),
        )

    async def reset_prefix_cache(self) -> None:
        await self._each(lambda e: e.reset_prefix_cache())

    async def shutdown(self) -> None:
        await self._each(lambda e: e.shutdown())
