"""GRPO's formulas: group-normalised advantages, the sampled distribution's logprobs, and the clipped surrogate.

The engine reports each sampled token's logprob under the distribution it was drawn from (vLLM's
``processed_logprobs``: the model's logits after min-tokens masking, temperature, min-p, top-k and
top-p, renormalised). An importance ratio is only unbiased when the trained policy's logprob is of
the same distribution, so :func:`sampled_logprobs` applies the same processing, in vLLM's order and
with its tie rules, to the trainer's logits.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from partial_rollout.snapshot import SamplingSpec

ADVANTAGE_EPS = 1e-4
"""Added to a group's reward std so a group with equal rewards gets zero advantages, not NaN."""


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` within each group; ``rewards`` is [groups, samples]."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + ADVANTAGE_EPS)


def sampled_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, sampling: SamplingSpec, *, stop_token_ids: Collection[int]
) -> torch.Tensor:
    """Log-probability of each target token under the distribution vLLM samples it from.

    The same steps as vLLM's sampler (0.32) with ``logprobs_mode="processed_logprobs"``: stop tokens
    masked while the completion is shorter than ``min_tokens``; then, unless greedy (vLLM keeps
    temperature 1 and no filter for greedy requests), logits / temperature, min-p, top-k (keep every
    logit >= the k-th largest) and top-p (sort ascending, drop tokens whose cumulative probability is
    <= 1 - p, always keep the most likely); then log-softmax. The selections are not differentiated
    through; a target the current policy no longer keeps gets ``-inf`` (its ratio is 0).

    Args:
        logits: [tokens, vocab], row ``j`` predicting completion token ``j`` (requires grad).
        targets: [tokens] completion token ids.
        sampling: the sample's sampling parameters.
        stop_token_ids: what vLLM masks for ``min_tokens``: the tokenizer's EOS, the generation
            config's EOS ids and ``sampling.stop_token_ids`` (EOS even with ``ignore_eos``, as vLLM does).

    Raises:
        ValueError: the sample used a processing step this function does not reproduce (penalties,
            which depend on the prompt and output so far; options in ``sampling.extra``).
    """
    for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        if getattr(sampling, name) != neutral:
            raise ValueError(
                f"sampling.{name}={getattr(sampling, name)} is not reproduced by the reference GRPO loss; "
                "its importance ratio would be biased. Train without penalties"
            )
    if sampling.extra:
        raise ValueError(
            f"sampling.extra {sorted(sampling.extra)} is not reproduced by the reference GRPO loss; "
            "its importance ratio could be biased. Train without extra sampling options"
        )
    x = logits.float() if sampling.is_greedy else logits.float() / sampling.temperature
    with torch.no_grad():  # which tokens the sampler keeps: a selection, not differentiated through
        drop = torch.zeros_like(x, dtype=torch.bool)
        stops = [t for t in set(stop_token_ids) | set(sampling.stop_token_ids) if 0 <= t < x.shape[-1]]
        if sampling.min_tokens and stops:
            drop[: sampling.min_tokens, stops] = True
        kept = x.masked_fill(drop, float("-inf"))
        if not sampling.is_greedy and sampling.min_p > 0:
            probs = torch.softmax(kept, dim=-1)
            drop = drop | (probs < probs.amax(dim=-1, keepdim=True) * sampling.min_p)
            kept = x.masked_fill(drop, float("-inf"))
        if not sampling.is_greedy and 0 < sampling.top_k < x.shape[-1]:
            drop = drop | (kept < kept.topk(sampling.top_k, dim=-1).values[:, -1:])
            kept = x.masked_fill(drop, float("-inf"))
        if not sampling.is_greedy and sampling.top_p < 1:
            ascending, order = kept.sort(dim=-1)
            low = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - sampling.top_p
            low[:, -1] = False
            drop = drop | torch.zeros_like(drop).scatter(-1, order, low)
    return torch.log_softmax(x.masked_fill(drop, float("-inf")), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def clipped_surrogate_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_min: float,
    clip_max: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped objective with per-token importance ratios against the behaviour policy.

    The behaviour logprobs are what the engine reported for each sampled token, under whichever
    policy version sampled it, so a sample that spans weight updates is corrected token by token.
    ``logprobs`` must be of the same distribution (:func:`sampled_logprobs`), else the ratio is
    biased by the temperature and the top-p/top-k renormalisation even on-policy.
    Each sample's loss is its mean over its tokens (GRPO's sequence-level mean), then samples are
    averaged, so a long completion does not outweigh the short ones of its group.

    Args:
        logprobs: [samples, tokens] under the policy being trained (requires grad).
        behaviour_logprobs: [samples, tokens] from generation.
        advantages: [samples], one per sample.
        mask: [samples, tokens], 1 for generated tokens, 0 for padding.
        clip_min, clip_max: the ratio is clipped to ``[1 - clip_min, 1 + clip_max]``.

    Returns:
        The loss and metrics (mean ratio, share of clipped tokens).
    """
    ratio = torch.exp(logprobs - behaviour_logprobs)
    adv = advantages.unsqueeze(1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_min, 1.0 + clip_max) * adv
    per_token = -torch.minimum(unclipped, clipped)
    per_sample = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
    loss = per_sample.mean()
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1)
        metrics = {
            "ratio_mean": float((ratio * mask).sum() / tokens),
            "clip_fraction": float(((unclipped != clipped).float() * mask).sum() / tokens),
        }
    return loss, metrics
