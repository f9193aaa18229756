"""GRPO's two formulas: group-normalised advantages and the clipped surrogate on per-token ratios."""

from __future__ import annotations

import torch

ADVANTAGE_EPS = 1e-4
"""Added to a group's reward std so a group with equal rewards gets zero advantages, not NaN."""


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` within each group; ``rewards`` is [groups, samples]."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + ADVANTAGE_EPS)


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
