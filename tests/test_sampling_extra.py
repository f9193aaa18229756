"""Sampling options beyond SamplingSpec's named fields (``extra``), on a real engine.

Stateless options pass and a continuation with them matches the uninterrupted run; options that
read the output so far (``bad_words``) reach vLLM but a cut declares their samples inexact; options
that cannot work with partial rollouts are refused at ``generate``, naming the option, before
anything is submitted.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from partial_rollout.engine import EngineConfig, ResumableEngine, sampling_options
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec

PROMPT = [random.Random(8).randrange(4, 500) for _ in range(12)]


@pytest.fixture(scope="module")
def engine(loop_thread, tiny_llama: Path) -> Iterator[ResumableEngine]:
    config = EngineConfig(model=str(tiny_llama), max_model_len=1024, multiprocessing=False)
    started = loop_thread.run(ResumableEngine.start(config))
    yield started
    loop_thread.run(started.shutdown())


@pytest.mark.engine
def test_stateless_options_pass_and_continue_exactly(loop_thread, engine: ResumableEngine) -> None:
    allowed = list(range(40, 80))
    # JSON-native, as a snapshot stores it: logit_bias keys are strings
    spec = SamplingSpec(
        max_tokens=40,
        temperature=0.0,
        ignore_eos=True,
        extra={"allowed_token_ids": allowed, "logit_bias": {"41": 5.0}, "include_stop_str_in_output": True},
    )

    async def run():
        whole = await engine.generate("whole", PROMPT, spec, index=0)
        k = 17
        cut = SampleRecord(
            index=0,
            state=SampleState.IN_FLIGHT,
            sampling=spec,
            token_ids=whole.token_ids[:k],
            logprobs=whole.logprobs[:k],
            versions=whole.versions[:k],
        )
        return whole, await engine.generate("resumed", PROMPT, spec, index=0, resume_from=cut)

    whole, resumed = loop_thread.run(run())
    assert set(whole.token_ids.tolist()) <= set(allowed)  # the options reached vLLM
    assert resumed.token_ids.tolist() == whole.token_ids.tolist()
    assert resumed.inexact is None


@pytest.mark.engine
def test_bad_words_reach_vllm_and_a_cut_declares_them_inexact(
    loop_thread, engine: ResumableEngine, tiny_llama: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    free = SamplingSpec(max_tokens=30, temperature=0.0, ignore_eos=True)
    long = SamplingSpec(max_tokens=400, temperature=0.0, ignore_eos=True, extra={"bad_words": ["zq"]})

    async def run():
        greedy = (await engine.generate("free", PROMPT, free, index=0)).token_ids.tolist()
        # a token greedy picks that is a word of its own (one token, no leading space): vLLM always masks it
        word, token = next(
            (w, t)
            for t in greedy
            if (w := tokenizer.decode([t])) == w.strip() and tokenizer.encode(w, add_special_tokens=False) == [t]
        )
        spec = SamplingSpec(max_tokens=30, temperature=0.0, ignore_eos=True, extra={"bad_words": [word]})
        banned = await engine.generate("banned", PROMPT, spec, index=0)
        task = asyncio.ensure_future(engine.generate("long", PROMPT, long, index=0))
        while True:  # polling: the engine's counters have no event to wait on
            if (await engine.progress()).live_tokens.get("long", 0) >= 5:
                break
            await asyncio.sleep(0.005)
        cut = await engine.cut()
        await task
        return token, banned, cut.samples["long"]

    token, banned, record = loop_thread.run(run())
    assert token not in banned.token_ids.tolist()  # the option reached vLLM
    assert record.state is SampleState.IN_FLIGHT and record.num_tokens >= 5
    assert record.inexact is not None and "bad_words" in record.inexact


@pytest.mark.engine
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("n", 2),
        ("output_kind", 2),
        ("extra_args", {"my_processor": 1}),
        ("truncate_prompt_tokens", 8),
        ("structured_outputs", {"json": {"type": "object"}}),
        ("no_such_option", 1),
    ],
)
def test_options_that_cannot_work_are_refused_before_submitting(
    loop_thread, engine: ResumableEngine, option: str, value: object
) -> None:
    spec = SamplingSpec(max_tokens=8, temperature=0.0, extra={option: value})

    async def run():
        before = (await engine.progress()).tokens_received
        with pytest.raises(ValueError, match=f"'{option}'") as refused:
            await engine.generate(f"refused-{option}", PROMPT, spec, index=0)
        after = await engine.progress()
        ok = await engine.generate(f"after-{option}", PROMPT, SamplingSpec(max_tokens=4, temperature=0.0), index=0)
        return refused.value, after.tokens_received - before, after.live_tokens, ok

    error, engine_tokens, live, ok = loop_thread.run(run())
    assert "Remove it" in str(error)
    assert engine_tokens == 0 and not live  # nothing was submitted
    assert ok.num_tokens > 0  # and the engine still serves


def test_every_vllm_sampling_option_is_classified() -> None:
    """A vLLM upgrade that adds a SamplingParams field fails here until someone decides what a cut does to it."""
    from vllm import SamplingParams

    named = {"max_tokens", "temperature", "top_p", "top_k", "min_p", "min_tokens", "seed", "stop"}
    named |= {"stop_token_ids", "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs"}
    fields = {f for f in SamplingParams.__struct_fields__ if not f.startswith("_")}
    classified = set(sampling_options.STATELESS) | set(sampling_options.INEXACT) | set(sampling_options.REFUSED)
    assert fields - named - classified == set()
    kinds = [set(sampling_options.STATELESS), set(sampling_options.INEXACT), set(sampling_options.REFUSED)]
    assert sum(map(len, kinds)) == len(classified)  # each option in one class only
