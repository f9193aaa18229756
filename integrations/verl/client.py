"""The verl side of a sample's identity: its agent-loop worker names it, its client carries it.

verl's agent-loop worker runs each sample of a prompt as one task (``_run_agent_loop``, with the
prompt's TransferQueue ``uid`` and the sample's ``session_id``); the client it hands to the agent
loop sends each attempt to a server under a fresh request id. Here the worker sets the sample's
stable key for the task (a context variable, so nothing in verl's agent loop changes) and the
client adds it to every attempt, with the snapshot's record of the sample after a restart. A
sample a restart finds finished in verl's restored TransferQueue is not run again (verl would
delete it and regenerate its whole group); one restored finished but not yet stored there is
handed back from the snapshot without engine work.
"""

from __future__ import annotations

import contextvars
from collections.abc import Collection, Mapping
from typing import Any

import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient
from verl.workers.rollout.replica import TokenOutput

from partial_rollout.snapshot import SampleState
from partial_rollout_integrations.seams import unwrap
from partial_rollout_integrations.verl.wire import RESUME_FROM, SAMPLE_KEY, HeldSample, sample_key

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


DurableAgentLoopWorker = ray.remote(_DurableWorker)


class DurableAgentLoopManager(AgentLoopManagerTQ):  # type: ignore[misc]
    """verl's TransferQueue agent-loop manager with :data:`DurableAgentLoopWorker` workers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = DurableAgentLoopWorker
