"""The verl side of a sample's identity: its agent-loop worker names it, its client carries it.

verl's agent-loop worker runs each sample of a prompt as one task (``_run_agent_loop``, with the
prompt's TransferQueue ``uid`` and the sample's ``session_id``); the client it hands to the agent
loop sends each attempt to a server under a fresh request id. Here the worker sets the sample's
stable key for the task (a context variable, so nothing in verl's agent loop changes) and the
client adds it to every attempt, with the snapshot's record of the sample after a restart. A
sample a restart finds finished in verl's restored TransferQueue is not run again (verl would
delete it and regenerate its whole group); one restored finished but not yet stored there is
handed back from the snapshot without engine work.

With ``record_events`` and the flag off, the worker names each sample the same way, and verl's
own client runs as it is: :class:`RecordingLLMServerClient` only notes what each attempt returned,
so the trainer can ask what verl's clients hold at a checkpoint (what a restart throws away).
"""

from __future__ import annotations

import contextvars
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec
from partial_rollout_integrations.seams import unwrap
from partial_rollout_integrations.verl.server import VERL_SAMPLING_KEYS, sampling_spec
from partial_rollout_integrations.verl.wire import RESUME_FROM, SAMPLE_KEY, HeldSample, sample_key, split_key

CURRENT_SAMPLE: contextvars.ContextVar[str | None] = contextvars.ContextVar("partial_rollout_verl_sample", default=None)
"""The stable key of the sample the current agent-loop task runs (``None``: validation, or not ours)."""


class DurableLLMServerClient(FullyAsyncLLMServerClient):  # type: ignore[misc]
    """verl's abort-resuming client, sending each sample's stable key and restored record."""

    def __init__(
        self,
        config: Any,
        load_balancer_handle: Any = None,
        *,
        restored: Mapping[str, HeldSample] | None = None,
        stored: Collection[str] = (),
        **kwargs: Any,
    ) -> None:
        """
        Args:
            restored: the snapshot's unfinished or not-yet-stored samples, by key.
            stored: keys of samples verl's restored TransferQueue already holds finished.
        """
        super().__init__(config=config, load_balancer_handle=load_balancer_handle, **kwargs)
        self._restored = dict(restored or {})
        self._stored = frozenset(stored)

    def is_stored(self, key: str) -> bool:
        """Whether verl's TransferQueue holds this sample finished (it must not run again)."""
        return key in self._stored

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        key = CURRENT_SAMPLE.get()
        if key is None:
            return await super().generate(request_id, **kwargs)
        held = self._restored.get(key)
        if held is not None and held.record.state is SampleState.FINISHED:
            return _finished_output(held)
        extra: dict[str, Any] = {SAMPLE_KEY: key}
        if held is not None:
            extra[RESUME_FROM] = held
        output = await super().generate(request_id, **kwargs, **extra)
        if held is not None and held.record.num_tokens:
            # verl's client counts versions per attempt; the restored prefix was drawn earlier.
            output.extra_fields["min_global_steps"] = int(held.record.versions.min())
        return output


def _finished_output(held: HeldSample) -> Any:
    record = held.record
    versions = record.versions.tolist()
    return TokenOutput(
        token_ids=record.token_ids.tolist(),
        log_probs=record.logprobs.tolist(),
        stop_reason="completed",
        num_preempted=0,
        extra_fields={
            "global_steps": max(versions, default=0),
            "min_global_steps": min(versions, default=0),
            "max_global_steps": max(versions, default=0),
        },
    )


ABORTED = ("aborted", "abort")
"""verl's stop reasons of an attempt a weight sync ended (its client sends the sample again)."""
UNBOUNDED = 2**31 - 1
"""The budget a noted sample has when verl's client sends none."""


@dataclass
class _Progress:
    """What verl's client holds of one training sample: its prompt, the tokens of its attempts so far."""

    prompt: list[int]
    sampling: SamplingSpec
    tokens: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    stop: str | None = None
    """verl's stop reason once the sample finished."""

    def add(self, output: Any) -> None:
        tokens = [int(t) for t in output.token_ids]
        self.tokens += tokens
        self.versions += [int(output.extra_fields.get("global_steps") or 0)] * len(tokens)
        if output.stop_reason not in ABORTED:
            self.stop = str(output.stop_reason)
        elif len(self.tokens) >= self.sampling.max_tokens:
            self.stop = "length"  # verl's client stops here too, the budget spent

    def held(self, key: str) -> HeldSample:
        """As the ledger records it: the tokens and their policy versions (no logprobs: it only counts)."""
        record = SampleRecord(
            index=split_key(key)[1],
            state=SampleState.IN_FLIGHT if self.stop is None else SampleState.FINISHED,
            sampling=self.sampling,
            token_ids=np.asarray(self.tokens, dtype=np.int32),
            logprobs=np.zeros(len(self.tokens), dtype=np.float32),
            versions=np.asarray(self.versions, dtype=np.int32),
            finish_reason=self.stop,
        )
        return HeldSample(key=key, prompt_token_ids=self.prompt, record=record)


class _NotedAttempts(LLMServerClient):  # type: ignore[misc]
    """One attempt of verl's retry loop, noted for the sample the current task runs.

    :class:`RecordingLLMServerClient` puts it between ``FullyAsyncLLMServerClient`` and verl's
    ``LLMServerClient`` (its MRO), so the ``super().generate`` of verl's retry loop, one attempt,
    passes through here unchanged: the loop keeps the tokens in a local, which nothing else can read.
    """

    _progress: dict[str, _Progress]

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        key = CURRENT_SAMPLE.get()
        if key is not None and key not in self._progress:  # the first attempt: the prompt alone
            # verl's loop pins max_tokens to the response length before its first attempt, where it has one.
            params = {k: v for k, v in kwargs["sampling_params"].items() if k in VERL_SAMPLING_KEYS}
            spec = sampling_spec(params, key=None, seed=0, response_length=UNBOUNDED)
            self._progress[key] = _Progress(prompt=[int(t) for t in kwargs["prompt_ids"]], sampling=spec)
        output = await super().generate(request_id, **kwargs)
        progress = self._progress.get(key) if key is not None else None
        if progress is not None:
            progress.add(output)
        return output


class RecordingLLMServerClient(FullyAsyncLLMServerClient, _NotedAttempts):  # type: ignore[misc]
    """verl's abort-resuming client as it is, noting what each training sample holds (``record_events``)."""

    def __init__(self, config: Any, load_balancer_handle: Any = None, **kwargs: Any) -> None:
        super().__init__(config=config, load_balancer_handle=load_balancer_handle, **kwargs)
        self._progress = {}

    def is_stored(self, key: str) -> bool:
        """Never: verl runs every sample it dispatches."""
        return False

    def recorded(self) -> list[HeldSample]:
        """Every training sample this client runs or ran, with what it holds of it, until forgotten."""
        return [progress.held(key) for key, progress in self._progress.items()]

    def forget(self, keys: Sequence[str]) -> None:
        """Drop finished samples the trainer saw reach verl's TransferQueue."""
        for key in keys:
            self._progress.pop(key, None)


_VerlWorker: Any = unwrap(AgentLoopWorkerTQ)


class _DurableWorker(_VerlWorker):  # type: ignore[misc]
    """verl's TransferQueue agent-loop worker, naming each training sample for its client."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not inherited: Ray ships an actor's methods by value, and verl's ``__init__`` calls
        # ``super()`` on a class Ray can only ship by value too (its module name is the actor
        # wrapper), so in the actor's process that copy would not be in this instance's MRO.
        _VerlWorker.__init__(self, *args, **kwargs)

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any) -> Any:
        if trajectory.get("validate"):
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        key = sample_key(str(kwargs["uid"]), int(kwargs["session_id"]))
        if self.llm_client.is_stored(key):
            return None  # finished before the restart and kept by verl's TransferQueue
        token = CURRENT_SAMPLE.set(key)
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        finally:
            CURRENT_SAMPLE.reset(token)

    # A record-only run (``record_events``, flag off) asks its workers what verl's clients hold.

    async def recorded(self) -> list[HeldSample]:
        """What this worker's :class:`RecordingLLMServerClient` holds of each training sample."""
        return self.llm_client.recorded()  # type: ignore[no-any-return]

    async def forget(self, keys: list[str]) -> None:
        self.llm_client.forget(keys)


DurableAgentLoopWorker = ray.remote(_DurableWorker)


class DurableAgentLoopManager(AgentLoopManagerTQ):  # type: ignore[misc]
    """verl's TransferQueue agent-loop manager with :data:`DurableAgentLoopWorker` workers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = DurableAgentLoopWorker
