"""One configuration of the steady-state benchmark, in the process that runs it: start, warm up, time rounds.

Every configuration generates the same workload (:func:`workload`) through the engine it names, each
request submitted on its own and awaited, as a trainer's rollout loop does. The plain vLLM ones are
what a user without this library would write: ``AsyncLLM`` from the same factory and config (so the
engine settings are identical), one ``generate`` per request, the final output's tokens and sampled
logprobs kept; in a Ray actor, one actor call per request, the actor started and pinned as
``EnginePool.ray`` starts and pins its own (:func:`partial_rollout.pool.cluster.placements`).

Besides the wall clock, each round reads the CPU seconds of every process involved: this one (the
trainer's, where the pool lives), each engine's Ray actor (vLLM's front end and our engine around
it) and the engine cores (the model); where a configuration is slower, that says where the time went.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partial_rollout.engine import EngineConfig
from partial_rollout.snapshot import SamplingSpec

CONFIGS = ("vllm", "engine", "local", "vllm-ray-1", "pool-ray-1", "vllm-ray-2", "pool-ray-2")
"""The configurations a run measures by default, in the order one repetition runs them (each baseline right
before its own)."""
STREAMS = ("pool-ray-1-streams", "pool-ray-2-streams")
"""``EnginePool.ray`` with one Ray stream per request instead of the channel: the transport before issue 33's
fix, and still what an actor that is no ``transport.Host`` gets (``--configs`` names them)."""
OUTPUT_KINDS = ("final", "delta", "cumulative")
"""How the plain vLLM baselines read their outputs (vLLM ``RequestOutputKind``): the final output only
(what a caller that awaits whole samples asks for, and the fastest), or every step's."""


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    seed: int


def workload(requests: int, prompt_tokens: int, *, vocab_size: int, seed: int) -> list[Request]:
    """``requests`` random prompts of ``prompt_tokens`` tokens, each with its own sampling seed."""
    rng = random.Random(seed)
    return [
        Request(prompt=[rng.randrange(4, vocab_size) for _ in range(prompt_tokens)], seed=rng.randrange(2**31))
        for _ in range(requests)
    ]


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (an actor's vLLM engine core)."""
    tree, i = [pid], 0
    while i < len(tree):
        try:
            tasks = list(Path(f"/proc/{tree[i]}/task").iterdir())
        except FileNotFoundError:
            tasks = []
        for task in tasks:
            try:
                tree += [int(c) for c in (task / "children").read_text().split()]
            except FileNotFoundError:
                pass
        i += 1
    return tree


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PlainHost:
    """A Ray actor with plain vLLM in it, as a user would write one: ``AsyncLLM`` and one method per request."""

    llm: Any

    async def start(self, config: EngineConfig) -> int:
        from partial_rollout.engine.factory import make_async_engine
        from partial_rollout.pool import cluster

        cluster.pin()  # as the pool's actors do, before vLLM starts
        self.llm = make_async_engine(config)
        return os.getpid()

    async def generate(self, request_id: str, prompt: list[int], params: Any) -> tuple[list[int], list[float]]:
        return await plain_generate(self.llm, request_id, prompt, params)

    async def shutdown(self) -> None:
        """Stop the engine core now: plain vLLM has no guard that ends it when this actor's process dies."""
        self.llm.shutdown()


async def plain_generate(llm: Any, request_id: str, prompt: list[int], params: Any) -> tuple[list[int], list[float]]:
    """One request on plain vLLM: its tokens and the sampled tokens' logprobs, whatever the output kind."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    tokens: list[int] = []
    logprobs: list[float] = []
    cumulative = params.output_kind is RequestOutputKind.CUMULATIVE
    async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id):
        c = out.outputs[0]
        new = [lp[t].logprob for lp, t in zip(c.logprobs or [], c.token_ids, strict=True)]
        if cumulative:
            tokens, logprobs = list(c.token_ids), new
        else:
            tokens += c.token_ids
            logprobs += new
    return tokens, logprobs


class Runner:
    """One configuration: ``generate`` one request, the pids to read CPU time from, ``close``."""

    def __init__(self, name: str, config: EngineConfig, output_kind: str, *, plain_text: bool = True) -> None:
        self.name = name
        self.config = config
        self.output_kind = output_kind
        self.plain_text = plain_text
        """Whether plain vLLM decodes text (its default); this library's engines ask for none unless stop strings
        need it."""
        self.target: Any = None
        self.actors: list[Any] = []
        self.pids: dict[str, int] = {"driver": os.getpid()}

    async def start(self) -> None:
        kind, _, n = self.name.partition("-ray-")
        if kind == "vllm" and not n:
            from partial_rollout.engine.factory import make_async_engine

            self.target = make_async_engine(self.config)
        elif kind == "engine":
            from partial_rollout.engine import ResumableEngine

            self.target = await ResumableEngine.start(self.config)
        elif kind == "local":
            from partial_rollout.pool import EnginePool

            self.target = await EnginePool.local(self.config)
        elif kind == "vllm":
            import ray

            from partial_rollout.pool import cluster

            host = ray.remote(PlainHost)
            self.actors = [host.options(**o).remote() for o in cluster.placements(int(n))]
            pids = await asyncio.gather(*[a.start.remote(self.config) for a in self.actors])
            self.pids.update({f"actor {i}": pid for i, pid in enumerate(pids)})
        elif kind == "pool":
            from partial_rollout.pool import EnginePool

            engines, _, streams = n.partition("-")
            self.target = await EnginePool.ray(self.config, int(engines))
            if streams:  # the actors' channel unused: each request its own Ray stream (RemoteEngine._ray_stream)
                for engine in self.target.engines:
                    engine._channel = None
            self.actors = [e.actor for e in self.target.engines]
            pids = await asyncio.gather(*[a.__ray_call__.remote(_pid) for a in self.actors])
            self.pids.update({f"actor {i}": pid for i, pid in enumerate(pids)})
        else:
            raise ValueError(f"unknown configuration {self.name!r}; one of {', '.join(CONFIGS + STREAMS)}")

    def _params(self, request: Request, max_tokens: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        kind = {"final": RequestOutputKind.FINAL_ONLY, "delta": RequestOutputKind.DELTA}.get(
            self.output_kind, RequestOutputKind.CUMULATIVE
        )
        return SamplingParams(
            temperature=1.0,
            seed=request.seed,
            max_tokens=max_tokens,
            ignore_eos=True,
            logprobs=0,
            output_kind=kind,
            detokenize=self.plain_text,
        )

    async def generate(self, request_id: str, request: Request, max_tokens: int, index: int) -> tuple[int, int]:
        """Tokens and logprobs the request returned."""
        if self.name == "vllm":
            tokens, logprobs = await plain_generate(
                self.target, request_id, request.prompt, self._params(request, max_tokens)
            )
            return len(tokens), len(logprobs)
        if self.name.startswith("vllm-ray-"):
            actor = self.actors[index % len(self.actors)]
            tokens, logprobs = await actor.generate.remote(
                request_id, request.prompt, self._params(request, max_tokens)
            )
            return len(tokens), len(logprobs)
        spec = SamplingSpec(max_tokens=max_tokens, temperature=1.0, seed=request.seed, ignore_eos=True, logprobs=0)
        record = await self.target.generate(request_id, request.prompt, spec, index=0)
        return record.num_tokens, len(record.logprobs)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of this process, and of each actor with its engine core."""
        out = {"driver": cpu_seconds(self.pids["driver"])}
        descendants = set(process_tree(self.pids["driver"])[1:])
        for name, pid in self.pids.items():
            if name.startswith("actor"):
                tree = process_tree(pid)
                descendants -= set(tree)
                out[name] = cpu_seconds(pid)
                out[f"{name} engine core"] = sum(cpu_seconds(p) for p in tree[1:])
        # in process: vLLM's engine core; with Ray: the local cluster's own processes (raylet, GCS, idle workers)
        out["ray" if self.actors else "engine core"] = sum(cpu_seconds(p) for p in descendants)
        return out

    async def close(self) -> None:
        """Stop every engine this configuration started (and the local Ray cluster, if it started one)."""
        if self.target is not None:
            result = self.target.shutdown()
            if asyncio.iscoroutine(result):
                await result
        elif self.actors:
            await asyncio.gather(*[a.shutdown.remote() for a in self.actors], return_exceptions=True)
        if self.actors:
            import ray

            ray.shutdown()


def _pid(_: Any) -> int:
    return os.getpid()


async def one_round(runner: Runner, work: list[Request], max_tokens: int, tag: str) -> dict[str, Any]:
    """Submit every request at once, wait for all; the tokens, the wall time and the CPU time of each process."""
    cpu_before = runner.cpu()
    started = time.perf_counter()
    counts = await asyncio.gather(*[runner.generate(f"{tag}-{i}", r, max_tokens, i) for i, r in enumerate(work)])
    wall = time.perf_counter() - started
    cpu_after = runner.cpu()
    short = [i for i, (t, lp) in enumerate(counts) if t != max_tokens or lp != max_tokens]
    if short:
        raise RuntimeError(f"{runner.name}: requests {short} did not return {max_tokens} tokens with their logprobs")
    tokens = sum(t for t, _ in counts)
    return dict(
        tokens=tokens,
        wall_s=wall,
        tok_s=tokens / wall,
        cpu_s={k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after},
        load_1m=os.getloadavg()[0],
    )


async def run(
    name: str,
    config: EngineConfig,
    *,
    requests: int,
    max_tokens: int,
    prompt_tokens: int,
    rounds: int,
    warm_up_tokens: int,
    seed: int,
    vocab_size: int,
    output_kind: str,
    plain_text: bool = True,
) -> dict[str, Any]:
    """Start ``name``'s engines, warm them up (one round of short requests), then time ``rounds`` rounds.

    Each round has prompts and seeds of its own (no prefix-cache hit across rounds); every
    configuration gets the same rounds.
    """
    if name.startswith(("vllm-ray-", "pool-ray-")):
        from partial_rollout.pool import connect_ray

        connect_ray(None, object_store_memory=256 * 2**20, log_to_driver=False)
    runner = Runner(name, config, output_kind, plain_text=plain_text)
    started = time.perf_counter()
    await runner.start()
    start_s = time.perf_counter() - started
    try:
        warm = workload(requests, prompt_tokens, vocab_size=vocab_size, seed=seed - 1)
        await one_round(runner, warm, warm_up_tokens, "warm")
        timed = [
            await one_round(
                runner,
                workload(requests, prompt_tokens, vocab_size=vocab_size, seed=seed + r),
                max_tokens,
                f"round{r}",
            )
            for r in range(rounds)
        ]
    finally:
        await runner.close()
    tokens = sum(r["tokens"] for r in timed)
    wall = sum(r["wall_s"] for r in timed)
    return dict(config=name, start_s=start_s, tok_s=tokens / wall, tokens=tokens, wall_s=wall, rounds=timed)
