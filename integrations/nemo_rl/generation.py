"""The generation backend NeMo RL's native rollout calls, on partial-rollout's resumable engines.

NeMo RL's ``AsyncRolloutImpl`` asks its ``policy_generation`` for one sample at a time through
``generate_async(BatchedDataDict)`` (input ids and lengths, stop strings) and reads back output ids,
logprobs, lengths and a truncation flag. :class:`EngineGeneration` answers that call with our engine
(one in this process or N behind Ray actors, the same :class:`~partial_rollout.engine.RolloutEngine`),
so every sample is a named, seeded request the session can cut and continue. Which sample a call is
for comes from :data:`~.session.CURRENT_SAMPLE`, set by the rollout wrapper.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import torch

from partial_rollout.engine import RolloutEngine
from partial_rollout_integrations.nemo_rl.session import CURRENT_SAMPLE, GenerationSettings, Session


class EngineGeneration:
    """NeMo RL's ``GenerationInterface`` subset used by the native async rollout, on our engines."""

    requires_kv_scale_sync = False

    def __init__(self, engine: RolloutEngine, settings: GenerationSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.session: Session | None = None
        """Set by the controller when it installs partial rollouts; without it every call is an
        anonymous, unseeded request, as NeMo RL's own vLLM worker makes them."""

    async def generate_async(self, data: Any, greedy: bool = False) -> AsyncIterator[tuple[int, Any]]:
        """Generate the one sample in ``data``; yields ``(0, output)`` in NeMo RL's output layout."""
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict

        if greedy or len(data["input_lengths"]) != 1:
            raise ValueError("EngineGeneration generates one sampled (not greedy) sequence per call")
        length = int(data["input_lengths"][0])
        input_ids = data["input_ids"][0, :length]
        ctx = CURRENT_SAMPLE.get()
        stop = data.get("stop_strings", [None])[0]
        if self.session is not None and ctx is not None:
            record = await self.session.generate(ctx, input_ids.tolist(), stop)
        else:
            sampling = self.settings.sampling(None, 0, length, stop)
            record = await self.engine.generate(str(uuid.uuid4()), input_ids.tolist(), sampling, index=0)
        n = record.num_tokens
        output_ids = torch.cat([input_ids, torch.as_tensor(record.token_ids, dtype=input_ids.dtype)]).unsqueeze(0)
        logprobs = torch.zeros((1, length + n), dtype=torch.float32)
        logprobs[0, length:] = torch.as_tensor(record.logprobs)
        yield (
            0,
            BatchedDataDict(
                {
                    "output_ids": output_ids,
                    "logprobs": logprobs,
                    "generation_lengths": torch.tensor([n], dtype=torch.long),
                    "unpadded_sequence_lengths": torch.tensor([length + n], dtype=torch.long),
                    "truncated": torch.tensor([record.finish_reason == "length"]),
                }
            ),
        )

    def invalidate_kv_cache(self) -> bool:
        """Nothing to do: our engines salt their prefix cache with the policy version."""
        return True

    def shutdown(self) -> bool:
        import asyncio

        asyncio.run(self.engine.shutdown())
        return True
