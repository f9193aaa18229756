"""What the benchmark measures, and the checks that it measured right.

Three clocks per interval, because a shared 2-core machine is bursty (the same work took from
0.5 s to 12 s of wall *and* CPU time in consecutive runs on one engine):

- engine steps that produced outputs (counted by a vLLM stat logger): the latency structure of
  the work, immune to other jobs; the most trustworthy figure here;
- wall-clock seconds: what a user waits for;
- CPU seconds of this process and the engine core: other jobs stretch wall time but barely change
  the CPU time the same work needs.

Tokens are counted per request from the engine's progress counter, polled every 5 ms by the
staggered dispatch and every 100 ms for the timeline (:class:`Tracker`).

The benchmark checks its own figures against the snapshot it wrote (:func:`consistency_checks`):
the counts recomputed from the loaded file, the counters it stored in the file, and its own
bookkeeping must agree. :func:`exactness` compares the tokens of the three ways of finishing the
same samples.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.resume import engine_calls as calls
from benchmarks.resume.workload import recovered
from partial_rollout.ledger import request_id
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec, Snapshot

TIMELINE_S = 0.1
"""Seconds between two points of a token timeline."""
TOKEN_TENSORS = ("sample.tokens", "sample.logprobs", "sample.version_run_values", "sample.version_run_lengths")
"""The snapshot tensors that grow with every generated token."""


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and its live descendants (the engine core)."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    cpu: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = int(fields[11]) + int(fields[12])
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / ticks


@dataclass(frozen=True)
class Clocks:
    """The three clocks at one instant; the difference of two readings is an interval."""

    wall_s: float
    cpu_s: float
    steps: int

    @classmethod
    async def read(cls, engine: Any) -> Clocks:
        wall_s, cpu_s = time.perf_counter(), tree_cpu_s()
        steps = (await calls.progress(engine)).steps
        assert steps is not None, "engine started without count_steps"
        return cls(wall_s, cpu_s, steps)

    def __sub__(self, other: Clocks) -> Clocks:
        return Clocks(self.wall_s - other.wall_s, self.cpu_s - other.cpu_s, self.steps - other.steps)


class Tracker:
    """Counts the tokens an engine generates, per request, while requests run.

    ``redo`` maps a request id to the number of its first generated tokens that only redo saved
    work (regenerate: the saved prefix); they count as engine tokens but not as useful tokens.
    """

    def __init__(self, engine: Any, redo: dict[str, int] | None = None) -> None:
        self.engine = engine
        self.redo = redo or {}
        self.done: dict[str, int] = {}
        self.timeline: list[tuple[float, int, int]] = []
        """(seconds since the start, engine tokens, useful tokens), cumulative."""
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def count(self, rid: str) -> int:
        """Tokens request ``rid`` has generated so far."""
        if rid in self.done:
            return self.done[rid]
        return (await calls.progress(self.engine)).live_tokens.get(rid, 0)

    async def totals(self) -> tuple[int, int]:
        """(engine tokens, useful tokens) generated so far by every request this tracker has seen."""
        engine = useful = 0
        counts = {**(await calls.progress(self.engine)).live_tokens, **self.done}
        for rid, n in counts.items():
            engine += n
            useful += max(0, n - self.redo.get(rid, 0))
        return engine, useful

    async def generate(
        self, rid: str, prompt: list[int], spec: SamplingSpec, *, index: int, resume_from: SampleRecord | None = None
    ) -> SampleRecord:
        """Run one request to the end and remember how many tokens it generated here."""
        record = await calls.generate(self.engine, rid, prompt, spec, index=index, resume_from=resume_from)
        base = 0 if resume_from is None else resume_from.num_tokens
        self.done[rid] = record.num_tokens - base
        return record

    def start_timeline(self, t0: float) -> None:
        async def sample() -> None:
            while not self._stop.is_set():
                engine, useful = await self.totals()
                self.timeline.append((round(time.perf_counter() - t0, 3), engine, useful))
                try:
                    await asyncio.wait_for(self._stop.wait(), TIMELINE_S)
                except TimeoutError:
                    pass

        self._task = asyncio.create_task(sample())

    async def stop_timeline(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


@dataclass(frozen=True)
class Steady:
    """The steady state before the cut: every group dispatched, the batch full."""

    tok_s: float | None
    """Engine tokens per second from the last dispatch to the cut."""
    window_s: float
    step_ms: float | None
    """Milliseconds per decode step: the first request gains one token per step."""


def steady_state(last_dispatch: tuple[float, int, int], t_cut: float, tokens_at_cut: int, clock_at_cut: int) -> Steady:
    """From ``last_dispatch`` = (time, engine tokens, first request's tokens) to the same figures at the cut."""
    window_s = t_cut - last_dispatch[0]
    tok_s = (tokens_at_cut - last_dispatch[1]) / window_s if window_s > 0 else None
    step_ms = 1000 * window_s / (clock_at_cut - last_dispatch[2]) if clock_at_cut > last_dispatch[2] else None
    return Steady(tok_s=tok_s, window_s=window_s, step_ms=step_ms)


@dataclass(frozen=True)
class SavedWork:
    """The work a snapshot hands to a restart, counted from its records: what every mode is measured against."""

    samples_in_flight: int
    samples_not_started: int
    prefix_tokens: int
    max_prefix: int
    remaining_tokens: int
    """Tokens still to generate: in-flight samples' remaining budgets plus pending samples' whole budgets."""
    sampler_state_bytes: int
    prompt_tokens: int
    """Prompt tokens of every recovered sample (shared group prompts counted once per sample)."""

    @classmethod
    def of(cls, snapshot: Snapshot) -> SavedWork:
        in_flight = [s for _, s in snapshot.iter_samples(SampleState.IN_FLIGHT)]
        not_started = [s for _, s in snapshot.iter_samples(SampleState.NOT_STARTED)]
        return cls(
            samples_in_flight=len(in_flight),
            samples_not_started=len(not_started),
            prefix_tokens=sum(s.num_tokens for s in in_flight),
            max_prefix=max((s.num_tokens for s in in_flight), default=0),
            remaining_tokens=sum(s.remaining_tokens for s in in_flight)
            + sum(s.sampling.max_tokens for s in not_started),
            sampler_state_bytes=sum(len(s.sampler_state or b"") for s in in_flight),
            prompt_tokens=sum(len(w.prompt) for w in recovered(snapshot)),
        )


def size_breakdown(path: Path) -> dict[str, int]:
    """Where a snapshot's bytes go, from its safetensors header: what grows per generated token and what does not."""
    from partial_rollout.snapshot import read_header

    header = read_header(path)
    parts = dict(token_data=0, prompts=0, sampler_state=0, per_sample_fields=0, per_group_fields=0, other_tensors=0)
    for name, entry in header.tensors.items():
        size = entry.end - entry.start
        if name in TOKEN_TENSORS:
            parts["token_data"] += size
        elif name == "group.prompt_tokens":
            parts["prompts"] += size
        elif name == "sample.sampler_state_bytes":
            parts["sampler_state"] += size
        elif name.startswith("sample."):
            parts["per_sample_fields"] += size
        elif name.startswith("group."):
            parts["per_group_fields"] += size
        else:
            parts["other_tensors"] += size
    tables = header.metadata.get("tables", "")
    parts["header_sampling_tables"] = len(tables.encode())
    parts["header_rest"] = header.data_start - parts["header_sampling_tables"]
    assert sum(parts.values()) == header.file_size, (parts, header.file_size)
    return parts


def consistency_checks(
    saved: Snapshot,
    loaded: Snapshot,
    *,
    work: SavedWork,
    prompts_lost: int,
    saved_bytes: int,
    file_bytes: int,
    sizes: dict[str, int],
    uninterrupted_decode: int,
    regenerate_decode: int,
    continue_decode: int,
    continue_prefill: int,
    floor_prefill: int,
) -> dict[str, dict[str, Any]]:
    """The benchmark's figures against the counts recomputed from the loaded file and the counters it stored in it.

    Each entry is ``{"bench": ..., "snapshot": ..., "ok": bench == snapshot}``.
    """
    counts = loaded.counts()
    ctr = saved.counters
    unfinished = (SampleState.IN_FLIGHT, SampleState.NOT_STARTED)
    pairs = {
        "loaded_equals_saved": (True, loaded == saved),
        "file_bytes": (saved_bytes, file_bytes),
        "sampler_state_bytes": (work.sampler_state_bytes, sizes["sampler_state"]),
        "samples_in_flight": (ctr["bench_samples_in_flight"], counts["samples_in_flight"]),
        "samples_in_flight_reported": (work.samples_in_flight, counts["samples_in_flight"]),
        "samples_not_started": (ctr["bench_samples_not_started"], counts["samples_not_started"]),
        "groups_pending": (ctr["bench_groups_pending"], counts["groups_pending"]),
        "prefix_tokens": (ctr["bench_prefix_tokens"], counts["tokens_in_flight"]),
        "prefix_tokens_reported": (work.prefix_tokens, counts["tokens_in_flight"]),
        "stored_counters": (ctr, loaded.counters),
        "drop_prompts_lost": (prompts_lost, counts["groups_in_flight"] + counts["groups_pending"]),
        "drop_prefix_tokens_lost": (work.prefix_tokens, counts["tokens_in_flight"]),
        "regenerate_redone_decode": (regenerate_decode - work.remaining_tokens, counts["tokens_in_flight"]),
        "continue_decode_tokens": (
            continue_decode,
            sum(s.remaining_tokens for _, s in loaded.iter_samples(*unfinished)),
        ),
        "continue_prefill_tokens": (
            continue_prefill,
            sum(len(g.prompt_token_ids) + s.num_tokens for g, s in loaded.iter_samples(*unfinished)),
        ),
        "floor_prefill_tokens": (
            floor_prefill,
            sum(len(g.prompt_token_ids) + s.num_tokens for g, s in loaded.iter_samples(SampleState.IN_FLIGHT)),
        ),
        "uninterrupted_decode_after_cut": (uninterrupted_decode, work.remaining_tokens),
        # A cut carries no sampler state where the engine derives it from the seed and the tokens
        # drawn (V1 CPU: resumable.py _generator_state); a legacy one would: the file keeps whichever.
        "sampler_states_kept": (
            sum(s.sampler_state is not None for _, s in saved.iter_samples(SampleState.IN_FLIGHT)),
            sum(s.sampler_state is not None for _, s in loaded.iter_samples(SampleState.IN_FLIGHT)),
        ),
    }
    return {name: {"bench": bench, "snapshot": snap, "ok": bench == snap} for name, (bench, snap) in pairs.items()}


def first_divergence(x: np.ndarray, y: np.ndarray) -> int:
    """Index of the first token where ``x`` and ``y`` differ (the shorter length when one is a prefix of the other)."""
    n = min(len(x), len(y))
    where = np.flatnonzero(x[:n] != y[:n])
    return int(where[0]) if len(where) else n


def _agreement(x: SampleRecord, y: SampleRecord, skip: int = 0) -> tuple[bool, float]:
    """(token-identical, largest |logprob diff| over the tokens from ``skip`` up to the first divergence)."""
    first = first_divergence(x.token_ids, y.token_ids)
    diff = np.abs(x.logprobs[skip:first] - y.logprobs[skip:first])
    return bool(np.array_equal(x.token_ids, y.token_ids)), float(diff.max(initial=0.0))


def exactness(
    saved: Snapshot,
    uninterrupted: dict[str, SampleRecord],
    continued: dict[str, SampleRecord],
    regenerated: dict[str, SampleRecord],
) -> dict[str, Any]:
    """Whether the three ways of finishing the same samples gave the same tokens, and where they first differ.

    Only samples that were in flight at the cut have an uninterrupted reference; pending ones are
    compared between continue and regenerate. The **noise floor** is regenerate against
    uninterrupted on the samples that were in flight: the same seeded samples generated twice
    without interruption, in different batches (engine A dispatched them staggered, the regenerate
    engine all together), so it is what vLLM's batch-variant kernels do anyway. Continuing is
    held against it: ``beyond_noise_floor`` when continue differs from uninterrupted on more of those
    samples than regenerate does.
    """
    ref = {rid: uninterrupted[rid] for rid in continued if rid in uninterrupted}
    same_continue = sum(np.array_equal(continued[rid].token_ids, r.token_ids) for rid, r in ref.items())
    same_regen = sum(np.array_equal(regenerated[rid].token_ids, r.token_ids) for rid, r in ref.items())
    same_pending = sum(np.array_equal(continued[rid].token_ids, regenerated[rid].token_ids) for rid in continued)
    saved_k = {request_id(g.group_id, smp.index): smp for g, smp in saved.iter_samples()}
    in_flight = [rid for rid in ref if saved_k[rid].state is SampleState.IN_FLIGHT and saved_k[rid].num_tokens > 0]
    resume = [_agreement(continued[rid], ref[rid], skip=saved_k[rid].num_tokens) for rid in in_flight]
    floor = [_agreement(regenerated[rid], ref[rid]) for rid in in_flight]
    prefix_kept = sum(
        np.array_equal(continued[rid].token_ids[: s.num_tokens], s.token_ids)
        and np.array_equal(continued[rid].logprobs[: s.num_tokens], s.logprobs)
        and np.array_equal(continued[rid].versions[: s.num_tokens], s.versions)
        for rid in in_flight
        for s in (saved_k[rid],)
    )
    mismatches = []
    for rid in continued:
        pairs = {"continue_vs_regenerate": (continued[rid], regenerated[rid])}
        if rid in ref:
            pairs["continue_vs_uninterrupted"] = (continued[rid], ref[rid])
            pairs["regenerate_vs_uninterrupted"] = (regenerated[rid], ref[rid])
        for name, (x, y) in pairs.items():
            if not np.array_equal(x.token_ids, y.token_ids):
                mismatches.append(
                    dict(
                        sample=rid,
                        pair=name,
                        prefix_at_cut=saved_k[rid].num_tokens,
                        first_divergence=first_divergence(x.token_ids, y.token_ids),
                        length=len(y.token_ids),
                    )
                )
    continue_same = sum(same for same, _ in resume)
    floor_same = sum(same for same, _ in floor)
    return dict(
        samples=len(ref),
        continue_equals_uninterrupted=int(same_continue),
        regenerate_equals_uninterrupted=int(same_regen),
        continue_equals_regenerate=int(same_pending),
        recovered=len(continued),
        in_flight=len(in_flight),
        continue_identical_in_flight=int(continue_same),
        noise_floor_identical_in_flight=int(floor_same),
        continue_max_logprob_diff=max((d for _, d in resume), default=0.0),
        noise_floor_max_logprob_diff=max((d for _, d in floor), default=0.0),
        prefix_bit_identical=int(prefix_kept),
        beyond_noise_floor=continue_same < floor_same,
        mismatches=mismatches,
    )
