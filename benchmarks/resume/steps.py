"""Engine steps timed on the engine's side, and the decode steps a save costs an engine that never pauses.

A save no longer pauses the engine: ``cut()`` reads what the front end has received and the
engine core (its own process) keeps stepping. What a save can still cost it is CPU time: the cut,
the in-memory snapshot and the write that follows run on the cores the engine core runs on. So the
cost of a save is measured as steps: how many decode steps the engine would have run over the
save's window at its steady rate, minus the steps it did run.

That needs each step's time as the *engine* ran it. The step counter of
:mod:`partial_rollout.engine.progress` counts steps when the front end processes their outputs, and
the front end is exactly what a save blocks: counted there, every step of the save's window would
land after it, and the engine would look stopped when it was not. vLLM's per-step statistics carry
the engine's own clock in one place: the inter-token latency of every request in the step, the
engine-core timestamp of this step's outputs minus that of the request's previous token. Every
request that decoded in the previous step has the previous step's timestamp, so the smallest
latency of a step is that step's duration on the engine's clock. Summed, the durations give each
step's end up to one offset per run of consecutive steps; the offset is the one that puts each
step's end at or before the moment the front end processed it, as close as any step came (the
front end reads an output within a fraction of a millisecond when it is idle). A step with no
decoding request (the engine was idle, or only prefilled) has no duration; the steps after it
start a new run, and a window that crosses such a gap is not measured (``nan``).

The clock is ``time.perf_counter``, which on Linux reads the same monotonic clock as vLLM's
engine-core timestamps and every process on the machine (Ray actors included).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STEADY_STEPS = 32
"""Steps before a save over which the engine's steady rate is taken (fewer if it has not run that many)."""
MIN_STEADY_STEPS = 4
"""Fewest steps a steady rate is taken over; fewer and the save is not measured."""
OUTLIER = 4.0
"""A step this many times the median of its neighbours is not the engine's pace (``Timeline.steady(robust=True)``)."""
AFTER_STEPS = 16
"""Steady step times the window after a save extends past the snapshot's write (see :func:`windows`)."""


@dataclass
class StepLog:
    """Every engine step that produced outputs, as the engine's front end processed it (filled by :func:`recorder`).

    Plain lists, so that an engine in a Ray actor can send its log to the driver.
    """

    received: list[float] = field(default_factory=list)
    """``time.perf_counter()`` when the front end processed the step's outputs."""
    tokens: list[int] = field(default_factory=list)
    """Tokens sampled in the step (vLLM's own count)."""
    durations: list[float] = field(default_factory=list)
    """The step's duration on the engine's clock (its smallest inter-token latency); ``nan`` when no
    request decoded in it."""


def recorder(log: StepLog) -> Callable[[Any, int], Any]:
    """A vLLM stat-logger factory (``AsyncLLM(stat_loggers=[...])``) that appends every step to ``log``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepRecorder(StatLoggerBase):  # type: ignore[misc]  # vLLM's class is untyped to mypy
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if iteration_stats is None:
                return
            latencies = iteration_stats.inter_token_latencies_iter
            log.received.append(time.perf_counter())
            log.tokens.append(int(iteration_stats.num_generation_tokens))
            log.durations.append(float(min(latencies)) if latencies else math.nan)

        def log_engine_initialized(self) -> None:
            pass

    return StepRecorder


@dataclass(frozen=True)
class Timeline:
    """One engine's steps on the engine's clock: when each ended, and the tokens it sampled."""

    ends: np.ndarray
    """End of each step (``time.perf_counter`` seconds)."""
    tokens: np.ndarray
    """Tokens sampled in each step."""
    known: np.ndarray
    """Whether each step's start is known (the step before it ended where it began): ``False`` at
    the first step and after every gap."""

    @classmethod
    def of(cls, log: StepLog) -> Timeline:
        """Each step's end: the summed engine-side durations, anchored per run of consecutive steps."""
        received = np.asarray(log.received, dtype=np.float64)
        durations = np.asarray(log.durations, dtype=np.float64)
        known = ~np.isnan(durations)
        if len(known):
            known[0] = False
        ends = np.empty_like(received)
        starts = [*np.flatnonzero(~known).tolist(), len(received)]
        for a, b in itertools.pairwise(starts):
            since = np.concatenate([[0.0], np.cumsum(durations[a + 1 : b])])
            ends[a:b] = float(np.min(received[a:b] - since)) + since
        return cls(ends=ends, tokens=np.asarray(log.tokens, dtype=np.int64), known=known)

    def _at(self, t: float, per_step: np.ndarray) -> float:
        """``per_step`` summed over the steps ended by ``t``, plus the elapsed share of the step running at ``t``."""
        k = int(np.searchsorted(self.ends, t, side="right"))
        if k == 0 or k >= len(self.ends) or not self.known[k]:
            return math.nan  # before the first step, after the last, or in a gap of unknown length
        share = (t - self.ends[k - 1]) / (self.ends[k] - self.ends[k - 1])
        return float(per_step[:k].sum() + share * per_step[k])

    def steps_at(self, t: float) -> float:
        """Steps run by ``t``, fractional: the step running at ``t`` counts for the share of it elapsed."""
        return self._at(t, np.ones(len(self.ends)))

    def tokens_at(self, t: float) -> float:
        """Tokens sampled by ``t``, the running step's spread evenly over its duration."""
        return self._at(t, self.tokens.astype(np.float64))

    def steady(self, t: float, steps: int = STEADY_STEPS, *, robust: bool = False) -> tuple[float, float]:
        """(steps per second, tokens per second) over the last ``steps`` steps that ended by ``t``, without a gap.

        ``robust`` leaves out steps over :data:`OUTLIER` times the median: where the engine stood
        still for a reason of its own (a weight update pauses it), which is not its pace. ``nan``
        when fewer than :data:`MIN_STEADY_STEPS` consecutive steps ended before ``t``.
        """
        k = int(np.searchsorted(self.ends, t, side="right"))  # steps 0..k-1 ended by t
        first = k - steps
        gaps = np.flatnonzero(~self.known[max(0, first) + 1 : k])
        if len(gaps):
            first = max(0, first) + 1 + int(gaps[-1])
        first = max(0, first)
        if k - 1 - first < MIN_STEADY_STEPS:
            return math.nan, math.nan
        durations = np.diff(self.ends[first:k])
        tokens = self.tokens[first + 1 : k]
        if robust:
            kept = durations <= OUTLIER * float(np.median(durations))
            durations, tokens = durations[kept], tokens[kept]
        span = float(durations.sum())
        return len(durations) / span, float(tokens.sum()) / span

    def decoding_until(self, t: float) -> float:
        """End of the engine's last step before its first gap after ``t``; ``nan`` before the first step.

        A window reaching past it crosses a gap (a step in which no request decoded: the work ran out,
        or the step only prefilled) and is not measured: this says why.
        """
        k = int(np.searchsorted(self.ends, t, side="right"))
        if k == 0:
            return math.nan
        gaps = np.flatnonzero(~self.known[k:])
        return float(self.ends[k + int(gaps[0]) - 1]) if len(gaps) else float(self.ends[-1])

    def lost(self, a: float, b: float, rate: float) -> float:
        """Steps lost over ``[a, b]``: ``rate`` x (b - a) minus the steps run in it (signed); ``nan`` across a gap."""
        first, last = np.searchsorted(self.ends, [a, b], side="right")
        if not self.known[first : last + 1].all():
            return math.nan
        return rate * (b - a) - (self.steps_at(b) - self.steps_at(a))


@dataclass(frozen=True)
class Windows:
    """A save's two windows, as offsets in seconds from its cut call."""

    gate_s: float
    """End of the save's own window: the snapshot is built in memory (a trainer's gate reopens)."""
    end_s: float
    """End of the window after it: :data:`AFTER_STEPS` steady step times past the end of the write."""


def windows(*, gate_s: float, written_s: float, steady_steps_per_s: float) -> Windows:
    """The windows of one save: [cut, gate] and [gate, max(gate, written) + AFTER_STEPS steady steps].

    The second shows what the save costs after the engine's cut (the snapshot's write in a thread
    competing for the CPU) and ends where the engine should be back at its pace.
    """
    step_s = 1.0 / steady_steps_per_s if steady_steps_per_s > 0 else 0.0
    return Windows(gate_s=gate_s, end_s=max(gate_s, written_s) + AFTER_STEPS * step_s)


def cost(
    timeline: Timeline, t_cut: float, w: Windows, steady_steps: int = STEADY_STEPS, *, robust: bool = False
) -> dict[str, float | None]:
    """One engine's figures around one save (or the same windows without one): steps lost, tokens per second.

    The steady rate is the engine's over the ``steady_steps`` steps before ``t_cut`` (``robust``:
    see :meth:`Timeline.steady`). Every figure is ``None`` where the engine was idle or had no
    steady rate (see :class:`Timeline`).
    """
    rate, tok_s = timeline.steady(t_cut, steady_steps, robust=robust)
    gate, end = t_cut + w.gate_s, t_cut + w.end_s
    around = (timeline.tokens_at(end) - timeline.tokens_at(t_cut)) / (end - t_cut) if end > t_cut else math.nan
    figures = dict(
        steady_step_ms=1000 / rate,
        steady_tok_s=tok_s,
        steps_lost=timeline.lost(t_cut, gate, rate),
        steps_lost_after=timeline.lost(gate, end, rate),
        tok_s_around=around,
        around_vs_steady=around / tok_s if tok_s > 0 else math.nan,
        decoding_until_ms=1000 * (timeline.decoding_until(t_cut) - t_cut),
    )
    return {k: None if math.isnan(v) else v for k, v in figures.items()}
