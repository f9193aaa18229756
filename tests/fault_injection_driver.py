"""The reference trainer on N Ray engines whose actors are SIGKILLed at moments drawn from a seed.

Usage::

    python tests/fault_injection_driver.py OUT --engines N --seed S --moments start,first_token [--resume]

Run by tests/test_engine_fault_injection.py as the child the kill-and-resume harness SIGKILLs and
reruns. Each moment kills one engine (its process and descendants): ``start`` while the pool starts,
``first_token`` once one of the victim's requests has delivered its first token, ``cut`` during a
checkpoint's freeze, ``weight_update`` during a weight update. The seed draws the victim of each
moment and which cut or weight update it hits. Every kill is appended to ``OUT/kills.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import ray
from engine_kills import kill_one_while_starting, process_tree, send

from partial_rollout.engine import Cut, EngineConfig
from partial_rollout.pool import EnginePool
from partial_rollout_integrations.reference_grpo import CONFIG_DIR, load_config, run_training

MOMENTS = ("start", "first_token", "cut", "weight_update")
STEPS = 10


def record_kill(out: Path, run: int, moment: str, engine: int) -> None:
    with open(out / "kills.jsonl", "a") as f:
        f.write(json.dumps({"run": run, "moment": moment, "engine": engine}) + "\n")


class FaultyPool(EnginePool):
    """A real pool whose cuts and weight updates kill an engine while they are under way, when the plan says."""

    def setup(self, out: Path, run: int, due: dict[str, tuple[int, int]], trees: dict[int, list[int]]) -> None:
        self.out, self.run, self.due, self.trees = out, run, due, trees
        self.calls = {"cut": 0, "weight_update": 0}

    def kill_engine(self, moment: str, engine: int) -> None:
        send(self.trees[engine], signal.SIGKILL)
        record_kill(self.out, self.run, moment, engine)

    def _maybe_kill(self, moment: str) -> None:
        if moment not in self.due:
            return
        self.calls[moment] += 1
        nth, engine = self.due[moment]
        if self.calls[moment] == nth:
            # at the loop's next turn: after a weight update's calls are sent (the victim dies with them
            # under way), or right after a cut (which calls no engine)
            asyncio.get_running_loop().call_soon(self.kill_engine, moment, engine)

    async def cut(self) -> Cut:
        self._maybe_kill("cut")  # the cut asks no engine: the victim dies right after it, inside the save
        return await super().cut()

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        self._maybe_kill("weight_update")
        await super().update_weights(weights_dir, policy_version)


async def _start(config: EngineConfig, n: int, kill_at_start: bool) -> tuple[FaultyPool, int | None]:
    if not kill_at_start:
        return await FaultyPool.ray(config, n), None  # type: ignore[return-value]
    pool = await kill_one_while_starting(FaultyPool.ray(config, n), n)
    (dead,) = pool.failover.dead
    return pool, dead  # type: ignore[return-value]


async def _first_token(pool: FaultyPool, engine: int) -> None:
    """Kill ``engine`` once one of its requests has delivered a token (frozen first: nothing finishes meanwhile)."""
    while True:
        while not any(n >= 1 for n in pool.failover.on_engine(engine).values()):  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        send(pool.trees[engine], signal.SIGSTOP)
        await asyncio.sleep(0.2)
        if any(n >= 1 for n in pool.failover.on_engine(engine).values()):
            pool.kill_engine("first_token", engine)
            return
        send(pool.trees[engine], signal.SIGCONT)


async def main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    run = 1 if args.resume else 0
    moments = [m for m in args.moments.split(",") if m]
    assert set(moments) <= set(MOMENTS), moments
    rng = random.Random(args.seed * 10 + run)
    config = load_config(
        CONFIG_DIR / "fast.yaml",
        [
            f"checkpointing.checkpoint_dir={out / 'checkpoints'}",
            f"logger.log_dir={out / 'logs'}",
            f"grpo.max_num_steps={STEPS}",
            "checkpointing.save_period=2",
            f"grpo.seed={args.seed}",
        ],
    )
    gen = config.generation
    engine_config = EngineConfig(
        model=args.model,
        max_model_len=gen.max_model_len,
        max_num_seqs=gen.max_num_seqs,
        kv_cache_memory_bytes=gen.kv_cache_memory_bytes,
        multiprocessing=False,
        seed=config.grpo.seed,
    )
    started = time.perf_counter()
    pool, dead = await _start(engine_config, args.engines, "start" in moments)
    alive = [i for i in range(args.engines) if i != dead]
    trees = {
        i: process_tree(await pool.engines[i].actor.__ray_call__.remote(lambda _: os.getpid()))  # type: ignore[attr-defined]
        for i in alive
    }
    rng.shuffle(alive)
    later = [m for m in moments if m != "start"]
    assert len(later) < len(alive), f"{len(later)} kills need more than {len(alive)} live engines"
    due = {m: (rng.randint(1, 2), alive.pop()) for m in later}
    pool.setup(out, run, due, trees)
    if dead is not None:
        record_kill(out, run, "start", dead)
    print(f"run {run}: seed {args.seed}, engines {args.engines}, kills {due} (start: {dead})", flush=True)
    watcher = asyncio.ensure_future(_first_token(pool, due["first_token"][1])) if "first_token" in due else None
    try:
        await run_training(config, resume=args.resume, engine=pool, progress=False)
    finally:
        if watcher is not None:
            watcher.cancel()
        await pool.shutdown()
    print(f"run {run}: done in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--model", required=True)
    parser.add_argument("--engines", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--moments", default="")
    parser.add_argument("--resume", action="store_true")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:
        asyncio.run(main(parser.parse_args()))
    finally:
        ray.shutdown()
    sys.exit(0)
