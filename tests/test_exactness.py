"""The exactness rules and the vLLM version guard (no engine needed)."""

from __future__ import annotations

from types import SimpleNamespace

from partial_rollout.engine import exactness
from partial_rollout.engine.support import TESTED_VLLM_VERSIONS, check_support
from partial_rollout.snapshot import SamplingSpec

_OK = {"ok": True, "runner": "CPUModelRunner"}
_LLM = SimpleNamespace(output_processor=SimpleNamespace(request_states={}))


def test_guard_accepts_tested_version_and_degrades_otherwise() -> None:
    assert check_support(TESTED_VLLM_VERSIONS[0] + "+cpu", [_OK], _LLM).sampler_state
    untested = check_support("0.99.0", [_OK], _LLM)
    assert not untested.sampler_state and "0.99.0" in untested.reason
    broken = check_support(TESTED_VLLM_VERSIONS[0], [{"ok": False, "runner": "X", "reason": "no requests"}], _LLM)
    assert not broken.sampler_state and "no requests" in broken.reason
    no_states = check_support(TESTED_VLLM_VERSIONS[0], [_OK], SimpleNamespace())
    assert not no_states.sampler_state and "request_states" in no_states.reason


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
    assert exactness.inexact_reason(stop, num_tokens=3, sampler_state=None, prefix_text="abc EN", **kw) == \
        exactness.STOP_STRADDLE
    assert exactness.inexact_reason(stop, num_tokens=3, sampler_state=None, prefix_text="abc", **kw) is None


def test_finish_in_prefix() -> None:
    decode = lambda ids: "".join(chr(97 + i % 26) for i in ids)  # noqa: E731
    spec = SamplingSpec(max_tokens=10, temperature=0.0, stop_token_ids=(9,))
    assert exactness.finish_in_prefix([3, 1, 4], spec, eos_token_id=1, decode=decode) == (2, "stop", None)
    assert exactness.finish_in_prefix([3, 9, 4], spec, eos_token_id=1, decode=decode) == (2, "stop", 9)
    min_spec = SamplingSpec(max_tokens=10, temperature=0.0, min_tokens=3)
    assert exactness.finish_in_prefix([1, 4], min_spec, eos_token_id=1, decode=decode) is None  # EOS masked by min_tokens
    ign = SamplingSpec(max_tokens=3, temperature=0.0, ignore_eos=True)
    assert exactness.finish_in_prefix([1, 1], ign, eos_token_id=1, decode=decode) is None
    assert exactness.finish_in_prefix([1, 1, 1], ign, eos_token_id=1, decode=decode) == (3, "length", None)
    text = SamplingSpec(max_tokens=10, temperature=0.0, stop=("cd",))
    assert exactness.finish_in_prefix([0, 2, 3], text, eos_token_id=None, decode=decode) == (3, "stop", "cd")
