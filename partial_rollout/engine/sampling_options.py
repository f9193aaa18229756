"""Which vLLM sampling options beyond :class:`SamplingSpec`'s named fields may reach vLLM, at what cost to a resume.

``SamplingSpec.extra`` holds further ``SamplingParams`` fields. A resumed sample is a new request
whose prompt is ``prompt + prefix`` and whose output starts after the cut, so an option that reads
the output so far or keeps state across steps behaves differently after a resume, and one the
adapter sets itself, or that rewrites the prompt, breaks the request. Every option of the tested
vLLM (0.32) is classified below; an option not listed is refused, since nobody has checked what a
cut does to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATELESS: Mapping[str, str] = {
    "logit_bias": "a fixed bias per token id, the same at every step",
    "allowed_token_ids": "a fixed mask, the same at every step",
    "skip_special_tokens": "changes the text only (stop strings are matched on the same text after a resume)",
    "spaces_between_special_tokens": "changes the text only (as skip_special_tokens)",
    "include_stop_str_in_output": "changes the text only; records keep the same tokens either way",
    "detokenize": "changes the text only (without text, stop strings do not apply, before or after a cut)",
    "skip_reading_prefix_cache": "a cache policy: the same logits either way",
}
"""Options that pass through unchanged: they do not depend on which tokens count as output."""

INEXACT: Mapping[str, str] = {
    "bad_words": "vLLM matches multi-token bad words within output tokens only: after a resume a bad word"
    " begun in the prefix (now prompt) is not blocked",
    "repetition_detection": "vLLM looks for repetitions within output tokens only: after a resume the prefix"
    " (now prompt) is not searched",
    "watermarking": "the watermark draws from a function of the context, not from the seeded noise a resume continues",
}
"""Options that pass through, but whose continuation after a cut can differ from the uninterrupted
run; a sample cut after its first token records the reason in ``inexact``."""

REFUSED: Mapping[str, str] = {
    "n": "each sample is its own request (a group's samples are separate SampleRecords)",
    "output_kind": "the adapter streams deltas itself (it must see every token as it is sampled)",
    "extra_args": "the adapter passes a resumed request's generator state in extra_args (Model Runner V1), and"
    " vLLM's per-request logits processors read their state from it, which a cut cannot save",
    "truncate_prompt_tokens": "it would cut the resubmitted prompt + prefix of a resumed sample",
    "structured_outputs": "the grammar's state cannot be carried across a cut: a resumed request would restart"
    " the grammar at the prefix's end",
    "thinking_token_budget": "vLLM counts thinking tokens in the output only: after a resume the budget restarts",
    "stream_interval": "vLLM's front end would hold sampled tokens back until several accumulate, and a weight"
    " update labels versions by the tokens received before it",
    "flat_logprobs": "the adapter reads logprobs in vLLM's default per-token form",
    "prompt_logprobs": "records hold no prompt logprobs (and after a resume the prompt includes the prefix)",
    "prompt_logprob_token_ids": "records hold no prompt logprobs",
    "prompt_logprob_start": "records hold no prompt logprobs",
    "logprob_token_ids": "records hold the sampled token's logprob only",
    "trace_decode_token_ids": "forced decoding replaces sampling, so there is no rollout to resume",
    "routed_experts_prompt_start": "records hold no expert routing",
    "skip_clone": "vLLM-internal",
    "output_text_buffer_length": "vLLM-internal",
}
"""Options refused before anything is submitted, with why."""


def check(extra: Mapping[str, Any]) -> None:
    """Refuse options that cannot work with partial rollouts, naming each with why.

    Raises:
        ValueError: an option in ``REFUSED``, or one this module does not know.
    """
    bad = []
    for name in sorted(extra):
        if name in REFUSED:
            bad.append(f"{name!r} ({REFUSED[name]})")
        elif name not in STATELESS and name not in INEXACT:
            bad.append(f"{name!r} (not a vLLM 0.32 sampling option that partial-rollout has checked across a cut)")
    if bad:
        raise ValueError(
            f"sampling.extra: {'; '.join(bad)}. Remove it from the sampling parameters; options that pass:"
            f" {sorted(STATELESS)}, and, declared inexact across a cut: {sorted(INEXACT)}"
        )


def inexact_reason(extra: Mapping[str, Any]) -> str | None:
    """Why a continuation with these options can differ from the uninterrupted run, or ``None``."""
    names = [name for name in sorted(extra) if name in INEXACT]
    return "; ".join(f"sampling.extra[{name!r}]: {INEXACT[name]}" for name in names) or None


def to_vllm(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The options as ``SamplingParams`` keywords (JSON keys are strings; vLLM's ``logit_bias`` wants token ids)."""
    out = dict(extra)
    if "logit_bias" in out:
        bias = out["logit_bias"]
        try:
            out["logit_bias"] = {int(token): float(value) for token, value in bias.items()}
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"sampling.extra['logit_bias'] must map token ids to numbers, got {bias!r}") from None
    return out
