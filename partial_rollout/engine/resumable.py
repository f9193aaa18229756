"""One vLLM ``AsyncLLM`` whose in-flight requests survive a checkpoint: the in-process :class:`RolloutEngine`.

This class only orchestrates. What a request has received and under which policy versions is in
:mod:`~partial_rollout.engine.live`; cutting it (from what was received: no pause, no worker read)
in :mod:`~partial_rollout.engine.cut`; continuing from a prefix in
:mod:`~partial_rollout.engine.continuation`, with the sampler family deciding what is exact
(:mod:`~partial_rollout.engine.samplers`); the one pause, around a weight update, in
:meth:`ResumableEngine.refit` with :mod:`~partial_rollout.engine.settle`; every private vLLM name,
and the start-up probe that decides what may be used, in
:mod:`~partial_rollout.engine.vllm_internals`. The same class runs inside a Ray actor
(:mod:`partial_rollout.pool`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from partial_rollout.engine import (
    continuation,
    cut,
    orphan_guard,
    samplers,
    sampling_options,
    settle,
    stops,
    vllm_internals,
)
from partial_rollout.engine.factory import EngineConfig, make_async_engine
from partial_rollout.engine.live import LiveRequest
from partial_rollout.engine.progress import StepCount, step_logger_factory
from partial_rollout.engine.protocol import Capabilities, Cut, Delta, Progress
from partial_rollout.errors import ConfigError
from partial_rollout.fingerprint import model_fingerprint, tokenizer_fingerprint
from partial_rollout.snapshot import Fingerprints, SampleRecord, SampleState, SamplingSpec

logger = logging.getLogger(__name__)


async def _warm_up(llm: Any) -> None:
    """Run one tiny request with logprobs: the first one in a process compiles a logprobs kernel
    (seconds on CPU), which would otherwise land inside the first checkpoint's pause."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=2, temperature=1.0, seed=0, logprobs=0)
    async for _ in llm.generate(TokensPrompt(prompt_token_ids=[0, 5, 6]), params, "partial-rollout-warm-up"):
        pass


def with_worker_hooks(config: EngineConfig) -> EngineConfig:
    """``config`` with the worker extension the engine needs: its start-up probe, and the V1 restore hook
    (vLLM takes one extension class)."""
    if config.worker_extension_cls not in (None, vllm_internals.EXTENSION):
        raise ConfigError(
            f"is {config.worker_extension_cls!r}; the resumable engine needs its own ({vllm_internals.EXTENSION})",
            field="worker_extension_cls",
            fix="Leave it unset",
        )
    return dataclasses.replace(config, worker_extension_cls=vllm_internals.EXTENSION)


def cache_salt(policy_version: int) -> str:
    """vLLM's per-request prefix-cache salt: requests share cached KV only under the same weights."""
    return f"partial-rollout-policy-v{policy_version}"


class ResumableEngine:
    """One vLLM engine in this process (its engine core in a child process, as vLLM does). Build with :meth:`start`."""

    def __init__(
        self,
        llm: Any,
        config: EngineConfig,
        capabilities: Capabilities,
        policy_version: int,
        steps: StepCount | None = None,
    ) -> None:
        self._llm = llm
        self._config = config
        self._capabilities = capabilities
        self._family = samplers.by_name(capabilities.sampler)
        self._seeded = None if capabilities.exact else (capabilities.reason or "not tested on this engine")
        """Why this engine cannot continue a seeded sample exactly (``None``: it can)."""
        self._max_model_len = int(llm.model_config.max_model_len)
        self._policy_version = policy_version
        self._live: dict[str, LiveRequest] = {}
        self._updating = False
        self._warned: set[str] = set()
        self._tokens_received = 0
        self._outputs_received = 0
        self._steps = steps
        self._tokenizer = llm.get_tokenizer()
        self._eos = stops.EosIds.of_engine(llm)

    @classmethod
    async def start(
        cls,
        config: EngineConfig,
        *,
        policy_version: int = 0,
        require_exact: bool = False,
        trust_untested: bool = False,
        count_steps: bool = False,
    ) -> ResumableEngine:
        """Start the engine, probe the vLLM internals it needs, and decide what it may promise.

        Args:
            config: how to start vLLM.
            policy_version: the version of the weights it starts with.
            require_exact: refuse to start where seeded samples could not continue exactly;
                otherwise such samples are marked ``inexact`` with the reason, and a warning says so once.
            trust_untested: promise exact seeded continuations on a vLLM build or model runner no
                row of :data:`~partial_rollout.engine.vllm_internals.BUILDS` covers, after
                ``partial-rollout check-resume`` showed exact continuations there.
            count_steps: count engine steps in :meth:`progress` (turns on vLLM's per-step
                statistics, a small cost per step).
        """
        config = with_worker_hooks(config)
        steps = StepCount() if count_steps else None
        llm = make_async_engine(config, stat_loggers=None if steps is None else [step_logger_factory(steps)])
        try:
            return await cls.attach(
                llm,
                config,
                policy_version=policy_version,
                require_exact=require_exact,
                trust_untested=trust_untested,
                steps=steps,
            )
        except BaseException:
            vllm_internals.shutdown(llm, config.shutdown_timeout_s)
            raise

    @classmethod
    async def attach(
        cls,
        llm: Any,
        config: EngineConfig,
        *,
        policy_version: int = 0,
        require_exact: bool = False,
        trust_untested: bool = False,
        steps: StepCount | None = None,
    ) -> ResumableEngine:
        """Take over a running ``AsyncLLM`` started from ``with_worker_hooks(config)`` (a trainer's own engine).

        Probes the internals first and decides what it may promise (see :meth:`start`); nothing
        else is touched before that decision.
        """
        if config.worker_extension_cls != vllm_internals.EXTENSION:
            raise ConfigError(
                f"is {config.worker_extension_cls!r}",
                field="worker_extension_cls",
                fix="Start the engine from with_worker_hooks(config)",
            )
        lifeline = orphan_guard.lifeline().as_dict()
        reports = await llm.collective_rpc("partial_rollout_probe", kwargs={"lifeline": lifeline})
        capabilities = vllm_internals.decide(
            vllm_internals.vllm_build(), vllm_internals.probe_frontend(llm), reports, trust_untested=trust_untested
        )
        if not capabilities.exact:
            if require_exact:
                raise ConfigError(
                    f"exact resume of seeded sampling is not possible here: {capabilities.reason}",
                    field="require_exact",
                    fix="Use a tested vLLM version, or accept inexact resumes",
                )
            warnings.warn(f"seeded samples will resume inexactly: {capabilities.reason}", stacklevel=3)
        elif not capabilities.verified_updates:
            warnings.warn(f"unverified weight-update boundaries: {capabilities.reason}", stacklevel=3)
        family = samplers.by_name(capabilities.sampler)
        if capabilities.exact and family is not None and family.continuation is samplers.Continuation.GENERATOR:
            await llm.collective_rpc("partial_rollout_install_restore")
        await _warm_up(llm)
        return cls(llm, config, capabilities, policy_version, steps)

    @property
    def policy_version(self) -> int:
        return self._policy_version

    async def capabilities(self) -> Capabilities:
        return self._capabilities

    async def fingerprints(self) -> Fingerprints:
        """What a snapshot of this engine's work must be resumed with, and what changes a saved prefix's meaning.

        The logprob kind is read from the running engine (an attached engine may have been started
        with another ``logprobs_mode`` than :class:`EngineConfig`'s default).
        """
        import vllm

        model = self._config.model
        return Fingerprints(
            model=model_fingerprint(model),
            tokenizer=tokenizer_fingerprint(self._config.tokenizer or model),
            vocab_size=int(self._llm.model_config.get_vocab_size()),
            vllm_version=vllm.__version__,
            model_path=str(model),
            logprobs_kind=str(self._llm.model_config.logprobs_mode),
            sampler=self._capabilities.sampler,
            max_model_len=self._max_model_len,
        )

    async def progress(self) -> Progress:
        return Progress(
            tokens_received=self._tokens_received,
            live_tokens={rid: len(req.token_ids) for rid, req in self._live.items()},
            steps=None if self._steps is None else self._steps.steps,
            generation_tokens=None if self._steps is None else self._steps.generation_tokens,
        )

    async def reset_prefix_cache(self) -> None:
        """Empty vLLM's prefix cache (between measurements: the next prefill computes everything)."""
        if not await self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset the prefix cache (requests still running?)")

    # ---------------------------------------------------------------- generation

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
        on_delta: Callable[[Delta], None] | None = None,
    ) -> SampleRecord:
        """Generate sample ``index`` to the end; with ``resume_from``, continue that saved prefix.

        Returns a finished record holding the whole completion (prefix and continuation): token
        ids, behaviour logprobs, and the policy version of every token. A record that is already
        finished, or whose prefix already ends the generation, is returned without engine work; so
        is one whose prompt + prefix no longer fits this engine's ``max_model_len`` (finished as
        ``"length"``, with a warning), where vLLM would refuse the request.

        ``on_delta`` is called with the tokens of each output as it arrives (their logprobs and policy
        versions too), so that a caller in another process always holds the request's prefix
        (:meth:`stream`).

        Raises:
            ValueError: ``resume_from`` is of another sample or sampling, or carries a sampler
                state this engine cannot restore (checked here: in the worker it would kill the
                engine core and every request in it).
        """
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already running")
        sampling_options.check(sampling.extra)
        scan = None
        if resume_from is not None:
            if resume_from.index != index:
                raise ValueError(f"{request_id}: resume_from is sample {resume_from.index}, not {index}")
            self._check_sampler_state(request_id, resume_from)
            scan = stops.StopScan(sampling, prompt_token_ids=prompt_token_ids, tokenizer=self._tokenizer, eos=self._eos)
            done = self._ended_without_engine(request_id, prompt_token_ids, sampling, resume_from, scan)
            if done is not None:
                return done
        if resume_from is not None and resume_from.num_tokens:
            return await self._run(request_id, prompt_token_ids, sampling, index, resume_from, scan, on_delta)
        # A fresh start; for a saved sample with nothing drawn yet, from its seed: that is its continuation.
        record = await self._run(request_id, prompt_token_ids, sampling, index, None, None, on_delta)
        if resume_from is not None and resume_from.inexact:
            record = dataclasses.replace(record, inexact=resume_from.inexact)
        return record

    def _ended_without_engine(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        base: SampleRecord,
        scan: stops.StopScan,
    ) -> SampleRecord | None:
        """The record a saved sample ends with without engine work: finished already, its prefix ending the
        generation, or prompt + prefix filling ``max_model_len`` (where vLLM would refuse the request)."""
        done = continuation.finished_without_engine(base, sampling, scan)
        if done is not None:
            return done
        total = len(prompt_token_ids) + base.num_tokens
        if base.num_tokens and total >= self._max_model_len:
            warnings.warn(
                f"{request_id}: prompt ({len(prompt_token_ids)}) + saved prefix ({base.num_tokens}) = {total} "
                f"tokens reach this engine's max_model_len {self._max_model_len}: finished as length-truncated",
                stacklevel=3,
            )
            return dataclasses.replace(base, state=SampleState.FINISHED, finish_reason="length", sampler_state=None)
        return None

    async def _run(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        index: int,
        base: SampleRecord | None,
        scan: stops.StopScan | None,
        on_delta: Callable[[Delta], None] | None,
    ) -> SampleRecord:
        """One vLLM request, from the prompt or from prompt + ``base``'s prefix, followed to its end."""
        from vllm.inputs import TokensPrompt

        consumed = 0 if base is None else base.num_tokens
        prompt = [int(t) for t in prompt_token_ids] + ([] if base is None else base.token_ids.tolist())
        req = LiveRequest(
            index=index,
            sampling=sampling,
            base=base,
            policy_version=self._policy_version,
            scan=scan if scan is not None and scan.reads_text else None,
        )
        params = continuation.to_vllm_params(
            sampling,
            consumed=consumed,
            sampler_state=self._generator_state(base),
            match_stop_strings=req.scan is None,
        )
        self._live[request_id] = req
        try:
            # The prefix cache is salted with the policy version: KV blocks computed by older weights
            # are never reused for a request labelled with the current version.
            inputs = TokensPrompt(prompt_token_ids=prompt, cache_salt=cache_salt(self._policy_version))
            stream = self._llm.generate(inputs, params, request_id)
            try:
                async for out in stream:
                    if self._received(request_id, req, out, on_delta):
                        break
            finally:
                await stream.aclose()  # ends vLLM's request where the loop stopped it early
            if req.finished is None:
                raise RuntimeError(f"{request_id}: vLLM's stream ended without a finished output")
            return req.finished
        finally:
            del self._live[request_id]

    def _received(self, request_id: str, req: LiveRequest, out: Any, on_delta: Callable[[Delta], None] | None) -> bool:
        """Add one vLLM output to ``req``; whether the request ended early (a stop string across the prefix)."""
        completion = out.outputs[0]
        new = completion.token_ids
        self._tokens_received += len(new)
        self._outputs_received += 1
        if new:
            if completion.logprobs is None or len(completion.logprobs) != len(new):
                raise RuntimeError(f"{request_id}: vLLM returned no logprob for some sampled tokens")
            logprobs = [lp[t].logprob for lp, t in zip(completion.logprobs, new, strict=True)]
            delta = Delta(token_ids=list(new), logprobs=logprobs, versions=[req.policy_version] * len(new))
            req.add(delta)
            if on_delta is not None:
                on_delta(delta)
        stitched = req.stitched_end(len(new))
        if stitched is not None:  # a stop string begun in the prefix, which vLLM cannot see
            req.finished = stitched
            return True
        if out.finished:
            req.finished = req.finish(
                len(req.token_ids), finish_reason=str(completion.finish_reason), stop_reason=completion.stop_reason
            )
        return False

    async def stream(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> AsyncIterator[Delta | SampleRecord]:
        """:meth:`generate` as a stream: deltas while it runs, then the finished record.

        What an engine in a Ray actor sends to its pool, so the pool holds every request's prefix
        and can continue it on another engine if the actor dies. Deltas that pile up while the
        consumer is busy (a Ray send in flight) are sent as one.
        """
        pending: list[Delta] = []
        ready = asyncio.Event()

        def push(delta: Delta) -> None:
            pending.append(delta)
            ready.set()

        task = asyncio.ensure_future(
            self.generate(request_id, prompt_token_ids, sampling, index=index, resume_from=resume_from, on_delta=push)
        )
        task.add_done_callback(lambda _: ready.set())
        try:
            while True:
                if pending:
                    batch = Delta.join(pending)
                    pending.clear()
                    yield batch
                    continue
                if task.done():
                    yield task.result()
                    return
                ready.clear()
                await ready.wait()
        finally:
            task.cancel()

    def _check_sampler_state(self, request_id: str, base: SampleRecord) -> None:
        state = base.sampler_state
        if state is None:
            return
        where = f"{request_id} (sample {base.index}): resume_from.sampler_state"
        if base.sampling.is_greedy or base.sampling.seed is None:
            raise ValueError(f"{where} is set, but only seeded sampling with temperature > 0 has a sampler state")
        if self._family is None or self._family.continuation is not samplers.Continuation.GENERATOR:
            raise ValueError(
                f"{where} is set, but this engine's sampler ({self._capabilities.sampler}) keeps no per-request "
                "state; drop it (a snapshot of another sampler family is loaded without its states)"
            )
        problem = vllm_internals.check_sampler_state(state)
        if problem is not None:
            raise ValueError(f"{where} {problem}")

    def _generator_state(self, base: SampleRecord | None) -> bytes | None:
        """The generator state a seeded continuation starts from, on a family that restores one (V1 CPU).

        A legacy snapshot's saved state, else the state derived from the seed and the tokens drawn.
        """
        if base is None or base.sampling.is_greedy or base.sampling.seed is None or self._seeded is not None:
            return None
        if self._family is None or self._family.continuation is not samplers.Continuation.GENERATOR:
            return None
        return base.sampler_state or self._family.generator_state(base.sampling.seed, base.num_tokens)

    # ---------------------------------------------------------------- checkpoint cut

    async def cut(self) -> Cut:
        """Every request in flight as received so far; the engine goes on generating (nothing is awaited).

        Tokens the engine sampled and not yet delivered are not in the cut (:mod:`~partial_rollout.engine.cut`).
        """
        started = time.perf_counter()
        samples: dict[str, SampleRecord] = {}
        for rid, req in self._live.items():
            try:
                record = cut.in_flight_record(req, seeded=self._seeded)
            except ValueError as exc:
                raise ValueError(f"{rid}: the engine's output is not a valid record: {exc}") from None
            if record.inexact and record.inexact not in self._warned:
                self._warned.add(record.inexact)
                warnings.warn(f"some samples will not resume exactly: {record.inexact}", stacklevel=2)
            samples[rid] = record
        return Cut(
            samples=samples,
            cut_s=time.perf_counter() - started,
            engine_tokens=sum(len(req.token_ids) for req in self._live.values() if req.finished is None),
        )

    # ---------------------------------------------------------------- weights

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        """Load new weights into the running engine; requests in flight continue under them.

        The engine is paused and settled first (:meth:`refit`), so the tokens each request holds
        at that moment are exactly the ones the old weights sampled: every later token is labelled
        ``policy_version``. Requests submitted from now on use a new prefix-cache salt, so none of
        them (resumed prefixes included) reuses KV blocks the old weights computed; requests already
        running keep their own KV, as in-flight weight updates do.
        """
        await self.refit(lambda: vllm_internals.reload_weights(self._llm, str(weights_dir)), policy_version)

    async def refit(self, load: Callable[[], Awaitable[None]], policy_version: int) -> None:
        """Run ``load``, a trainer's own transfer of new weights into this engine (NCCL, IPC), paused and settled.

        What :meth:`update_weights` does with a weights folder, for a transfer the trainer owns: vLLM's
        keep-mode pause (nothing aborted, the KV cache kept), then a wait until every token sampled
        before it has been received (:mod:`~partial_rollout.engine.settle`); those tokens were sampled
        by the old weights, every later token is labelled ``policy_version``. A request submitted
        meanwhile waits in vLLM's queue and samples under the new weights. If ``load`` raises, no
        version changes.
        """
        if policy_version < self._policy_version:
            raise ValueError(f"policy version must not go back ({self._policy_version} -> {policy_version})")
        if self._updating:
            raise RuntimeError("a weight update is already running on this engine")
        self._updating = True
        try:
            await self._llm.pause_generation(mode="keep", clear_cache=False)
            try:
                queue = vllm_internals.outputs_queue(self._llm) if self._capabilities.verified_updates else None
                if queue is not None:
                    await settle.settle(
                        queue, lambda: (self._outputs_received, len(self._live)), outputs=len(self._live)
                    )
                await load()
                self._policy_version = policy_version
                for req in self._live.values():
                    req.mark_version(policy_version)
            finally:
                await self._llm.resume_generation()
        finally:
            self._updating = False

    async def shutdown(self) -> None:
        """Stop the engine core now, not in ``AsyncLLM.__del__`` during interpreter exit (which fails noisily)."""
        llm, self._llm = self._llm, None
        if llm is not None:
            vllm_internals.shutdown(llm, self._config.shutdown_timeout_s)
