"""An LLM server for verl's router whose samples survive verl's aborts and a restart.

verl's V1 async trainers abort every request at each weight sync, and its client
(``FullyAsyncLLMServerClient``) re-sends prompt + tokens so far as a new request: the tokens survive
in the client's memory, nothing else (the seed is lost, and a restart loses it all). This
server speaks the same protocol (``generate``, ``abort_all_requests``, ``resume_generation``, ...)
on a :class:`~partial_rollout.engine.ResumableEngine`, and keeps each sample by its stable key:

- an abort cuts the sample's prefix with its logprobs and per-token policy versions (what the
  server had received) and ends the request in the same turn, so the client's retry continues the
  very same draw (exactly where the engine's sampler family continues seeded samples);
- a finished sample is held until the trainer's cut has seen it reach verl's TransferQueue;
- :meth:`freeze` hands the trainer everything held and running, in one cut, for a snapshot: the
  engine is not paused; new requests, and the replies of samples that finish meanwhile, wait until
  :meth:`thaw`, so verl stores nothing the snapshot holds unfinished;
- a request carrying ``resume_from`` (a sample of a snapshot) continues that record.

verl sends no seed; each sample gets the library's seed of its identity, the run's seed, verl's uid and
the sample's index (:func:`partial_rollout.snapshot.sample_seed`), so continuations are exact where the
engine's exactness rules say so.
This module imports no verl: the server runs where vLLM is (on a CPU machine, the project's
``.venv``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from partial_rollout.engine import Capabilities, EngineConfig, Progress, ResumableEngine
from partial_rollout.snapshot import Fingerprints, SampleRecord, SampleState, SamplingSpec, sample_seed
from partial_rollout_integrations.verl.wire import HeldSample, ServerOutput, split_key

logger = logging.getLogger(__name__)

VERL_SAMPLING_KEYS = frozenset(
    {"temperature", "top_p", "top_k", "repetition_penalty", "logprobs", "max_tokens", "max_new_tokens", "seed"}
)
"""The sampling keys verl's agent loops send; another key fails the request naming it."""


def sampling_spec(params: Mapping[str, Any], *, key: str | None, seed: int, response_length: int) -> SamplingSpec:
    """verl's sampling dict as the library's spec (the whole completion's budget)."""
    unknown = sorted(set(params) - VERL_SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"sampling parameter {unknown[0]!r} is not supported by the durable server")
    temperature = float(params.get("temperature", 1.0))
    request_seed = params.get("seed")
    if request_seed is None and key is not None and temperature > 0:
        request_seed = sample_seed(seed, *split_key(key))
    top_k = int(params.get("top_k", -1))
    return SamplingSpec(
        max_tokens=int(params.get("max_tokens", params.get("max_new_tokens", response_length))),
        temperature=temperature,
        top_p=float(params.get("top_p", 1.0)),
        top_k=0 if top_k < 0 else top_k,
        repetition_penalty=float(params.get("repetition_penalty", 1.0)),
        seed=None if request_seed is None else int(request_seed),
    )


@dataclass
class _Attempt:
    key: str | None
    prompt_token_ids: list[int]
    """The sample's prompt (without any prefix the request re-sent)."""
    offset: int
    """Tokens of the sample the request already carried; the reply holds only what follows."""
    task: asyncio.Task[SampleRecord]
    continued_tokens: int
    submitted: SampleRecord
    """What the attempt was submitted with: its saved record, or a not-started one (what a cut holds of it
    before its task first runs, when the engine has not registered it yet)."""
    aborted: SampleRecord | None = None


class DurableServer:
    """The body of one server actor (see the module docstring)."""

    def __init__(self, config: EngineConfig, *, seed: int = 0, response_length: int = 512) -> None:
        self._config = config
        self._seed = seed
        self._response_length = response_length
        self._engine: ResumableEngine | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._attempts: dict[str, _Attempt] = {}
        self._held: dict[str, HeldSample] = {}
        """In-flight samples between attempts (aborted, awaiting the client's retry)."""
        self._done: dict[str, HeldSample] = {}
        """Finished samples the trainer has not yet seen in the TransferQueue."""
        self._tries: dict[str, int] = {}
        self._frozen = False
        self._unfrozen = asyncio.Event()
        """Cleared while the trainer's cut holds the server frozen: no attempt starts, and no reply leaves (the
        engine decodes on; a sample that finishes meanwhile is answered at the thaw)."""
        self._unfrozen.set()
        self.global_steps = 0

    async def start(self, policy_version: int = 0) -> None:
        """Start the engine (an actor's first call: vLLM starts inside the actor's own process)."""
        self.attach(await ResumableEngine.start(self._config, policy_version=policy_version))

    def attach(self, engine: ResumableEngine) -> None:
        """Serve on an engine already running (a restarted server on the same engine, in tests)."""
        self._engine = engine
        self.global_steps = engine.policy_version

    @property
    def engine(self) -> ResumableEngine:
        assert self._engine is not None, "start() first"
        return self._engine

    # ---------------------------------------------------------------- verl's server protocol

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        sample_key: str | None = None,
        resume_from: HeldSample | None = None,
        **kwargs: Any,
    ) -> ServerOutput:
        """One attempt of a sample: continue what this server holds of it, or start it."""
        if image_data is not None or video_data is not None or kwargs.get("audio_data") is not None:
            raise ValueError("the durable server takes text prompts only")
        await self._open.wait()
        await self._unfrozen.wait()
        prompt_ids = [int(t) for t in prompt_ids]
        base = self._base(sample_key, resume_from, prompt_ids)
        if base is None:
            spec = sampling_spec(
                sampling_params, key=sample_key, seed=self._seed, response_length=self._response_length
            )
            prompt, offset, record = prompt_ids, 0, None
        else:
            prompt, record = base.prompt_token_ids, base.record
            offset = len(prompt_ids) - len(prompt)
            spec = record.sampling
        index = record.index if record is not None else 0 if sample_key is None else split_key(sample_key)[1]
        rid = self._request_id(request_id, sample_key)
        task = asyncio.ensure_future(self.engine.generate(rid, prompt, spec, index=index, resume_from=record))
        continued = 0 if base is None else base.continued_tokens
        submitted = record or SampleRecord(index=index, state=SampleState.NOT_STARTED, sampling=spec)
        attempt = _Attempt(
            key=sample_key,
            prompt_token_ids=prompt,
            offset=offset,
            task=task,
            continued_tokens=continued,
            submitted=submitted,
        )
        self._attempts[rid] = attempt
        try:
            await asyncio.wait({task})
        finally:
            del self._attempts[rid]
        if attempt.aborted is not None and attempt.aborted.state is not SampleState.FINISHED:
            result, stop = attempt.aborted, "aborted"
            if sample_key is not None:
                self._held[sample_key] = HeldSample(
                    key=sample_key, prompt_token_ids=prompt, record=result, continued_tokens=continued
                )
        else:
            result = attempt.aborted if attempt.aborted is not None else task.result()
            stop = "completed" if result.finish_reason in ("stop", "length") else str(result.finish_reason)
            if sample_key is not None:
                self._held.pop(sample_key, None)
                self._done[sample_key] = HeldSample(
                    key=sample_key, prompt_token_ids=prompt, record=result, continued_tokens=continued
                )
        # Frozen: the trainer's cut holds this sample as it is here, and verl must not store it before the
        # trainer's checkpoint commits (in ``separate_async`` the freeze lasts until verl's save is done).
        await self._unfrozen.wait()
        return self._reply(result, offset, stop, logprobs=bool(sampling_params.get("logprobs", True)))

    def _base(self, key: str | None, resume_from: HeldSample | None, prompt_ids: list[int]) -> HeldSample | None:
        """What to continue: this server's own copy of the sample, else the restored one, checked."""
        if key is None:
            return None
        base = self._held.get(key) or resume_from
        if base is None:
            return None
        if base.key != key:
            raise ValueError(f"resume_from is sample {base.key!r}, the request is {key!r}")
        sent = prompt_ids[len(base.prompt_token_ids) :]
        tokens = base.record.token_ids.tolist()
        if prompt_ids[: len(base.prompt_token_ids)] != base.prompt_token_ids or sent != tokens[: len(sent)]:
            raise ValueError(f"{key}: the request's prompt is not the held sample's prompt and prefix")
        return base

    def _request_id(self, request_id: str, key: str | None) -> str:
        if key is None:
            return request_id
        attempt = self._tries.get(key, 0)
        self._tries[key] = attempt + 1
        return f"{key}/{attempt}"

    def _reply(self, record: SampleRecord, offset: int, stop: str, *, logprobs: bool) -> ServerOutput:
        versions = record.versions.tolist()
        return ServerOutput(
            token_ids=record.token_ids[offset:].tolist(),
            log_probs=record.logprobs[offset:].tolist() if logprobs else None,
            stop_reason=stop,
            num_preempted=0,
            extra_fields={
                "global_steps": self.global_steps,
                "min_global_steps": min(versions, default=self.global_steps),
                "max_global_steps": max(versions, default=self.global_steps),
            },
        )

    async def abort_all_requests(self, reject_request: bool = False, **_: Any) -> dict[str, Any]:
        """End every running attempt as ``aborted``, keeping each sample's prefix as received.

        Requests arriving after this wait for :meth:`resume_generation` (verl's parking), or, with
        ``reject_request``, end at once as aborted with no tokens.
        """
        del reject_request
        self._open.clear()
        attempts = dict(self._attempts)
        ids = list(attempts)
        if ids:
            # the cut and the cancellations in one turn: no token arrives between them
            cut = await self.engine.cut()
            for rid, attempt in attempts.items():
                if not attempt.task.done():
                    attempt.aborted = cut.samples.get(rid, attempt.submitted)
                    attempt.task.cancel()
            await asyncio.gather(*(a.task for a in attempts.values()), return_exceptions=True)
        return {"aborted_count": len(ids), "request_ids": ids}

    async def resume_generation(self) -> None:
        self._open.set()

    async def sleep(self) -> None:
        """verl frees GPU memory here; a CPU engine keeps its weights (nothing to free)."""

    async def wake_up(self, tags: list[str] | None = None) -> None:
        del tags

    async def clear_kv_cache(self) -> None:
        await self.engine.reset_prefix_cache()

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def update_weights(self, weights_dir: str, global_steps: int) -> None:
        """Load the trainer's weights of step ``global_steps`` (the CPU harness's weight sync)."""
        await self.engine.update_weights(weights_dir, global_steps)
        self.global_steps = global_steps

    # ---------------------------------------------------------------- the trainer's cut

    async def fingerprints(self) -> Fingerprints:
        return await self.engine.fingerprints()

    async def capabilities(self) -> Capabilities:
        return await self.engine.capabilities()

    async def progress(self) -> Progress:
        """The engine's own counters: ``tokens_received`` is what a test counts as generated here."""
        return await self.engine.progress()

    async def freeze(self) -> list[HeldSample]:
        """Every sample this server holds or runs, as received (the engine goes on); new requests and the
        replies of samples that finish meanwhile wait for :meth:`thaw`."""
        if self._frozen:
            raise RuntimeError("freeze called twice without thaw")
        self._frozen = True
        self._unfrozen.clear()
        attempts = dict(self._attempts)
        cut = await self.engine.cut() if attempts else None  # awaits nothing: the same turn as what follows
        samples = {**self._done, **self._held}
        for rid, attempt in attempts.items():
            if attempt.key is None or (attempt.key in samples and rid not in self._attempts):
                continue
            task = attempt.task
            ended = task.done() and not task.cancelled() and task.exception() is None
            record = task.result() if ended else None if cut is None else cut.samples.get(rid, attempt.submitted)
            if record is not None:
                samples[attempt.key] = HeldSample(
                    key=attempt.key,
                    prompt_token_ids=attempt.prompt_token_ids,
                    record=record,
                    continued_tokens=attempt.continued_tokens,
                )
        return list(samples.values())

    async def thaw(self) -> None:
        if self._frozen:
            self._frozen = False
            self._unfrozen.set()

    async def forget(self, keys: list[str]) -> None:
        """Drop finished samples the trainer saw reach verl's TransferQueue (they need no snapshot)."""
        for key in keys:
            self._done.pop(key, None)
            self._tries.pop(key, None)

    async def shutdown(self) -> None:
        if self._engine is not None:
            await self._engine.shutdown()
