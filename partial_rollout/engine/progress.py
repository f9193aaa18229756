"""Count engine steps through vLLM's public stat-logger interface.

Seconds are a poor clock on a shared machine; engine steps are not: a recovery that needs 1,000
decode steps needs them however busy the host is. vLLM calls every stat logger once per engine
iteration, with an ``IterationStats`` when that iteration produced outputs, so a logger that only
counts those calls measures steps without touching the engine's internals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class StepCount:
    """Running totals over the engine's life; read them before and after an interval."""

    steps: int = 0
    """Engine iterations that produced outputs."""
    generation_tokens: int = 0
    """Tokens sampled in those iterations, as vLLM's own statistics count them."""


def step_logger_factory(count: StepCount) -> Callable[[Any, int], Any]:
    """A per-engine stat-logger factory for ``AsyncLLM(stat_loggers=[...])`` that adds into ``count``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepLogger(StatLoggerBase):  # type: ignore[misc]  # vLLM's class is untyped to mypy
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if iteration_stats is None:
                return
            count.steps += 1
            count.generation_tokens += int(getattr(iteration_stats, "num_generation_tokens", 0))

        def log_engine_initialized(self) -> None:
            pass

    return StepLogger
