"""Stop conditions across a cut, on a real engine: a resumed sample ends exactly where the uninterrupted one did.

vLLM matches stop strings within a request's own output text, and a resumed request's output starts
after the cut, so a stop string that straddles the cut is invisible to it; and vLLM stops on the
generation config's EOS ids, which the tokenizer may not list. The engine here runs a copy of the
tiny Llama whose generation config lists extra EOS ids (half the vocabulary) that its tokenizer
does not; its tokenizer's EOS stays id 1.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer

from partial_rollout.engine import EngineConfig, ResumableEngine
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec

pytestmark = pytest.mark.engine

EXTRA_EOS = frozenset(range(256, 512))
"""Listed by the copy's generation config only (the tiny vocabulary has 512 ids)."""


@pytest.fixture(scope="module")
def extra_eos_model(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = tmp_path_factory.mktemp("extra-eos") / "model"
    shutil.copytree(tiny_llama, model)
    config_path = model / "generation_config.json"
    config = json.loads(config_path.read_text())
    config["eos_token_id"] = [1, *sorted(EXTRA_EOS)]
    config_path.write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def engine(loop_thread, extra_eos_model: Path) -> Iterator[ResumableEngine]:
    config = EngineConfig(model=str(extra_eos_model), max_model_len=1024, multiprocessing=False)
    started = loop_thread.run(ResumableEngine.start(config))
    yield started
    loop_thread.run(started.shutdown())


def _cut(ref: SampleRecord, k: int) -> SampleRecord:
    """What a cut after ``k`` tokens of a greedy sample saves."""
    return SampleRecord(
        index=0,
        state=SampleState.IN_FLIGHT,
        sampling=ref.sampling,
        token_ids=ref.token_ids[:k],
        logprobs=ref.logprobs[:k],
        versions=ref.versions[:k],
    )


def _text(tokenizer: Any, prompt: list[int], tokens: list[int]) -> tuple[str, list[int]]:
    """vLLM's output text (its detokenizer: a decode stream primed with the prompt) and its length after each token."""
    stream = DecodeStream(ids=prompt, skip_special_tokens=True)
    text, ends = "", []
    for t in tokens:
        text += stream.step(tokenizer.backend_tokenizer, t) or ""
        ends.append(len(text))
    return text, ends


def _straddling_stop(tokenizer: Any, prompt: list[int], tokens: list[int]) -> tuple[str, int] | None:
    """A 4-character stop string whose first occurrence spans the end of token K's text, and that K."""
    text, ends = _text(tokenizer, prompt, tokens)
    for k in range(8, len(tokens) - 8):
        cut_at = ends[k - 1]
        stop = text[cut_at - 2 : cut_at + 2]
        if len(stop) == 4 and stop.isprintable() and text.find(stop) == cut_at - 2:
            return stop, k
    return None


async def cut_across_a_stop_string(
    engine: ResumableEngine, tokenizer: Any
) -> tuple[str, int, SampleRecord, SampleRecord]:
    """A greedy sample with a stop string straddling token K, whole and continued from its first K tokens:
    (stop, K, whole, continued). Also tests/test_vllm_core.py's, on every vLLM build."""
    rng = random.Random(3)
    free = SamplingSpec(max_tokens=80, temperature=0.0, ignore_eos=True)  # ignore_eos: no EOS id ends it early
    for attempt in range(20):
        prompt = [rng.randrange(4, 500) for _ in range(12)]
        ref = await engine.generate(f"free-{attempt}", prompt, free, index=0)
        found = _straddling_stop(tokenizer, prompt, ref.token_ids.tolist())
        if found is None:
            continue
        stop, k = found
        spec = SamplingSpec(max_tokens=80, temperature=0.0, ignore_eos=True, stop=(stop,))
        whole = await engine.generate(f"whole-{attempt}", prompt, spec, index=0)
        resumed = await engine.generate(f"resumed-{attempt}", prompt, spec, index=0, resume_from=_cut(whole, k))
        return stop, k, whole, resumed
    raise AssertionError("no greedy generation offered a stop string across a token boundary")


def test_stop_string_straddling_the_cut(loop_thread, engine: ResumableEngine, tiny_llama: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    stop, k, whole, resumed = loop_thread.run(cut_across_a_stop_string(engine, tokenizer))
    # the uninterrupted run stops after the cut point, on the straddling string
    assert whole.finish_reason == "stop" and whole.stop_reason == stop and whole.num_tokens > k
    assert resumed.token_ids.tolist() == whole.token_ids.tolist(), (stop, k)
    assert (resumed.finish_reason, resumed.stop_reason) == ("stop", stop)
    assert resumed.logprobs[:k].tobytes() == whole.logprobs[:k].tobytes()  # the saved prefix, bit for bit


def test_prefix_ending_in_a_generation_config_eos(loop_thread, engine: ResumableEngine) -> None:
    rng = random.Random(4)
    free = SamplingSpec(max_tokens=60, temperature=0.0, ignore_eos=True)  # ignore_eos ignores the extra ids too
    spec = SamplingSpec(max_tokens=60, temperature=0.0)

    async def run():
        for attempt in range(20):
            prompt = [rng.randrange(4, 500) for _ in range(12)]
            ref = (await engine.generate(f"free-{attempt}", prompt, free, index=0)).token_ids.tolist()
            p = next((i for i, t in enumerate(ref) if t in EXTRA_EOS or t == 1), None)
            if p is None or p < 2 or ref[p] == 1:
                continue
            whole = await engine.generate(f"whole-{attempt}", prompt, spec, index=0)
            before = (await engine.progress()).tokens_received
            resumed = await engine.generate(
                f"resumed-{attempt}", prompt, spec, index=0, resume_from=_cut(whole, whole.num_tokens)
            )
            return ref[p], p, whole, resumed, (await engine.progress()).tokens_received - before
        raise AssertionError("no greedy generation reached an extra EOS id after its second token")

    eos, p, whole, resumed, engine_tokens = loop_thread.run(run())
    # what vLLM does uninterrupted: it stops on the generation config's id, and names it as the stop reason
    assert whole.num_tokens == p + 1 and (whole.finish_reason, whole.stop_reason) == ("stop", eos)
    # a cut that raced the engine saved the whole of it: finished as is, nothing resubmitted
    assert resumed.token_ids.tolist() == whole.token_ids.tolist()
    assert (resumed.finish_reason, resumed.stop_reason, resumed.state) == ("stop", eos, SampleState.FINISHED)
    assert engine_tokens == 0


@pytest.fixture(scope="module")
def fp32_engine(loop_thread, tiny_llama: Path) -> Iterator[ResumableEngine]:
    """float32, so that a greedy continuation flips no token (bf16 prefill and decode may differ)."""
    config = EngineConfig(model=str(tiny_llama), max_model_len=1024, dtype="float32", multiprocessing=False)
    started = loop_thread.run(ResumableEngine.start(config))
    yield started
    loop_thread.run(started.shutdown())


def test_a_continuation_stops_where_the_uninterrupted_sample_stops_at_every_cut(
    loop_thread, fp32_engine: ResumableEngine
) -> None:
    """Greedy samples with short stop strings, cut after every one of their tokens and continued.

    The tiny tokenizer is byte-level, so many cuts fall inside a multi-byte character. vLLM decodes a
    continuation's output primed with prompt + prefix; when vLLM matched the stop strings on that
    text, continuations ended early (over 6 prompts x 3 stop strings, 5 of the 18 samples stopped at
    a cut's next token, on a stop string their text never contained); the engine's own scan of the
    whole completion decides instead.
    """
    rng = random.Random(0)
    prompts = [[rng.randrange(4, 512) for _ in range(12)] for _ in range(2)]

    async def run() -> list[tuple[int, str, int, int, int]]:
        wrong = []
        for p, prompt in enumerate(prompts):
            for stop in ("th", "e"):
                spec = SamplingSpec(
                    max_tokens=120, temperature=0.0, stop=(stop,), extra={"include_stop_str_in_output": True}
                )
                whole = await fp32_engine.generate(f"whole-{p}-{stop}", prompt, spec, index=0)
                for k in range(1, whole.num_tokens):
                    resumed = await fp32_engine.generate(
                        f"cut-{p}-{stop}-{k}", prompt, spec, index=0, resume_from=_cut(whole, k)
                    )
                    if resumed.token_ids.tolist() != whole.token_ids.tolist():
                        wrong.append((p, stop, k, resumed.num_tokens, whole.num_tokens))
        return wrong

    assert loop_thread.run(run()) == []
