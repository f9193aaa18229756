"""The resume benchmark by engine count: what a save costs each of N Ray engines, and elastic resume N -> M.

**What a save costs** 1, 2 and 4 engines (Ray actors on a local cluster, each pinned to its own
core group), each with ``--per-engine`` samples in flight (64 by default, seeded, 3-5 x ``--prefix``
tokens each, plus the steps the saves span). Once every engine has run ``--prefix`` decode steps
with every sample in flight, the pool is saved as a trainer saves it: the pool's cut (what the
engines streamed to this process; no engine is paused and no actor is called), a snapshot built in
memory (where a trainer's gate reopens), then its write in a thread while generation goes on. Then,
every ``--every`` steps of the slowest engine, the same again, alternating with a mark where
nothing is saved: ``--saves`` saves and as many marks without one, over the same run.

Each engine records the time of each of its steps on the engine's clock
(:mod:`benchmarks.resume.steps`), so per save and per engine: the **decode steps lost** (the steps
it would have run at its steady rate over the window, minus those it ran; signed) in the save's
window (from the cut call until the snapshot is built) and in the window after it (until 16 steady
step times after the write returned), and the pool's **tokens per second** from the cut to the end
of that window over its steady rate before. A mark without a save gets the windows of the save
before it: the same estimator where nothing was saved. The target is each engine's median over the
saves of its steps lost in the save's window: at most 0.1.

**Elastic resume** N -> M (4 -> 2 and 2 -> 4): the first save's cut of the N-engine point is
finished in place (the uninterrupted run, the later saves included: they change nothing in it),
then, with every prefix cache emptied, continued on M engines from its prefixes and regenerated
from scratch on the same M engines. Reported: engine steps (the slowest engine's) and wall time to
finish against the uninterrupted remainder, and how many samples in flight at the cut came out
token-identical to the uninterrupted run, next to the noise floor (regenerate against
uninterrupted: the same seeded samples generated twice, in different batches).

All points share one set of 4 engines (sub-pools of 1 and 2), so the figures compare engine
counts, not engine starts. On this 2-core machine 4 engines share cores (two per core): their
wall times measure contention as much as the save; steps do not.

Run from the repository root::

    python -m benchmarks.resume.engines                       # 1/2/4 engines x 64 in flight each
    python -m benchmarks.resume.engines --per-engine 8 --prefix 16 --saves 2 --every 16 --out /tmp/e   # smoke test

Writes ``<out>.json`` and ``<out>.png`` (steps lost per save and engine count; elastic resume against uninterrupted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import numpy as np

from benchmarks import provenance
from benchmarks.resume import engine_calls as calls
from benchmarks.resume.measure import first_divergence
from benchmarks.resume.steps import Timeline, Windows, cost, windows
from partial_rollout.snapshot import (
    Fingerprints,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    save_snapshot,
)

RESULTS = Path(__file__).resolve().parents[1] / "results"
POLL_S = 0.02
"""Seconds between two polls of the engines' step counters (each a Ray call per engine): polls back to
back would load the cores the engines run on, and make the saves' windows, where the loop is busy
elsewhere, look faster than the steady state."""
TARGET_STEPS_LOST = 0.1
"""Decode steps a save may cost each engine (its median over the saves, save window)."""
DEFINITIONS = {
    "steps_lost": (
        "an engine's decode steps lost to a save in the save's window (from the cut call until the snapshot is "
        "built in memory, where a trainer's gate reopens): its steady rate (steps per second over the 32 steps "
        "before the cut) x the window, minus the steps it ran in it. Steps timed on the engine's clock (vLLM's "
        "per-step inter-token latencies; benchmarks/resume/steps.py), the steps at the window's ends counted for "
        "their share inside it: fractional and signed (noise makes it negative). Target: each engine's median "
        "over the saves <= 0.1"
    ),
    "steps_lost_after": (
        "the same over the window after it: from the snapshot built until 16 steady step times after its write "
        "(in a thread, beside generation) returned"
    ),
    "no_save_*": (
        "the same figures at the marks without a save (every other mark, the windows of the save before it): what"
        " the estimator gives where nothing is saved"
    ),
    "*_per_engine": ("each engine's median over the saves (or the marks without one), in pool order"),
    "steps_lost_worst_engine": ("the largest of steps_lost_per_engine; steps_lost_met: it is <= steps_lost_target"),
    "around_vs_steady": (
        "the pool's tokens per second from the cut until the end of the window after it, over its steady tokens "
        "per second before the cut (median over the saves)"
    ),
    "tok_s_around_vs_no_save": (
        "around_vs_steady over no_save_around_vs_steady: tokens per second around a save against around a mark "
        "without one, each relative to the pace before it. 1 = the save cost nothing"
    ),
    "cut_ms": ("the pool's cut (Cut.cut_s): read from what each Ray engine streamed to this process, no actor called"),
    "gate_ms": ("from the cut call until the snapshot was built in memory"),
    "written_ms": ("from the cut call until save_snapshot returned in its thread"),
}
Work = dict[str, tuple[list[int], SamplingSpec]]


def workload(num: int, prefix: int, *, extra: int, seed: int, max_model_len: int, vocab_size: int) -> Work:
    """``num`` seeded samples, 8 per prompt, each with a budget of 3-5 x ``prefix`` + ``extra`` tokens (within context).

    Long enough that every sample is still in flight at every save (``extra`` covers the steps the
    saves span), even a first save that comes late: polling N engines over Ray takes a while on a
    loaded machine.
    """
    rng = np.random.default_rng([seed, num, prefix])
    work: Work = {}
    for g in range(-(-num // 8)):
        prompt = rng.integers(3, vocab_size, 32).tolist()
        for i in range(min(8, num - 8 * g)):
            budget = min(int(rng.integers(3 * prefix, 5 * prefix + 1)) + extra, max_model_len - len(prompt))
            spec = SamplingSpec(max_tokens=budget, temperature=1.0, seed=int(rng.integers(2**31)), ignore_eos=True)
            work[f"prompt-{g:04d}/{i}"] = (prompt, spec)
    return work


async def _sampled(pool: Any) -> int:
    """Tokens the engines sampled so far, by vLLM's own statistics."""
    return sum(p.generation_tokens or 0 for p in await asyncio.gather(*[e.progress() for e in pool.engines]))


async def _steps(pool: Any) -> list[int]:
    return [p.steps or 0 for p in await asyncio.gather(*[e.progress() for e in pool.engines])]


async def _finish(pool: Any, tasks: dict[str, asyncio.Future[SampleRecord]]) -> tuple[dict[str, SampleRecord], float]:
    t = time.perf_counter()
    done = {rid: await task for rid, task in tasks.items()}
    return done, time.perf_counter() - t


async def _live(
    pool: Any, tasks: dict[str, asyncio.Future[SampleRecord]], *, strict: bool = True
) -> tuple[list[int], dict[str, int]]:
    """Each engine's step count and every running request's tokens (``strict``: a request that ended raises)."""
    for rid, task in tasks.items():
        if task.done():
            task.result()  # its error, if it failed
            if strict:
                raise RuntimeError(f"{rid} finished before the first save: raise --prefix (its budget is 3-5 x it)")
    parts = await asyncio.gather(*[e.progress() for e in pool.engines])
    return [p.steps or 0 for p in parts], {rid: n for p in parts for rid, n in p.live_tokens.items()}


def snapshot_of(cut: Any, work: Work, fingerprints: Fingerprints) -> Snapshot:
    """What a trainer's save holds of the pool's cut: one group per sample (each was submitted as sample 0)."""
    groups = [
        GroupRecord(
            group_id=rid.replace("/", "-"),
            prompt_token_ids=np.asarray(work[rid][0], dtype=np.int32),
            state=GroupState.IN_FLIGHT,
            dispatch_version=0,
            samples=[record],
        )
        for rid, record in cut.samples.items()
    ]
    return Snapshot(
        trainer_step=1, policy_version=0, fingerprints=fingerprints, groups=groups, metadata={"bench": "engines"}
    )


async def _wait_steps(
    pool: Any, tasks: dict[str, asyncio.Future[SampleRecord]], since: list[int], n: int, *, strict: bool
) -> None:
    """Until every engine has run ``n`` steps since ``since``, polled every :data:`POLL_S` (``strict``: see _live)."""
    while True:
        counts, _ = await _live(pool, tasks, strict=strict)
        if min(c - s for c, s in zip(counts, since, strict=True)) >= n:
            return
        await asyncio.sleep(POLL_S)


async def save_point(pool: Any, work: Work, args: argparse.Namespace, fingerprints: Fingerprints) -> dict[str, Any]:
    """Start ``work`` on ``pool``, save it ``--saves`` times between as many marks without a save, finish in place.

    The first save comes once every engine has run ``--prefix`` steps with all its samples in
    flight (a point whose first save finds a sample finished or not yet started fails instead of
    being recorded); each mark after it ``--every`` steps of the slowest engine after the one before.
    """
    tasks = {rid: asyncio.ensure_future(pool.generate(rid, p, s, index=0)) for rid, (p, s) in work.items()}
    while len((await _live(pool, tasks))[1]) < len(work):  # noqa: ASYNC110  (polling engines, no event to wait on)
        await asyncio.sleep(POLL_S)
    base = await _steps(pool)
    await _wait_steps(pool, tasks, base, args.prefix, strict=True)
    polled = await _steps(pool)  # the last poll before the first save
    marks: list[dict[str, Any]] = []
    first: Any = None
    with tempfile.TemporaryDirectory(prefix="engines-bench-") as tmp:
        writing: asyncio.Future[float] | None = None
        for m in range(2 * args.saves):
            if m:
                # later saves may find a sample finished (an engine far ahead of the slowest): a save as any other
                await _wait_steps(pool, tasks, marks[-1]["_steps"], args.every, strict=False)
            if writing is not None:
                await writing  # the previous save's write is done before the next mark
            at = await _steps(pool)
            t_cut = time.perf_counter()
            if m % 2 == 0:
                captured = await pool.cut()  # suspends nothing: no actor is called
                snapshot = snapshot_of(captured, work, fingerprints)
                gate_s = time.perf_counter() - t_cut
                path = Path(tmp) / f"save-{m}" / "partial_rollouts.safetensors"

                def write(snapshot: Snapshot = snapshot, path: Path = path) -> float:
                    path.parent.mkdir()
                    save_snapshot(snapshot, path)
                    return time.perf_counter()

                writing = asyncio.ensure_future(asyncio.to_thread(write))
                first = first or captured
                mark = dict(
                    save=True,
                    cut_ms=1e3 * captured.cut_s,
                    gate_ms=1e3 * gate_s,
                    engine_tokens=captured.engine_tokens,
                    samples=len(captured.samples),
                    _t=t_cut,
                    _writing=writing,
                )
            else:  # a mark without a save: the windows of the save before it
                writing = None
                mark = dict(save=False, _t=t_cut)
            marks.append(dict(mark, _steps=at))
        if writing is not None:
            await writing
        for mark in marks:
            if mark["save"]:
                mark["written_ms"] = 1e3 * (mark.pop("_writing").result() - mark["_t"])
        done, rest_s = await _finish(pool, tasks)
    after = await _steps(pool)
    timelines = [Timeline.of(log) for log in await calls.step_logs(pool)]
    in_flight = [r for r in first.samples.values() if r.state is SampleState.IN_FLIGHT and r.num_tokens]
    if len(in_flight) < len(work):
        raise RuntimeError(f"the first save came late: {len(in_flight)} of {len(work)} samples in flight")
    saves = _costs(marks, timelines)
    return dict(
        engines=len(pool.engines),
        samples=len(work),
        in_flight_at_cut=len(in_flight),
        prefix_tokens=sum(r.num_tokens for r in in_flight),
        requests_per_engine=[sum(1 for e in first.engines.values() if e == i) for i in range(len(pool.engines))],
        steps_before_cut=[a - b for a, b in zip(marks[0]["_steps"], base, strict=True)],
        # from the last poll before the first save (a few steps early: polling engines over Ray takes a while)
        steps_after_cut=[a - p for a, p in zip(after, polled, strict=True)],
        rest_s=rest_s,
        saves=[{k: v for k, v in s.items() if not k.startswith("_")} for s in saves],
        **summary(saves, len(pool.engines)),
        _cut=first,
        _done=done,
    )


def _costs(marks: list[dict[str, Any]], timelines: list[Timeline]) -> list[dict[str, Any]]:
    """Each mark's windows (a mark without a save takes the save's before it) and every engine's figures in them."""
    spans: Windows | None = None
    for mark in marks:
        rates = [tl.steady(mark["_t"])[0] for tl in timelines]
        rate = statistics.median(r for r in rates if not math.isnan(r)) if any(not math.isnan(r) for r in rates) else 0
        if mark["save"]:
            spans = windows(gate_s=mark["gate_ms"] / 1e3, written_s=mark["written_ms"] / 1e3, steady_steps_per_s=rate)
        assert spans is not None, "every other mark is a save, the first one included"
        per_engine = [cost(tl, mark["_t"], spans) for tl in timelines]
        mark.update(
            gate_window_ms=1e3 * spans.gate_s,
            after_window_ms=1e3 * (spans.end_s - spans.gate_s),
            per_engine=per_engine,
            pool_around_vs_steady=_pool_ratio(per_engine),
        )
    return marks


def _pool_ratio(per_engine: list[dict[str, float | None]]) -> float | None:
    """The pool's tokens per second from the cut to the window's end over its steady rate before."""
    around = [e["tok_s_around"] for e in per_engine]
    steady = [e["steady_tok_s"] for e in per_engine]
    if None in around or None in steady:
        return None
    return sum(a for a in around if a is not None) / sum(s for s in steady if s is not None)


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summary(marks: list[dict[str, Any]], engines: int) -> dict[str, Any]:
    """Each engine's median over the saves (and over the marks without one) of each figure; the target."""
    out: dict[str, Any] = {}
    for kind, chosen in (("", [m for m in marks if m["save"]]), ("no_save_", [m for m in marks if not m["save"]])):
        for key in ("steps_lost", "steps_lost_after"):
            out[f"{kind}{key}_per_engine"] = [
                _median([m["per_engine"][e][key] for m in chosen]) for e in range(engines)
            ]
        out[f"{kind}around_vs_steady"] = _median([m["pool_around_vs_steady"] for m in chosen])
        out[f"{kind}steady_step_ms_per_engine"] = [
            _median([m["per_engine"][e]["steady_step_ms"] for m in chosen]) for e in range(engines)
        ]
    worst = [v for v in out["steps_lost_per_engine"] if v is not None]
    out["steps_lost_worst_engine"] = max(worst) if len(worst) == engines else None
    out["steps_lost_target"] = TARGET_STEPS_LOST
    out["steps_lost_met"] = (
        out["steps_lost_worst_engine"] is not None and out["steps_lost_worst_engine"] <= TARGET_STEPS_LOST
    )
    out["tok_s_around_vs_no_save"] = (
        out["around_vs_steady"] / out["no_save_around_vs_steady"]
        if out["around_vs_steady"] is not None and out["no_save_around_vs_steady"]
        else None
    )
    saves = [m for m in marks if m["save"]]
    out["cut_ms"] = _median([m["cut_ms"] for m in saves])
    out["gate_ms"] = _median([m["gate_ms"] for m in saves])
    out["written_ms"] = _median([m["written_ms"] for m in saves])
    return out


async def elastic(
    pool: Any, work: Work, cut: Any, ref: dict[str, SampleRecord], *, ref_steps: int, ref_s: float
) -> dict[str, Any]:
    """Continue ``cut`` on ``pool`` (caches emptied), then regenerate the same work from scratch there."""
    out: dict[str, Any] = dict(engines=len(pool.engines), uninterrupted_steps=ref_steps, uninterrupted_s=ref_s)
    for mode in ("continue", "regenerate"):
        await pool.reset_prefix_cache()
        base = await _steps(pool)
        sampled = await _sampled(pool)
        tasks = {
            rid: asyncio.ensure_future(
                pool.generate(
                    rid if mode == "continue" else f"regen-{rid}",
                    *work[rid],
                    index=0,
                    resume_from=cut.samples[rid] if mode == "continue" else None,
                )
            )
            for rid in cut.samples  # what was running at the cut; the rest had finished before the save
        }
        done, wall = await _finish(pool, tasks)
        steps = [a - b for a, b in zip(await _steps(pool), base, strict=True)]
        in_flight = [rid for rid, r in cut.samples.items() if r.state is SampleState.IN_FLIGHT and r.num_tokens]
        same = sum(np.array_equal(done[rid].token_ids, ref[rid].token_ids) for rid in in_flight)
        first = [first_divergence(done[rid].token_ids, ref[rid].token_ids) for rid in in_flight]
        # decode tokens the engines sampled beyond what was missing at the cut (the prefix already saved)
        needed = sum(done[rid].num_tokens - cut.samples[rid].num_tokens for rid in cut.samples)
        redone = await _sampled(pool) - sampled - needed
        out[mode] = dict(
            steps=max(steps),
            steps_per_engine=steps,
            wall_s=wall,
            in_flight=len(in_flight),
            identical_to_uninterrupted=int(same),
            first_divergences=sorted(f for f, rid in zip(first, in_flight, strict=True) if f < ref[rid].num_tokens),
            prefix_tokens_redone=redone,
        )
    out["beyond_noise_floor"] = (
        out["continue"]["identical_to_uninterrupted"] < out["regenerate"]["identical_to_uninterrupted"]
    )
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from partial_rollout.engine import EngineConfig
    from partial_rollout.models import TinyModelSpec, build_tiny_model
    from partial_rollout.pool import EnginePool, connect_ray

    if args.saves < 1 or args.every < 1:
        raise SystemExit("--saves and --every must be at least 1")

    model = args.model or str(build_tiny_model(TinyModelSpec(arch="llama")))
    config = EngineConfig(
        model=model,
        max_model_len=args.max_model_len,
        max_num_seqs=max(args.per_engine, 8) * 2,
        kv_cache_memory_bytes=args.kv_cache_bytes,
        multiprocessing=False,
    )
    connect_ray(None, object_store_memory=256 * 2**20, log_to_driver=False)
    started = time.perf_counter()
    most = max(args.engines)
    pool = await calls.ray_pool(config, most)
    start_s = time.perf_counter() - started
    fingerprints = await pool.fingerprints()
    vocab = fingerprints.vocab_size
    result: dict[str, Any] = dict(
        benchmark="resume_engines",
        machine=dict(cpus=os.cpu_count(), platform=platform.platform(), load_before=os.getloadavg()),
        commit=provenance.short_commit(),
        config=dict(vars(args), model=model, out=str(args.out), engine_start_s=start_s),
        definitions=DEFINITIONS,
        save=[],
        elastic=[],
    )
    cuts: dict[int, dict[str, Any]] = {}
    try:
        for n in args.engines:
            sub = EnginePool(pool.engines[:n])
            await sub.reset_prefix_cache()
            work = workload(
                n * args.per_engine,
                args.prefix,
                extra=2 * args.saves * args.every,
                seed=n,
                max_model_len=args.max_model_len,
                vocab_size=vocab,
            )
            point = await save_point(sub, work, args, fingerprints)
            cuts[n] = dict(point, _work=work)
            result["save"].append({k: v for k, v in point.items() if not k.startswith("_")})
            print(_save_line(result["save"][-1]), flush=True)
            provenance.write_json(args.out, result)
        for n, m in args.elastic:
            if n not in cuts or m > most:
                continue
            c = cuts[n]
            e = await elastic(
                EnginePool(pool.engines[:m]),
                c["_work"],
                c["_cut"],
                c["_done"],
                ref_steps=max(c["steps_after_cut"]),
                ref_s=c["rest_s"],
            )
            e.update(saved_on=n)
            result["elastic"].append(e)
            print(_elastic_line(e), flush=True)
            provenance.write_json(args.out, result)
    finally:
        await pool.shutdown()
    result["machine"]["load_after"] = os.getloadavg()
    provenance.write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    return result


def _save_line(p: dict[str, Any]) -> str:
    return (
        f"{p['engines']} engine(s) x {p['samples'] // p['engines']}: decode steps lost per save, each engine's median"
        f" {_list(p['steps_lost_per_engine'])} (without a save {_list(p['no_save_steps_lost_per_engine'])});"
        f" after it {_list(p['steps_lost_after_per_engine'])}"
        f" (without {_list(p['no_save_steps_lost_after_per_engine'])});"
        f" tokens/s around a save vs without {_num(p['tok_s_around_vs_no_save'])};"
        f" {'met' if p['steps_lost_met'] else 'NOT MET'} (<= {p['steps_lost_target']})"
    )


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _list(values: list[float | None], digits: int = 2) -> str:
    return ", ".join(_num(v, digits) for v in values)


def _elastic_line(e: dict[str, Any]) -> str:
    c, r = e["continue"], e["regenerate"]
    return (
        f"{e['saved_on']} -> {e['engines']}: steps uninterrupted {e['uninterrupted_steps']} / continue {c['steps']}"
        f" / regenerate {r['steps']}; wall {e['uninterrupted_s']:.1f} / {c['wall_s']:.1f} / {r['wall_s']:.1f} s;"
        f" identical {c['identical_to_uninterrupted']}/{c['in_flight']}"
        f" (noise floor {r['identical_to_uninterrupted']}/{r['in_flight']})"
    )


def table(result: dict[str, Any]) -> str:
    """The README tables of a result: what a save costs per engine count, then the elastic resumes."""
    rows = [
        "| engines x in flight each | saves | decode steps lost per save, each engine (median): save window"
        " (without a save) | worst engine | after it, each engine (without a save) | tok/s around a save / without"
        " | cut ms; gate ms; write ms | one decode step ms, each engine | requests per engine at the first save |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in result.get("save", []):  # results before the cut without a pause have none
        rows.append(
            f"| {p['engines']} x {p['samples'] // p['engines']} | {sum(m['save'] for m in p['saves'])}"
            f" | {_list(p['steps_lost_per_engine'], 3)} ({_list(p['no_save_steps_lost_per_engine'], 3)})"
            f" | {_num(p['steps_lost_worst_engine'], 3)}{'' if p['steps_lost_met'] else ' **over 0.1**'}"
            f" | {_list(p['steps_lost_after_per_engine'])} ({_list(p['no_save_steps_lost_after_per_engine'])})"
            f" | {_num(p['tok_s_around_vs_no_save'])} | {_num(p['cut_ms'], 1)}; {_num(p['gate_ms'], 1)};"
            f" {_num(p['written_ms'], 1)} | {_list(p['steady_step_ms_per_engine'], 1)}"
            f" | {', '.join(map(str, p['requests_per_engine']))} |"
        )
    rows += [
        "",
        "| save -> resume engines | samples continued | engine steps to finish: uninterrupted / continue / regenerate"
        " | wall s: uninterrupted / continue / regenerate | prefix tokens redone: continue / regenerate"
        " | token-identical to uninterrupted: continue / noise floor |",
        "|---|---|---|---|---|---|",
    ]
    for e in result["elastic"]:
        c, r = e["continue"], e["regenerate"]
        flag = " **beyond**" if e["beyond_noise_floor"] else ""
        rows.append(
            f"| {e['saved_on']} -> {e['engines']} | {c['in_flight']} | {e['uninterrupted_steps']} / {c['steps']} /"
            f" {r['steps']} | {e['uninterrupted_s']:.1f} / {c['wall_s']:.1f} / {r['wall_s']:.1f} |"
            f" {c['prefix_tokens_redone']:,} / {r['prefix_tokens_redone']:,} |"
            f" {c['identical_to_uninterrupted']}/{c['in_flight']} /"
            f" {r['identical_to_uninterrupted']}/{r['in_flight']}{flag} |"
        )
    return "\n".join(rows)


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    points = result["save"]
    n = [p["engines"] for p in points]
    for ax, key, title in (
        (a, "steps_lost", "decode steps lost per save: save window"),
        (b, "steps_lost_after", "in the window after it"),
    ):
        for shift, saved, marker, label in ((-0.08, True, "o", "save"), (0.08, False, "x", "no save (same windows)")):
            xs, ys = [], []
            for p in points:
                for m in p["saves"]:
                    if m["save"] is saved:
                        vals = [e[key] for e in m["per_engine"] if e[key] is not None]
                        xs += [p["engines"] + shift] * len(vals)
                        ys += vals
            ax.plot(xs, ys, marker, alpha=0.6, label=f"{label}: each engine, each mark")
        if key == "steps_lost":
            ax.axhline(TARGET_STEPS_LOST, color="k", ls="--", lw=0.8, label=f"target {TARGET_STEPS_LOST}")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(xlabel="engines", ylabel="decode steps lost (signed)", title=title, xticks=n)
        ax.legend(fontsize=7)
    labels = [f"{e['saved_on']}->{e['engines']}" for e in result["elastic"]]
    x = np.arange(len(labels))
    steps: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("uninterrupted", lambda e: e["uninterrupted_steps"]),
        ("continue", lambda e: e["continue"]["steps"]),
        ("regenerate", lambda e: e["regenerate"]["steps"]),
    ]
    for k, (name, get) in enumerate(steps):
        c.bar(x + (k - 1) * 0.27, [get(e) for e in result["elastic"]], 0.27, label=name)
    c.set(xticks=x, xticklabels=labels, ylabel="engine steps (slowest engine)", title="elastic resume: steps to finish")
    c.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument(
        "--elastic", type=lambda s: tuple(int(x) for x in s.split("->")), nargs="*", default=[(4, 2), (2, 4)]
    )
    ap.add_argument("--per-engine", type=int, default=64, help="samples in flight per engine")
    ap.add_argument("--prefix", type=int, default=64, help="mean prefix (decode steps before the first save)")
    ap.add_argument("--saves", type=int, default=3, help="saves per point, each followed by a mark without one")
    ap.add_argument("--every", type=int, default=32, help="steps of the slowest engine between two marks")
    ap.add_argument("--model", default=None, help="model folder (default: the tiny Llama)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--kv-cache-bytes", type=int, default=128 * 2**20)
    ap.add_argument("--out", type=Path, default=RESULTS / "resume_engines")
    ap.add_argument("--report", type=Path, help="print the README tables of this result JSON and exit")
    args = ap.parse_args(argv)
    if args.report:
        print(table(json.loads(args.report.read_text())))
        return 0
    print(table(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
