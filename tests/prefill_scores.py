"""What one prefill says of a sample's tokens: the numerics a continuation meets, whose prefix is prefilled
where the uninterrupted run decoded it step by step.

A test compares a continued sample's logprobs with the uninterrupted run's within measured floors; the batch
floor (the same work in other batches) does not see this one, and on one OpenMP thread it is the larger.
"""

from __future__ import annotations

from typing import Any

import numpy as np


async def score(llm: Any, tokens: list[int], name: str) -> np.ndarray:
    """Logprob of each of ``tokens[1:]`` given those before it, from one prefill on plain vLLM ``llm`` (its own
    cache salt: no KV block of an earlier request is reused). These are raw logprobs: they are a sample's
    recorded (processed) ones at temperature 0 or 1 with no top-p / top-k."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    final = None
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    async for out in llm.generate(TokensPrompt(prompt_token_ids=tokens, cache_salt=f"score-{name}"), params, name):
        final = out
    assert final is not None and final.prompt_logprobs is not None
    return np.array([lp[t].logprob for lp, t in zip(final.prompt_logprobs[1:], tokens[1:], strict=True)])


async def prefill_gap(llm: Any, prompt: list[int], token_ids: np.ndarray, logprobs: np.ndarray, name: str) -> float:
    """Largest |logprob difference| between a decoded completion's logprobs and one prefill of prompt + completion."""
    scored = await score(llm, [*prompt, *token_ids.tolist()], name)
    return float(np.abs(scored[len(prompt) - 1 :] - logprobs).max())
