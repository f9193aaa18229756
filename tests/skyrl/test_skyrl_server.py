"""The SkyRL server on a real vLLM engine, over HTTP as SkyRL's client speaks to it.

A sample cut while it runs, written as the library's snapshot, read back and handed to a restarted
server, continues the same seeded draw when SkyRL asks for its session again (float32, where the
engine's decode and re-prefill agree to about 1e-5); a finished sample is answered from its record
without the engine; a group trained on leaves the servers at the cut.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.snapshot import GroupState, SampleState, sample_seed, save_snapshot
from partial_rollout_integrations.skyrl.checkpoint import (
    STEP_KEY,
    ServerError,
    Servers,
    load_restored,
    snapshot_of,
)
from partial_rollout_integrations.skyrl.server import SessionServer, app
from partial_rollout_integrations.skyrl.wire import SESSION_HEADER

pytestmark = pytest.mark.engine

PROMPT = [17, 230, 41, 99, 8, 311, 27, 64, 150, 5, 77, 402]
BUDGET = 120
SEED = 3
PARAMS = {
    "min_tokens": 1,
    "skip_special_tokens": True,
    "include_stop_str_in_output": True,
    "max_tokens": BUDGET,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "logprobs": 0,
    "stop": None,
}
NUMERICS = 1e-4
"""|logprob difference| allowed between a decode and a continuation's re-prefill in float32."""


class Served:
    """One engine, and a SessionServer on it behind HTTP (replaced to stand for a restart)."""

    def __init__(self, engine: ResumableEngine, loop_thread: Any) -> None:
        self.engine = engine
        self._loop = loop_thread
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.runner: web.AppRunner | None = None
        self.restart()

    def restart(self) -> None:
        """A new server on the same engine: it holds nothing of what the last one held."""

        async def start() -> None:
            if self.runner is not None:
                await self.runner.cleanup()
            self.server = SessionServer(self.engine, seed=SEED)
            self.runner = web.AppRunner(app(self.server, model_name="tiny", decode=lambda ids: " ".join(map(str, ids))))
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

        self._loop.run(start())

    async def generate(self, session: str | None, params: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {SESSION_HEADER: session} if session else {}
        body = {"token_ids": PROMPT, "sampling_params": params or PARAMS, "model": "tiny"}
        url = f"{self.url}/inference/v1/generate"
        async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as resp:
            answer: dict[str, Any] = await resp.json()
            if resp.status != 200:
                raise ValueError(answer["error"]["message"])
            return answer["choices"][0]

    def close(self) -> None:
        if self.runner is not None:
            self._loop.run(self.runner.cleanup())


@pytest.fixture(scope="module")
def served(tiny_llama: Path, loop_thread: Any) -> Iterator[Served]:
    config = EngineConfig(model=str(tiny_llama), dtype="float32", max_model_len=1024, multiprocessing=False)
    engine = loop_thread.run(ResumableEngine.start(config))
    s = Served(engine, loop_thread)
    yield s
    s.close()
    loop_thread.run(engine.shutdown())


@pytest.fixture(scope="module")
def long_sessions(served: Served, loop_thread: Any) -> dict[str, dict[str, Any]]:
    """Sessions whose seeded draw runs the whole budget (no EOS), each with its uninterrupted answer."""

    async def find() -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for uid in range(40):
            session = f"{uid}_0"
            choice = await served.generate(session)
            if len(choice["token_ids"]) == BUDGET:
                found[session] = choice
            if len(found) == 3:
                return found
        raise AssertionError(f"only {len(found)} of 40 seeded draws ran {BUDGET} tokens")

    found = loop_thread.run(find())
    Servers([served.url]).cut([s.split("_")[0] for s in found])  # trained on: the server forgets them
    return found


async def _until_tokens(engine: ResumableEngine, at_least: int) -> None:
    for _ in range(4000):
        live = (await engine.progress()).live_tokens
        if live and max(live.values()) >= at_least:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"no request reached {at_least} tokens")


def _logprobs(choice: dict[str, Any]) -> np.ndarray:
    return np.array([c["logprob"] for c in choice["logprobs"]["content"]])


def test_a_cut_prefix_saved_and_handed_to_a_restarted_server_continues_the_same_draw(
    served: Served, long_sessions: dict[str, dict[str, Any]], loop_thread: Any, tmp_path: Path
) -> None:
    session, whole = next(iter(long_sessions.items()))
    uid = session.split("_")[0]
    servers = Servers([served.url])

    async def start_and_wait() -> asyncio.Future[dict[str, Any]]:
        task = asyncio.ensure_future(served.generate(session))
        await _until_tokens(served.engine, 40)
        return task

    task = loop_thread.run(start_and_wait())
    cut = servers.cut([])  # the engine runs on meanwhile
    loop_thread.run(asyncio.wait_for(task, 600))
    snapshot = snapshot_of(cut, n=3, trainer_step=4, scheduled_at={uid: 2})
    save_snapshot(snapshot, tmp_path)

    (group,) = snapshot.groups
    assert group.group_id == uid and group.state is GroupState.IN_FLIGHT and group.data == {STEP_KEY: 2}
    prefix, *unstarted = group.samples
    assert prefix.state is SampleState.IN_FLIGHT and 40 <= prefix.num_tokens < BUDGET
    assert prefix.sampler_state is None and prefix.inexact is None  # V1 CPU: the seed and the count suffice
    # the samples no server was asked for carry the seeds the server would give them
    assert [s.sampling.seed for s in unstarted] == [sample_seed(SEED, uid, i) for i in (1, 2)]
    assert all(s.state is SampleState.NOT_STARTED for s in unstarted)

    served.restart()
    restored = load_restored(tmp_path, expect=servers.fingerprints())
    assert restored.scheduled_at == {uid: 2} and [s.session for s in restored.samples] == [session]
    servers.restore(restored.samples)
    before = servers.state()[0]["tokens_generated"]
    again = loop_thread.run(served.generate(session))
    state = servers.state()[0]
    assert state["tokens_generated"] - before == BUDGET - prefix.num_tokens, "the prefix must be continued"
    assert state["tokens_continued"] == prefix.num_tokens
    assert again["token_ids"] == whole["token_ids"], "the continued sample must draw what it drew uninterrupted"
    assert np.max(np.abs(_logprobs(again) - _logprobs(whole))) < NUMERICS
    servers.cut([uid])


def test_a_finished_sample_is_replayed_and_a_trained_group_is_forgotten(
    served: Served, long_sessions: dict[str, dict[str, Any]], loop_thread: Any, tmp_path: Path
) -> None:
    served.restart()
    servers = Servers([served.url])
    session = list(long_sessions)[1]
    uid = session.split("_")[0]
    finished = loop_thread.run(served.generate(session))
    loop_thread.run(served.generate("trained_0"))
    cut = servers.cut(["trained"])
    assert [s.session for s in cut.samples] == [session], "the trained group must leave the server"
    save_snapshot(snapshot_of(cut, n=1, trainer_step=1, scheduled_at={}), tmp_path)

    served.restart()
    restored = load_restored(tmp_path, expect=servers.fingerprints())
    assert restored.snapshot.groups[0].state is GroupState.READY
    servers.restore(restored.samples)
    before = servers.state()[0]["tokens_generated"]
    again = loop_thread.run(served.generate(session))
    state = servers.state()[0]
    assert state["tokens_generated"] == before and state["replayed"] == 1
    assert again["token_ids"] == finished["token_ids"]
    assert np.array_equal(_logprobs(again), _logprobs(finished))
    servers.cut([uid])


def test_what_the_server_cannot_serve_is_refused_by_name(served: Served, loop_thread: Any) -> None:
    with pytest.raises(ValueError, match="'repetition_penalty' is not supported"):
        loop_thread.run(served.generate("9_0", {**PARAMS, "repetition_penalty": 1.1}))
    with pytest.raises(ValueError, match="not SkyRL's '<uid>_<repetition>'"):
        loop_thread.run(served.generate("no-repetition"))
    with pytest.raises(ServerError, match="pause mode 'abort' is not served"):
        Servers([served.url])._call(served.url, "/pause?mode=abort", {})
