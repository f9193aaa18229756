"""Resuming on an engine that differs from the one that saved: what is allowed, refused, or finished.

Engine A (max_model_len 1024) cuts two seeded samples in flight; the snapshot records A's
max_model_len, logprob kind and sampler. Engine B has max_model_len 384:

* the snapshot loads on B (a different max_model_len is allowed) and `dump` shows A's limit;
* a sample whose prompt + prefix no longer fits B finishes as ``length`` with a warning and keeps
  its whole prefix, instead of vLLM refusing the request (which would end the caller's task group);
  one that fits continues up to B's limit;
* a sampler state of the wrong type cannot make a record (it is refused, field named, when built);
  a malformed one (wrong size, invalid content, or on an unseeded sample) is rejected by the front
  end with the request, sample and field named, and B keeps serving; without that check the
  worker's restore hook raises inside the engine core, which dies with every request;
* a snapshot whose logprob kind or sampler differs from B's is refused, naming the field and both
  values (this machine has one kind of sampler, so the other kind is B's fingerprint with another
  device; a real engine of the other logprob kind is in test_behaviour_logprobs.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from partial_rollout.engine import EngineConfig, ResumableEngine, samplers
from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import (
    GroupRecord,
    GroupState,
    SampleState,
    SamplingSpec,
    Snapshot,
    load_snapshot,
    save_snapshot,
)

pytestmark = pytest.mark.engine

rng = random.Random(3)
LONG_PROMPT = [rng.randrange(4, 500) for _ in range(300)]
SHORT_PROMPT = [rng.randrange(4, 500) for _ in range(20)]
SPEC = SamplingSpec(max_tokens=400, temperature=1.0, seed=11, ignore_eos=True)
B_LEN = 384


def _config(model: Path, max_model_len: int) -> EngineConfig:
    return EngineConfig(model=str(model), max_model_len=max_model_len, multiprocessing=False)


def _cut(model: Path, loop_thread) -> tuple[dict, object]:
    async def go():
        engine = await ResumableEngine.start(_config(model, 1024))
        try:
            tasks = [
                asyncio.ensure_future(engine.generate("long", LONG_PROMPT, SPEC, index=0)),
                asyncio.ensure_future(engine.generate("short", SHORT_PROMPT, SPEC, index=1)),
            ]
            while True:  # polling: the engine's counters have no event to wait on
                live = (await engine.progress()).live_tokens
                if min(live.get("long", 0), live.get("short", 0)) >= 100:
                    break
                await asyncio.sleep(0.01)
            cut = await engine.cut()
            prints = await engine.fingerprints()
            for t in tasks:
                t.cancel()
            return cut.samples, prints
        finally:
            await engine.shutdown()

    return loop_thread.run(go())


def test_resume_on_an_engine_with_other_limits(tiny_llama: Path, loop_thread, tmp_path: Path) -> None:
    samples, a_prints = _cut(tiny_llama, loop_thread)
    long, short = samples["long"], samples["short"]
    assert long.state is short.state is SampleState.IN_FLIGHT
    assert long.sampler_state is None and long.inexact is None  # exact, with nothing of the sampler saved
    assert len(LONG_PROMPT) + long.num_tokens >= B_LEN > len(SHORT_PROMPT) + short.num_tokens
    assert (a_prints.max_model_len, a_prints.logprobs_kind) == (1024, "processed_logprobs")
    assert (a_prints.sampler, a_prints.sampler_state_bytes) == ("vllm-v1-cpu-randint", None)
    groups = [
        GroupRecord(
            group_id="g", prompt_token_ids=LONG_PROMPT, state=GroupState.IN_FLIGHT, dispatch_version=0, samples=[long]
        ),
        GroupRecord(
            group_id="h",
            prompt_token_ids=SHORT_PROMPT,
            state=GroupState.IN_FLIGHT,
            dispatch_version=0,
            samples=[dataclasses.replace(short, index=0)],
        ),
    ]
    save_snapshot(Snapshot(trainer_step=1, policy_version=0, fingerprints=a_prints, groups=groups), tmp_path)

    dumped = subprocess.run(
        [sys.executable, "-m", "partial_rollout.cli", "dump", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(dumped.stdout)["fingerprints"]["max_model_len"] == 1024

    async def on_b():
        engine = await ResumableEngine.start(_config(tiny_llama, B_LEN))
        try:
            prints = await engine.fingerprints()
            snapshot = load_snapshot(tmp_path, expect=prints)  # another max_model_len is allowed
            saved_long, saved_short = (g.samples[0] for g in snapshot.groups)
            # a snapshot of earlier versions carries the generator's state; a malformed one is refused
            # before it reaches the worker (where it would kill the engine core)
            valid = samplers.V1_CPU_GENERATOR.generator_state(SPEC.seed, saved_short.num_tokens)
            assert valid is not None
            bad = {"wrong size": valid[:-8], "invalid content": bytes(len(valid))}
            errors = {}
            for what, state in bad.items():
                record = dataclasses.replace(saved_short, sampler_state=state)
                with pytest.raises(ValueError) as caught:
                    await engine.generate(f"bad-{what}", SHORT_PROMPT, SPEC, index=0, resume_from=record)
                errors[what] = str(caught.value)
            with pytest.raises(ValueError, match="sampler_state must be bytes or None, got str"):
                dataclasses.replace(saved_short, sampler_state="not bytes")  # type: ignore[arg-type]
            unseeded = dataclasses.replace(saved_short, sampling=SPEC.with_seed(None), sampler_state=valid)
            with pytest.raises(ValueError) as caught:
                await engine.generate("bad-unseeded", SHORT_PROMPT, SPEC.with_seed(None), index=0, resume_from=unseeded)
            errors["unseeded"] = str(caught.value)
            with pytest.warns(UserWarning, match="max_model_len 384"):
                finished_long = await engine.generate("long", LONG_PROMPT, SPEC, index=0, resume_from=saved_long)
            continued = await engine.generate("short", SHORT_PROMPT, SPEC, index=0, resume_from=saved_short)
            return prints, errors, finished_long, continued
        finally:
            await engine.shutdown()

    b_prints, errors, finished_long, continued = loop_thread.run(on_b())
    assert b_prints.max_model_len == B_LEN
    for what, message in errors.items():
        assert "bad-" in message and "sample 0" in message and "sampler_state" in message, (what, message)
    assert "bytes" in errors["wrong size"] and "not a valid" in errors["invalid content"]

    # over the new limit: finished as length-truncated, the whole prefix kept bit for bit
    assert finished_long.state is SampleState.FINISHED and finished_long.finish_reason == "length"
    np.testing.assert_array_equal(finished_long.token_ids, long.token_ids)
    np.testing.assert_array_equal(finished_long.logprobs, long.logprobs)
    # within it: continued on the engine that refused the malformed states, up to B's limit
    assert continued.finish_reason == "length"
    assert len(SHORT_PROMPT) + continued.num_tokens == B_LEN
    np.testing.assert_array_equal(continued.token_ids[: short.num_tokens], short.token_ids)

    # another logprob kind is refused, both values named
    with pytest.raises(SnapshotError) as refused:
        load_snapshot(tmp_path, expect=dataclasses.replace(b_prints, logprobs_kind="raw_logprobs"))
    message = str(refused.value)
    assert "fingerprints.logprobs_kind" in message and "'raw_logprobs'" in message and "'processed_logprobs'" in message
    # another sampler family draws another stream: its seeded in-flight samples continue inexactly, one warning
    other = samplers.V2_MURMUR3.name
    why = f"saved under sampler {a_prints.sampler}, continued under sampler {other}"
    with pytest.warns(UserWarning, match="seeded in-flight samples continue inexactly") as warned:
        moved = load_snapshot(tmp_path, expect=dataclasses.replace(b_prints, sampler=other))
    assert len(warned) == 1 and why in str(warned[0].message)
    assert [s.inexact for g in moved.groups for s in g.samples] == [why, why]
