"""A cut while vLLM's scheduler preempts requests for lack of KV cache, and a resume under the same pressure.

The KV cache holds 1,024 tokens (512 KiB of the tiny Llama's 512 bytes per token) and eight requests
grow towards 16 + 300 tokens each, so vLLM preempts (recompute mode: a preempted request loses its
KV blocks, waits, and is prefilled again). vLLM's own statistics (its public stat-logger interface)
show that, when the cut was taken, fewer requests were running than had produced tokens (the others
were preempted and waiting), and count the preemptions. Every request is in the cut once, with
exactly the tokens it had received, which are the first tokens of what it goes on to generate; the
cut samples then resume to completion on the same, still too small, cache.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.engine.factory import make_async_engine
from partial_rollout.engine.resumable import with_worker_hooks
from partial_rollout.snapshot import SampleState, SamplingSpec

pytestmark = pytest.mark.engine

KV_TOKENS = 1024
KV_BYTES_PER_TOKEN = 512
"""2 layers x (K, V) x 2 KV heads x head_dim 32 x 2 bytes (bf16)."""
MAX_TOKENS = 300
RNG = random.Random(8)
WORK = {
    f"r{i}": (
        [RNG.randrange(4, 500) for _ in range(16)],
        SamplingSpec(
            max_tokens=MAX_TOKENS,
            temperature=0.0 if i % 2 else 1.0,
            seed=None if i % 2 else 40 + i,
            ignore_eos=True,
        ),
    )
    for i in range(8)
}


class SchedulerWatch:
    """Totals from vLLM's per-step statistics: preemptions, and the queues at the latest step."""

    def __init__(self) -> None:
        self.preemptions = 0
        self.waiting = 0
        self.running = 0

    def factory(self) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        watch = self

        class Logger(StatLoggerBase):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx=0):
                if iteration_stats is not None:
                    watch.preemptions += int(iteration_stats.num_preempted_reqs)
                if scheduler_stats is not None:
                    watch.waiting = int(scheduler_stats.num_waiting_reqs)
                    watch.running = int(scheduler_stats.num_running_reqs)

            def log_engine_initialized(self) -> None:
                pass

        return Logger


def test_cut_and_resume_while_the_scheduler_preempts(loop_thread, tiny_llama: Path) -> None:
    watch = SchedulerWatch()
    config = with_worker_hooks(
        EngineConfig(
            model=str(tiny_llama),
            max_model_len=512,
            kv_cache_memory_bytes=KV_TOKENS * KV_BYTES_PER_TOKEN,
            enable_prefix_caching=False,
            multiprocessing=False,
        )
    )

    async def run():
        llm = make_async_engine(config, stat_loggers=[watch.factory()])
        try:
            engine = await ResumableEngine.attach(llm, config)
        except BaseException:
            llm.shutdown()
            raise
        try:
            tasks = {rid: asyncio.ensure_future(engine.generate(rid, p, s, index=0)) for rid, (p, s) in WORK.items()}
            while True:  # until more requests have started than run: the others were preempted
                live = (await engine.progress()).live_tokens
                started = sum(1 for n in live.values() if n > 0)
                if watch.waiting and started > watch.running:
                    break
                assert not any(t.done() for t in tasks.values()), "a request finished before any preemption"
                await asyncio.sleep(0.002)
            at_cut = {"started": started, "waiting": watch.waiting, "running": watch.running}
            cut = await engine.cut()
            held = (await engine.progress()).live_tokens  # the same turn: what each request had received
            uninterrupted = {rid: await t for rid, t in tasks.items()}
            preempted_before_resume = watch.preemptions
            resumed = await asyncio.gather(
                *[
                    engine.generate(f"{rid}-resumed", p, s, index=0, resume_from=cut.samples[rid])
                    for rid, (p, s) in WORK.items()
                ]
            )
            return at_cut, cut, held, uninterrupted, dict(zip(WORK, resumed, strict=True)), preempted_before_resume
        finally:
            await engine.shutdown()

    at_cut, cut, held, uninterrupted, resumed, preempted_before_resume = loop_thread.run(run())

    # vLLM really preempted: at the cut, requests that had produced tokens were waiting, not running (its
    # preemption events reach the statistics only with a preempted request's next output, so they are
    # counted after the cut)
    assert at_cut["started"] > at_cut["running"] and at_cut["waiting"] > 0, at_cut
    assert preempted_before_resume > 0
    # every request once, with exactly the tokens it had received, which its own generation went on from
    assert set(cut.samples) == set(WORK)
    for rid, record in cut.samples.items():
        assert record.state is (SampleState.IN_FLIGHT if held[rid] else SampleState.NOT_STARTED), rid
    assert {rid: r.num_tokens for rid, r in cut.samples.items()} == held
    assert cut.engine_tokens == sum(held.values())
    for rid, record in cut.samples.items():
        k = record.num_tokens
        np.testing.assert_array_equal(uninterrupted[rid].token_ids[:k], record.token_ids, err_msg=rid)
        np.testing.assert_array_equal(uninterrupted[rid].logprobs[:k], record.logprobs, err_msg=rid)
    # the cut samples resume to completion on the same, too small, cache (which keeps preempting)
    assert watch.preemptions > preempted_before_resume
    for rid, done in resumed.items():
        record = cut.samples[rid]
        assert done.state is SampleState.FINISHED and done.num_tokens == MAX_TOKENS, rid
        np.testing.assert_array_equal(done.token_ids[: record.num_tokens], record.token_ids, err_msg=rid)
        np.testing.assert_array_equal(done.logprobs[: record.num_tokens], record.logprobs, err_msg=rid)
