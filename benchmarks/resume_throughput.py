"""Resume throughput: continue from saved prefixes vs regenerate vs drop, with the cost of the save.

One workload, one engine configuration, the same seeds, compared within one run. Per repetition:

1. **Engine A** (the run that will be "killed"). Prompt groups (GRPO-style, ``--group-size``
   samples per prompt, seeded, temperature 1, ``ignore_eos``) are dispatched in staggered waves
   so that at the cut every dispatched sample is in flight with a prefix of K tokens, K spread
   uniformly over [0.5 L, 1.5 L] around the sweep's mean prefix length L, and a long-tailed
   remainder R (lognormal, mean 0.5 L, clipped to [16, 2 L] and to the context). A few more
   groups are yielded but not dispatched (pending). At the cut: a keep-mode pause and capture
   (:meth:`ResumableEngine.pause_and_capture`), the snapshot is built, the engine resumes, and the
   snapshot is saved to disk while generation goes on (a trainer can do the same: the cut is in
   memory). A then finishes the remaining work in place (and dispatches the pending groups): that
   is the **uninterrupted** reference for the same remainder. Then A is shut down: the "kill".
   The restart is in-process: a new ``ResumableEngine``, i.e. a new engine-core process with a
   cold KV cache. Nothing carries over from A except the snapshot file, which is read back from
   disk after evicting it from the page cache, so the load time is a real read.
2. **Engine B** (fresh, started after A is gone): **continue**: the snapshot read from disk,
   every in-flight sample resubmitted from its saved prefix (with its sampler state) and every
   pending one from scratch.
   **Engine C** (fresh): **regenerate**: every in-flight and pending prompt group re-dispatched
   from scratch with the same seeds (the interim fix of NeMo RL #3480 and verl #7037); then, on
   the same now-warm engine and after emptying its prefix cache, the **physical floor**: every
   saved prompt + prefix prefilled alone (``max_tokens=1``, all submitted together). B and C swap
   order on odd repetitions. Both restart modes pay the same fresh-process costs; the
   uninterrupted run does not, which is part of what a restart costs (in a first design that ran
   regenerate on continue's engine after it, continue took ~3x longer than regenerate; on fresh
   engines each, that gap closed; why a fresh CPU engine is slower at first is not pinned down).
3. **drop** (legacy semantics) does no work: its figures are the prompts, samples and prefix
   tokens it loses.

Recovery time runs from engine-ready (``ResumableEngine.start`` returned, warm-up included) until
every recovered sample finished; the uninterrupted mode's runs from ``resume()`` after the cut.
Tokens are counted per request from the adapter's progress counter
(:meth:`ResumableEngine.live_tokens`), polled every 5 ms to stagger the dispatch and every 100 ms
for the timeline.

Three clocks per mode, because this 2-core machine is shared and bursty (the same work took from
0.5 s to 12 s of wall *and* CPU time in consecutive runs on one engine):

- ``steps``: engine steps that produced outputs (``ResumableEngine.steps``, counted by a vLLM
  stat logger), the latency structure of the recovery, immune to other jobs; the most
  trustworthy figure here;
- ``recovery_s``: wall-clock seconds, what a user waits for;
- ``cpu_s``: CPU seconds of this process and the engine core over the same interval.

Each restart mode is then rerun on its own, now warm, engine after emptying the prefix cache
(``warm_s``, ``warm_cpu_s``): the first batches of a fresh CPU engine can be much slower, the same
for every restart mode, and the warm rerun shows the modes without that effect.

Inside each repetition the benchmark checks its own figures against the snapshot it wrote: the
counts recomputed from the loaded file (``Snapshot.counts()``), the counters it stored in the
file, and its own bookkeeping must agree (in-flight and pending samples, prefix tokens, prompts
lost by drop, tokens redone by regenerate, prefill and decode tokens of continue, file size); the
loaded snapshot must equal the saved one. ``consistency.passed`` in the JSON is the verdict.

On this machine the model is the project's tiny Llama (0.4 M parameters), so the timings measure
the engine's per-token and per-step overheads more than model compute; the token counts and
ratios carry over, the absolute seconds do not.

Usage::

    python -m benchmarks.resume_throughput              # quick default: a few minutes on 2 CPU cores
    python -m benchmarks.resume_throughput --full       # 16/64/256 in-flight x 128/512/2048 prefix
    python -m benchmarks.resume_throughput --samples 8 --prefix 32 --reps 1 --out /tmp/r   # smoke test

On a GPU with a real model (Hugging Face folder, nothing is downloaded)::

    python -m benchmarks.resume_throughput --full --model /models/Qwen2.5-1.5B-Instruct \\
        --max-model-len 8192 --max-num-seqs 256 --gpu-memory-utilization 0.85 --dtype bfloat16 \\
        --out benchmarks/results/resume_gpu

Writes ``<out>.json`` (machine, versions, config, every figure per repetition, medians and spread)
and the plots ``<out>_recovery.png``, ``<out>_timeline.png`` and ``<out>_ratio.png`` (see :mod:`benchmarks.plots`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks.snapshot_io import evict  # noqa: E402
from partial_rollout.snapshot import (  # noqa: E402
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    load_snapshot,
    save_snapshot,
)

RESULTS = Path(__file__).resolve().parent / "results"
QUICK = dict(samples=[32], prefix=[128, 512], reps=3)
FULL = dict(samples=[16, 64, 256], prefix=[128, 512, 2048], reps=3)
MODES = ("uninterrupted", "drop", "regenerate", "continue")
POLL_S = 0.005
TIMELINE_S = 0.1
MIN_REMAINDER = 16
TARGET_CONTINUE_VS_UNINTERRUPTED = 1.15
TARGET_BYTES_PER_TOKEN = 8.0


# --- workload ------------------------------------------------------------------------------------


@dataclass
class Group:
    group_id: str
    prompt: list[int]
    specs: list[SamplingSpec]
    prefix_target: int
    """Tokens each sample should have generated at the cut (0 for pending groups)."""
    pending: bool = False

    def rid(self, index: int) -> str:
        return f"{self.group_id}/{index}"


def build_workload(
    num_in_flight: int, mean_prefix: int, *, group_size: int, prompt_tokens: int, max_model_len: int,
    vocab_size: int, seed: int,
) -> list[Group]:
    """Dispatched groups (``num_in_flight`` samples) plus pending ones (1/8 as many groups, at least one)."""
    rng = np.random.default_rng([seed, num_in_flight, mean_prefix])
    num_groups = max(1, math.ceil(num_in_flight / group_size))
    num_pending = max(1, num_groups // 8)
    low, high = (3, vocab_size) if vocab_size < 1000 else (100, min(vocab_size, 32_000))
    mean_r = 0.5 * mean_prefix
    sigma = 1.0
    mu = math.log(mean_r) - sigma**2 / 2
    budget = max_model_len - prompt_tokens
    if int(1.5 * mean_prefix) + MIN_REMAINDER > budget:
        raise ValueError(
            f"mean prefix {mean_prefix}: 1.5 x prefix + {MIN_REMAINDER} + prompt {prompt_tokens} exceeds"
            f" --max-model-len {max_model_len}"
        )
    groups = []
    for g in range(num_groups + num_pending):
        pending = g >= num_groups
        k = int(rng.integers(max(1, mean_prefix // 2), int(1.5 * mean_prefix) + 1))
        size = group_size if pending or g < num_groups - 1 else num_in_flight - group_size * (num_groups - 1)
        specs = []
        for i in range(size):
            r = int(np.clip(rng.lognormal(mu, sigma), MIN_REMAINDER, 2 * mean_prefix))
            total = min(k + r, budget)
            specs.append(SamplingSpec(max_tokens=total, temperature=1.0, seed=int(rng.integers(2**31)), ignore_eos=True))
        groups.append(Group(
            group_id=f"{'pending' if pending else 'prompt'}-{g:04d}",
            prompt=rng.integers(low, high, prompt_tokens).tolist(),
            specs=specs, prefix_target=0 if pending else k, pending=pending,
        ))
    return groups


# --- token accounting ----------------------------------------------------------------------------


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
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def count(self, rid: str) -> int:
        if rid in self.done:
            return self.done[rid]
        return self.engine.live_tokens().get(rid, 0)

    def totals(self) -> tuple[int, int]:
        engine = useful = 0
        counts = {**self.engine.live_tokens(), **self.done}
        for rid, n in counts.items():
            engine += n
            useful += max(0, n - self.redo.get(rid, 0))
        return engine, useful

    async def generate(self, rid: str, prompt: list[int], spec: SamplingSpec, resume_from: SampleRecord | None = None) -> SampleRecord:
        record = await self.engine.generate(rid, prompt, spec, resume_from=resume_from)
        base = 0 if resume_from is None else resume_from.num_tokens
        self.done[rid] = record.num_tokens - base
        return record

    def start_timeline(self, t0: float) -> None:
        async def sample() -> None:
            while not self._stop.is_set():
                engine, useful = self.totals()
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


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and its live descendants (the engine core).

    Other jobs on a shared machine stretch wall-clock times but barely change the CPU time the
    engine needs for the same work, so modes are also compared on this.
    """
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


# --- phases --------------------------------------------------------------------------------------


async def start_engine(config: Any) -> tuple[Any, float]:
    from partial_rollout.engine.adapter import ResumableEngine

    t = time.perf_counter()
    engine = await ResumableEngine.start(config, count_steps=True)
    return engine, time.perf_counter() - t


def bench_counters(groups: list[Group], cut: dict[str, SampleRecord]) -> dict[str, int]:
    """The benchmark's own account of the cut, stored in the snapshot and checked after load."""
    in_flight = [r for r in cut.values() if r.state is SampleState.IN_FLIGHT]
    pending = [g for g in groups if g.pending]
    return {
        "bench_groups_dispatched": sum(not g.pending for g in groups),
        "bench_groups_pending": len(pending),
        "bench_samples_in_flight": len(in_flight),
        "bench_samples_finished": sum(r.state is SampleState.FINISHED for r in cut.values()),
        "bench_samples_not_started": sum(r.state is SampleState.NOT_STARTED for r in cut.values())
        + sum(len(g.specs) for g in pending),
        "bench_prefix_tokens": sum(r.num_tokens for r in in_flight),
    }


def build_snapshot(fingerprints: Any, groups: list[Group], cut: dict[str, SampleRecord], counters: dict[str, int]) -> Snapshot:
    records = []
    for g in groups:
        if g.pending:
            samples = [SampleRecord(index=i, state=SampleState.NOT_STARTED, sampling=s) for i, s in enumerate(g.specs)]
            records.append(GroupRecord(group_id=g.group_id, prompt_token_ids=g.prompt, state=GroupState.PENDING,
                                       samples=samples, data={"bench": "resume_throughput"}))
            continue
        samples = [dataclasses.replace(cut[g.rid(i)], index=i) for i in range(len(g.specs))]
        state = GroupState.READY if all(s.state is SampleState.FINISHED for s in samples) else GroupState.IN_FLIGHT
        records.append(GroupRecord(group_id=g.group_id, prompt_token_ids=g.prompt, state=state, dispatch_version=0,
                                   samples=samples, data={"bench": "resume_throughput"}))
    return Snapshot(trainer_step=1, policy_version=0, fingerprints=fingerprints, groups=records,
                    counters=counters, metadata={"bench": "resume_throughput"})


async def phase_presave(config: Any, groups: list[Group], folder: Path) -> dict[str, Any]:
    """Engine A: staggered dispatch, the cut, the save, then the uninterrupted remainder in place."""
    engine, start_s = await start_engine(config)
    try:
        fingerprints = engine.fingerprints()  # hashes files: a trainer does it once, not inside the pause
        tracker = Tracker(engine)
        t0 = time.perf_counter()
        tracker.start_timeline(t0)
        dispatched = sorted((g for g in groups if not g.pending), key=lambda g: -g.prefix_target)
        kmax = dispatched[0].prefix_target
        clock = dispatched[0].rid(0)
        tasks: dict[str, asyncio.Task[SampleRecord]] = {}

        def launch(g: Group) -> None:
            for i, spec in enumerate(g.specs):
                tasks[g.rid(i)] = asyncio.create_task(tracker.generate(g.rid(i), g.prompt, spec))

        launch(dispatched[0])
        nxt = 1
        last_dispatch = (time.perf_counter(), 0, 0)
        while True:
            await asyncio.sleep(POLL_S)
            now = tracker.count(clock)
            while nxt < len(dispatched) and now >= kmax - dispatched[nxt].prefix_target:
                launch(dispatched[nxt])
                nxt += 1
                if nxt == len(dispatched):
                    last_dispatch = (time.perf_counter(), tracker.totals()[0], now)
            if nxt == 1 and len(dispatched) == 1:
                last_dispatch = (t0, 0, 0)
            if now >= kmax:
                break
        t_cut = time.perf_counter()
        cut = await engine.pause_and_capture()
        # Paused and drained: the live records hold exactly the captured tokens. A sample can
        # finish while the pause waits for the step in progress (with hundreds of samples, the
        # engine's output backlog too); the cut no longer has it, its finished record does.
        at_cut = {**{rid: t.result() for rid, t in tasks.items() if t.done()}, **cut.samples}
        tokens_at_cut = tracker.totals()[0]
        clock_at_cut = tracker.count(clock)
        counters = bench_counters(groups, at_cut)
        snapshot = build_snapshot(fingerprints, groups, at_cut, counters)
        await engine.resume()
        t_resume, cpu_resume, steps_resume = time.perf_counter(), tree_cpu_s(), engine.steps.steps
        for g in groups:  # an uninterrupted run dispatches the pending prompts too: same remaining work
            if g.pending:
                launch(g)
        path = folder / "partial_rollouts.safetensors"

        def save() -> tuple[int, float]:
            t = time.perf_counter()
            size = save_snapshot(snapshot, path)
            return size, time.perf_counter() - t

        size, save_s = await asyncio.to_thread(save)
        finished = dict(zip(tasks, await asyncio.gather(*tasks.values())))
        t_end, cpu_end, steps_end = time.perf_counter(), tree_cpu_s(), engine.steps.steps
        await tracker.stop_timeline()
    finally:
        await engine.shutdown()

    window_s = t_cut - last_dispatch[0]
    steady_tok_s = (tokens_at_cut - last_dispatch[1]) / window_s if window_s > 0 else None
    step_ms = 1000 * window_s / (clock_at_cut - last_dispatch[2]) if clock_at_cut > last_dispatch[2] else None
    return dict(
        engine_start_s=start_s, snapshot=snapshot, path=path, bytes=size, save_s=save_s,
        pause_s=cut.pause_s, stop_s=cut.stop_s, freeze_s=t_resume - t_cut, finished=finished,
        uninterrupted_s=t_end - t_resume, uninterrupted_cpu_s=cpu_end - cpu_resume,
        uninterrupted_steps=steps_end - steps_resume, tokens_before_cut=tokens_at_cut,
        decode_tokens_after_cut=tracker.totals()[0] - tokens_at_cut, precut_s=t_cut - t0,
        steady_tok_s=steady_tok_s, steady_window_s=window_s, step_ms=step_ms,
        timeline=[(round(t - (t_cut - t0), 3), e, u) for t, e, u in tracker.timeline],
    )


def recovered(snapshot: Snapshot) -> list[tuple[str, list[int], SampleRecord]]:
    """Every sample a restart must finish: in-flight and pending groups' unfinished samples."""
    return [
        (f"{g.group_id}/{s.index}", g.prompt_token_ids.tolist(), s)
        for g, s in snapshot.iter_samples(SampleState.IN_FLIGHT, SampleState.NOT_STARTED)
    ]


async def warm_rerun(engine: Any, work: list[tuple[str, list[int], SampleRecord]], *, resume: bool) -> tuple[float, float]:
    """The same recovery again on the now-warm engine, prefix cache emptied first: (wall s, CPU s).


    A fresh CPU engine runs its first batches much slower (we measured up to ~10x the CPU time
    per token of a warm one; the cause is not pinned down), and that start-up effect is the same
    whichever mode runs. The warm rerun compares the modes without it.
    """
    await engine.reset_prefix_cache()
    t0, cpu0 = time.perf_counter(), tree_cpu_s()
    await asyncio.gather(*(
        engine.generate(f"warm/{rid}", prompt, s.sampling, resume_from=s if resume else None) for rid, prompt, s in work
    ))
    return time.perf_counter() - t0, tree_cpu_s() - cpu0


async def phase_continue(config: Any, path: Path) -> dict[str, Any]:
    """A fresh engine: load the snapshot from disk and continue every saved prefix; then again, warm."""
    engine, start_s = await start_engine(config)
    try:
        evict(path)
        t = time.perf_counter()
        snapshot = load_snapshot(path, expect=engine.fingerprints())
        load_s = time.perf_counter() - t
        work = recovered(snapshot)
        tracker = Tracker(engine)
        t0, cpu0, steps0 = time.perf_counter(), tree_cpu_s(), engine.steps.steps
        tracker.start_timeline(t0)
        records = await asyncio.gather(*(tracker.generate(rid, prompt, s.sampling, resume_from=s) for rid, prompt, s in work))
        continue_s, cpu_s, n_steps = time.perf_counter() - t0, tree_cpu_s() - cpu0, engine.steps.steps - steps0
        await tracker.stop_timeline()
        decode, useful = tracker.totals()
        warm_s, warm_cpu_s = await warm_rerun(engine, work, resume=True)
    finally:
        await engine.shutdown()
    return dict(engine_start_s=start_s, load_s=load_s, loaded=snapshot, recovery_s=continue_s, cpu_s=cpu_s, steps=n_steps,
                warm_s=warm_s, warm_cpu_s=warm_cpu_s, decode_tokens=decode,
                useful_tokens=useful, prefill_tokens=sum(len(p) + s.num_tokens for _, p, s in work),
                records={rid: r for (rid, _, _), r in zip(work, records)}, timeline=tracker.timeline)


async def phase_regenerate(config: Any, path: Path) -> dict[str, Any]:
    """A fresh engine: regenerate every recovered prompt from scratch, again warm; then the prefill floor.

    The floor runs last, on this now-warm engine and after emptying the prefix cache: it is a
    lower bound (pure prefill compute, no fresh-process costs), and regenerate's own cached blocks
    cannot help it.
    """
    engine, start_s = await start_engine(config)
    try:
        snapshot = load_snapshot(path)  # the legacy path re-dispatches the same prompts from its loader
        work = recovered(snapshot)
        tracker = Tracker(engine, redo={rid: s.num_tokens for rid, _, s in work})
        t0, cpu0, steps0 = time.perf_counter(), tree_cpu_s(), engine.steps.steps
        tracker.start_timeline(t0)
        records = await asyncio.gather(*(tracker.generate(rid, prompt, s.sampling) for rid, prompt, s in work))
        regenerate_s, cpu_s, n_steps = time.perf_counter() - t0, tree_cpu_s() - cpu0, engine.steps.steps - steps0
        await tracker.stop_timeline()
        decode, useful = tracker.totals()
        warm_s, warm_cpu_s = await warm_rerun(engine, work, resume=False)

        await engine.reset_prefix_cache()
        floor = [(rid, prompt + s.token_ids.tolist(), s) for rid, prompt, s in work if s.state is SampleState.IN_FLIGHT]
        t, cpu0, steps0 = time.perf_counter(), tree_cpu_s(), engine.steps.steps
        await asyncio.gather(*(
            engine.generate(f"floor/{rid}", ids, SamplingSpec(max_tokens=1, temperature=1.0, seed=s.sampling.seed, ignore_eos=True))
            for rid, ids, s in floor
        ))
        floor_s, floor_cpu_s, floor_steps = time.perf_counter() - t, tree_cpu_s() - cpu0, engine.steps.steps - steps0
    finally:
        await engine.shutdown()
    return dict(engine_start_s=start_s, floor_s=floor_s, floor_cpu_s=floor_cpu_s, floor_steps=floor_steps, steps=n_steps,
                floor_prefill_tokens=sum(len(ids) for _, ids, _ in floor), recovery_s=regenerate_s, cpu_s=cpu_s,
                warm_s=warm_s, warm_cpu_s=warm_cpu_s, decode_tokens=decode, useful_tokens=useful,
                prefill_tokens=sum(len(p) for _, p, _ in work), records={rid: r for (rid, _, _), r in zip(work, records)},
                timeline=tracker.timeline)


# --- one repetition ------------------------------------------------------------------------------


TOKEN_TENSORS = ("sample.tokens", "sample.logprobs", "sample.version_run_values", "sample.version_run_lengths")


def size_breakdown(path: Path) -> dict[str, int]:
    """Where a snapshot's bytes go, from its safetensors header: what grows per generated token and what does not."""
    from partial_rollout.snapshot.container import read_header

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


def check(name: str, bench: Any, snapshot: Any, checks: dict[str, Any]) -> None:
    checks[name] = {"bench": bench, "snapshot": snapshot, "ok": bench == snapshot}


async def one_rep(config: Any, groups: list[Group], rep: int, bar: tqdm) -> dict[str, Any]:
    load_before, wall_start = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="resume-bench-") as tmp:
        folder = Path(tmp)
        bar.set_postfix_str("pre-save + uninterrupted")
        a = await phase_presave(config, groups, folder)
        bar.update(1)
        order = ("continue", "regenerate") if rep % 2 == 0 else ("regenerate", "continue")
        out = {}
        for mode in order:
            bar.set_postfix_str(f"restart: {mode}" + (" + floor" if mode == "regenerate" else ""))
            out[mode] = await (phase_continue if mode == "continue" else phase_regenerate)(config, a["path"])
            bar.update(1)
        c, b = out["continue"], out["regenerate"]
        file_bytes = a["path"].stat().st_size
        sizes = size_breakdown(a["path"])
    saved: Snapshot = a["snapshot"]
    loaded: Snapshot = c["loaded"]
    counts = loaded.counts()
    ctr = saved.counters
    in_flight = [s for _, s in saved.iter_samples(SampleState.IN_FLIGHT)]
    not_started = [s for _, s in saved.iter_samples(SampleState.NOT_STARTED)]
    prefix_tokens = sum(s.num_tokens for s in in_flight)
    remaining = sum(s.remaining_tokens for s in in_flight) + sum(s.sampling.max_tokens for s in not_started)
    lost_groups = [g for g in saved.groups if g.state in (GroupState.IN_FLIGHT, GroupState.PENDING)]
    sampler_bytes = sum(len(s.sampler_state or b"") for s in in_flight)
    prompt_tokens = sum(len(p) for _, p, _ in recovered(saved))

    # Consistency: the benchmark's figures against the counters recomputed from the loaded file
    # and against the counters the benchmark stored in it.
    checks: dict[str, Any] = {}
    check("loaded_equals_saved", True, loaded == saved, checks)
    check("file_bytes", a["bytes"], file_bytes, checks)
    check("sampler_state_bytes", sampler_bytes, sizes["sampler_state"], checks)
    check("samples_in_flight", ctr["bench_samples_in_flight"], counts["samples_in_flight"], checks)
    check("samples_in_flight_reported", len(in_flight), counts["samples_in_flight"], checks)
    check("samples_not_started", ctr["bench_samples_not_started"], counts["samples_not_started"], checks)
    check("groups_pending", ctr["bench_groups_pending"], counts["groups_pending"], checks)
    check("prefix_tokens", ctr["bench_prefix_tokens"], counts["tokens_in_flight"], checks)
    check("prefix_tokens_reported", prefix_tokens, counts["tokens_in_flight"], checks)
    check("stored_counters", ctr, loaded.counters, checks)
    check("drop_prompts_lost", len(lost_groups), counts["groups_in_flight"] + counts["groups_pending"], checks)
    check("drop_prefix_tokens_lost", prefix_tokens, counts["tokens_in_flight"], checks)
    check("regenerate_redone_decode", b["decode_tokens"] - remaining, counts["tokens_in_flight"], checks)
    check("continue_decode_tokens", c["decode_tokens"],
          sum(s.remaining_tokens for _, s in loaded.iter_samples(SampleState.IN_FLIGHT, SampleState.NOT_STARTED)), checks)
    check("continue_prefill_tokens", c["prefill_tokens"],
          sum(len(g.prompt_token_ids) + s.num_tokens for g, s in loaded.iter_samples(SampleState.IN_FLIGHT, SampleState.NOT_STARTED)), checks)
    check("floor_prefill_tokens", b["floor_prefill_tokens"],
          sum(len(g.prompt_token_ids) + s.num_tokens for g, s in loaded.iter_samples(SampleState.IN_FLIGHT)), checks)
    check("uninterrupted_decode_after_cut", a["decode_tokens_after_cut"], remaining, checks)
    check("sampler_state_per_in_flight_sample", len(in_flight), sum(s.sampler_state is not None for _, s in loaded.iter_samples(SampleState.IN_FLIGHT)), checks)

    # Exactness: the three ways of finishing the same samples give the same tokens.
    ref = {rid: a["finished"][rid] for rid in c["records"] if rid in a["finished"]}
    same_continue = sum(np.array_equal(c["records"][rid].token_ids, r.token_ids) for rid, r in ref.items())
    same_regen = sum(np.array_equal(b["records"][rid].token_ids, r.token_ids) for rid, r in ref.items())
    same_pending = sum(np.array_equal(c["records"][rid].token_ids, b["records"][rid].token_ids) for rid in c["records"])

    saved_k = {f"{g.group_id}/{smp.index}": smp.num_tokens for g, smp in saved.iter_samples()}

    def first_diff(x: np.ndarray, y: np.ndarray) -> int:
        n = min(len(x), len(y))
        where = np.flatnonzero(x[:n] != y[:n])
        return int(where[0]) if len(where) else n

    mismatches = []
    for rid in c["records"]:
        pairs = {"continue_vs_regenerate": (c["records"][rid], b["records"][rid])}
        if rid in ref:
            pairs["continue_vs_uninterrupted"] = (c["records"][rid], ref[rid])
            pairs["regenerate_vs_uninterrupted"] = (b["records"][rid], ref[rid])
        for name, (x, y) in pairs.items():
            if not np.array_equal(x.token_ids, y.token_ids):
                mismatches.append(dict(sample=rid, pair=name, prefix_at_cut=saved_k[rid],
                                       first_divergence=first_diff(x.token_ids, y.token_ids), length=len(y.token_ids)))

    unint_s = a["uninterrupted_s"]
    modes = {
        "uninterrupted": dict(recovery_s=unint_s, cpu_s=a["uninterrupted_cpu_s"], steps=a["uninterrupted_steps"], decode_tokens=a["decode_tokens_after_cut"], prefill_tokens=0,
                              redone_decode_tokens=a["decode_tokens_after_cut"] - remaining, useful_tokens=remaining,
                              prompts_lost=0, samples_lost=0, prefix_tokens_lost=0),
        "drop": dict(recovery_s=0.0, cpu_s=0.0, steps=0, decode_tokens=0, prefill_tokens=0, redone_decode_tokens=0, useful_tokens=0,
                     prompts_lost=len(lost_groups), samples_lost=len(in_flight) + len(not_started),
                     prefix_tokens_lost=prefix_tokens),
        "regenerate": dict(recovery_s=b["recovery_s"], cpu_s=b["cpu_s"], steps=b["steps"], warm_s=b["warm_s"], warm_cpu_s=b["warm_cpu_s"], decode_tokens=b["decode_tokens"], prefill_tokens=b["prefill_tokens"],
                           redone_decode_tokens=b["decode_tokens"] - remaining, useful_tokens=b["useful_tokens"],
                           prompts_lost=0, samples_lost=0, prefix_tokens_lost=0, engine_start_s=b["engine_start_s"]),
        "continue": dict(recovery_s=c["recovery_s"], cpu_s=c["cpu_s"], steps=c["steps"], floor_steps=b["floor_steps"], warm_s=c["warm_s"], warm_cpu_s=c["warm_cpu_s"], decode_tokens=c["decode_tokens"], prefill_tokens=c["prefill_tokens"],
                         redone_decode_tokens=c["decode_tokens"] - remaining, useful_tokens=c["useful_tokens"],
                         prompts_lost=0, samples_lost=0, prefix_tokens_lost=0, engine_start_s=c["engine_start_s"],
                         load_s=c["load_s"], floor_s=b["floor_s"], floor_cpu_s=b["floor_cpu_s"],
                         over_floor_s=c["recovery_s"] - b["floor_s"], over_floor_cpu_s=c["cpu_s"] - b["floor_cpu_s"],
                         over_floor_ratio=c["recovery_s"] / b["floor_s"] if b["floor_s"] > 0 else None),
    }
    for m in modes.values():
        m["useful_tok_s"] = m["useful_tokens"] / m["recovery_s"] if m["recovery_s"] > 0 else None
        m["vs_uninterrupted"] = m["recovery_s"] / unint_s if unint_s > 0 and m["recovery_s"] > 0 else None
        m["steps_vs_uninterrupted"] = m["steps"] / a["uninterrupted_steps"] if a["uninterrupted_steps"] and m["steps"] else None
        unint_cpu = a["uninterrupted_cpu_s"]
        m["cpu_vs_uninterrupted"] = m["cpu_s"] / unint_cpu if unint_cpu > 0 and m["cpu_s"] > 0 else None
        m["useful_vs_steady"] = m["useful_tok_s"] / a["steady_tok_s"] if m["useful_tok_s"] and a["steady_tok_s"] else None
    modes["regenerate"]["vs_continue"] = b["recovery_s"] / c["recovery_s"]
    modes["regenerate"]["steps_vs_continue"] = b["steps"] / c["steps"] if c["steps"] else None
    modes["regenerate"]["cpu_vs_continue"] = b["cpu_s"] / c["cpu_s"] if c["cpu_s"] > 0 else None
    modes["regenerate"]["warm_vs_continue"] = b["warm_s"] / c["warm_s"]
    modes["regenerate"]["warm_cpu_vs_continue"] = b["warm_cpu_s"] / c["warm_cpu_s"] if c["warm_cpu_s"] > 0 else None
    for name, m in (("regenerate", b), ("continue", c)):
        modes[name]["warm_vs_uninterrupted"] = m["warm_s"] / unint_s if unint_s > 0 else None
        modes[name]["warm_cpu_vs_uninterrupted"] = m["warm_cpu_s"] / a["uninterrupted_cpu_s"] if a["uninterrupted_cpu_s"] > 0 else None

    tokens_total = prefix_tokens
    stall_ms = 1000 * (a["freeze_s"] - a["stop_s"])  # the engine stood idle from its stop until resume()
    return dict(
        rep=rep,
        wall_s=time.perf_counter() - wall_start,
        loadavg_1m=dict(before=load_before, after=os.getloadavg()[0]),
        workload=dict(groups=len(saved.groups), groups_pending=counts["groups_pending"],
                      samples_in_flight=len(in_flight), samples_not_started=len(not_started),
                      samples_finished_before_cut=counts["samples_finished"], prefix_tokens=prefix_tokens,
                      mean_prefix_measured=prefix_tokens / max(1, len(in_flight)),
                      max_prefix=max((s.num_tokens for s in in_flight), default=0),
                      remaining_tokens=remaining, recovered_prompt_tokens=prompt_tokens),
        presave=dict(engine_start_s=a["engine_start_s"], precut_s=a["precut_s"], tokens_before_cut=a["tokens_before_cut"],
                     steady_tok_s=a["steady_tok_s"], steady_window_s=a["steady_window_s"], step_ms=a["step_ms"]),
        save=dict(pause_ms=1000 * a["pause_s"], freeze_ms=1000 * a["freeze_s"],
                  stop_ms=1000 * a["stop_s"], stall_ms=stall_ms,
                  pause_in_decode_steps=(1000 * a["pause_s"] / a["step_ms"]) if a["step_ms"] else None,
                  stall_in_decode_steps=stall_ms / a["step_ms"] if a["step_ms"] else None,
                  save_s=a["save_s"], load_s=c["load_s"], snapshot_bytes=a["bytes"], in_flight_tokens=tokens_total,
                  sampler_state_bytes=sampler_bytes,
                  bytes_per_in_flight_token=a["bytes"] / tokens_total if tokens_total else None,
                  bytes_per_in_flight_token_excl_sampler_state=(a["bytes"] - sampler_bytes) / tokens_total if tokens_total else None,
                  token_data_bytes_per_token=sizes["token_data"] / counts["tokens"] if counts["tokens"] else None,
                  **{f"bytes_{k}": v for k, v in sizes.items()}),
        floor=dict(floor_s=b["floor_s"], floor_cpu_s=b["floor_cpu_s"], floor_steps=b["floor_steps"], floor_prefill_tokens=b["floor_prefill_tokens"]),
        modes=modes,
        exact=dict(samples=len(ref), continue_equals_uninterrupted=int(same_continue),
                   regenerate_equals_uninterrupted=int(same_regen), continue_equals_regenerate=int(same_pending),
                   recovered=len(c["records"]), mismatches=mismatches),
        checks=checks,
        consistent=all(v["ok"] for v in checks.values()),
        timelines=dict(presave=a["timeline"], regenerate=b["timeline"], **{"continue": c["timeline"]},
                       restart_s={"continue": c["engine_start_s"] + c["load_s"], "regenerate": b["engine_start_s"]},
                       floor_s=b["floor_s"], save_s=a["save_s"], uninterrupted_s=unint_s),
    )


# --- statistics and report -----------------------------------------------------------------------


def spread(values: list[Any]) -> dict[str, Any] | None:
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    med = statistics.median(vals)
    return dict(median=med, min=min(vals), max=max(vals), n=len(vals),
                rel_spread=(max(vals) - min(vals)) / med if med else 0.0)


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"modes": {}, "save": {}, "workload": {}, "presave": {}}
    for mode in MODES:
        keys = reps[0]["modes"][mode].keys()
        summary["modes"][mode] = {k: spread([r["modes"][mode].get(k) for r in reps]) for k in keys}
    for section in ("save", "workload", "presave", "floor"):
        summary[section] = {k: spread([r[section][k] for r in reps]) for k in reps[0][section]}
    med = lambda m, k: (summary["modes"][m][k] or {}).get("median")  # noqa: E731
    save = summary["save"]
    summary["targets"] = {
        "continue_redone_decode_tokens_max": max(r["modes"]["continue"]["redone_decode_tokens"] for r in reps),
        "continue_redone_decode_tokens_target": 0,
        "continue_vs_uninterrupted_median": med("continue", "vs_uninterrupted"),
        "continue_vs_uninterrupted_target": TARGET_CONTINUE_VS_UNINTERRUPTED,
        "continue_vs_uninterrupted_met": (med("continue", "vs_uninterrupted") or math.inf) <= TARGET_CONTINUE_VS_UNINTERRUPTED,
        "continue_cpu_vs_uninterrupted_median": med("continue", "cpu_vs_uninterrupted"),
        "continue_steps_vs_uninterrupted_median": med("continue", "steps_vs_uninterrupted"),
        "continue_steps_vs_uninterrupted_met": (med("continue", "steps_vs_uninterrupted") or math.inf) <= TARGET_CONTINUE_VS_UNINTERRUPTED,
        "regenerate_vs_continue_steps_median": med("regenerate", "steps_vs_continue"),
        "regenerate_vs_continue_median": med("regenerate", "vs_continue"),
        "regenerate_vs_continue_cpu_median": med("regenerate", "cpu_vs_continue"),
        "continue_warm_vs_uninterrupted_median": med("continue", "warm_vs_uninterrupted"),
        "regenerate_vs_continue_warm_median": med("regenerate", "warm_vs_continue"),
        "regenerate_vs_continue_warm_cpu_median": med("regenerate", "warm_cpu_vs_continue"),
        "pause_in_decode_steps_median": (save["pause_in_decode_steps"] or {}).get("median"),
        "stall_in_decode_steps_median": (save["stall_in_decode_steps"] or {}).get("median"),
        "stall_within_one_decode_step": ((save["stall_in_decode_steps"] or {}).get("median") or math.inf) <= 1.0,
        "bytes_per_in_flight_token_excl_sampler_state_median": (save["bytes_per_in_flight_token_excl_sampler_state"] or {}).get("median"),
        "bytes_per_token_target": TARGET_BYTES_PER_TOKEN,
        "bytes_per_token_met": ((save["bytes_per_in_flight_token_excl_sampler_state"] or {}).get("median") or math.inf) <= TARGET_BYTES_PER_TOKEN,
    }
    summary["consistent_all_reps"] = all(r["consistent"] for r in reps)
    summary["exact_all_reps"] = all(
        r["exact"]["continue_equals_uninterrupted"] == r["exact"]["samples"] == r["exact"]["regenerate_equals_uninterrupted"]
        for r in reps
    )
    return summary


def table(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for p in points:
        s = p["summary"]
        for mode in MODES:
            m = s["modes"][mode]
            g = lambda k: (m.get(k) or {}).get("median")  # noqa: E731
            rows.append(dict(
                in_flight=p["num_in_flight"], mean_prefix=p["mean_prefix"], mode=mode, reps=len(p["reps"]),
                recovery_s=g("recovery_s"), recovery_s_min=(m.get("recovery_s") or {}).get("min"),
                recovery_s_max=(m.get("recovery_s") or {}).get("max"), vs_uninterrupted=g("vs_uninterrupted"),
                cpu_s=g("cpu_s"), cpu_vs_uninterrupted=g("cpu_vs_uninterrupted"),
                warm_s=g("warm_s"), warm_vs_uninterrupted=g("warm_vs_uninterrupted"),
                steps=g("steps"), steps_vs_uninterrupted=g("steps_vs_uninterrupted"),
                decode_tokens=g("decode_tokens"), prefill_tokens=g("prefill_tokens"),
                redone_decode_tokens=g("redone_decode_tokens"), useful_tok_s=g("useful_tok_s"),
                useful_vs_steady=g("useful_vs_steady"), prompts_lost=g("prompts_lost"),
                prefix_tokens_lost=g("prefix_tokens_lost"),
            ))
    return rows


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.{digits}f}"
    return f"{int(v)}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| in flight | mean prefix | mode | engine steps (x uninterrupted) | recovery s (median [min-max]) | x uninterrupted | CPU s (x uninterrupted) | warm engine s (x uninterrupted) | decode tok | prefill tok | redone decode | useful tok/s (x steady) | prompts lost |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["table"]:
        lines.append(
            f"| {r['in_flight']} | {r['mean_prefix']} | {r['mode']} | {fmt(r.get('steps'), 0)} ({fmt(r.get('steps_vs_uninterrupted'))}) | {fmt(r['recovery_s'])} [{fmt(r['recovery_s_min'])}-{fmt(r['recovery_s_max'])}]"
            f" | {fmt(r['vs_uninterrupted'])} | {fmt(r.get('cpu_s'))} ({fmt(r.get('cpu_vs_uninterrupted'))}) | {fmt(r.get('warm_s'))} ({fmt(r.get('warm_vs_uninterrupted'))}) | {fmt(r['decode_tokens'])} | {fmt(r['prefill_tokens'])} | {fmt(r['redone_decode_tokens'])}"
            f" | {fmt(r['useful_tok_s'], 0)} ({fmt(r['useful_vs_steady'])}) | {fmt(r['prompts_lost'])} |"
        )
    lines += ["", "| in flight | mean prefix | pause ms | stall ms (/ decode step) | save s | load s | bytes / in-flight token (excl. sampler state) [token data only] | floor s (steps) | continue - floor s | regenerate / continue (steps; wall; CPU; warm wall) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in result["points"]:
        s = p["summary"]
        sv = lambda k: (s["save"].get(k) or {}).get("median")  # noqa: E731
        c = s["modes"]["continue"]
        lines.append(
            f"| {p['num_in_flight']} | {p['mean_prefix']} | {fmt(sv('pause_ms'), 1)} | {fmt(sv('stall_ms'), 1)} ({fmt(sv('stall_in_decode_steps'))}) | {fmt(sv('save_s'), 3)}"
            f" | {fmt(sv('load_s'), 3)} | {fmt(sv('bytes_per_in_flight_token'))} ({fmt(sv('bytes_per_in_flight_token_excl_sampler_state'))}) [{fmt(sv('token_data_bytes_per_token'), 3)}]"
            f" | {fmt((c['floor_s'] or {}).get('median'))} ({fmt((c.get('floor_steps') or {}).get('median'), 0)}) | {fmt((c['over_floor_s'] or {}).get('median'))}"
            f" | {fmt((s['modes']['regenerate'].get('steps_vs_continue') or {}).get('median'))}; {fmt((s['modes']['regenerate']['vs_continue'] or {}).get('median'))};"
            f" {fmt((s['modes']['regenerate'].get('cpu_vs_continue') or {}).get('median'))};"
            f" {fmt((s['modes']['regenerate'].get('warm_vs_continue') or {}).get('median'))} |"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = None
    try:
        mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))) * 1024
    except (OSError, StopIteration):
        pass
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - informational only
        pass
    return dict(platform=platform.platform(), python=platform.python_version(), cpu=cpu, cpu_count=os.cpu_count(),
                affinity=len(os.sched_getaffinity(0)), memory_bytes=mem, loadavg_at_end=os.getloadavg(), gpu=gpu)


def versions() -> dict[str, Any]:
    import torch
    import vllm

    commit = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True,
                                timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return dict(vllm=vllm.__version__, torch=torch.__version__, numpy=np.__version__, partial_rollout_commit=commit)


DEFINITIONS = {
    "recovery_s": "seconds from engine-ready after the restart until every recovered sample finished (uninterrupted: from resume() after the cut)",
    "decode_tokens": "tokens the engine generated for the recovered samples",
    "prefill_tokens": "prompt tokens submitted for the recovered samples (continue: prompt + saved prefix); prefix caching is on, so shared group prompts may be computed once",
    "steps": "engine steps (scheduler iterations that produced outputs) over the same interval as recovery_s: the latency structure, immune to other jobs on the machine",
    "cpu_s": "CPU seconds (user + system) of this process and the engine core over the same interval as recovery_s; robust to other jobs on the machine",
    "warm_s": "the same recovery rerun on the same engine right after (prefix cache emptied): no fresh-engine start-up effects",
    "warm_cpu_s": "CPU seconds of the warm rerun",
    "redone_decode_tokens": "decode_tokens minus the tokens the recovered samples still needed at the cut",
    "useful_tokens": "generated tokens that were not already in the snapshot",
    "useful_tok_s": "useful_tokens / recovery_s",
    "useful_vs_steady": "useful_tok_s over the pre-cut steady-state rate (all groups dispatched, full batch)",
    "vs_uninterrupted": "recovery_s over the uninterrupted mode's time for the same remainder",
    "prompts_lost": "prompt groups (in flight or pending) that never come back",
    "pause_ms": "keep-mode pause + capture of the cut (ResumableEngine.pause_and_capture), from the call until the cut is ready",
    "stop_ms": "from the pause call until the engine stopped: it first finishes the step it is running, whose tokens are in the cut (Cut.stop_s)",
    "freeze_ms": "from the pause call until resume() returned: pause + capture + building the Snapshot object + resume",
    "stall_ms": "freeze_ms - stop_ms: the time the engine stood idle because of the save (the target: <= one decode step)",
    "pause_in_decode_steps": "pause_ms over the steady-state decode step time",
    "stall_in_decode_steps": "stall_ms over the steady-state decode step time",
    "token_data_bytes_per_token": "bytes of the per-token tensors (token ids, logprobs, version runs) per stored token: the marginal cost of a generated token",
    "bytes_*": "the snapshot file split by what the bytes hold (token_data, prompts, sampler_state, per-sample and per-group fields, the sampling-parameter tables in the header, the rest of the header); they add up to the file size. The workload gives every sample its own max_tokens (to shape the length distribution), so every sample has its own sampling-table entry; a trainer with one max_tokens has one",
    "save_s": "save_snapshot wall time (fsync + atomic rename), overlapping generation in a thread",
    "load_s": "load_snapshot wall time, page cache evicted first (full checksum + validation)",
    "floor_s": "time to prefill every saved prompt+prefix alone (max_tokens=1, all together), on the regenerate engine after it finished and its prefix cache was emptied",
    "over_floor_s": "continue recovery_s minus floor_s",
}


# --- driver --------------------------------------------------------------------------------------


def engine_config(args: argparse.Namespace, model: str) -> Any:
    from partial_rollout.engine.factory import EngineConfig

    return EngineConfig(
        model=model, dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        kv_cache_memory_bytes=args.kv_cache_bytes, gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size, multiprocessing=args.multiprocessing,
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.model:
        model = args.model
    else:
        from partial_rollout.models.tiny import build_tiny_model

        model = str(build_tiny_model())
    config = engine_config(args, model)
    vocab = json.loads((Path(model) / "config.json").read_text()).get("vocab_size")
    points_spec = [(n, L, args.reps if n * L < args.big_point else min(args.reps, args.big_reps))
                   for n in args.samples for L in args.prefix]
    points_spec.sort(key=lambda p: p[0] * p[1])
    workloads = {(n, L): build_workload(n, L, group_size=args.group_size, prompt_tokens=args.prompt_tokens,
                                        max_model_len=args.max_model_len, vocab_size=vocab, seed=args.seed)
                 for n, L, _ in points_spec}
    results: dict[tuple[int, int], list[dict[str, Any]]] = {(n, L): [] for n, L, _ in points_spec}
    started = time.time()
    # Rounds: every point's first repetition, then every point's second, and so on, so that a
    # deadline costs repetitions evenly and never a whole sweep point.
    with tqdm(total=sum(r for _, _, r in points_spec) * 3, desc="resume bench", unit="phase", file=sys.stderr,
              dynamic_ncols=True) as bar:
        for rep in range(max(r for _, _, r in points_spec)):
            if rep and args.deadline and time.time() > args.deadline:
                break
            for n, L in [(n, L) for n, L, reps in points_spec if rep < reps]:
                if rep and args.deadline and time.time() > args.deadline:
                    tqdm.write(f"deadline reached: no repetition {rep + 1} for {n}x{L} and later points", file=sys.stderr)
                    break
                bar.set_description(f"rep {rep + 1}: {n} in flight x {L} prefix")
                r = await one_rep(config, workloads[n, L], rep, bar)
                results[n, L].append(r)
                tqdm.write(
                    f"{n:>4} x {L:>5} rep {rep}: uninterrupted {r['modes']['uninterrupted']['recovery_s']:.2f}s"
                    f" continue {r['modes']['continue']['recovery_s']:.2f}s regenerate {r['modes']['regenerate']['recovery_s']:.2f}s"
                    f" floor {r['floor']['floor_s']:.2f}s consistent={r['consistent']}", file=sys.stderr)
                write(assemble(args, config, collect(points_spec, results), started), args.out, plots=False)
    return assemble(args, config, collect(points_spec, results), started)


def collect(points_spec: list[tuple[int, int, int]], results: dict[tuple[int, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per-point summaries of the repetitions run so far; the first repetition's timelines are kept."""
    points = []
    for n, L, reps in points_spec:
        done = results[n, L]
        if not done:
            continue
        timeline = done[0].get("timelines")
        kept = [{k: v for k, v in r.items() if k != "timelines"} for r in done]
        points.append(dict(num_in_flight=n, mean_prefix=L, reps_planned=reps, reps=kept,
                           summary=summarize(kept), timeline=timeline))
    return points


def assemble(args: argparse.Namespace, config: Any, points: list[dict[str, Any]], started: float) -> dict[str, Any]:
    result = dict(
        benchmark="resume_throughput", created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        wall_s=time.time() - started, command=" ".join(["python -m benchmarks.resume_throughput", *sys.argv[1:]]),
        machine=machine(), versions=versions(),
        config=dict(engine={k: v for k, v in dataclasses.asdict(config).items() if k != "extra"},
                    samples=args.samples, prefix=args.prefix, reps=args.reps, big_point=args.big_point,
                    big_reps=args.big_reps, group_size=args.group_size, prompt_tokens=args.prompt_tokens, seed=args.seed,
                    workload="prefix K ~ U[0.5L, 1.5L] per group (staggered dispatch), remainder ~ lognormal(mean 0.5L, sigma 1) clipped to [16, 2L] and the context; temperature 1, per-sample seeds, ignore_eos; pending groups = max(1, groups/8)",
                    restart="in-process: engine shut down after the uninterrupted remainder; each recovery mode starts a fresh ResumableEngine (new engine-core process, cold KV cache) and reads the snapshot from disk"),
        definitions=DEFINITIONS,
        points=points,
    )
    loads = [r["loadavg_1m"]["before"] for p in points for r in p["reps"]] + [r["loadavg_1m"]["after"] for p in points for r in p["reps"]]
    if loads:
        result["notes"] = (
            f"1-minute load average around the repetitions: median {statistics.median(loads):.1f}, max {max(loads):.1f}"
            f" on {os.cpu_count()} CPUs. Above the CPU count, other jobs shared the machine and the timings are"
            " correspondingly slower and noisier; token counts, checks and snapshot sizes are unaffected."
        )
    result["table"] = table(points)
    result["consistency"] = dict(passed=bool(points) and all(p["summary"]["consistent_all_reps"] for p in points),
                                 failed=[dict(point=f"{p['num_in_flight']}x{p['mean_prefix']}", rep=r["rep"], check=k, **v)
                                         for p in points for r in p["reps"] for k, v in r["checks"].items() if not v["ok"]])
    result["exact"] = dict(all_reps=bool(points) and all(p["summary"]["exact_all_reps"] for p in points))
    result["continue_redone_decode_tokens_max"] = max(
        (r["modes"]["continue"]["redone_decode_tokens"] for p in points for r in p["reps"]), default=None)
    result["markdown"] = markdown(result)
    return result


def write(result: dict[str, Any], out: Path, *, plots: bool = True) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_name(out.name + ".json")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    written = [path]
    if plots:
        from benchmarks.plots import plot_all

        written += plot_all(result, out)
    return written


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.resume_throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--full", action="store_true", help="the full sweep: --samples 16,64,256 --prefix 128,512,2048")
    parser.add_argument("--samples", type=ints, default=None, help="in-flight samples at the cut, comma-separated (quick: 32)")
    parser.add_argument("--prefix", type=ints, default=None, help="mean prefix lengths L, comma-separated (quick: 128,512)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per point (default 3)")
    parser.add_argument("--big-point", type=int, default=256 * 2048,
                        help="points with samples x prefix >= this run at most --big-reps reps (default 524288)")
    parser.add_argument("--big-reps", type=int, default=1, help="reps for the biggest points (default 1)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="unix time after which no further repetition starts (every point always gets its first)")
    parser.add_argument("--budget-min", type=float, default=None, help="sets --deadline to now + this many minutes")
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt group (default 4)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output prefix: writes PREFIX.json and PREFIX_*.png (default benchmarks/results/resume_quick or resume_full)")
    engine = parser.add_argument_group("engine (defaults suit the tiny CPU model; on GPU pass a real --model)")
    engine.add_argument("--model", default=None, help="Hugging Face model folder (default: the project's tiny Llama)")
    engine.add_argument("--dtype", default="bfloat16")
    engine.add_argument("--max-model-len", type=int, default=4096)
    engine.add_argument("--max-num-seqs", type=int, default=256)
    engine.add_argument("--kv-cache-bytes", type=int, default=None,
                        help="KV cache bytes (default 2 GiB on CPU; on GPU unset means --gpu-memory-utilization)")
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    engine.add_argument("--tensor-parallel-size", type=int, default=1)
    engine.add_argument("--multiprocessing", action="store_true", help="run vLLM's worker in its own process (default: in the engine core)")
    args = parser.parse_args(argv)
    if args.budget_min is not None:
        args.deadline = time.time() + 60 * args.budget_min
    base = FULL if args.full else QUICK
    args.samples = args.samples or base["samples"]
    args.prefix = args.prefix or base["prefix"]
    args.reps = args.reps or base["reps"]
    if args.out is None:
        args.out = RESULTS / ("resume_full" if args.full else "resume_quick")
    if args.kv_cache_bytes is None:
        from partial_rollout.engine.factory import is_cpu_platform

        if is_cpu_platform():
            args.kv_cache_bytes = 2 * 2**30
    if args.multiprocessing:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # unwind: engines shut down their engine-core processes
    result = asyncio.run(run(args))
    paths = write(result, args.out)
    print(result["markdown"])
    print(f"\nconsistency check: {'passed' if result['consistency']['passed'] else 'FAILED'};"
          f" continue redid {result['continue_redone_decode_tokens_max']} decode tokens; exact: {result['exact']['all_reps']}")
    for p in paths:
        print(f"wrote {p}")
    return 0 if result["consistency"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
