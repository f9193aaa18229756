"""When a continuation from a saved prefix equals the uninterrupted generation, and when it cannot.

A resumed sample is a *new* vLLM request whose prompt is ``prompt + prefix``. It reproduces the
uninterrupted run token for token when (a) the model gives the same logits for the prefix whether
it was decoded incrementally or prefilled at once (observed bit-identical on vLLM's CPU kernels with
the tiny models; a property of kernels, not a theorem), and (b) the sampler makes the same draws.
(b) holds for greedy sampling, and for seeded sampling once the request's generator state is
restored. It fails where vLLM's sampling depends on what counts as *output*, or on a generator the
request does not own. Each such case is named here and recorded per sample as ``inexact``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from partial_rollout.snapshot import SamplingSpec

BATCH_LOGPROB_TOLERANCE = 0.1
"""Largest |logprob difference| counted as a match between a continuation and the uninterrupted run.

vLLM's CPU kernels are not batch-invariant: one request's logprobs move in the last bits with the
batch it shares a step with, in uninterrupted runs too (measured up to 0.038 in bf16 on this
project's CPU machines; see docs/exact_resume.md). Under the same batch composition the difference
is exactly 0."""

PENALTIES = "presence/frequency penalties count only output tokens; after a resume the prefix is prompt"
UNSEEDED = "unseeded sampling draws from the engine's shared generator, which a resume cannot restore"
STOP_STRADDLE = "the prefix ends inside a possible stop string, which vLLM only matches within output text"


def no_sampler_state(why: str) -> str:
    return f"seeded sampling without a saved sampler state ({why})"


def version_mix(lo: int, hi: int, now: int) -> str:
    return f"prefix sampled under policy versions {lo}..{hi} is re-prefilled under version {now}"


def inexact_reason(
    sampling: SamplingSpec,
    *,
    num_tokens: int,
    sampler_state: bytes | None,
    capture_unsupported: str | None,
    prefix_text: str | None = None,
) -> str | None:
    """Why continuing this sample after ``num_tokens`` tokens cannot be exact, or ``None``.

    A sample cut before its first token (``num_tokens == 0``) restarts from scratch with a fresh
    generator from its seed, which is exact except for unseeded sampling.
    """
    if not sampling.is_greedy and sampling.seed is None:
        return UNSEEDED
    if num_tokens == 0:
        return None
    if sampling.presence_penalty or sampling.frequency_penalty:
        return PENALTIES
    if not sampling.is_greedy and sampler_state is None:
        return no_sampler_state(capture_unsupported or "not captured")
    if prefix_text is not None and any(
        prefix_text.endswith(stop[:i]) for stop in sampling.stop for i in range(1, len(stop))
    ):
        return STOP_STRADDLE
    return None


def finish_in_prefix(
    token_ids: Sequence[int],
    sampling: SamplingSpec,
    *,
    eos_token_id: int | None,
    decode: Callable[[Sequence[int]], str],
) -> tuple[int, str, int | str | None] | None:
    """Where a saved prefix already ends the generation: ``(length to keep, finish_reason, stop_reason)``.

    A cut can race the engine: the last token of a prefix may be EOS, a stop token, or complete a
    stop string, or the prefix may already fill ``max_tokens``. Such a sample is finished, not
    resumed (resubmitting it would generate past its end).
    """
    stop_ids = set(sampling.stop_token_ids)
    if eos_token_id is not None and not sampling.ignore_eos:
        stop_ids.add(eos_token_id)
    for i, tok in enumerate(token_ids):
        if i + 1 >= sampling.min_tokens and tok in stop_ids:
            return i + 1, "stop", None if tok == eos_token_id and not sampling.ignore_eos else int(tok)
    if sampling.stop and len(token_ids) >= max(1, sampling.min_tokens):
        text = decode(token_ids)
        hits = [(text.find(s), s) for s in sampling.stop if s in text]
        if hits:
            return len(token_ids), "stop", min(hits)[1]
    if len(token_ids) >= sampling.max_tokens:
        return len(token_ids), "length", None
    return None
