"""Every call the benchmark makes on an engine, and nothing else.

The rest of the benchmark sees an opaque engine object and these functions, so a change to the
engine's interface (:class:`~partial_rollout.engine.protocol.RolloutEngine`) is adapted here alone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec

if TYPE_CHECKING:
    from partial_rollout.engine import Cut, EngineConfig, Progress, ResumableEngine


async def start(config: EngineConfig) -> tuple[ResumableEngine, float]:
    """A fresh engine (new engine-core process, cold KV cache) counting its steps; and its start-up seconds."""
    from partial_rollout.engine import ResumableEngine

    t = time.perf_counter()
    engine = await ResumableEngine.start(config, count_steps=True)
    return engine, time.perf_counter() - t


async def generate(
    engine: ResumableEngine,
    rid: str,
    prompt: list[int],
    sampling: SamplingSpec,
    *,
    index: int,
    resume_from: SampleRecord | None = None,
) -> SampleRecord:
    """Generate sample ``index`` of a group to the end; with ``resume_from``, continue that saved prefix."""
    return await engine.generate(rid, prompt, sampling, index=index, resume_from=resume_from)


async def fingerprints(engine: ResumableEngine) -> Fingerprints:
    return await engine.fingerprints()


async def progress(engine: ResumableEngine) -> Progress:
    """Live tokens per request and engine steps (always counted: :func:`start` asks for them)."""
    return await engine.progress()


async def pause_and_capture(engine: ResumableEngine) -> Cut:
    return await engine.pause_and_capture()


async def resume(engine: ResumableEngine) -> None:
    await engine.resume()


async def reset_prefix_cache(engine: ResumableEngine) -> None:
    await engine.reset_prefix_cache()


async def shutdown(engine: ResumableEngine) -> None:
    await engine.shutdown()
