"""Every call the benchmark makes on an engine, and nothing else.

The rest of the benchmark sees an opaque engine object and these functions, so a change to the
engine's interface (:class:`~partial_rollout.engine.protocol.RolloutEngine`) is adapted here alone.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from benchmarks.resume.steps import StepLog, recorder
from partial_rollout.pool import EnginePool, RemoteEngine
from partial_rollout.pool.pool import _EngineHost  # the pool's actor body: RecordingHost is it, recording
from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec

if TYPE_CHECKING:
    from partial_rollout.engine import Cut, EngineConfig, Progress, ResumableEngine


async def start_recording(config: EngineConfig, log: StepLog) -> ResumableEngine:
    """A fresh engine that counts its steps (:meth:`progress`) and records each one's engine-side time in ``log``.

    Started as a trainer starts its own vLLM engine and hands it over (:meth:`ResumableEngine.attach`),
    because that is the one way to add a stat logger of our own (:func:`benchmarks.resume.steps.recorder`).
    """
    from partial_rollout.engine import ResumableEngine, with_worker_hooks
    from partial_rollout.engine.factory import make_async_engine
    from partial_rollout.engine.progress import StepCount, step_logger_factory

    config = with_worker_hooks(config)
    steps = StepCount()
    llm = make_async_engine(config, stat_loggers=[step_logger_factory(steps), recorder(log)])
    try:
        return await ResumableEngine.attach(llm, config, steps=steps)
    except BaseException:
        llm.shutdown(timeout=config.shutdown_timeout_s)
        raise


async def start(config: EngineConfig) -> tuple[ResumableEngine, float, StepLog]:
    """A fresh engine (new engine-core process, cold KV cache) counting and timing its steps; its start-up seconds."""
    t = time.perf_counter()
    log = StepLog()
    engine = await start_recording(config, log)
    return engine, time.perf_counter() - t, log


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


async def cut(engine: ResumableEngine) -> Cut:
    """Every request in flight as received so far; the engine goes on generating (nothing inside awaits)."""
    return await engine.cut()


async def reset_prefix_cache(engine: ResumableEngine) -> None:
    await engine.reset_prefix_cache()


async def shutdown(engine: ResumableEngine) -> None:
    await engine.shutdown()


# --- engines in Ray actors -----------------------------------------------------------------------


class RecordingHost(_EngineHost):
    """The pool's own engine actor, with an engine that also records each step's engine-side time.

    The pool's host starts its engine with ``ResumableEngine.start``, which has no place for a stat
    logger of ours; this one starts it as :func:`start_recording` does and otherwise is the pool's
    (the same ``call`` and ``stream``, so :class:`~partial_rollout.pool.RemoteEngine` drives it).
    """

    log: StepLog

    async def start(self, config: EngineConfig, options: dict[str, Any]) -> None:
        from partial_rollout.pool import cluster

        cluster.pin()  # before vLLM starts: its engine core's processes inherit the core group
        self.log = StepLog()
        self.engine = await start_recording(config, self.log)

    async def step_log(self) -> StepLog:
        return self.log


async def ray_pool(config: EngineConfig, num_engines: int) -> EnginePool:
    """``num_engines`` recording engines in Ray actors, placed as :meth:`EnginePool.ray` places them (own cores)."""
    import ray

    from partial_rollout.pool import cluster

    host = ray.remote(RecordingHost)
    actors = [host.options(**o).remote() for o in cluster.placements(num_engines)]
    await asyncio.gather(*[a.start.remote(config, {}) for a in actors])
    return EnginePool([RemoteEngine(a) for a in actors])


async def step_logs(pool: EnginePool) -> list[StepLog]:
    """Each engine's step log, in pool order (the engines of :func:`ray_pool`)."""
    logs: list[StepLog] = await asyncio.gather(
        *[e.actor.step_log.remote() for e in pool.engines if isinstance(e, RemoteEngine)]
    )
    return logs
