"""Every call the benchmark makes on an engine, and nothing else.

The engine's API is still moving; keeping its calls here means a change to it is adapted in this
file alone. The rest of the benchmark sees an opaque engine object and these functions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec

if TYPE_CHECKING:
    from partial_rollout.engine.adapter import Cut
    from partial_rollout.engine.factory import EngineConfig


@dataclass(frozen=True)
class Progress:
    """The engine's progress counters at one instant."""

    live_tokens: dict[str, int]
    """Tokens each running request has generated on this engine so far (a resumed prefix not counted)."""
    steps: int
    """Engine steps that produced outputs since the engine started."""


async def start(config: EngineConfig) -> tuple[Any, float]:
    """A fresh engine (new engine-core process, cold KV cache) counting its steps; and its start-up seconds."""
    from partial_rollout.engine.adapter import ResumableEngine

    t = time.perf_counter()
    engine = await ResumableEngine.start(config, count_steps=True)
    return engine, time.perf_counter() - t


async def generate(
    engine: Any, rid: str, prompt: list[int], sampling: SamplingSpec, *, index: int,
    resume_from: SampleRecord | None = None,
) -> SampleRecord:
    """Generate sample ``index`` of a group to the end; with ``resume_from``, continue that saved prefix."""
    del index  # the sample index is in ``rid`` for this engine API
    return await engine.generate(rid, prompt, sampling, resume_from=resume_from)


async def fingerprints(engine: Any) -> Fingerprints:
    return engine.fingerprints()


async def progress(engine: Any) -> Progress:
    return Progress(live_tokens=engine.live_tokens(), steps=engine.steps.steps)


async def pause_and_capture(engine: Any) -> Cut:
    return await engine.pause_and_capture()


async def resume(engine: Any) -> None:
    await engine.resume()


async def reset_prefix_cache(engine: Any) -> None:
    await engine.reset_prefix_cache()


async def shutdown(engine: Any) -> None:
    await engine.shutdown()
