"""The resume benchmark by engine count: the stall of one cut across N Ray engines, and elastic resume N -> M.

**Stall of one cut** for 1, 2 and 4 engines (Ray actors on a local cluster, each pinned to its own
core group), each with ``--per-engine`` samples in flight (64 by default, seeded, 3-5 x ``--prefix``
tokens each): the samples are submitted to paused engines and start together once every engine holds
its own, and once every engine has run ``--prefix`` decode steps with every sample in flight the pool is
cut (every engine paused concurrently, keep mode) and resumed at once.
The stall is what the reference trainer logs: from the pause request until ``resume()`` returned,
minus the step each engine was finishing (its tokens belong to the cut). It is reported in
milliseconds and in decode steps (the stall over the median wall time of one engine step before
the cut), next to the engines' own pause times: their maximum, and their sum (what pausing one
after the other would cost).

**Elastic resume** N -> M (4 -> 2 and 2 -> 4): the cut of the N-engine point is finished in place
(the uninterrupted run), then, with every prefix cache emptied, continued on M engines from its
prefixes and regenerated from scratch on the same M engines. Reported: engine steps (the slowest
engine's) and wall time to finish against the uninterrupted remainder, and how many samples in
flight at the cut came out token-identical to the uninterrupted run, next to the noise floor
(regenerate against uninterrupted: the same seeded samples generated twice, in different batches).

All points share one set of 4 engines (sub-pools of 1 and 2), so the figures compare engine
counts, not engine starts. On this 2-core machine 4 engines share cores (two per core): their
wall times measure contention as much as the cut; steps do not.

Run from the repository root::

    python -m benchmarks.resume.engines                       # 1/2/4 engines x 64 in flight each
    python -m benchmarks.resume.engines --per-engine 8 --prefix 16 --out /tmp/e   # smoke test

Writes ``<out>.json`` and ``<out>.png`` (stall per engine count; elastic resume against uninterrupted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import numpy as np

from benchmarks.resume.measure import first_divergence
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec

RESULTS = Path(__file__).resolve().parents[1] / "results"
Work = dict[str, tuple[list[int], SamplingSpec]]


def workload(num: int, prefix: int, *, seed: int, max_model_len: int, vocab_size: int) -> Work:
    """``num`` seeded samples, 8 per prompt, each with a budget of 3-5 x ``prefix`` tokens (within the context).

    Long enough that every sample is still in flight when the cut comes, even a cut that comes late:
    polling N engines' step counters over Ray takes a while on a loaded machine.
    """
    rng = np.random.default_rng([seed, num, prefix])
    work: Work = {}
    for g in range(-(-num // 8)):
        prompt = rng.integers(3, vocab_size, 32).tolist()
        for i in range(min(8, num - 8 * g)):
            budget = min(int(rng.integers(3 * prefix, 5 * prefix + 1)), max_model_len - len(prompt))
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


async def _live(pool: Any, tasks: dict[str, asyncio.Future[SampleRecord]]) -> tuple[list[int], dict[str, int]]:
    """Each engine's step count and every running request's tokens (a request that ended early raises)."""
    for rid, task in tasks.items():
        if task.done():
            task.result()  # its error, if it failed
            raise RuntimeError(f"{rid} finished before the cut: raise --prefix (its budget is 3-5 x --prefix)")
    parts = await asyncio.gather(*[e.progress() for e in pool.engines])
    return [p.steps or 0 for p in parts], {rid: n for p in parts for rid, n in p.live_tokens.items()}


async def cut_point(pool: Any, work: Work, prefix: int) -> dict[str, Any]:
    """Start ``work`` on ``pool`` at once, cut once every engine has run ``prefix`` steps with all its samples
    in flight, finish in place.

    The samples are submitted to paused engines, which resume once they hold every one: over Ray on a
    loaded machine the submissions arrive over a second or more, and the first samples would otherwise
    run to their end before the last ones started (an earlier version cut 1 engine with 21 of 64 in flight).
    The engines are polled back to back, without sleeping, so that the cut comes as soon as it may.
    """
    await pool.pause_and_capture()
    tasks = {rid: asyncio.ensure_future(pool.generate(rid, p, s, index=0)) for rid, (p, s) in work.items()}
    while len((await _live(pool, tasks))[1]) < len(work):
        pass
    base = await _steps(pool)
    await pool.resume()
    timeline: list[tuple[float, list[int]]] = [(time.perf_counter(), [0] * len(pool.engines))]
    while True:
        counts, live = await _live(pool, tasks)
        steps = [s - b for s, b in zip(counts, base, strict=True)]
        timeline.append((time.perf_counter(), steps))
        if min(steps) >= prefix and len(live) == len(work) and min(live.values()) > 0:
            break
    requested = time.perf_counter()
    cut = await pool.pause_and_capture()
    captured = time.perf_counter()
    await pool.resume()
    resumed = time.perf_counter()
    at_cut = await _steps(pool)
    done, rest_s = await _finish(pool, tasks)
    after = await _steps(pool)
    # one engine step's wall time before the cut, median over engines: over the second half of the polls
    # (past the prompts' prefill), or from the submission when the cut came at the first polls
    first, last = timeline[len(timeline) // 2 if len(timeline) >= 4 else 0], timeline[-1]
    per_engine = [(last[0] - first[0]) / max(1, last[1][e] - first[1][e]) for e in range(len(pool.engines))]
    step_s = statistics.median(per_engine)
    stall_s = resumed - requested - cut.stop_s
    in_flight = [r for r in cut.samples.values() if r.state is SampleState.IN_FLIGHT and r.num_tokens]
    if len(in_flight) < len(work):
        raise RuntimeError(f"the cut came late: {len(in_flight)} of {len(work)} samples in flight; raise --prefix")
    return dict(
        engines=len(pool.engines),
        samples=len(work),
        in_flight_at_cut=len(in_flight),
        prefix_tokens=sum(r.num_tokens for r in in_flight),
        stall_ms=1e3 * stall_s,
        stall_decode_steps=stall_s / step_s,
        decode_step_ms=1e3 * step_s,
        pause_ms=1e3 * cut.pause_s,
        stop_ms=1e3 * cut.stop_s,
        capture_to_resume_ms=1e3 * (resumed - captured),
        engine_pause_ms=[1e3 * p for p in cut.engine_pause_s],
        engine_pause_max_ms=1e3 * max(cut.engine_pause_s),
        engine_pause_sum_ms=1e3 * sum(cut.engine_pause_s),
        requests_per_engine=[sum(1 for e in cut.engines.values() if e == i) for i in range(len(pool.engines))],
        steps_before_cut=[a - b for a, b in zip(at_cut, base, strict=True)],
        # from the last poll before the cut (a few steps early: polling engines over Ray takes a while)
        steps_after_cut=[a - b - c for a, b, c in zip(after, base, timeline[-1][1], strict=True)],
        steps_after_resume_returned=[a - b for a, b in zip(after, at_cut, strict=True)],
        rest_s=rest_s,
        _cut=cut,
        _done=done,
    )


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
    pool = await EnginePool.ray(config, most, count_steps=True)
    start_s = time.perf_counter() - started
    vocab = (await pool.fingerprints()).vocab_size
    result: dict[str, Any] = dict(
        benchmark="resume_engines",
        machine=dict(cpus=os.cpu_count(), platform=platform.platform(), load_before=os.getloadavg()),
        commit=_commit(),
        config=dict(vars(args), model=model, out=str(args.out), engine_start_s=start_s),
        cut=[],
        elastic=[],
    )
    cuts: dict[int, dict[str, Any]] = {}
    try:
        for n in args.engines:
            sub = EnginePool(pool.engines[:n])
            await sub.reset_prefix_cache()
            work = workload(
                n * args.per_engine, args.prefix, seed=n, max_model_len=args.max_model_len, vocab_size=vocab
            )
            point = await cut_point(sub, work, args.prefix)
            cuts[n] = dict(point, _work=work)
            result["cut"].append({k: v for k, v in point.items() if not k.startswith("_")})
            print(_cut_line(result["cut"][-1]), flush=True)
            _write(args.out, result)
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
            _write(args.out, result)
    finally:
        await pool.shutdown()
    result["machine"]["load_after"] = os.getloadavg()
    _write(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    return result


def _cut_line(p: dict[str, Any]) -> str:
    return (
        f"{p['engines']} engine(s) x {p['samples'] // p['engines']}: stall {p['stall_ms']:.1f} ms"
        f" = {p['stall_decode_steps']:.2f} decode steps (step {p['decode_step_ms']:.1f} ms);"
        f" engine pauses max {p['engine_pause_max_ms']:.1f} / sum {p['engine_pause_sum_ms']:.1f} ms"
    )


def _elastic_line(e: dict[str, Any]) -> str:
    c, r = e["continue"], e["regenerate"]
    return (
        f"{e['saved_on']} -> {e['engines']}: steps uninterrupted {e['uninterrupted_steps']} / continue {c['steps']}"
        f" / regenerate {r['steps']}; wall {e['uninterrupted_s']:.1f} / {c['wall_s']:.1f} / {r['wall_s']:.1f} s;"
        f" identical {c['identical_to_uninterrupted']}/{c['in_flight']}"
        f" (noise floor {r['identical_to_uninterrupted']}/{r['in_flight']})"
    )


def table(result: dict[str, Any]) -> str:
    """The README tables of a result: the stall per engine count, then the elastic resumes."""
    rows = [
        "| engines x in flight each | samples in flight at the cut | stall ms (decode steps) | one decode step ms"
        " | engine pauses ms: max / sum | requests per engine at the cut |",
        "|---|---|---|---|---|---|",
    ]
    for p in result["cut"]:
        rows.append(
            f"| {p['engines']} x {p['samples'] // p['engines']} | {p['in_flight_at_cut']} | {p['stall_ms']:.1f}"
            f" ({p['stall_decode_steps']:.2f}) | {p['decode_step_ms']:.1f} | {p['engine_pause_max_ms']:.1f} /"
            f" {p['engine_pause_sum_ms']:.1f} | {', '.join(map(str, p['requests_per_engine']))} |"
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


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def _write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    cuts = result["cut"]
    n = [p["engines"] for p in cuts]
    a.plot(n, [p["stall_ms"] for p in cuts], "o-", label="stall (pool)")
    a.plot(n, [p["engine_pause_max_ms"] for p in cuts], "s--", label="engine pauses: max")
    a.plot(n, [p["engine_pause_sum_ms"] for p in cuts], "^:", label="engine pauses: sum (one after another)")
    a.set(xlabel="engines", ylabel="ms", title="one cut across N engines", xticks=n)
    a.legend(fontsize=8)
    b.bar([str(x) for x in n], [p["stall_decode_steps"] for p in cuts])
    b.set(xlabel="engines", ylabel="decode steps", title="stall in decode steps")
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
    ap.add_argument("--prefix", type=int, default=64, help="mean prefix (decode steps before the cut)")
    ap.add_argument("--model", default=None, help="model folder (default: the tiny Llama)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--kv-cache-bytes", type=int, default=64 * 2**20)
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
