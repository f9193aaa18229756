"""An engine that dies at any moment is handled and logged: while the pool starts, or while it holds nothing.

Real vLLM engines in real Ray actors on the tiny Llama, their processes SIGKILLed as an operator's
fault injection would (the actor's process and its descendants, vLLM's engine core among them). An
engine killed while the pool starts leaves a smaller pool that still generates (below
``min_engines`` a one-line error names it); an engine killed while idle is reported once, with
nothing carried, when the pool first calls it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from engine_kills import kill, kill_one_while_starting

from partial_rollout.engine import EngineConfig
from partial_rollout.pool import EnginePool, EngineStartError, Failover
from partial_rollout.snapshot import SamplingSpec

pytestmark = [pytest.mark.engine, pytest.mark.ray]

GREEDY = SamplingSpec(max_tokens=24, temperature=0.0, ignore_eos=True)


def _config(tiny_llama: Path) -> EngineConfig:
    return EngineConfig(
        model=str(tiny_llama), max_model_len=512, multiprocessing=False, kv_cache_memory_bytes=32 * 2**20
    )


async def _start_killing_one(config: EngineConfig, **options: object) -> EnginePool:
    """Start a pool of 2 and SIGKILL one engine's processes while both are still starting."""
    return await kill_one_while_starting(EnginePool.ray(config, 2, **options), 2)  # type: ignore[arg-type]


def test_an_engine_that_dies_while_the_pool_starts_leaves_a_smaller_pool_that_generates(
    loop_thread, tiny_llama: Path
) -> None:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:

        async def run() -> tuple[int, list[Failover], int, str]:
            pool = await _start_killing_one(_config(tiny_llama))
            try:
                reports: list[Failover] = []
                pool.failover.on_failover = reports.append  # told now: it died before anyone listened
                done = await pool.generate("r0", [5, 6, 7], GREEDY, index=0)
                await pool.cut()  # a cut asks no engine, and the dead one reports nothing more
                await pool.progress()
                return pool.live_engines, reports, done.num_tokens, str(done.state.value)
            finally:
                await pool.shutdown()
                for engine in pool.engines:
                    ray.kill(engine.actor)  # type: ignore[attr-defined]

        live, reports, tokens, state = loop_thread.run(run(), timeout=900)

        async def too_few() -> None:
            await _start_killing_one(_config(tiny_llama), min_engines=2)

        with pytest.raises(EngineStartError) as refused:
            loop_thread.run(too_few(), timeout=900)
    finally:
        ray.shutdown()

    assert live == 1 and tokens == GREEDY.max_tokens and state == "finished"
    (report,) = reports
    assert report.carried == {} and "start: the engine's Ray actor died" in report.error, report
    message = str(refused.value)
    assert "\n" not in message and "failed to start: the engine's Ray actor died" in message
    assert "(1 of 2 started, the run needs at least 2)" in message


def test_an_engine_that_dies_holding_no_request_is_reported_once_when_the_pool_calls_it(
    loop_thread, tiny_llama: Path
) -> None:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:

        async def run() -> tuple[list[Failover], int, int]:
            pool = await EnginePool.ray(_config(tiny_llama), 2)
            try:
                reports: list[Failover] = []
                pool.failover.on_failover = reports.append
                await pool.generate("warm", [5, 6], GREEDY, index=0)  # every request has returned: both idle
                victim = 1
                pid = await pool.engines[victim].actor.__ray_call__.remote(lambda _: os.getpid())  # type: ignore[attr-defined]
                kill(pid)
                await asyncio.sleep(0.5)
                await pool.cut()  # a cut asks no engine: it notices nothing
                await pool.progress()  # the first call that notices
                await pool.capabilities()  # and another: reported once
                done = await pool.generate("after", [5, 6, 7], GREEDY, index=0)
                return reports, pool.live_engines, done.num_tokens
            finally:
                await pool.shutdown()

        reports, live, tokens = loop_thread.run(run(), timeout=900)
    finally:
        ray.shutdown()

    (report,) = reports
    assert report.engine == 1 and report.carried == {} and report.fields()["requests"] == []
    assert "EngineDiedError: progress: the engine's Ray actor died" in report.error, report.error
    assert live == 1 and tokens == GREEDY.max_tokens
