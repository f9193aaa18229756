"""A generation that runs across a live weight update: each token carries the version that sampled it.

The new weights differ from the old only in ``lm_head``, so the KV cache (embeddings and decoder
layers) is the same under both, and a token's logprob is the one the version that sampled it gives
when scoring the same sequence from scratch (vLLM's prompt logprobs on a fresh request). That pins
the boundary to the token: before it every logprob is the old head's, from it on the new head's;
the two heads disagree by far more than the engine's prefill/decode numerics at both sides of it.
The boundary is also checked against the token count the engine's own workers held when the new
weights were loaded, and it survives a snapshot, ``dump`` and a resume under a later version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import v1_worker
from safetensors.torch import load_file, save_file

from partial_rollout.cli import main
from partial_rollout.engine import EngineConfig, ResumableEngine, exactness, vllm_internals
from partial_rollout.engine.factory import make_async_engine
from partial_rollout.engine.resumable import with_worker_hooks
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

PROMPT = [random.Random(21).randrange(4, 500) for _ in range(24)]
SAMPLING = SamplingSpec(max_tokens=400, temperature=1.0, seed=11, ignore_eos=True)
RID = "g/0"
BEFORE, AFTER = 20, 20
"""Tokens the request holds at least before the update, and gains at least after it before the cut."""
NUMERICS = 1e-3
"""|logprob difference| allowed between a decode step and a prefill scoring the same token under the
same weights. The engine runs in float32, where they agree to about 1e-5: in bf16 they differed by up
to 0.038 on a CPU without AMX (docs/exact_resume.md) and by up to 0.077 on one with AMX (vLLM's AMX
attention kernel), too close to the heads' separation for a sharp check."""
SEPARATION = 0.5
"""|logprob difference| the two heads must show at the boundary for it to be pinned."""


@pytest.fixture(scope="module")
def new_head(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with another random ``lm_head`` (same std), everything else byte-identical."""
    folder = tmp_path_factory.mktemp("new-head")
    for f in tiny_llama.iterdir():
        if f.is_file():
            shutil.copy(f, folder / f.name)
    tensors = load_file(tiny_llama / "model.safetensors")
    head = tensors["lm_head.weight"]
    generator = torch.Generator().manual_seed(99)
    tensors["lm_head.weight"] = (torch.randn(head.shape, generator=generator) * head.float().std()).to(head.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


async def _score(llm, tokens: list[int], salt: str) -> np.ndarray:
    """Logprob of each of ``tokens[1:]`` given those before it, from one fresh prefill under the loaded weights."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    final = None
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    async for out in llm.generate(TokensPrompt(prompt_token_ids=tokens, cache_salt=salt), params, f"score-{salt}"):
        final = out
    assert final is not None and final.prompt_logprobs is not None
    return np.array([lp[t].logprob for lp, t in zip(final.prompt_logprobs[1:], tokens[1:], strict=True)])


async def _attach(model: Path, version: int):
    config = with_worker_hooks(
        EngineConfig(model=str(model), max_model_len=1024, multiprocessing=False, dtype="float32")
    )
    llm = make_async_engine(config)
    try:
        return llm, await ResumableEngine.attach(llm, config, policy_version=version)
    except BaseException:
        llm.shutdown()
        raise


def test_versions_follow_a_live_update_through_a_cut_and_a_resume(
    loop_thread, tiny_llama: Path, new_head: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    at_reload: dict[str, dict[str, int]] = {}
    reload = vllm_internals.reload_weights

    async def observed_reload(llm, weights_dir: str) -> None:
        """The engine is paused and settled here: record what its workers hold, then load."""
        at_reload[weights_dir] = {rid: count for rid, (count, _) in (await v1_worker.worker_requests(llm)).items()}
        await reload(llm, weights_dir)

    monkeypatch.setattr(vllm_internals, "reload_weights", observed_reload)

    async def live_update():
        llm, engine = await _attach(tiny_llama, 0)
        try:
            task = asyncio.ensure_future(engine.generate(RID, PROMPT, SAMPLING, index=0))

            async def holds(n: int) -> int:
                while (held := (await engine.progress()).live_tokens.get(RID, 0)) < n:  # no event to wait on
                    assert not task.done(), "the request ended before the update could span it"
                    await asyncio.sleep(0.002)
                return held

            await holds(BEFORE)
            await engine.update_weights(str(new_head), 1)
            boundary = at_reload[str(new_head)][RID]
            await holds(boundary + AFTER)
            cut = await engine.cut()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            record = cut.samples[RID]
            sequence = PROMPT + record.token_ids.tolist()
            new = await _score(llm, sequence, "new")
            await engine.update_weights(str(tiny_llama), 2)  # the old head again, only to score with it
            old = await _score(llm, sequence, "old")
            return record, boundary, old[len(PROMPT) - 1 :], new[len(PROMPT) - 1 :], await engine.fingerprints()
        finally:
            await engine.shutdown()

    record, boundary, old, new, prints = loop_thread.run(live_update())
    k = record.num_tokens
    assert record.state is SampleState.IN_FLIGHT and k >= boundary + AFTER and boundary >= BEFORE

    # the label: version 0 up to the engine's own count at the update, version 1 after it
    np.testing.assert_array_equal(record.versions, [0] * boundary + [1] * (k - boundary))
    # the truth: tokens before the boundary were scored by the old head, from it on by the new one
    np.testing.assert_allclose(record.logprobs[:boundary], old[:boundary], rtol=0, atol=NUMERICS)
    np.testing.assert_allclose(record.logprobs[boundary:], new[boundary:k], rtol=0, atol=NUMERICS)
    for i in (boundary - 1, boundary):
        assert abs(old[i] - new[i]) > SEPARATION, f"the heads agree at token {i}: the boundary is not pinned"
    # a request that spanned an update is declared a version mix at the cut
    mix = exactness.version_mix(0, 1, 1)
    assert record.inexact == mix

    # the snapshot keeps all of it bit for bit, and dump shows it
    group = GroupRecord(
        group_id="g",
        prompt_token_ids=np.array(PROMPT),
        state=GroupState.IN_FLIGHT,
        dispatch_version=0,
        samples=[record],
    )
    save_snapshot(Snapshot(trainer_step=1, policy_version=1, fingerprints=prints, groups=[group]), tmp_path)
    assert main(["dump", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("g "))
    assert row.split()[5] == "0..1" and row.endswith(mix)
    assert main(["dump", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["in_flight"]["rows"][0]
    assert shown["versions"] == [0, 1] and shown["inexact"] == mix
    assert main(["dump", str(tmp_path), "--request", RID, "--json"]) == 0
    tokens = json.loads(capsys.readouterr().out)["tokens"]
    assert [t["version"] for t in tokens] == record.versions.tolist()

    async def resume():
        llm, engine = await _attach(new_head, 2)
        try:
            saved = load_snapshot(tmp_path, expect=await engine.fingerprints()).groups[0].samples[0]
            assert saved == record
            done = await engine.generate(RID, PROMPT, SAMPLING, index=0, resume_from=saved)
            return done, await _score(llm, PROMPT + done.token_ids.tolist(), "resumed")
        finally:
            await engine.shutdown()

    done, scored = loop_thread.run(resume())
    n = SAMPLING.max_tokens
    assert done.state is SampleState.FINISHED and done.num_tokens == n
    # the saved prefix is kept bit for bit; tokens sampled after the resume carry the resume-time version
    np.testing.assert_array_equal(done.token_ids[:k], record.token_ids)
    np.testing.assert_array_equal(done.logprobs[:k], record.logprobs)
    np.testing.assert_array_equal(done.versions, [0] * boundary + [1] * (k - boundary) + [2] * (n - k))
    np.testing.assert_allclose(done.logprobs[k:], scored[len(PROMPT) - 1 + k :], rtol=0, atol=NUMERICS)
    assert done.inexact == mix
