"""The phases of one repetition: one workload, one engine configuration, the same seeds.

1. **Engine A**, the run that will be "killed" (:func:`run_to_kill`). The prompt groups are
   dispatched in staggered waves, longest prefix target first, so that at the cut every sample has
   its target prefix (:func:`dispatch_staggered`). At the cut (:func:`cut`): the engine's cut (what
   its front end has received; the engine is not paused) and the snapshot built in memory, the
   point where a trainer's gate to the engine reopens. The snapshot is then saved to disk while
   generation goes on (a trainer does the same: the cut is in memory), and A finishes the
   remaining work in place, pending groups included: the **uninterrupted** reference for the same
   remainder (:func:`uninterrupted_and_save`). Then, on the same engine with its prefix cache
   emptied, the same workload runs again up to the same cut point and a little past it, with no
   save (:func:`twin`): the run the save's cost is measured against. Then A is shut down: the "kill".
2. The restart is in-process: a new engine, i.e. a new engine-core process with a cold KV cache.
   Nothing carries over from A but the snapshot file.
   **continue** (:func:`restart_continue`, engine B): the snapshot read back from disk after
   evicting it from the page cache (so the load is a real read), every in-flight sample
   resubmitted from its saved prefix (with its sampler state), every pending one from scratch.
   **regenerate** (:func:`restart_regenerate`, engine C): every in-flight and pending prompt
   group re-dispatched from scratch with the same seeds (the interim fix of NeMo RL #3480 and
   verl #7037); then, on the same now-warm engine, the prefill floor (:func:`prefill_floor`).
   B and C swap order on odd repetitions. Both restart modes pay the same fresh-process costs; the
   uninterrupted run does not, which is part of what a restart costs (in a first design that ran
   regenerate on continue's engine after it, continue took ~3x longer than regenerate; on fresh
   engines each, that gap closed).
3. **drop** (:func:`drop`, legacy semantics) does no work: its figures are what it loses.

Recovery time runs from engine-ready (start returned, warm-up included) until every recovered
sample finished; the uninterrupted mode's runs from the moment the snapshot was built after the
cut. Each restart mode is then rerun on its own, now warm, engine after emptying the prefix cache
(:func:`warm_rerun`).

What the save costs engine A is measured in engine steps timed on the engine's side
(:mod:`benchmarks.resume.steps`): the steps lost in the save's window and in a window after it,
next to the same windows of the twin run, and the tokens per second around the save against the
twin's around the same point.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.resume import engine_calls as calls
from benchmarks.resume import figures
from benchmarks.resume.measure import Clocks, Steady, Tracker, size_breakdown, steady_state
from benchmarks.resume.steps import (
    MIN_STEADY_STEPS,
    STEADY_STEPS,
    StepLog,
    Timeline,
    Windows,
    cost,
    windows,
)
from benchmarks.resume.workload import Group, Recovered, bench_counters, build_snapshot, recovered
from benchmarks.snapshot_io import evict
from partial_rollout.snapshot import (
    Fingerprints,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    load_snapshot,
    save_snapshot,
)

POLL_S = 0.005
"""Seconds between two looks at the first request's progress while the dispatch is staggered."""
SNAPSHOT_NAME = "partial_rollouts.safetensors"
TWIN_MARGIN_STEPS = 4
"""Steps the twin runs past the end of the windows it is measured over, so that a step ends after them."""


class Requests:
    """Engine A's requests by request id, launched group by group and gathered at the end."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.tasks: dict[str, asyncio.Task[SampleRecord]] = {}

    def launch(self, group: Group) -> None:
        for i, spec in enumerate(group.specs):
            rid = group.rid(i)
            self.tasks[rid] = asyncio.create_task(self.tracker.generate(rid, group.prompt, spec, index=i))

    def finished(self) -> dict[str, SampleRecord]:
        return {rid: t.result() for rid, t in self.tasks.items() if t.done()}

    async def gather(self) -> dict[str, SampleRecord]:
        return dict(zip(self.tasks, await asyncio.gather(*self.tasks.values()), strict=True))


# --- engine A: dispatch, cut, save, uninterrupted ------------------------------------------------


@dataclass(frozen=True)
class Dispatched:
    clock: str
    """The first request launched (longest prefix target): its token count times the cut."""
    last_dispatch: tuple[float, int, int]
    """(time, engine tokens, clock tokens) when the last group was launched: the steady state starts there."""


async def dispatch_staggered(requests: Requests, groups: list[Group], t0: float) -> Dispatched:
    """Launch each group once the first request is ``kmax - K`` tokens in, so all reach their K together.

    Returns at the cut."""
    tracker = requests.tracker
    dispatched = sorted((g for g in groups if not g.pending), key=lambda g: -g.prefix_target)
    kmax = dispatched[0].prefix_target
    clock = dispatched[0].rid(0)
    requests.launch(dispatched[0])
    nxt = 1
    last_dispatch = (time.perf_counter(), 0, 0)
    while True:
        await asyncio.sleep(POLL_S)
        now = await tracker.count(clock)
        while nxt < len(dispatched) and now >= kmax - dispatched[nxt].prefix_target:
            requests.launch(dispatched[nxt])
            nxt += 1
            if nxt == len(dispatched):
                last_dispatch = (time.perf_counter(), (await tracker.totals())[0], now)
        if nxt == 1 and len(dispatched) == 1:
            last_dispatch = (t0, 0, 0)
        if now >= kmax:
            return Dispatched(clock=clock, last_dispatch=last_dispatch)


@dataclass(frozen=True)
class CutResult:
    snapshot: Snapshot
    t_cut: float
    """When the cut was called (``time.perf_counter``)."""
    cut_s: float
    """The engine's cut (:attr:`Cut.cut_s <partial_rollout.engine.Cut.cut_s>`)."""
    gate_s: float
    """From the cut call until the snapshot was built in memory: where a trainer's gate to the engine reopens."""
    engine_tokens: int
    """Tokens the engine had delivered of the requests in the cut (:attr:`Cut.engine_tokens`)."""
    tokens_at_cut: int
    steady: Steady
    gate: Clocks
    """The clocks once the snapshot was built: the uninterrupted remainder is timed from here."""


async def cut(
    engine: Any, requests: Requests, groups: list[Group], fingerprints: Fingerprints, dispatched: Dispatched
) -> CutResult:
    """The engine's cut and the snapshot built in memory; the engine generates throughout (it is never paused)."""
    t_cut = time.perf_counter()
    captured = await calls.cut(engine)
    # Nothing here suspends until the snapshot is built, so nothing is received meanwhile: a sample
    # is either in the cut (as received so far) or finished, and the token counts are those of the cut.
    at_cut = {**requests.finished(), **captured.samples}
    tokens_at_cut = (await requests.tracker.totals())[0]
    clock_at_cut = await requests.tracker.count(dispatched.clock)
    snapshot = build_snapshot(fingerprints, groups, at_cut, bench_counters(groups, at_cut))
    gate_s = time.perf_counter() - t_cut
    return CutResult(
        snapshot=snapshot,
        t_cut=t_cut,
        cut_s=captured.cut_s,
        gate_s=gate_s,
        engine_tokens=captured.engine_tokens,
        tokens_at_cut=tokens_at_cut,
        steady=steady_state(dispatched.last_dispatch, t_cut, tokens_at_cut, clock_at_cut),
        gate=await Clocks.read(engine),
    )


@dataclass(frozen=True)
class Uninterrupted:
    path: Path
    bytes: int
    save_s: float
    """save_snapshot wall time (fsync + atomic rename), in a thread while generation goes on."""
    written_s: float
    """From the cut call until save_snapshot returned."""
    finished: dict[str, SampleRecord]
    spent: Clocks
    """From the snapshot built after the cut until every sample finished."""


async def uninterrupted_and_save(
    engine: Any, requests: Requests, groups: list[Group], at_cut: CutResult, path: Path
) -> Uninterrupted:
    """Finish the remainder in place, pending groups included (the same remaining work), while the snapshot is saved."""
    for g in groups:
        if g.pending:
            requests.launch(g)

    def save() -> tuple[int, float, float]:
        t = time.perf_counter()
        size = save_snapshot(at_cut.snapshot, path)
        done = time.perf_counter()
        return size, done - t, done

    size, save_s, written = await asyncio.to_thread(save)
    finished = await requests.gather()
    return Uninterrupted(
        path=path,
        bytes=size,
        save_s=save_s,
        written_s=written - at_cut.t_cut,
        finished=finished,
        spent=await Clocks.read(engine) - at_cut.gate,
    )


async def twin(engine: Any, groups: list[Group], spans: Windows, log: StepLog) -> float:
    """The same workload again on the same engine, up to the same cut point and past the save's windows, with no save.

    Nothing runs in the save's own window (the event loop waits it out), and what the save run did
    after it but the save itself is done at the same offset (the clocks read, the pending groups
    launched), so that the two runs differ by the save. The prefix cache is emptied first (the
    save run's prompts would otherwise skip their prefill), and the requests are cancelled once
    the engine (its step ``log``) has run a few steps past the windows: only they are measured.
    Returns the twin's cut time (``time.perf_counter``).
    """
    await calls.reset_prefix_cache(engine)
    twins = [dataclasses.replace(g, group_id=f"twin-{g.group_id}") for g in groups]
    tracker = Tracker(engine)
    requests = Requests(tracker)
    t0 = time.perf_counter()
    tracker.start_timeline(t0)
    try:
        await dispatch_staggered(requests, twins, t0)
        t_cut = time.perf_counter()
        await asyncio.sleep(spans.gate_s)
        await Clocks.read(engine)
        for g in twins:
            if g.pending:
                requests.launch(g)
        # until the step before the last few ones was received after the windows' end (the front end
        # lags the engine by less than that), or the work ran out first (then the windows past its end
        # are not measured); a look every 20 ms, not to load the cores the engine core runs on
        while len(log.received) < TWIN_MARGIN_STEPS or log.received[-TWIN_MARGIN_STEPS] <= t_cut + spans.end_s:
            if all(task.done() for task in requests.tasks.values()):
                break
            await asyncio.sleep(0.02)
    finally:
        for task in requests.tasks.values():
            task.cancel()
        await asyncio.gather(*requests.tasks.values(), return_exceptions=True)
        await tracker.stop_timeline()
    return t_cut


@dataclass(frozen=True)
class KilledRun:
    """Engine A from start to kill."""

    engine_start_s: float
    precut_s: float
    cut: CutResult
    uninterrupted: Uninterrupted
    decode_tokens_after_cut: int
    timeline: list[tuple[float, int, int]]
    """Token timeline with the cut at 0."""
    windows: Windows
    """The save's windows (offsets from the cut)."""
    save_cost: dict[str, float | None]
    """Engine A's steps lost and tokens per second around the save (:func:`benchmarks.resume.steps.cost`)."""
    twin_cost: dict[str, float | None]
    """The same windows in the twin run, which did not save."""


async def run_to_kill(config: Any, groups: list[Group], folder: Path) -> KilledRun:
    """Engine A: staggered dispatch, the cut, the save, the uninterrupted remainder in place, the twin; the kill."""
    engine, start_s, log = await calls.start(config)
    try:
        fingerprints = await calls.fingerprints(engine)  # hashes files: a trainer does it once, not inside the cut
        tracker = Tracker(engine)
        requests = Requests(tracker)
        t0 = time.perf_counter()
        tracker.start_timeline(t0)
        dispatched = await dispatch_staggered(requests, groups, t0)
        at_cut = await cut(engine, requests, groups, fingerprints, dispatched)
        rest = await uninterrupted_and_save(engine, requests, groups, at_cut, folder / SNAPSHOT_NAME)
        await tracker.stop_timeline()
        decode_after_cut = (await tracker.totals())[0] - at_cut.tokens_at_cut
        steady = steady_steps(dispatched, at_cut.t_cut, log)
        rate, _ = Timeline.of(log).steady(at_cut.t_cut, steady)
        spans = windows(gate_s=at_cut.gate_s, written_s=rest.written_s, steady_steps_per_s=rate)
        t_twin = await twin(engine, groups, spans, log)
    finally:
        await calls.shutdown(engine)
    timeline = Timeline.of(log)
    shift = at_cut.t_cut - t0
    return KilledRun(
        engine_start_s=start_s,
        precut_s=shift,
        cut=at_cut,
        uninterrupted=rest,
        decode_tokens_after_cut=decode_after_cut,
        timeline=[(round(t - shift, 3), e, u) for t, e, u in tracker.timeline],
        windows=spans,
        save_cost=cost(timeline, at_cut.t_cut, spans, steady),
        twin_cost=cost(timeline, t_twin, spans, steady),
    )


def steady_steps(dispatched: Dispatched, t_cut: float, log: StepLog) -> int:
    """Steps the steady rate is taken over: :data:`STEADY_STEPS`, or fewer when the last group was dispatched later.

    A dispatch prefills a group beside the decoding ones; the steady rate starts after the last.
    """
    received = log.received
    since = sum(dispatched.last_dispatch[0] <= t <= t_cut for t in received)
    return max(MIN_STEADY_STEPS, min(STEADY_STEPS, since - 1))


# --- the restarts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Restart:
    """One restart mode on a fresh engine."""

    engine_start_s: float
    spent: Clocks
    """From engine-ready until every recovered sample finished."""
    warm: Clocks
    decode_tokens: int
    useful_tokens: int
    prefill_tokens: int
    records: dict[str, SampleRecord]
    timeline: list[tuple[float, int, int]]


@dataclass(frozen=True)
class Continued(Restart):
    load_s: float
    """load_snapshot wall time with the page cache evicted first, fingerprint check included."""
    loaded: Snapshot


@dataclass(frozen=True)
class Floor:
    """Every saved prompt + prefix prefilled alone: the physical lower bound of a restart."""

    spent: Clocks
    prefill_tokens: int


async def recover(engine: Any, work: list[Recovered], *, resume: bool, start_s: float) -> Restart:
    """Finish every recovered sample: from its saved prefix (``resume``) or from scratch; then again, warm."""
    tracker = Tracker(engine, redo=None if resume else {w.rid: w.sample.num_tokens for w in work})
    before = await Clocks.read(engine)
    tracker.start_timeline(before.wall_s)
    records = await asyncio.gather(
        *(
            tracker.generate(
                w.rid, w.prompt, w.sample.sampling, index=w.sample.index, resume_from=w.sample if resume else None
            )
            for w in work
        )
    )
    spent = await Clocks.read(engine) - before
    await tracker.stop_timeline()
    decode, useful = await tracker.totals()
    warm = await warm_rerun(engine, work, resume=resume)
    return Restart(
        engine_start_s=start_s,
        spent=spent,
        warm=warm,
        decode_tokens=decode,
        useful_tokens=useful,
        prefill_tokens=sum(len(w.prompt) + (w.sample.num_tokens if resume else 0) for w in work),
        records={w.rid: r for w, r in zip(work, records, strict=True)},
        timeline=tracker.timeline,
    )


async def warm_rerun(engine: Any, work: list[Recovered], *, resume: bool) -> Clocks:
    """The same recovery again on the now-warm engine, prefix cache emptied first (its wall and CPU seconds).

    A fresh CPU engine runs its first batches much slower (we measured up to ~10x the CPU time
    per token of a warm one; the cause is not pinned down), and that start-up effect is the same
    whichever mode runs. The warm rerun compares the modes without it.
    """
    await calls.reset_prefix_cache(engine)
    before = await Clocks.read(engine)
    await asyncio.gather(
        *(
            calls.generate(
                engine,
                f"warm/{w.rid}",
                w.prompt,
                w.sample.sampling,
                index=w.sample.index,
                resume_from=w.sample if resume else None,
            )
            for w in work
        )
    )
    return await Clocks.read(engine) - before


async def prefill_floor(engine: Any, work: list[Recovered]) -> Floor:
    """Prefill every saved prompt + prefix alone (``max_tokens=1``, all submitted together), prefix cache emptied first.

    Run last, on the regenerate engine: it is a lower bound (pure prefill compute, no
    fresh-process costs), and regenerate's own cached blocks cannot help it.
    """
    await calls.reset_prefix_cache(engine)
    floor = [
        (w.rid, w.prompt + w.sample.token_ids.tolist(), w.sample)
        for w in work
        if w.sample.state is SampleState.IN_FLIGHT
    ]
    before = await Clocks.read(engine)
    await asyncio.gather(
        *(
            calls.generate(
                engine,
                f"floor/{rid}",
                ids,
                SamplingSpec(max_tokens=1, temperature=1.0, seed=s.sampling.seed, ignore_eos=True),
                index=s.index,
            )
            for rid, ids, s in floor
        )
    )
    return Floor(spent=await Clocks.read(engine) - before, prefill_tokens=sum(len(ids) for _, ids, _ in floor))


async def restart_continue(config: Any, path: Path) -> Continued:
    """A fresh engine: load the snapshot from disk and continue every saved prefix; then again, warm."""
    engine, start_s, _ = await calls.start(config)
    try:
        evict(path)
        t = time.perf_counter()
        snapshot = load_snapshot(path, expect=await calls.fingerprints(engine))
        load_s = time.perf_counter() - t
        restart = await recover(engine, recovered(snapshot), resume=True, start_s=start_s)
    finally:
        await calls.shutdown(engine)
    return Continued(**vars(restart), load_s=load_s, loaded=snapshot)


async def restart_regenerate(config: Any, path: Path) -> tuple[Restart, Floor]:
    """A fresh engine: regenerate every recovered prompt from scratch, again warm; then the prefill floor."""
    engine, start_s, _ = await calls.start(config)
    try:
        work = recovered(load_snapshot(path))  # the legacy path re-dispatches the same prompts from its loader
        restart = await recover(engine, work, resume=False, start_s=start_s)
        floor = await prefill_floor(engine, work)
    finally:
        await calls.shutdown(engine)
    return restart, floor


@dataclass(frozen=True)
class Lost:
    prompts: int
    samples: int
    prefix_tokens: int


def drop(saved: Snapshot) -> Lost:
    """Legacy semantics: nothing is resumed, so in-flight and pending prompts never come back."""
    unfinished = [s for _, s in saved.iter_samples(SampleState.IN_FLIGHT, SampleState.NOT_STARTED)]
    return Lost(
        prompts=sum(g.state in (GroupState.IN_FLIGHT, GroupState.PENDING) for g in saved.groups),
        samples=len(unfinished),
        prefix_tokens=sum(s.num_tokens for s in unfinished if s.state is SampleState.IN_FLIGHT),
    )


# --- one repetition ------------------------------------------------------------------------------


async def one_rep(config: Any, groups: list[Group], rep: int, bar: tqdm) -> dict[str, Any]:
    """Kill, then both restarts (continue first on even repetitions), then drop; the repetition's JSON record."""
    load_before, wall_start = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="resume-bench-") as tmp:
        bar.set_postfix_str("pre-save + uninterrupted")
        killed = await run_to_kill(config, groups, Path(tmp))
        bar.update(1)
        path = killed.uninterrupted.path
        restarts: dict[str, Any] = {}
        for mode in ("continue", "regenerate") if rep % 2 == 0 else ("regenerate", "continue"):
            bar.set_postfix_str(f"restart: {mode}" + (" + floor" if mode == "regenerate" else ""))
            restarts[mode] = await (restart_continue if mode == "continue" else restart_regenerate)(config, path)
            bar.update(1)
        file_bytes = path.stat().st_size
        sizes = size_breakdown(path)
    regenerated, floor = restarts["regenerate"]
    return figures.rep_record(
        rep,
        killed,
        restarts["continue"],
        regenerated,
        floor,
        drop(killed.cut.snapshot),
        file_bytes=file_bytes,
        sizes=sizes,
        load_before=load_before,
        wall_start=wall_start,
    )
