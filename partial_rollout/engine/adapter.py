"""A vLLM ``AsyncLLM`` that can cut its in-flight requests at a checkpoint and continue them later.

Trainers call :meth:`ResumableEngine.generate` instead of ``AsyncLLM.generate``. While requests
run, the adapter keeps each one's tokens and behaviour logprobs; vLLM itself records which weight
version produced each token. At a checkpoint, :meth:`~ResumableEngine.pause_and_capture` freezes
the engine with a keep-mode pause (nothing is aborted), reads every seeded request's sampler state
from the worker, checks its token counts against the engine's, and returns the cut as
:class:`~partial_rollout.snapshot.SampleRecord` objects; :meth:`~ResumableEngine.resume` lets
generation continue in place. In a new process, ``generate(..., resume_from=record)`` resubmits
the prompt plus the saved prefix with the remaining budget and the sampler state, and stitches
prefix and continuation into one completion.

The same class runs in-process or inside a Ray actor (:mod:`partial_rollout.engine.pool`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
import warnings
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from partial_rollout.engine import exactness
from partial_rollout.engine.factory import EngineConfig, make_async_engine
from partial_rollout.engine.progress import StepCount, step_logger_factory
from partial_rollout.engine.sampler_state import SAMPLER_STATE_ARG, encode_sampler_state
from partial_rollout.engine.support import CaptureSupport, check_support
from partial_rollout.errors import ConfigError
from partial_rollout.fingerprint import model_fingerprint, tokenizer_fingerprint
from partial_rollout.snapshot import Fingerprints, SampleRecord, SampleState, SamplingSpec

logger = logging.getLogger(__name__)

EXTENSION = "partial_rollout.engine.sampler_state.SamplerStateExtension"
DRAIN_TIMEOUT_S = 30.0
"""How long a capture waits for outputs already produced by the engine to reach this process."""


@dataclass(kw_only=True)
class Cut:
    """The in-flight state of one engine at one instant."""

    samples: dict[str, SampleRecord]
    """Every request submitted and not yet returned by :meth:`ResumableEngine.generate`, by request id."""
    pause_s: float = 0.0
    """Seconds from the pause request until the cut was ready (the engine stays paused until resume)."""
    stop_s: float = 0.0
    """Seconds from the pause request until the engine stopped: the step it was running finishes
    first (its tokens are in the cut), so the engine idles only for ``pause_s - stop_s`` plus
    whatever the caller does before :meth:`ResumableEngine.resume`."""
    engine_tokens: int = 0
    """Output tokens the engine's worker reported for the captured requests (checked equal to ours)."""


@dataclass
class _Live:
    """A request this adapter submitted and has not yet returned."""

    sampling: SamplingSpec
    base: SampleRecord | None
    """The saved prefix this request continues, if it is a resume."""
    token_ids: array = field(default_factory=lambda: array("i"))
    """Typed buffers (int32, float32), not lists: a cut copies them into numpy without a per-token
    conversion, which keeps the engine's pause short when hundreds of long samples are in flight."""
    logprobs: array = field(default_factory=lambda: array("f"))
    finished: SampleRecord | None = None


def to_vllm_params(sampling: SamplingSpec, *, consumed: int = 0, sampler_state: bytes | None = None) -> Any:
    """vLLM ``SamplingParams`` for the rest of a sample after ``consumed`` prefix tokens."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    extra_args = {SAMPLER_STATE_ARG: encode_sampler_state(sampler_state)} if sampler_state else None
    return SamplingParams(
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        seed=sampling.seed,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        ignore_eos=sampling.ignore_eos,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
        max_tokens=sampling.max_tokens - consumed,
        min_tokens=max(0, sampling.min_tokens - consumed),
        logprobs=max(0, sampling.logprobs),
        output_kind=RequestOutputKind.DELTA,
        extra_args=extra_args,
        **sampling.extra,
    )


def _versions(n: int, fallback: int, spans: Iterable[tuple[str, int, int]]) -> np.ndarray:
    """Per-token policy versions from vLLM's ``(label, start, end)`` weight-version spans."""
    versions = np.full(n, fallback, dtype=np.int32)
    for label, start, end in spans:
        versions[start:end] = int(label)
    return versions


async def _warm_up(llm: Any) -> None:
    """Run one tiny request with logprobs: the first one in a process compiles a logprobs kernel
    (seconds on CPU), which would otherwise land inside the first checkpoint's pause."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=2, temperature=1.0, seed=0, logprobs=0)
    async for _ in llm.generate(TokensPrompt(prompt_token_ids=[0, 5, 6]), params, "partial-rollout-warm-up"):
        pass


class ResumableEngine:
    """One vLLM engine whose in-flight requests survive a checkpoint. Build with :meth:`start`."""

    def __init__(
        self, llm: Any, config: EngineConfig, support: CaptureSupport, policy_version: int,
        steps: StepCount | None = None,
    ) -> None:
        self._llm = llm
        self._config = config
        self.support = support
        self._policy_version = policy_version
        self._live: dict[str, _Live] = {}
        self._paused_at: float | None = None
        self._warned: set[str] = set()
        self.tokens_received = 0
        """Output tokens this engine has delivered since it started (a progress counter)."""
        self.steps = steps
        """Engine steps that produced outputs, when started with ``count_steps=True`` (else ``None``)."""
        tokenizer = llm.get_tokenizer()
        self._tokenizer = tokenizer
        self._eos_token_id: int | None = getattr(tokenizer, "eos_token_id", None)

    @classmethod
    async def start(
        cls, config: EngineConfig, *, policy_version: int = 0, require_exact: bool = False, count_steps: bool = False,
    ) -> ResumableEngine:
        """Start the engine with the sampler-state extension and check what it supports.

        ``require_exact=True`` refuses to start where seeded samples could not continue exactly;
        otherwise such samples are marked ``inexact`` with the reason, and a warning says so once.
        ``count_steps=True`` counts engine steps in :attr:`steps` (it turns on vLLM's per-step
        statistics, a small cost per step, so it is off by default).
        """
        if config.worker_extension_cls not in (None, EXTENSION):
            raise ConfigError(
                f"is {config.worker_extension_cls!r}; the resumable engine needs its own ({EXTENSION})",
                field="worker_extension_cls", fix="Leave it unset",
            )
        config = dataclasses.replace(config, worker_extension_cls=EXTENSION)
        steps = StepCount() if count_steps else None
        llm = make_async_engine(config, stat_loggers=None if steps is None else [step_logger_factory(steps)])
        try:
            import vllm

            reports = await llm.collective_rpc("partial_rollout_install", kwargs={"frontend_pid": os.getpid()})
            support = check_support(vllm.__version__, reports, llm)
            if not support.sampler_state:
                if require_exact:
                    raise ConfigError(
                        f"exact resume of seeded sampling is not possible here: {support.reason}",
                        field="require_exact", fix="Upgrade/downgrade vLLM to a tested version, or accept inexact resumes",
                    )
                warnings.warn(f"seeded samples will resume inexactly: {support.reason}", stacklevel=2)
            await llm.update_weight_version(str(policy_version))
            await _warm_up(llm)
        except BaseException:
            llm.shutdown()
            raise
        return cls(llm, config, support, policy_version, steps)

    @property
    def policy_version(self) -> int:
        return self._policy_version

    def fingerprints(self) -> Fingerprints:
        """What a snapshot of this engine's work must be resumed with."""
        import vllm

        model = self._config.model
        return Fingerprints(
            model=model_fingerprint(model),
            tokenizer=tokenizer_fingerprint(self._config.tokenizer or model),
            vocab_size=int(self._llm.model_config.get_vocab_size()),
            vllm_version=vllm.__version__,
            model_path=str(model),
        )

    def live_tokens(self) -> dict[str, int]:
        """Tokens each running request has generated on this engine so far (a resumed prefix not counted)."""
        return {rid: len(live.token_ids) for rid, live in self._live.items()}

    async def reset_prefix_cache(self) -> None:
        """Empty vLLM's prefix cache (between measurements: the next prefill computes everything)."""
        if not await self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset the prefix cache (requests still running?)")

    # --- generation -----------------------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        """Generate one sample to the end; with ``resume_from``, continue that saved prefix.

        Returns a finished record holding the whole completion (prefix and continuation): token
        ids, behaviour logprobs, and the policy version of every token. A record that is already
        finished, or whose prefix already ends the generation, is returned without engine work.
        """
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already running")
        base = resume_from
        if base is not None:
            if base.state is SampleState.FINISHED:
                return base
            if base.sampling != sampling:
                raise ValueError(f"{request_id}: resume_from was saved with other sampling parameters")
            done = exactness.finish_in_prefix(
                base.token_ids.tolist(), sampling, eos_token_id=self._eos_token_id, decode=self._decode
            )
            if done is not None:
                keep, reason, stop = done
                return dataclasses.replace(
                    base, state=SampleState.FINISHED, token_ids=base.token_ids[:keep],
                    logprobs=base.logprobs[:keep], versions=base.versions[:keep],
                    finish_reason=reason, stop_reason=stop, sampler_state=None,
                )
            if base.num_tokens == 0:
                record = await self.generate(request_id, prompt_token_ids, sampling)
                return dataclasses.replace(record, inexact=base.inexact) if base.inexact else record
        from vllm.inputs import TokensPrompt

        consumed = 0 if base is None else base.num_tokens
        prompt = list(prompt_token_ids) + ([] if base is None else base.token_ids.tolist())
        params = to_vllm_params(sampling, consumed=consumed, sampler_state=None if base is None else base.sampler_state)
        live = _Live(sampling=sampling, base=base)
        self._live[request_id] = live
        try:
            async for out in self._llm.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id):
                completion = out.outputs[0]
                new = completion.token_ids
                live.token_ids.extend(new)
                self.tokens_received += len(new)
                if new:
                    if completion.logprobs is None or len(completion.logprobs) != len(new):
                        raise RuntimeError(f"{request_id}: vLLM returned no logprob for some sampled tokens")
                    live.logprobs.extend(lp[t].logprob for lp, t in zip(completion.logprobs, new))
                if out.finished:
                    live.finished = self._finished_record(live, completion)
            if live.finished is None:
                raise RuntimeError(f"{request_id}: vLLM's stream ended without a finished output")
            return live.finished
        finally:
            del self._live[request_id]

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids))

    def _finished_record(self, live: _Live, completion: Any) -> SampleRecord:
        n = len(live.token_ids)
        spans = ((span.version, span.start, span.end) for span in completion.weight_versions or ())
        versions = _versions(n, self._policy_version, spans)
        return self._record(live, SampleState.FINISHED, n, versions,
                            finish_reason=str(completion.finish_reason), stop_reason=completion.stop_reason)

    def _record(self, live: _Live, state: SampleState, n: int, versions: np.ndarray, **kw: Any) -> SampleRecord:
        """Stitch the saved prefix (if any) with the first ``n`` tokens this engine generated."""
        tokens = np.frombuffer(live.token_ids, dtype=np.int32, count=n).copy()
        logprobs = np.frombuffer(live.logprobs, dtype=np.float32, count=n).copy()
        inexact = None
        if live.base is not None:
            tokens = np.concatenate([live.base.token_ids, tokens])
            logprobs = np.concatenate([live.base.logprobs, logprobs])
            prefix_versions = live.base.versions
            inexact = live.base.inexact
            if inexact is None and len(prefix_versions) and (
                prefix_versions.min() != prefix_versions.max() or int(prefix_versions[-1]) != int(versions[0] if len(versions) else self._policy_version)
            ):
                inexact = exactness.version_mix(int(prefix_versions.min()), int(prefix_versions.max()),
                                                int(versions[0]) if len(versions) else self._policy_version)
            versions = np.concatenate([prefix_versions, versions])
        return SampleRecord(index=0, state=state, sampling=live.sampling, token_ids=tokens, logprobs=logprobs,
                            versions=versions, inexact=inexact, **kw)

    # --- checkpoint cut -------------------------------------------------------------------------

    async def pause_and_capture(self) -> Cut:
        """Freeze the engine (keep-mode pause) and return its in-flight requests; call :meth:`resume` after.

        Between this returning and :meth:`resume`, the engine produces nothing, so the caller can
        take the rest of its checkpoint (loader cursor, buffers) in one await-free window.
        """
        if self._paused_at is not None:
            raise RuntimeError("pause_and_capture called twice without resume")
        started = time.perf_counter()
        await self._pause()
        stopped = time.perf_counter()
        self._paused_at = started
        try:
            per_worker = await self._llm.collective_rpc("partial_rollout_capture")
            worker = self._by_external_id(per_worker[0])
            await self._drain(worker)
            samples: dict[str, SampleRecord] = {}
            engine_tokens = 0
            version_starts = {
                st.external_req_id: list(st.weight_version_starts)
                for st in self._llm.output_processor.request_states.values()
            }
            for rid, live in self._live.items():
                if live.finished is not None:
                    samples[rid] = live.finished
                    continue
                count, state = worker.get(rid, (0, None))
                engine_tokens += count
                samples[rid] = self._in_flight_record(live, count, state, version_starts.get(rid, []))
        except BaseException:
            await self.resume()
            raise
        return Cut(samples=samples, pause_s=time.perf_counter() - started, stop_s=stopped - started,
                   engine_tokens=engine_tokens)

    async def _pause(self) -> None:
        """Keep-mode pause of the scheduler: requests stay queued with their KV cache.

        ``AsyncLLM.pause_generation`` adds a fixed 20 ms sleep so that outputs produced before the
        pause reach their streams first; :meth:`_drain` waits for exactly those outputs, so the
        capture asks the engine-core client directly and the freeze stays within about a step.
        """
        core = getattr(self._llm, "engine_core", None)
        if core is not None and hasattr(core, "pause_scheduler_async"):
            await core.pause_scheduler_async(mode="keep", clear_cache=False)
        else:
            await self._llm.pause_generation(mode="keep", clear_cache=False)

    async def resume(self) -> None:
        """Let generation continue after :meth:`pause_and_capture`."""
        if self._paused_at is None:
            return
        await self._llm.resume_generation()
        self._paused_at = None

    def _by_external_id(self, worker: dict[str, tuple[int, bytes | None]]) -> dict[str, tuple[int, bytes | None]]:
        """vLLM renames requests internally (``<id>-<random>``); map the worker's view back to our ids."""
        states = self._llm.output_processor.request_states
        return {states[i].external_req_id: v for i, v in worker.items() if i in states}

    async def _drain(self, worker: dict[str, tuple[int, bytes | None]]) -> None:
        """Wait until every output the engine produced before the pause has reached our records."""
        deadline = time.perf_counter() + DRAIN_TIMEOUT_S
        while True:
            behind = [
                rid for rid, live in self._live.items()
                if live.finished is None
                and (len(live.token_ids) < worker.get(rid, (0, None))[0]
                     or (rid not in worker and live.token_ids))  # finished in the engine, final output in transit
            ]
            if not behind:
                return
            if time.perf_counter() > deadline:
                raise RuntimeError(f"engine outputs for {behind[:5]} did not arrive within {DRAIN_TIMEOUT_S} s")
            await asyncio.sleep(0.001)

    def _in_flight_record(
        self, live: _Live, count: int, sampler_state: bytes | None, version_starts: list[tuple[str, int]]
    ) -> SampleRecord:
        assert len(live.token_ids) == count, f"client has {len(live.token_ids)} tokens, engine {count}"
        consumed = count + (0 if live.base is None else live.base.num_tokens)
        if consumed == 0:
            reason = exactness.inexact_reason(live.sampling, num_tokens=0, sampler_state=None,
                                              capture_unsupported=self.support.reason)
            return SampleRecord(index=0, state=SampleState.NOT_STARTED, sampling=live.sampling, inexact=reason)
        ends = [begin for _, begin in version_starts[1:]] + [count]
        versions = _versions(count, self._policy_version,
                             ((label, begin, end) for (label, begin), end in zip(version_starts, ends)))
        if count == 0 and live.base is not None:
            sampler_state = live.base.sampler_state  # resumed but not yet scheduled: nothing drawn since
        if live.sampling.is_greedy or live.sampling.seed is None or not self.support.sampler_state:
            sampler_state = None
        record = self._record(live, SampleState.IN_FLIGHT, count, versions, sampler_state=sampler_state)
        reason = record.inexact or exactness.inexact_reason(
            live.sampling, num_tokens=consumed, sampler_state=sampler_state,
            capture_unsupported=self.support.reason,
            prefix_text=self._decode(record.token_ids.tolist()) if live.sampling.stop else None,
        )
        if reason and reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"some samples will not resume exactly: {reason}", stacklevel=3)
        return dataclasses.replace(record, inexact=reason)

    # --- weights --------------------------------------------------------------------------------

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        """Load new weights into the running engine; requests in flight continue under them.

        Tokens sampled after this call are labelled ``policy_version`` by vLLM itself, so every
        completion carries the version of each of its tokens.
        """
        if policy_version < self._policy_version:
            raise ValueError(f"policy version must not go back ({self._policy_version} -> {policy_version})")
        await self._llm.pause_generation(mode="keep", clear_cache=False)
        try:
            await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(weights_dir)})
            await self._llm.update_weight_version(str(policy_version))
            self._policy_version = policy_version
        finally:
            await self._llm.resume_generation()

    async def shutdown(self) -> None:
        self._llm.shutdown()
