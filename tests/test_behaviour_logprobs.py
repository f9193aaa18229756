"""Behaviour logprobs on the real engine are of the distribution each token was sampled from.

At temperature 0.7 and top-p 0.9 the engine's recorded logprob of every sampled token must equal an
independent computation: the same tiny Llama run through transformers in float32, logits / T, the
nucleus renormalised. The engine runs in float32 too, so what is left is the engine's own numerics
(measured here: at most 2e-5). The same reference without temperature and nucleus (what vLLM reports
by default, ``raw_logprobs``) is far from the recorded values, so a raw engine fails the comparison;
a raw engine is started to show it, and its snapshot fingerprints refuse a snapshot of the processed
one. The reference GRPO loss's own computation (``sampled_logprobs``) must agree too, so that its
importance ratio is exactly 1 on-policy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from partial_rollout.engine import EngineConfig, ResumableEngine
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
from partial_rollout_integrations.reference_grpo.grpo import sampled_logprobs
from partial_rollout_integrations.reference_grpo.policy import min_tokens_stop_ids

pytestmark = pytest.mark.engine

T, TOP_P = 0.7, 0.9
NOISE = 1e-4
"""Largest |engine - reference| accepted (float32 engine and reference; measured at most 2e-5)."""
PROMPTS = [[5, 6, 7, 8], [100, 200, 300, 17, 9, 250], [42] * 3, list(range(10, 40))]


def _spec(seed: int) -> SamplingSpec:
    return SamplingSpec(max_tokens=40, temperature=T, top_p=TOP_P, seed=seed, ignore_eos=True)


def _run(model: Path, loop_thread, mode: str, tmp_path: Path | None = None):
    config = EngineConfig(
        model=str(model), dtype="float32", max_model_len=256, multiprocessing=False, logprobs_mode=mode
    )

    async def go():
        engine = await ResumableEngine.start(config)
        try:
            done = await asyncio.gather(
                *(engine.generate(f"s{i}", p, _spec(1000 + i), index=0) for i, p in enumerate(PROMPTS))
            )
            return list(done), await engine.fingerprints()
        finally:
            await engine.shutdown()

    return loop_thread.run(go())


def _reference(model, prompt: list[int], completion: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(processed, raw) logprobs of ``completion``: float32 transformers, written without vLLM's code."""
    ids = torch.tensor([prompt + completion.tolist()])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()
    targets = torch.from_numpy(completion.astype(np.int64))
    raw = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    probs = torch.softmax(logits / T, -1)
    descending, order = probs.sort(-1, descending=True)
    above = descending.cumsum(-1) - descending  # mass of the strictly more likely tokens
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above < TOP_P)
    nucleus = torch.where(keep, probs, 0.0)
    processed = (nucleus / nucleus.sum(-1, keepdim=True)).gather(-1, targets[:, None])[:, 0].log()
    return processed.numpy(), raw.numpy()


def test_recorded_logprobs_are_of_the_sampled_distribution(tiny_llama: Path, loop_thread, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    stops = min_tokens_stop_ids(tiny_llama)

    processed, processed_prints = _run(tiny_llama, loop_thread, "processed_logprobs")
    diffs, raw_gaps, loss_diffs = [], [], []
    for prompt, record in zip(PROMPTS, processed, strict=True):
        assert record.num_tokens == 40
        want, raw = _reference(model, prompt, record.token_ids)
        diffs.append(np.abs(record.logprobs - want).max())
        raw_gaps.append(np.abs(raw - want).mean())
        with torch.no_grad():
            ids = torch.tensor([prompt + record.token_ids.tolist()])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            ours = sampled_logprobs(
                logits, torch.from_numpy(record.token_ids.astype(np.int64)), record.sampling, stop_token_ids=stops
            )
        loss_diffs.append(np.abs(ours.numpy() - record.logprobs).max())
    print(f"max |engine - reference| {max(diffs):.2e}; mean |raw - processed| {min(raw_gaps):.3f}..{max(raw_gaps):.3f}")
    assert max(diffs) < NOISE
    assert max(loss_diffs) < NOISE  # the loss's current-policy logprob: ratio 1 on-policy
    assert min(raw_gaps) > 100 * NOISE  # the comparison tells the kinds apart
    assert processed_prints.logprobs_kind == "processed_logprobs"

    # vLLM's default kind is the unscaled model: far from what was sampled, and refused on resume
    raw_records, raw_prints = _run(tiny_llama, loop_thread, "raw_logprobs")
    assert raw_prints.logprobs_kind == "raw_logprobs"
    raw_diffs = [
        np.abs(r.logprobs - _reference(model, p, r.token_ids)[0]).max()
        for p, r in zip(PROMPTS, raw_records, strict=True)
    ]
    assert min(raw_diffs) > 100 * NOISE

    cut = processed[0]
    prefix = type(cut)(
        index=0,
        state=SampleState.IN_FLIGHT,
        sampling=cut.sampling,
        token_ids=cut.token_ids[:10],
        logprobs=cut.logprobs[:10],
        versions=cut.versions[:10],
    )
    group = GroupRecord(
        group_id="g", prompt_token_ids=PROMPTS[0], state=GroupState.IN_FLIGHT, dispatch_version=0, samples=[prefix]
    )
    save_snapshot(Snapshot(trainer_step=1, policy_version=0, fingerprints=processed_prints, groups=[group]), tmp_path)
    assert load_snapshot(tmp_path, expect=processed_prints).groups[0].samples[0] == prefix
    with pytest.raises(SnapshotError) as refused:
        load_snapshot(tmp_path, expect=raw_prints)
    message = str(refused.value)
    assert "fingerprints.logprobs_kind" in message
    assert "'processed_logprobs'" in message and "'raw_logprobs'" in message


def test_loss_logprobs_stay_finite_for_tokens_outside_the_nucleus() -> None:
    """A token the current policy's nucleus no longer keeps gets ratio 0, and gradients stay finite."""
    from partial_rollout_integrations.reference_grpo.grpo import clipped_surrogate_loss

    logits = torch.tensor([[4.0, 3.0, -5.0, 0.0], [0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    spec = SamplingSpec(max_tokens=2, temperature=T, top_p=TOP_P, top_k=3, seed=1, min_tokens=2)
    lp = sampled_logprobs(logits, torch.tensor([2, 1]), spec, stop_token_ids={3})
    assert lp[0] == float("-inf")  # token 2 is outside top-p and top-k
    assert torch.isclose(lp[1], torch.tensor(1 / 3).log())  # token 3 masked by min_tokens, uniform over 3
    loss, _ = clipped_surrogate_loss(
        lp[None], torch.tensor([[-1.0, -1.1]]), torch.tensor([1.0]), torch.ones(1, 2), clip_min=0.2, clip_max=0.2
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
