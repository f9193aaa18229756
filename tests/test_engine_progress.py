"""The adapter's progress counters on a real engine: live tokens per request, and engine steps.

Benchmarks and trainers read these instead of the adapter's internals, so they must agree with
what the engine actually did: a lone request makes one token per step, and a cut holds exactly
the tokens the live counter showed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.snapshot import SampleState, SamplingSpec

pytestmark = pytest.mark.engine


def test_steps_and_live_tokens_match_the_engine(loop_thread, tiny_llama: Path) -> None:
    config = EngineConfig(model=str(tiny_llama), max_model_len=1024, multiprocessing=False)

    async def run():
        engine = await ResumableEngine.start(config, count_steps=True)
        try:
            start = await engine.progress()
            assert start.steps is not None and start.steps > 0  # the warm-up request ran
            alone = await engine.generate(
                "alone", [5, 6, 7], SamplingSpec(max_tokens=20, temperature=0.0, ignore_eos=True), index=0
            )
            end = await engine.progress()
            lone = (end.steps - start.steps, end.generation_tokens - start.generation_tokens)
            assert end.tokens_received - start.tokens_received == 20

            spec = SamplingSpec(max_tokens=400, temperature=1.0, seed=3, ignore_eos=True)
            tasks = {
                rid: asyncio.ensure_future(engine.generate(rid, [9, 10 + i], spec, index=i))
                for i, rid in enumerate(("a", "b"))
            }
            while True:
                live = (await engine.progress()).live_tokens
                if min(live.get(rid, 0) for rid in tasks) >= 10:
                    break
                await asyncio.sleep(0.005)
            cut = await engine.cut()
            frozen = (await engine.progress()).live_tokens  # the same turn: nothing was received in between
            # no resume anywhere: the engine was never paused, so the requests run to their end
            done = await asyncio.gather(*tasks.values())
            after_done = (await engine.progress()).live_tokens
            await engine.reset_prefix_cache()
            return alone, lone, cut, frozen, done, after_done
        finally:
            await engine.shutdown()

    alone, (steps, generated), cut, frozen, done, after_done = loop_thread.run(run())
    assert alone.num_tokens == 20
    assert steps == 20 and generated == 20, "a lone request samples one token per engine step"
    for rid in ("a", "b"):
        record = cut.samples[rid]
        assert record.state is SampleState.IN_FLIGHT
        assert record.index == ("a", "b").index(rid), "a cut record carries the index it was submitted with"
        assert frozen[rid] == record.num_tokens >= 10
    assert all(r.num_tokens == 400 for r in done)
    assert after_done == {}, "finished requests leave the live counter"
