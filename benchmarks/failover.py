"""Engine failover: one of N Ray-actor engines killed mid-run, against the same run uninterrupted.

Two runs of one workload on one pool of N engines (prefix cache emptied between them), the same
prompts, seeds and placement: **uninterrupted**, then **killed**, where engine 1's actor is killed
with ``ray.kill`` as soon as every request it holds has delivered ``--at`` tokens. In both runs the
clock that matters starts at that point (reached, not killed, in the uninterrupted run) and stops
when the last of engine 1's requests finishes: the time to finish the failed engine's work, against
the time the same work took uninterrupted. The token accounting of engine 1's requests is exact:
tokens the pool had received before the kill (carried over), tokens delivered over every engine
against each request's final length (the difference is decode tokens redone), requests lost or
finished twice.

On this machine the model is the project's tiny Llama, so seconds measure engine overheads on 2
shared CPU cores (the load average is in the JSON); the token counts are what carries over.

Run from the repository root::

    python -m benchmarks.failover                      # 3 engines x 8 requests x 512 tokens, kill at 128
    python -m benchmarks.failover --requests 12 --max-tokens 256 --at 64 --out /tmp/failover   # smoke test

Writes ``<out>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from partial_rollout.engine import Delta, EngineConfig
from partial_rollout.pool import EnginePool, Failover
from partial_rollout.snapshot import SampleRecord, SamplingSpec

RESULTS = Path(__file__).resolve().parent / "results"
VICTIM = 1
"""The engine killed (by position in the pool)."""


@dataclass
class Attempt:
    """One submission of a request to one engine: what it started from and what it delivered."""

    engine: int
    resume_from: SampleRecord | None
    tokens: list[int] = field(default_factory=list)


def watch(pool: EnginePool) -> dict[str, list[Attempt]]:
    """Record every stream of the pool's Ray engines (the engines stay real: each stream is passed through)."""
    attempts: dict[str, list[Attempt]] = defaultdict(list)
    for i, engine in enumerate(pool.engines):
        original = engine.stream  # type: ignore[attr-defined]

        def stream(  # type: ignore[no-untyped-def]
            request_id, prompt, sampling, *, index, resume_from=None, _i=i, _original=original
        ) -> AsyncIterator[Delta | SampleRecord]:
            attempt = Attempt(engine=_i, resume_from=resume_from)
            attempts[request_id].append(attempt)

            async def items() -> AsyncIterator[Delta | SampleRecord]:
                async for item in _original(request_id, prompt, sampling, index=index, resume_from=resume_from):
                    if isinstance(item, Delta):
                        attempt.tokens.extend(item.token_ids)
                    yield item

            return items()

        engine.stream = stream  # type: ignore[attr-defined]
    return attempts


async def until_delivered(pool: EnginePool, engine: int, tokens: int, timeout_s: float = 1800) -> set[str]:
    """Poll until every request ``engine`` holds has delivered ``tokens``; returns those requests."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        held = pool.failover.on_engine(engine)
        if held and min(held.values()) >= tokens:
            return set(held)
        await asyncio.sleep(0.01)
    raise TimeoutError(f"engine {engine} did not deliver {tokens} tokens per request in {timeout_s} s")


def workload(requests: int, max_tokens: int, seed: int) -> list[tuple[list[int], SamplingSpec]]:
    """Random prompts; every fourth sample greedy (every engine gets some), the others seeded (their
    continuation is declared inexact)."""
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(4, 500) for _ in range(rng.randrange(8, 40))],
            SamplingSpec(
                max_tokens=max_tokens,
                temperature=0.0 if i % 4 == 0 else 1.0,
                seed=None if i % 4 == 0 else seed + i,
                ignore_eos=True,
            ),
        )
        for i in range(requests)
    ]


async def one_run(
    pool: EnginePool,
    attempts: dict[str, list[Attempt]],
    name: str,
    work: list[tuple[list[int], SamplingSpec]],
    *,
    at: int,
    kill: bool,
) -> dict[str, Any]:
    """Generate ``work`` as requests ``<name><i>``; with ``kill``, kill engine :data:`VICTIM` at ``at`` tokens."""
    import ray

    failovers: list[tuple[float, Failover]] = []
    pool.failover.on_failover = lambda f: failovers.append((time.perf_counter(), f))
    started = time.perf_counter()
    finished: dict[str, float] = {}

    async def one(rid: str, prompt: list[int], sampling: SamplingSpec) -> SampleRecord:
        record = await pool.generate(rid, prompt, sampling, index=0)
        finished[rid] = time.perf_counter()
        return record

    tasks = {f"{name}{i}": asyncio.ensure_future(one(f"{name}{i}", p, s)) for i, (p, s) in enumerate(work)}
    victims = await until_delivered(pool, VICTIM, at)
    point = time.perf_counter()
    if kill:
        ray.kill(pool.engines[VICTIM].actor)  # type: ignore[attr-defined]
    records = {rid: await t for rid, t in tasks.items()}
    end = time.perf_counter()
    budget = work[0][1].max_tokens
    delivered = {rid: sum(len(a.tokens) for a in attempts[rid]) for rid in records}
    out: dict[str, Any] = dict(
        wall_s=round(end - started, 3),
        point_s=round(point - started, 3),
        victim_requests=sorted(victims, key=lambda r: int(r[len(name) :])),
        victim_finish_s=round(max(finished[r] for r in victims) - point, 3),
        lost=sum(1 for r in records.values() if r.num_tokens != budget),
        tokens_delivered=sum(delivered.values()),
        tokens_final=sum(r.num_tokens for r in records.values()),
        decode_tokens_redone=sum(delivered[rid] - records[rid].num_tokens for rid in records),
    )
    if kill:
        moved = [rid for rid in victims if len(attempts[rid]) > 1]
        # A moved request's second attempt starts from what the first one delivered.
        carried = {rid: cast(SampleRecord, attempts[rid][1].resume_from) for rid in moved}
        out["failover"] = dict(
            events=[f.fields() for _, f in failovers],
            moved_s=round(failovers[0][0] - point, 3),
            requests_moved=len(moved),
            tokens_carried=sum(carried[rid].num_tokens for rid in moved),
            carried_equals_received=all(
                carried[rid].token_ids.tolist() == attempts[rid][0].tokens
                and records[rid].token_ids[: len(attempts[rid][0].tokens)].tolist() == attempts[rid][0].tokens
                for rid in moved
            ),
            declared_inexact=sum(1 for rid in moved if records[rid].inexact),
            exact_greedy=sum(1 for rid in moved if records[rid].inexact is None),
        )
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from benchmarks.provenance import machine, versions

    model = args.model
    if model is None:
        from partial_rollout.models import TinyModelSpec, build_tiny_model

        model = str(build_tiny_model(TinyModelSpec(arch="llama")))
    config = EngineConfig(model=model, max_model_len=args.max_tokens + 64, multiprocessing=False)
    work = workload(args.engines * args.requests, args.max_tokens, args.seed)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    started = time.time()
    reps = []
    try:
        for _ in range(args.reps):  # a fresh pool each time: the kill takes one engine away
            pool = await EnginePool.ray(config, args.engines)
            attempts = watch(pool)
            try:
                uninterrupted = await one_run(pool, attempts, "u", work, at=args.at, kill=False)
                await pool.reset_prefix_cache()
                killed = await one_run(pool, attempts, "k", work, at=args.at, kill=True)
            finally:
                await pool.shutdown()
            reps.append(
                dict(
                    uninterrupted=uninterrupted,
                    killed=killed,
                    victim_finish_ratio=round(killed["victim_finish_s"] / uninterrupted["victim_finish_s"], 3),
                    wall_ratio=round(killed["wall_s"] / uninterrupted["wall_s"], 3),
                )
            )
    finally:
        ray.shutdown()
    return dict(
        benchmark="failover",
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        wall_s=round(time.time() - started, 1),
        command=" ".join(["python -m benchmarks.failover", *sys.argv[1:]]),
        machine=machine(),
        versions=versions(),
        config=dict(
            model=model,
            engines=args.engines,
            requests=len(work),
            max_tokens=args.max_tokens,
            kill_engine=VICTIM,
            kill_at_tokens=args.at,
            seed=args.seed,
        ),
        definitions=dict(
            point_s="seconds from the submission until every request on the killed engine had delivered kill_at_tokens",
            moved_s="seconds from the kill until the last of the killed engine's requests was resubmitted elsewhere",
            victim_finish_s="seconds from that point until the last of those requests finished",
            decode_tokens_redone="tokens delivered over every engine minus the final lengths, all requests",
            lost="requests that did not finish with their whole budget",
        ),
        reps=reps,
        median=dict(
            uninterrupted_victim_finish_s=statistics.median(r["uninterrupted"]["victim_finish_s"] for r in reps),
            killed_victim_finish_s=statistics.median(r["killed"]["victim_finish_s"] for r in reps),
            moved_s=statistics.median(r["killed"]["failover"]["moved_s"] for r in reps),
            victim_finish_ratio=statistics.median(r["victim_finish_ratio"] for r in reps),
            wall_ratio=statistics.median(r["wall_ratio"] for r in reps),
        ),
        decode_tokens_redone=sum(r[k]["decode_tokens_redone"] for r in reps for k in ("uninterrupted", "killed")),
        lost=sum(r[k]["lost"] for r in reps for k in ("uninterrupted", "killed")),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8, help="per engine")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--at", type=int, default=128, help="kill once each request on the engine has this many")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--reps", type=int, default=3, help="repetitions, each on a fresh pool")
    parser.add_argument("--model", default=None, help="a model folder (default: the tiny Llama)")
    parser.add_argument("--out", type=Path, default=RESULTS / "failover")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    out = args.out.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for r in result["reps"]:
        for name in ("uninterrupted", "killed"):
            run = r[name]
            print(
                f"{name:>13}: wall {run['wall_s']} s, engine {VICTIM}'s work after it {run['victim_finish_s']} s,"
                f" lost {run['lost']}, decode tokens redone {run['decode_tokens_redone']}"
            )
        f = r["killed"]["failover"]
        print(
            f"     failover: {f['requests_moved']} requests moved in {f['moved_s']} s, {f['tokens_carried']} tokens"
            f" carried over, carried == received: {f['carried_equals_received']}; ratio {r['victim_finish_ratio']}"
        )
    print(f"median: {result['median']} -> {out}")


if __name__ == "__main__":
    main()
