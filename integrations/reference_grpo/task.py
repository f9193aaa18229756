"""The toy task: a verifiable reward a tiny random model learns in minutes, with long-tailed lengths.

Prompt ``[bos, m+b, m+b, m+b]`` names a residue class ``b`` in ``0..num_buckets-1`` (``m`` is a
fixed marker offset). The reward is the share of the first ``reward_tokens`` generated tokens
``t`` with ``t % num_buckets == b``: about ``1/num_buckets`` for a random policy, 1 when the policy
has learned to answer in the named class. GRPO lifts it from ~0.2 to ~0.8 within a few dozen
steps of the tiny Llama on CPU.

Each prompt also draws its completion budget from a Pareto tail (``ignore_eos``, so every sample
runs to its budget): most groups are short, a few are ten times longer. Those long groups are the
ones in flight when a checkpoint fires, which is the bias the partial-rollout flag removes. Each
sample then gets between half and all of its prompt's budget, so the samples of a group finish at
different times and a save also catches partly finished groups.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from partial_rollout.snapshot import SamplingSpec, sample_seed
from partial_rollout_integrations.reference_grpo.config import DataConfig

MARKER = 400
"""Token id offset of the class markers in the prompt (ordinary tokens of the tiny vocabulary)."""
BOS = 0


class BucketTask(Dataset[dict[str, Any]]):
    """``num_prompts`` deterministic prompts; item ``i`` is a JSON-native dict (it travels in snapshots)."""

    def __init__(self, config: DataConfig, *, seed: int) -> None:
        self.config = config
        self.seed = seed

    def __len__(self) -> int:
        return self.config.num_prompts

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = random.Random(self.seed * 1_000_003 + index)
        bucket = rng.randrange(self.config.num_buckets)
        budget = self.config.min_tokens * (1.0 - rng.random()) ** (-1.0 / self.config.length_tail_alpha)
        return {
            "index": index,
            "prompt_token_ids": [BOS] + [MARKER + bucket] * 3,
            "bucket": bucket,
            "max_tokens": int(min(self.config.max_tokens, budget)),
        }


def collate(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep the batch a list of dicts (the default collate would stack them into tensors)."""
    return items


def reward(item: dict[str, Any], token_ids: np.ndarray, *, num_buckets: int, reward_tokens: int) -> float:
    """Share of the first ``reward_tokens`` tokens in the named class."""
    head = np.asarray(token_ids[:reward_tokens])
    return float(np.mean(head % num_buckets == item["bucket"])) if len(head) else 0.0


def sampling_specs(
    item: dict[str, Any], group_id: str, *, n: int, temperature: float, seed: int, min_tokens: int
) -> list[SamplingSpec]:
    """One seeded spec per sample. The seed (the library's :func:`sample_seed`) and the budget derive from
    the run seed, the group id and the index, so a regenerated or resumed sample draws from the same
    stream as the original."""
    specs = []
    for i in range(n):
        digest = hashlib.sha256(f"{seed}/{group_id}/{i}".encode()).digest()
        share = 0.5 + 0.5 * digest[4] / 255
        specs.append(
            SamplingSpec(
                max_tokens=max(min_tokens, round(item["max_tokens"] * share)),
                temperature=temperature,
                ignore_eos=True,
                seed=sample_seed(seed, group_id, i),
            )
        )
    return specs
