"""verl's durable servers, seen by the checkpointer as one engine it can cut.

verl's agent loops send requests to the servers through verl's router; the trainer never
generates through this object. What the checkpointer needs of an engine is the cut: take what each
server holds (prefixes between attempts, running samples as received, finished samples verl has
not stored yet) while it holds back new requests, which :meth:`VerlServers.thaw` lets through once
the trainer's own cut is taken. No server's engine pauses. :class:`VerlServers` is that, plus the
weight sync of the CPU harness, over the servers' Ray actor handles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from partial_rollout.engine import Capabilities, Cut, Progress
from partial_rollout.ledger import request_id
from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec
from partial_rollout_integrations.verl.wire import HeldSample, split_key


class VerlServers:
    """The durable server actors of a verl run as a :class:`~partial_rollout.engine.RolloutEngine`."""

    def __init__(self, handles: Sequence[Any]) -> None:
        if not handles:
            raise ValueError("no durable servers: the run's rollout replicas launched none")
        self._handles = list(handles)
        self.held: dict[str, HeldSample] = {}
        """What the last freeze found, by sample key (the prompts the ledger yields groups with)."""

    async def _each(self, method: str, *args: Any) -> list[Any]:
        return list(await asyncio.gather(*(getattr(h, method).remote(*args) for h in self._handles)))

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        raise TypeError("verl's agent loops generate through verl's router; the trainer only cuts")

    async def cut(self) -> Cut:
        """Every server's samples; each holds back new requests until :meth:`thaw`."""
        samples: dict[str, SampleRecord] = {}
        engines: dict[str, int] = {}
        self.held = {}
        for engine, held in enumerate(await self._each("freeze")):
            for sample in held:
                uid, session = split_key(sample.key)
                rid = request_id(uid, session)
                samples[rid], engines[rid] = sample.record, engine
                self.held[sample.key] = sample
        return Cut(samples=samples, engines=engines)

    async def thaw(self) -> None:
        """Let the servers take new requests again (after the trainer's cut)."""
        await self._each("thaw")

    async def forget(self, keys: Sequence[str]) -> None:
        """Tell every server to drop these finished samples (verl has them now)."""
        if keys:
            await self._each("forget", list(keys))

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        await self._each("update_weights", weights_dir, policy_version)

    async def fingerprints(self) -> Fingerprints:
        first, *others = await self._each("fingerprints")
        for other in others:
            if other != first:
                raise RuntimeError(f"the servers run different models or vLLMs: {first} and {other}")
        return first  # type: ignore[no-any-return]

    async def capabilities(self) -> Capabilities:
        caps: list[Capabilities] = await self._each("capabilities")
        return min(caps, key=lambda c: (c.exact, c.verified_updates))

    async def progress(self) -> Progress:
        total = Progress()
        for p in await self._each("progress"):
            total.tokens_received += p.tokens_received
            total.live_tokens.update(p.live_tokens)
        return total

    async def reset_prefix_cache(self) -> None:
        await self._each("clear_kv_cache")

    async def shutdown(self) -> None:
        await self._each("shutdown")
