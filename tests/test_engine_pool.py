"""N engines behind Ray actors and one in-process engine are the same code path.

A cut taken from a pool of two Ray-actor engines resumes on a single in-process engine (N=2 at the
save, M=1 at the resume) and every sample continues token for token.

In float32: resumed concurrently, in other batches than the reference, a bf16 engine flips a
near-tied token now and then whatever the resume does (docs/exact_resume.md: 94-100% of samples
identical at these lengths, as for the engine's own noise floor); one CI run saw r4 leave the
reference at token 548 of 600. In float32 the logprob noise is about 1e-5, so a flip here is a bug.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.engine.factory import make_async_engine
from partial_rollout.engine.resumable import with_worker_hooks
from partial_rollout.pool import EnginePool
from partial_rollout.snapshot import SampleState, SamplingSpec

pytestmark = [pytest.mark.engine, pytest.mark.ray]


def test_ray_pool_cut_resumes_on_a_local_engine(loop_thread, tiny_llama: Path) -> None:
    ray = pytest.importorskip("ray")
    config = EngineConfig(model=str(tiny_llama), max_model_len=1024, multiprocessing=False, dtype="float32")
    rng = random.Random(3)
    work = {
        f"r{i}": (
            [rng.randrange(4, 500) for _ in range(rng.randrange(8, 60))],
            SamplingSpec(
                max_tokens=300,
                temperature=0.0 if i % 3 == 0 else 1.0,
                seed=None if i % 3 == 0 else 10 + i,
                ignore_eos=True,
            ),
        )
        for i in range(8)
    }
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:

        async def save_side():
            pool = await EnginePool.ray(config, 2)
            try:
                assert len(pool.engines) == 2
                tasks = {rid: asyncio.ensure_future(pool.generate(rid, p, s, index=0)) for rid, (p, s) in work.items()}
                # Cut mid-generation whatever the machine's speed (the engine's counters have no event to wait on).
                while (await pool.progress()).tokens_received < 64:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                cut = await pool.cut()
                return {rid: await t for rid, t in tasks.items()}, cut, await pool.fingerprints()
            finally:
                await pool.shutdown()

        ref, cut, prints = loop_thread.run(save_side())
    finally:
        ray.shutdown()
    assert set(cut.samples) == set(work)
    assert any(r.state is SampleState.IN_FLIGHT and r.num_tokens > 0 for r in cut.samples.values())

    async def resume_side():
        llm = make_async_engine(with_worker_hooks(config))
        pool = EnginePool([await ResumableEngine.attach(llm, with_worker_hooks(config))])
        try:
            assert await pool.fingerprints() == prints
            resumed = await asyncio.gather(
                *[pool.generate(rid, work[rid][0], work[rid][1], index=0, resume_from=cut.samples[rid]) for rid in work]
            )
            # the noise floor: the same work from scratch, uninterrupted, in other batches (staggered
            # in reverse order, so prefills share steps with decodes, as the resumed prefixes did)
            scratch = {}
            for rid in reversed(work):
                scratch[rid] = asyncio.ensure_future(pool.generate(f"scratch-{rid}", *work[rid], index=0))
                await asyncio.sleep(0.05)
            # the prefill floor: a continuation prefills its prefix where the reference decoded it step
            # by step; the reference's own tokens scored in one prefill measure what that path moves
            prefill = [await _score(llm, work[rid][0] + ref[rid].token_ids.tolist(), rid) for rid in work]
            # the continuation's own batch noise: the same continuations again in two halves, one
            # after the other (other batches than all together)
            halves = []
            for half in (list(work)[::2], list(work)[1::2]):
                halves += await asyncio.gather(
                    *[pool.generate(f"half-{rid}", *work[rid], index=0, resume_from=cut.samples[rid]) for rid in half]
                )
            again = dict(zip(list(work)[::2] + list(work)[1::2], halves, strict=True))
            return resumed, [await scratch[rid] for rid in work], prefill, [again[rid] for rid in work]
        finally:
            await pool.shutdown()

    resumed, scratch, prefill, halves = loop_thread.run(resume_side())
    noise_floor = 0.0
    for out, half in zip(resumed, halves, strict=True):
        differ = np.flatnonzero(out.token_ids != half.token_ids)
        upto = int(differ[0]) if len(differ) else out.num_tokens
        noise_floor = max(noise_floor, float(np.abs(out.logprobs[:upto] - half.logprobs[:upto]).max(initial=0)))
    for rid, scored in zip(work, prefill, strict=True):
        noise_floor = max(noise_floor, float(np.abs(scored[len(work[rid][0]) - 1 :] - ref[rid].logprobs).max()))
    for rid, again in zip(work, scratch, strict=True):
        differ = np.flatnonzero(again.token_ids != ref[rid].token_ids)
        upto = int(differ[0]) if len(differ) else again.num_tokens
        noise_floor = max(noise_floor, float(np.abs(again.logprobs[:upto] - ref[rid].logprobs[:upto]).max(initial=0)))
    print(f"noise floor {noise_floor:.3g}")
    for rid, out in zip(work, resumed, strict=True):
        assert out.inexact is None
        np.testing.assert_array_equal(out.token_ids, ref[rid].token_ids, err_msg=rid)
        # concurrent on both sides: logprobs agree within the engine's noise floor (docs/exact_resume.md)
        np.testing.assert_allclose(out.logprobs, ref[rid].logprobs, rtol=0, atol=noise_floor, err_msg=rid)


async def _score(llm, tokens: list[int], name: str) -> np.ndarray:
    """Logprob of each of ``tokens[1:]`` given those before it, from one prefill (its own cache salt:
    no KV block of an earlier request is reused). The samples here use temperature 0 or 1 and no
    top-p / top-k, where the recorded (processed) logprobs are these raw ones."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    final = None
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    async for out in llm.generate(TokensPrompt(prompt_token_ids=tokens, cache_salt=f"score-{name}"), params, name):
        final = out
    assert final is not None and final.prompt_logprobs is not None
    return np.array([lp[t].logprob for lp, t in zip(final.prompt_logprobs[1:], tokens[1:], strict=True)])
