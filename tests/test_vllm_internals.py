"""A vLLM without one of the private names the adapter uses degrades at start; it never crashes later.

A cut uses none of them, so cuts are the same whatever is missing. Each test starts a real engine,
then hides an internal the way a vLLM release that renamed it would look to the probe: the V1
restore hook's generator field is dropped from the dataclass field list of the worker's
per-request state (vLLM itself no longer reads that list once the class's ``__init__`` exists), or
the front end's output queue is hidden from the adapter behind a proxy (vLLM itself still uses
it). Only then does :meth:`ResumableEngine.attach` probe the engine, and the test drives a cut, a
resume and (without the queue) a weight update through it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cloudpickle
import pytest

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.engine.factory import make_async_engine
from partial_rollout.engine.resumable import with_worker_hooks
from partial_rollout.errors import ConfigError
from partial_rollout.snapshot import SampleState, SamplingSpec

pytestmark = pytest.mark.engine

SEEDED = SamplingSpec(max_tokens=120, temperature=1.0, seed=11, ignore_eos=True)
GREEDY = SamplingSpec(max_tokens=120, temperature=0.0, ignore_eos=True)


def _drop_field(worker: Any, name: str) -> None:
    """Runs in the worker: ``CachedRequestState`` as a vLLM without field ``name`` would show it."""
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    fields = {k: v for k, v in CachedRequestState.__dataclass_fields__.items() if k != name}
    CachedRequestState.__dataclass_fields__ = fields


async def _engine_without(config: EngineConfig, field: str, **options: Any) -> ResumableEngine:
    config = with_worker_hooks(config)
    llm = make_async_engine(config)
    try:
        await llm.collective_rpc(cloudpickle.dumps(_drop_field), kwargs={"name": field})
        return await ResumableEngine.attach(llm, config, **options)
    except BaseException:
        llm.shutdown()
        raise


async def _cut_and_resume(engine: ResumableEngine) -> tuple[dict, dict, list]:
    work = {"seeded": SEEDED, "greedy": GREEDY}
    tasks = {
        rid: asyncio.ensure_future(engine.generate(rid, [7, 8, 9 + i], spec, index=i))
        for i, (rid, spec) in enumerate(work.items())
    }
    while True:
        live = (await engine.progress()).live_tokens
        if len(live) == 2 and min(live.values()) >= 10:
            break
        await asyncio.sleep(0.005)
    cut = await engine.cut()
    uninterrupted = {rid: await t for rid, t in tasks.items()}
    resumed = [
        await engine.generate(f"again-{rid}", [7, 8, 9 + i], work[rid], index=i, resume_from=cut.samples[rid])
        for i, rid in enumerate(work)
    ]
    return cut.samples, uninterrupted, resumed


def test_missing_generator_field_degrades_to_inexact_seeded_resume(loop_thread, tiny_llama: Path) -> None:
    config = EngineConfig(model=str(tiny_llama), max_model_len=512, multiprocessing=False)

    async def run():
        with pytest.warns(UserWarning, match=r"seeded samples will resume inexactly: .*CachedRequestState\.generator"):
            engine = await _engine_without(config, "generator")
        try:
            caps = await engine.capabilities()
            return caps, await _cut_and_resume(engine)
        finally:
            await engine.shutdown()

    caps, (cut, uninterrupted, resumed) = loop_thread.run(run())
    assert caps.verified_updates and not caps.exact
    seeded, greedy = cut["seeded"], cut["greedy"]
    assert seeded.state is SampleState.IN_FLIGHT and seeded.sampler_state is None
    assert "CachedRequestState.generator" in seeded.inexact
    assert greedy.inexact is None, "greedy needs no sampler state: it stays exact"
    for record, full in zip((seeded, greedy), uninterrupted.values(), strict=True):
        assert (record.token_ids == full.token_ids[: record.num_tokens]).all(), "the cut is what was received"
    assert [r.num_tokens for r in resumed] == [120, 120]
    assert (resumed[1].token_ids == uninterrupted["greedy"].token_ids).all()

    async def refuse():
        await _engine_without(config, "generator", require_exact=True)

    with pytest.raises(ConfigError, match=r"require_exact: .*CachedRequestState\.generator"):
        loop_thread.run(refuse())


class _HiddenQueue:
    """The front end as a vLLM whose engine-core client has no ``outputs_queue`` would show it to the adapter
    (vLLM's own output handler keeps using the real one)."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def __getattr__(self, name: str) -> Any:
        if name == "engine_core":
            return SimpleNamespace()
        return getattr(self._llm, name)


def test_missing_output_queue_degrades_weight_updates_to_vllms_own_wait_and_nothing_else(
    loop_thread, tiny_llama: Path
) -> None:
    config = with_worker_hooks(EngineConfig(model=str(tiny_llama), max_model_len=512, multiprocessing=False))

    async def run():
        llm = make_async_engine(config)
        try:
            with pytest.warns(UserWarning, match=r"unverified weight-update boundaries: .*engine_core\.outputs_queue"):
                engine = await ResumableEngine.attach(_HiddenQueue(llm), config)
        except BaseException:
            llm.shutdown()
            raise
        try:
            task = asyncio.ensure_future(engine.generate("r", [7, 8, 9], GREEDY, index=0))
            while not (await engine.progress()).live_tokens.get("r"):  # noqa: ASYNC110 - counters have no event
                await asyncio.sleep(0.005)
            await engine.update_weights(str(tiny_llama), 1)  # the same weights, under vLLM's pause alone
            return await engine.capabilities(), await task, await _cut_and_resume(engine)
        finally:
            await engine.shutdown()

    caps, updated, (cut, uninterrupted, resumed) = loop_thread.run(run())
    assert caps.exact and not caps.verified_updates and "engine_core.outputs_queue" in caps.reason
    assert updated.num_tokens == 120 and set(updated.versions.tolist()) <= {0, 1} and updated.versions[-1] == 1
    for rid, record in cut.items():  # cuts and exact resumes are untouched
        assert record.inexact is None and (record.token_ids == uninterrupted[rid].token_ids[: record.num_tokens]).all()
    assert all(
        (r.token_ids == uninterrupted[rid].token_ids).all() for rid, r in zip(uninterrupted, resumed, strict=True)
    )
