"""An inference server for SkyRL whose samples survive a checkpoint and a restart.

SkyRL's fully async trainer talks to its inference servers over vLLM's HTTP API (tokens in, tokens
out, ``POST /inference/v1/generate``) and names each sample in the ``X-Session-ID`` header:
``{uid}_{repetition}``, the same after a restart. This server speaks the part of that API SkyRL uses on a
:class:`~partial_rollout.engine.ResumableEngine` and keeps each sample under its session:

- a finished sample is held until the trainer's cut learns its group was trained on;
- ``POST /partial_rollout/cut`` hands the trainer, in one instant, every sample it runs (the prefix
  received so far: the engine is not paused), holds finished, or was handed back and not yet asked
  for again;
- ``POST /partial_rollout/restore`` hands it a snapshot's samples: when SkyRL's resumed loop asks for a
  session again, the server continues that prefix, or answers a finished sample from its record,
  instead of generating it anew.

SkyRL sends no seed; a sampled request gets the library's seed of its identity (the run's seed, its
uid and its repetition: :func:`partial_rollout.snapshot.sample_seed`), so a continuation draws what
the uninterrupted sample would have, where the engine's sampler family allows.

Pauses: SkyRL pauses in ``keep`` mode around a weight sync. Here new requests wait until
``/resume``, and requests in flight decode on until the weight load itself pauses the engine
(:meth:`ResumableEngine.update_weights`), which labels each token with the weights that sampled it.
``abort`` mode is refused: SkyRL's client does not retry an aborted request.

Run one with ``python -m partial_rollout_integrations.skyrl.server --model DIR --port N`` (in ``.venv``,
where vLLM is). It imports no SkyRL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec, sample_seed
from partial_rollout_integrations.skyrl.wire import SESSION_HEADER, HeldSample, split_session

logger = logging.getLogger(__name__)

SKYRL_SAMPLING_KEYS = frozenset(
    {
        "max_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "logprobs",
        "stop",
        "seed",
        "skip_special_tokens",
        "include_stop_str_in_output",
    }
)
"""The sampling keys SkyRL's vLLM backend sends (``get_vllm_sampling_params``); another key fails the
request naming it. ``skip_special_tokens`` and ``include_stop_str_in_output`` shape text only: this
server answers token ids."""


def sampling_spec(params: Mapping[str, Any], *, session: str | None, seed: int) -> SamplingSpec:
    """SkyRL's sampling dict as the library's spec.

    Raises:
        ValueError: an unknown key, a missing ``max_tokens``, or a bad value (named).
    """
    unknown = sorted(set(params) - SKYRL_SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"sampling parameter {unknown[0]!r} is not supported by the durable server")
    if params.get("max_tokens") is None:
        raise ValueError("sampling parameter 'max_tokens' is required (SkyRL's generator.max_generate_length)")
    temperature = float(params.get("temperature", 1.0))
    request_seed = params.get("seed")
    if request_seed is None and session is not None and temperature > 0:
        request_seed = sample_seed(seed, *split_session(session))
    top_k = params.get("top_k")
    return SamplingSpec(
        max_tokens=int(params["max_tokens"]),
        min_tokens=int(params.get("min_tokens") or 0),
        temperature=temperature,
        top_p=float(params.get("top_p", 1.0)),
        top_k=0 if top_k is None or int(top_k) < 0 else int(top_k),
        min_p=float(params.get("min_p") or 0.0),
        stop=tuple(params.get("stop") or ()),
        seed=None if request_seed is None else int(request_seed),
    )


@dataclass
class _Running:
    request_id: str
    prompt_token_ids: list[int]
    task: asyncio.Task[SampleRecord]
    submitted: SampleRecord
    """What it was submitted with: the handed-back record, or a not-started one (what a cut holds before the
    engine has registered the request)."""
    continued_tokens: int


class SessionServer:
    """The body of one server (see the module docstring): samples by session, cut and restore."""

    def __init__(self, engine: ResumableEngine, *, seed: int = 0, request_log: Path | None = None) -> None:
        self.engine = engine
        self._log = None if request_log is None else open(request_log, "a", encoding="utf-8")  # noqa: SIM115
        """One line per request started and ended (``--request-log``): what a test counts as regenerated."""
        self._note("", "serve")  # a line per server start: a restart's requests follow it
        self.seed = seed
        """The run's seed: a sampled session's seed derives from it and the session id."""
        self._open = asyncio.Event()
        self._open.set()
        self._running: dict[str, _Running] = {}
        self._done: dict[str, HeldSample] = {}
        """Finished samples whose group the trainer has not yet trained on (as far as the last cut knew)."""
        self._restored: dict[str, HeldSample] = {}
        """Samples handed back from a snapshot that SkyRL has not asked for again yet."""
        self._attempts = 0
        self.untracked = 0
        """Requests served without a session id (evaluation): nothing of them is kept."""
        self.continued_tokens = 0
        """Tokens of handed-back prefixes that requests continued (not generated here)."""
        self.replayed = 0
        """Requests answered from a handed-back finished record, without the engine."""

    async def generate(self, session: str | None, prompt: list[int], params: Mapping[str, Any]) -> SampleRecord:
        """Generate, continue or replay one sample (see the module docstring)."""
        await self._open.wait()
        if session is None:
            self.untracked += 1
            self._attempts += 1
            spec = sampling_spec(params, session=None, seed=self.seed)
            return await self.engine.generate(f"untracked/{self._attempts}", prompt, spec, index=0)
        if session in self._running:
            raise ValueError(f"session {session!r} is already generating (SkyRL sends each sample once)")
        base = self._restored.pop(session, None) or self._done.get(session)
        if base is not None and base.prompt_token_ids != prompt:
            raise ValueError(f"session {session!r}: the prompt differs from the one its saved sample was drawn for")
        if base is not None and base.record.state is SampleState.FINISHED:
            self.replayed += 1
            self._done[session] = base
            self._note(session, "replayed", tokens=base.record.num_tokens)
            return base.record
        index = split_session(session)[1]
        if base is None:
            spec = sampling_spec(params, session=session, seed=self.seed)
            submitted, continued = SampleRecord(index=index, state=SampleState.NOT_STARTED, sampling=spec), 0
        else:
            spec, submitted, continued = base.record.sampling, base.record, base.continued_tokens
            self.continued_tokens += base.record.num_tokens
        self._attempts += 1
        rid = f"{session}/{self._attempts}"
        task = asyncio.ensure_future(
            self.engine.generate(rid, prompt, spec, index=index, resume_from=None if base is None else base.record)
        )
        self._running[session] = _Running(rid, prompt, task, submitted, continued)
        self._note(session, "start", prefix=submitted.num_tokens)
        try:
            record = await task
        finally:
            del self._running[session]
        self._note(session, "end", tokens=record.num_tokens, prefix=submitted.num_tokens)
        self._done[session] = HeldSample(
            session=session, prompt_token_ids=prompt, record=record, continued_tokens=continued
        )
        return record

    def _note(self, session: str, event: str, **fields: int) -> None:
        if self._log is not None:
            self._log.write(json.dumps({"session": session, "event": event, **fields}) + "\n")
            self._log.flush()

    # ---------------------------------------------------------------- SkyRL's control plane

    async def pause(self, mode: str) -> None:
        if mode not in ("keep", "wait"):
            raise ValueError(f"pause mode {mode!r} is not served: SkyRL's client does not retry aborted requests")
        self._open.clear()
        if mode == "wait":
            while self._running:
                await asyncio.wait({r.task for r in self._running.values()})

    def resume(self) -> None:
        self._open.set()

    # ---------------------------------------------------------------- the trainer's cut

    async def cut(self, trained_uids: list[str]) -> list[HeldSample]:
        """Forget the samples of groups trained on, then hand over every other sample, in one instant."""
        trained = set(trained_uids)
        for held in (self._done, self._restored):
            for session in [s for s in held if split_session(s)[0] in trained]:
                del held[session]
        running = dict(self._running)
        cut = await self.engine.cut() if running else None  # awaits nothing: the same instant as what follows
        samples = {**self._restored, **self._done}
        for session, run in running.items():
            if run.task.done():  # finished, and its request not yet answered
                if run.task.cancelled() or run.task.exception() is not None:
                    continue  # failed: SkyRL gets the error, and the sample nothing to continue
                record = run.task.result()
            else:
                record = cut.samples.get(run.request_id, run.submitted) if cut is not None else run.submitted
            samples[session] = HeldSample(
                session=session,
                prompt_token_ids=run.prompt_token_ids,
                record=record,
                continued_tokens=run.continued_tokens,
            )
        return [s for s in samples.values() if split_session(s.session)[0] not in trained]

    def restore(self, samples: list[HeldSample]) -> None:
        for sample in samples:
            if sample.session in self._running or sample.session in self._done:
                raise ValueError(f"session {sample.session!r} is already served here; restore before generating")
            self._restored[sample.session] = sample


# -------------------------------------------------------------------- HTTP


def _choice(record: SampleRecord, *, logprobs: bool) -> dict[str, Any]:
    content = [{"logprob": float(lp)} for lp in record.logprobs] if logprobs else None
    return {
        "index": 0,
        "token_ids": record.token_ids.tolist(),
        "logprobs": None if content is None else {"content": content},
        "finish_reason": record.finish_reason,
        "stop_reason": record.stop_reason,
    }


def _bad_request(exc: Exception) -> web.Response:
    return web.json_response({"error": {"message": str(exc), "type": "BadRequestError", "code": 400}}, status=400)


def app(server: SessionServer, *, model_name: str, decode: Callable[[list[int]], str]) -> web.Application:
    """The HTTP routes of one server: SkyRL's (vLLM's dev-mode names) and the trainer's cut and restore."""
    routes = web.RouteTableDef()

    @routes.post("/inference/v1/generate")
    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            params = body.get("sampling_params") or {}
            record = await server.generate(
                request.headers.get(SESSION_HEADER), [int(t) for t in body["token_ids"]], params
            )
        except (ValueError, KeyError) as exc:
            return _bad_request(exc)
        choice = _choice(record, logprobs=params.get("logprobs") is not None)
        return web.json_response({"model": model_name, "choices": [choice]})

    @routes.post("/detokenize")
    async def detokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": decode([int(t) for t in body["tokens"]])})

    @routes.get("/get_world_size")
    async def world_size(_: web.Request) -> web.Response:
        return web.json_response({"world_size": 1})

    @routes.post("/pause")
    async def pause(request: web.Request) -> web.Response:
        try:
            await server.pause(request.query.get("mode", "keep"))
        except ValueError as exc:
            return _bad_request(exc)
        return web.json_response({"status": "paused"})

    @routes.post("/resume")
    async def resume(_: web.Request) -> web.Response:
        server.resume()
        return web.json_response({"status": "resumed"})

    @routes.post("/reset_prefix_cache")
    async def reset_prefix_cache(_: web.Request) -> web.Response:
        await server.engine.reset_prefix_cache()
        return web.json_response({"status": "ok"})

    @routes.post("/finish_session")
    async def finish_session(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})  # SkyRL's router hint; one server routes nothing

    @routes.get("/health")
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    @routes.post("/partial_rollout/update_weights")
    async def update_weights(request: web.Request) -> web.Response:
        body = await request.json()
        await server.engine.update_weights(body["weights_dir"], int(body["policy_version"]))
        return web.json_response({"policy_version": server.engine.policy_version})

    @routes.post("/partial_rollout/cut")
    async def cut(request: web.Request) -> web.Response:
        body = await request.json()
        samples = await server.cut([str(u) for u in body.get("trained_uids", [])])
        fingerprints = await server.engine.fingerprints()
        return web.json_response(
            {
                "samples": [s.to_json() for s in samples],
                "policy_version": server.engine.policy_version,
                "fingerprints": fingerprints.to_json(),
                "seed": server.seed,
            }
        )

    @routes.post("/partial_rollout/restore")
    async def restore(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            server.restore([HeldSample.from_json(s) for s in body["samples"]])
        except ValueError as exc:
            return _bad_request(exc)
        return web.json_response({"restored": len(body["samples"])})

    @routes.get("/partial_rollout/state")
    async def state(_: web.Request) -> web.Response:
        progress = await server.engine.progress()
        fingerprints = await server.engine.fingerprints()
        return web.json_response(
            {
                "policy_version": server.engine.policy_version,
                "fingerprints": fingerprints.to_json(),
                "tokens_generated": progress.tokens_received,
                "tokens_continued": server.continued_tokens,
                "replayed": server.replayed,
                "untracked": server.untracked,
            }
        )

    application = web.Application(client_max_size=64 * 2**20)
    application.add_routes(routes)
    return application


async def serve(
    config: EngineConfig, *, host: str, port: int, seed: int, policy_version: int, request_log: Path | None
) -> None:
    """Start the engine, serve until SIGTERM or SIGINT, then stop the engine."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or config.model)
    engine = await ResumableEngine.start(config, policy_version=policy_version)
    server = SessionServer(engine, seed=seed, request_log=request_log)
    runner = web.AppRunner(app(server, model_name=config.model, decode=tokenizer.decode))
    try:
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        logger.info("serving %s on http://%s:%d (policy version %d)", config.model, host, port, policy_version)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
        await engine.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m partial_rollout_integrations.skyrl.server", description=__doc__)
    parser.add_argument("--model", required=True, help="the model folder (weights of --policy-version)")
    parser.add_argument("--tokenizer", default=None, help="its tokenizer's folder (default: --model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (sessions' seeds derive from it)")
    parser.add_argument("--policy-version", type=int, default=0, help="the version of the weights in --model")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--request-log", type=Path, default=None, help="append a line per request started and ended")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = EngineConfig(
        model=args.model, tokenizer=args.tokenizer, dtype=args.dtype, max_model_len=args.max_model_len
    )
    asyncio.run(
        serve(
            config,
            host=args.host,
            port=args.port,
            seed=args.seed,
            policy_version=args.policy_version,
            request_log=args.request_log,
        )
    )


if __name__ == "__main__":
    main()
