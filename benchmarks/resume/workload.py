"""The workload: GRPO-style prompt groups whose samples are cut at a chosen prefix length.

Every dispatched group has a prefix target K, spread uniformly over [0.5 L, 1.5 L] around the
sweep point's mean prefix length L; the dispatch is staggered (:mod:`benchmarks.resume.phases`) so
that at the cut every sample of the group has generated K tokens. The remainder R after the cut is
long-tailed (lognormal, mean 0.5 L, clipped to [16, 2 L] and to the context), so each sample gets
its own ``max_tokens = K + R``: that is how the length distribution is shaped (``ignore_eos``, so a
sample always runs to its budget). Sampling is seeded per sample at temperature 1, so the same
sample can be finished three ways (uninterrupted, continue, regenerate) and compared token by token.
A few more groups (1/8 as many, at least one) are yielded but not dispatched: pending at the cut.

This module also maps the workload onto the snapshot format: the snapshot written at the cut, the
benchmark's own counters stored in it, and the list of samples a restart must finish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from partial_rollout.ledger import request_id
from partial_rollout.snapshot import (
    Fingerprints,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
)

MIN_REMAINDER = 16
"""Fewest tokens a sample still generates after the cut."""


@dataclass
class Group:
    group_id: str
    prompt: list[int]
    specs: list[SamplingSpec]
    prefix_target: int
    """Tokens each sample should have generated at the cut (0 for pending groups)."""
    pending: bool = False

    def rid(self, index: int) -> str:
        return request_id(self.group_id, index)


def build_workload(
    num_in_flight: int,
    mean_prefix: int,
    *,
    group_size: int,
    prompt_tokens: int,
    max_model_len: int,
    vocab_size: int,
    seed: int,
) -> list[Group]:
    """Dispatched groups (``num_in_flight`` samples) plus pending ones (1/8 as many groups, at least one)."""
    rng = np.random.default_rng([seed, num_in_flight, mean_prefix])
    num_groups = max(1, math.ceil(num_in_flight / group_size))
    num_pending = max(1, num_groups // 8)
    low, high = (3, vocab_size) if vocab_size < 1000 else (100, min(vocab_size, 32_000))
    mean_r = 0.5 * mean_prefix
    sigma = 1.0
    mu = math.log(mean_r) - sigma**2 / 2
    budget = max_model_len - prompt_tokens
    if int(1.5 * mean_prefix) + MIN_REMAINDER > budget:
        raise ValueError(
            f"mean prefix {mean_prefix}: 1.5 x prefix + {MIN_REMAINDER} + prompt {prompt_tokens} exceeds"
            f" --max-model-len {max_model_len}"
        )
    groups = []
    for g in range(num_groups + num_pending):
        pending = g >= num_groups
        k = int(rng.integers(max(1, mean_prefix // 2), int(1.5 * mean_prefix) + 1))
        size = group_size if pending or g < num_groups - 1 else num_in_flight - group_size * (num_groups - 1)
        specs = []
        for _ in range(size):
            r = int(np.clip(rng.lognormal(mu, sigma), MIN_REMAINDER, 2 * mean_prefix))
            total = min(k + r, budget)
            specs.append(
                SamplingSpec(max_tokens=total, temperature=1.0, seed=int(rng.integers(2**31)), ignore_eos=True)
            )
        groups.append(
            Group(
                group_id=f"{'pending' if pending else 'prompt'}-{g:04d}",
                prompt=rng.integers(low, high, prompt_tokens).tolist(),
                specs=specs,
                prefix_target=0 if pending else k,
                pending=pending,
            )
        )
    return groups


def bench_counters(groups: list[Group], cut: dict[str, SampleRecord]) -> dict[str, int]:
    """The benchmark's own account of the cut, stored in the snapshot and checked after load."""
    in_flight = [r for r in cut.values() if r.state is SampleState.IN_FLIGHT]
    pending = [g for g in groups if g.pending]
    return {
        "bench_groups_dispatched": sum(not g.pending for g in groups),
        "bench_groups_pending": len(pending),
        "bench_samples_in_flight": len(in_flight),
        "bench_samples_finished": sum(r.state is SampleState.FINISHED for r in cut.values()),
        "bench_samples_not_started": sum(r.state is SampleState.NOT_STARTED for r in cut.values())
        + sum(len(g.specs) for g in pending),
        "bench_prefix_tokens": sum(r.num_tokens for r in in_flight),
    }


def build_snapshot(
    fingerprints: Fingerprints, groups: list[Group], cut: dict[str, SampleRecord], counters: dict[str, int]
) -> Snapshot:
    """The checkpoint a trainer would write at the cut: dispatched groups from ``cut``, pending ones not started."""
    records = []
    for g in groups:
        if g.pending:
            samples = [SampleRecord(index=i, state=SampleState.NOT_STARTED, sampling=s) for i, s in enumerate(g.specs)]
            records.append(
                GroupRecord(
                    group_id=g.group_id,
                    prompt_token_ids=np.asarray(g.prompt, dtype=np.int32),
                    state=GroupState.PENDING,
                    samples=samples,
                    data={"bench": "resume_throughput"},
                )
            )
            continue
        samples = [cut[g.rid(i)] for i in range(len(g.specs))]
        state = GroupState.READY if all(s.state is SampleState.FINISHED for s in samples) else GroupState.IN_FLIGHT
        records.append(
            GroupRecord(
                group_id=g.group_id,
                prompt_token_ids=np.asarray(g.prompt, dtype=np.int32),
                state=state,
                dispatch_version=0,
                samples=samples,
                data={"bench": "resume_throughput"},
            )
        )
    return Snapshot(
        trainer_step=1,
        policy_version=0,
        fingerprints=fingerprints,
        groups=records,
        counters=counters,
        metadata={"bench": "resume_throughput"},
    )


class Recovered(NamedTuple):
    """A sample a restart must finish: its request id, its group's prompt, and its saved record."""

    rid: str
    prompt: list[int]
    sample: SampleRecord


def recovered(snapshot: Snapshot) -> list[Recovered]:
    """Every sample a restart must finish: in-flight and pending groups' unfinished samples."""
    return [
        Recovered(request_id(g.group_id, s.index), g.prompt_token_ids.tolist(), s)
        for g, s in snapshot.iter_samples(SampleState.IN_FLIGHT, SampleState.NOT_STARTED)
    ]
