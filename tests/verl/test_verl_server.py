"""The durable server on a real vLLM engine: verl's abort-and-retry protocol loses no draw.

verl's client answers an ``aborted`` reply by re-sending prompt + tokens so far with the rest of
the budget; these tests speak that protocol to :class:`DurableServer` as verl's client does and
compare with the same sample generated uninterrupted (float32, where the engine's decode and
re-prefill agree to about 1e-5). Without the held sampler state a seeded sample's continuation is
a fresh draw and the tokens after the abort differ.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from partial_rollout.engine import EngineConfig
from partial_rollout.snapshot import SampleState
from partial_rollout_integrations.verl.server import DurableServer
from partial_rollout_integrations.verl.wire import HeldSample, ServerOutput

pytestmark = pytest.mark.engine

_rng = random.Random(5)
PROMPT = [_rng.randrange(4, 500) for _ in range(16)]
BUDGET = 160
PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
NUMERICS = 1e-4
"""|logprob difference| allowed between a decode and a continuation's re-prefill in float32."""


@pytest.fixture(scope="module")
def config(tiny_llama: Path) -> EngineConfig:
    return EngineConfig(model=str(tiny_llama), dtype="float32", max_model_len=1024, multiprocessing=False)


@pytest.fixture(scope="module")
def server(config: EngineConfig, loop_thread: Any) -> Any:
    srv = DurableServer(config, seed=3, response_length=BUDGET)
    loop_thread.run(srv.start())
    yield srv
    loop_thread.run(srv.shutdown())


async def _whole(srv: DurableServer, key: str) -> ServerOutput:
    out = await srv.generate("r", PROMPT, {**PARAMS, "max_tokens": BUDGET}, sample_key=key)
    await srv.forget([key])
    return out


@pytest.fixture(scope="module")
def keys(server: DurableServer, loop_thread: Any) -> list[str]:
    """Sample keys whose seeded draw runs the whole budget (no EOS): aborts then land mid-sample."""

    async def find() -> list[str]:
        found = []
        for i in range(64):
            if len((await _whole(server, f"k{i}_0")).token_ids) == BUDGET:
                found.append(f"k{i}_0")
            if len(found) == 4:
                return found
        raise AssertionError(f"only {len(found)} of 64 seeded draws ran {BUDGET} tokens")

    return loop_thread.run(find())


async def _until_tokens(srv: DurableServer, at_least: int) -> None:
    for _ in range(2000):
        live = (await srv.engine.progress()).live_tokens
        if live and max(live.values()) >= at_least:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"no request reached {at_least} tokens")


async def _client(srv: DurableServer, key: str, between: Any) -> tuple[list[int], list[float], int]:
    """verl's client loop: on ``aborted``, re-send prompt + tokens so far with the budget left."""
    tokens: list[int] = []
    logprobs: list[float] = []
    aborts = 0
    task = asyncio.ensure_future(srv.generate("r", PROMPT, {**PARAMS, "max_tokens": BUDGET}, sample_key=key))
    while True:
        if aborts == 0:
            await _until_tokens(srv, 40)
            await between()
        out = await task
        tokens += out.token_ids
        logprobs += out.log_probs or []
        if out.stop_reason != "aborted":
            return tokens, logprobs, aborts
        aborts += 1
        await srv.resume_generation()
        left = {**PARAMS, "max_tokens": BUDGET - len(tokens)}
        task = asyncio.ensure_future(srv.generate("r", PROMPT + tokens, left, sample_key=key))


def test_abort_and_retry_continues_the_same_draw(server: DurableServer, keys: list[str], loop_thread: Any) -> None:
    async def run() -> tuple[ServerOutput, tuple[list[int], list[float], int]]:
        whole = await _whole(server, keys[0])
        return whole, await _client(server, keys[0], lambda: server.abort_all_requests())

    whole, (tokens, logprobs, aborts) = loop_thread.run(run())
    assert aborts == 1
    assert len(whole.token_ids) == BUDGET
    assert tokens == whole.token_ids, "the retry after the abort drew other tokens"
    assert np.max(np.abs(np.array(logprobs) - np.array(whole.log_probs))) < NUMERICS


def test_versions_across_an_abort_and_a_weight_update(
    server: DurableServer, keys: list[str], tiny_llama: Path, loop_thread: Any
) -> None:
    """verl's colocate step: abort, update the weights, resume; the new tokens carry the new version."""
    seen: dict[str, Any] = {}

    async def abort_and_update() -> None:
        await server.abort_all_requests()
        version = server.global_steps + 1
        await server.update_weights(str(tiny_llama), version)  # the same weights, relabelled
        seen["version"] = version

    async def run() -> list[HeldSample]:
        await _client(server, keys[1], abort_and_update)
        return [s for s in await server.freeze() if s.key == keys[1]]

    (held,) = loop_thread.run(run())
    loop_thread.run(server.thaw())
    record = held.record
    assert record.state is SampleState.FINISHED
    versions = record.versions.tolist()
    cut = versions.index(seen["version"])
    assert cut >= 40, "tokens sampled before the update must keep the old version"
    assert set(versions[:cut]) == {seen["version"] - 1}
    assert set(versions[cut:]) == {seen["version"]}
    loop_thread.run(server.forget([keys[1]]))


def test_freeze_hands_over_a_running_sample_that_a_restarted_server_continues(
    server: DurableServer, keys: list[str], config: EngineConfig, loop_thread: Any
) -> None:
    """A cut while the sample runs, then a new server (a restart) continues it from ``resume_from``."""

    async def run() -> tuple[ServerOutput, HeldSample, ServerOutput, int]:
        whole = await _whole(server, keys[2])
        task = asyncio.ensure_future(server.generate("r", PROMPT, {**PARAMS, "max_tokens": BUDGET}, sample_key=keys[2]))
        await _until_tokens(server, 30)
        (held,) = [s for s in await server.freeze() if s.key == keys[2]]
        await server.thaw()
        await task
        await server.forget([keys[2]])
        restarted = DurableServer(config, seed=3, response_length=BUDGET)
        restarted.attach(server.engine)
        before = (await server.engine.progress()).tokens_received
        again = await restarted.generate(
            "r", PROMPT, {**PARAMS, "max_tokens": BUDGET}, sample_key=keys[2], resume_from=held
        )
        return whole, held, again, (await server.engine.progress()).tokens_received - before

    whole, held, again, generated = loop_thread.run(run())
    assert held.record.state is SampleState.IN_FLIGHT and held.record.num_tokens >= 30
    # nothing of the sampler is saved: the seeded draw continues from its seed and the tokens drawn
    assert held.record.sampler_state is None and held.record.inexact is None
    assert generated == BUDGET - held.record.num_tokens, "the restored prefix must be continued, not redrawn"
    assert again.token_ids == whole.token_ids, "the restored sample must continue the same draw"
    assert np.max(np.abs(np.array(again.log_probs) - np.array(whole.log_probs))) < NUMERICS
    assert again.extra_fields["min_global_steps"] <= again.extra_fields["max_global_steps"]


def test_a_retry_that_does_not_match_the_held_prefix_is_refused(
    server: DurableServer, keys: list[str], loop_thread: Any
) -> None:
    async def bad_retry() -> None:
        task = asyncio.ensure_future(server.generate("r", PROMPT, {**PARAMS, "max_tokens": BUDGET}, sample_key=keys[3]))
        await _until_tokens(server, 20)
        await server.abort_all_requests()
        out = await task
        await server.resume_generation()
        wrong = [*PROMPT, *[(t + 1) % 500 for t in out.token_ids]]
        await server.generate("r", wrong, {**PARAMS, "max_tokens": 10}, sample_key=keys[3])

    with pytest.raises(ValueError, match="not the held sample's prompt and prefix"):
        loop_thread.run(bad_retry())
    loop_thread.run(server.resume_generation())
