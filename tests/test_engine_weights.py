"""Weight updates on a real engine: samples after an update are on-policy, and every token carries its version.

The "new weights" are a second tiny Llama with the same tokenizer and another init scale, loaded
into the running engine through vLLM's ``reload_weights``; the reference is a fresh engine that only
ever had those weights.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model
from partial_rollout.snapshot import SamplingSpec

pytestmark = pytest.mark.engine

GREEDY = SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)
LONG = SamplingSpec(max_tokens=300, temperature=0.0, ignore_eos=True)
PROMPT = [random.Random(5).randrange(4, 500) for _ in range(600)]


def test_update_is_on_policy_and_labels_each_token(loop_thread, tiny_llama: Path) -> None:
    new_weights = build_tiny_model(TinyModelSpec(arch="llama", init_range=0.3))
    old = EngineConfig(model=str(tiny_llama), max_model_len=1024, multiprocessing=False)

    async def updated():
        engine = await ResumableEngine.start(old)
        try:
            await engine.generate("warm-cache", PROMPT, GREEDY, index=0)  # the prompt's blocks, old weights
            spanning = asyncio.ensure_future(engine.generate("spanning", [7, 8, 9], LONG, index=0))
            while True:  # polling: the engine's counters have no event to wait on
                if (await engine.progress()).live_tokens.get("spanning", 0) >= 20:
                    break
                await asyncio.sleep(0.005)
            await engine.update_weights(str(new_weights), 1)
            at_update = (await engine.progress()).live_tokens["spanning"]
            spanned = await spanning
            after = await engine.generate("after", PROMPT, GREEDY, index=0)  # alone, like the reference
            return after, spanned, at_update
        finally:
            await engine.shutdown()

    async def fresh():
        engine = await ResumableEngine.start(
            EngineConfig(model=str(new_weights), max_model_len=1024, multiprocessing=False), policy_version=1
        )
        try:
            return await engine.generate("fresh", PROMPT, GREEDY, index=0)
        finally:
            await engine.shutdown()

    after, spanning, at_update = loop_thread.run(updated())
    reference = loop_thread.run(fresh())

    # a prompt whose blocks the old weights cached is computed under the new weights
    np.testing.assert_array_equal(after.token_ids, reference.token_ids)
    np.testing.assert_allclose(after.logprobs, reference.logprobs, rtol=0, atol=1e-5)
    assert (after.versions == 1).all()

    # a request running across the update: version 0 up to the boundary, 1 after it, one boundary
    boundary = int(np.argmax(spanning.versions))
    assert 20 <= boundary <= at_update < spanning.num_tokens
    assert (spanning.versions[:boundary] == 0).all() and (spanning.versions[boundary:] == 1).all()
