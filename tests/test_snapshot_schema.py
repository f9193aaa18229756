"""The in-memory model refuses a bad snapshot where it is built, naming the field."""

from __future__ import annotations

import copy
import pickle
from dataclasses import FrozenInstanceError, replace
from typing import Any

import numpy as np
import pytest
from snapshot_helpers import example_snapshot, fingerprints, sample

from partial_rollout.snapshot import (
    Fingerprints,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
)

SPEC = SamplingSpec(max_tokens=4)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": 0}, "sampling.max_tokens must be >= 1"),
        ({"max_tokens": True}, "sampling.max_tokens must be an int"),
        ({"temperature": -0.1}, "sampling.temperature must be >= 0"),
        ({"temperature": float("nan")}, "sampling.temperature must be finite"),
        ({"top_p": 0.0}, r"sampling.top_p must be in \(0, 1\]"),
        ({"top_k": -2}, "sampling.top_k must be >= -1"),
        ({"min_p": 1.5}, r"sampling.min_p must be in \[0, 1\]"),
        ({"min_tokens": 9}, "sampling.min_tokens must be <= 4"),
        ({"seed": 2**63}, "sampling.seed must be <="),
        ({"stop": "eos"}, "not one string"),
        ({"stop": ("",)}, "must not be empty"),
        ({"stop_token_ids": (-1,)}, "sampling.stop_token_ids must be >= 0"),
        ({"presence_penalty": 3.0}, r"sampling.presence_penalty must be in \[-2, 2\]"),
        ({"repetition_penalty": 0.0}, "sampling.repetition_penalty must be > 0"),
        ({"extra": {"top_p": 0.5}}, "must not repeat a named field"),
        ({"extra": {"bad": (1, 2)}}, "sampling.extra must be JSON-native"),
        ({"ignore_eos": 1}, "sampling.ignore_eos must be a bool"),
    ],
)
def test_sampling_spec_rejects(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingSpec(**{"max_tokens": 4, **fields})


def test_sampling_spec_json_and_seed() -> None:
    spec = SamplingSpec(
        max_tokens=8, temperature=0.5, stop=["\u00e9nd"], stop_token_ids=[2], seed=3, extra={"bad_words": ["x"]}
    )
    assert spec.stop == ("\u00e9nd",) and spec.stop_token_ids == (2,)
    assert SamplingSpec.from_json(spec.to_json()) == spec
    assert SamplingSpec.from_json({"max_tokens": 8}) == SamplingSpec(max_tokens=8)
    with pytest.raises(ValueError, match="unknown sampling parameters"):
        SamplingSpec.from_json({"max_tokens": 8, "best_of": 2})
    reseeded = spec.with_seed(9)
    assert reseeded.seed == 9 and spec.seed == 3 and reseeded.unseeded_key() == spec.unseeded_key()
    assert SamplingSpec(max_tokens=8, temperature=0.9).unseeded_key() != spec.unseeded_key()
    assert SamplingSpec(max_tokens=1, temperature=0.0).is_greedy and not spec.is_greedy
    with pytest.raises(ValueError, match="sampling.seed"):
        spec.with_seed(2**64)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"token_ids": [1, 2], "logprobs": [-1.0], "versions": [0, 0]}, "equal lengths"),
        ({"token_ids": [1] * 5, "logprobs": [-1.0] * 5, "versions": [0] * 5}, "exceed sampling.max_tokens 4"),
        ({"token_ids": [-1], "logprobs": [-1.0], "versions": [0]}, "token_ids must be >= 0"),
        ({"token_ids": [2**31], "logprobs": [-1.0], "versions": [0]}, "token_ids must fit in int32"),
        ({"token_ids": [1.5], "logprobs": [-1.0], "versions": [0]}, "token_ids must hold integers"),
        ({"token_ids": [1], "logprobs": [0.1], "versions": [0]}, "logprobs must be finite and <= 0"),
        ({"token_ids": [1], "logprobs": [float("-inf")], "versions": [0]}, "logprobs must be finite"),
        ({"token_ids": [1], "logprobs": [-1.0], "versions": [-1]}, "versions must be >= 0"),
        ({"token_ids": [[1]], "logprobs": [-1.0], "versions": [0]}, "one-dimensional"),
        ({"finish_reason": "stop"}, "finish_reason must be None while the sample is in_flight"),
        ({"reward": 1.0}, "reward must be None while"),
        ({"sampler_state": b""}, "sampler_state must not be empty"),
        ({"inexact": ""}, "inexact must be a non-empty reason"),
        ({"stop_reason": True}, "stop_reason must be an int"),
    ],
)
def test_sample_record_rejects(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SampleRecord(**{"index": 0, "state": SampleState.IN_FLIGHT, "sampling": SPEC, **fields})


def test_sample_record_state_rules() -> None:
    with pytest.raises(ValueError, match="a finished sample needs a finish_reason"):
        SampleRecord(index=0, state=SampleState.FINISHED, sampling=SPEC)
    with pytest.raises(ValueError, match="a not_started sample has no tokens"):
        SampleRecord(index=0, state="not_started", sampling=SPEC, token_ids=[1], logprobs=[-1.0], versions=[0])
    record = SampleRecord(
        index=0,
        state="finished",
        sampling=SPEC,
        token_ids=[1, 2],
        logprobs=[-1, -2],
        versions=[0, 1],
        finish_reason="stop",
    )
    assert record.state is SampleState.FINISHED and record.logprobs.dtype == np.float32 and record.remaining_tokens == 2
    strided = np.arange(8, dtype=np.int32)[::2]  # a view the writer could not stream: copied to contiguous
    record = SampleRecord(
        index=0, state="in_flight", sampling=SPEC, token_ids=strided, logprobs=[-1.0] * 4, versions=strided
    )
    assert record.token_ids.flags.c_contiguous and record.token_ids.tolist() == [0, 2, 4, 6]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"group_id": ""}, "group_id must not be empty"),
        ({"prompt_token_ids": []}, "prompt_token_ids must not be empty"),
        ({"data": {"t": (1,)}}, "data must be JSON-native"),
        ({"data": {1: "x"}}, "data must be JSON-native"),
        ({"data": {"x": float("nan")}}, "data must be JSON-native"),
        ({"samples": []}, "at least one sample"),
        ({"samples": [sample(1, SampleState.NOT_STARTED)]}, "samples must be in index order"),
        ({"dispatch_version": 0}, "a pending group has dispatch_version -1"),
        ({"samples": [sample(0, SampleState.IN_FLIGHT, 1)]}, "every sample of a pending group must be not_started"),
        ({"state": GroupState.IN_FLIGHT}, "needs dispatch_version >= 0"),
        ({"state": GroupState.READY, "dispatch_version": 0}, "every sample of a ready group must be finished"),
    ],
)
def test_group_record_rejects(fields: dict[str, Any], message: str) -> None:
    base = {
        "group_id": "g",
        "prompt_token_ids": [1],
        "state": GroupState.PENDING,
        "samples": [sample(0, SampleState.NOT_STARTED)],
    }
    with pytest.raises(ValueError, match=message):
        GroupRecord(**{**base, **fields})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda g: g[1].samples[1].token_ids.__setitem__(0, 1000), "token id 1000 >= fingerprints.vocab_size 1000"),
        (lambda g: g[1].samples[1].versions.__setitem__(0, 4), "version 4 > policy_version 3"),
        (lambda g: g.__setitem__(1, replace(g[1], dispatch_version=9)), "dispatch_version 9 > policy_version 3"),
        (lambda g: g[0].prompt_token_ids.__setitem__(0, 5000), "prompt token id 5000"),
        (lambda g: g.__setitem__(2, replace(g[2], group_id="ready-3")), "appears twice"),
    ],
)
def test_snapshot_checks_groups_against_its_fingerprints(change: Any, message: str) -> None:
    """Token ids must be below the vocabulary, versions at most the policy version, ids unique."""
    groups = list(example_snapshot().groups)
    change(groups)
    with pytest.raises(ValueError, match=message):
        example_snapshot(groups=groups)


def test_snapshot_rejects_bad_extras() -> None:
    with pytest.raises(ValueError, match=r"counters\['yielded'\] must be >= 0"):
        example_snapshot(counters={"yielded": -1})
    with pytest.raises(ValueError, match="metadata must be JSON-native"):
        example_snapshot(metadata={"when": object()})
    with pytest.raises(ValueError, match="without pickle"):
        example_snapshot(loader_state={"lock": object()})
    with pytest.raises(ValueError, match="policy_version must be <="):
        example_snapshot(policy_version=2**31)


def test_snapshot_counts_and_iterators() -> None:
    snap = example_snapshot()
    assert snap.counts() == {
        "groups_pending": 1,
        "groups_in_flight": 2,
        "groups_ready": 1,
        "samples_not_started": 3,
        "samples_in_flight": 2,
        "samples_finished": 3,
        "groups_partial": 1,
        "tokens": 20,
        "tokens_in_flight": 9,
    }
    in_flight = [(g.group_id, s.index) for g, s in snap.iter_samples(SampleState.IN_FLIGHT)]
    assert in_flight == [("partial-1", 1), ("flight-2", 0)]
    assert [g.group_id for g in snap.iter_groups(GroupState.PENDING, GroupState.READY)] == ["pending-0", "ready-3"]


def test_records_are_frozen_and_every_copy_is_built_by_the_constructor() -> None:
    """A record is valid for as long as it exists: no field can be assigned, and a copy or an
    unpickled record (one a Ray actor sent) goes through the checks of a new one."""
    snap = example_snapshot()
    with pytest.raises(FrozenInstanceError):
        snap.groups[0].state = GroupState.READY  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        snap.groups[1].samples[0].reward = 1.0  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        snap.trainer_step = 5  # type: ignore[misc]
    assert isinstance(snap.groups, tuple) and isinstance(snap.groups[1].samples, tuple)
    assert pickle.loads(pickle.dumps(snap)) == snap and copy.deepcopy(snap) == snap
    rebuild, (cls, fields) = snap.groups[1].samples[1].__reduce__()
    positive = np.full(len(fields["logprobs"]), 0.5, np.float32)
    with pytest.raises(ValueError, match="logprobs must be finite and <= 0, got 0.5 at position 0"):
        rebuild(cls, {**fields, "logprobs": positive})


def test_equality_is_exact() -> None:
    """Equality compares arrays by dtype and value, so a round-trip test cannot pass by accident."""
    a, b = example_snapshot(), example_snapshot()
    assert a == b
    b.groups[1].samples[1].logprobs[0] = -0.75
    assert a != b
    c = example_snapshot()
    c.loader_state["generator"] = c.loader_state["generator"].astype(np.int64)
    assert a != c


def test_fingerprints() -> None:
    fp = fingerprints(extra={"world_size": "8"})
    assert Fingerprints.from_json(fp.to_json()) == fp
    assert fp.mismatches(fingerprints(extra={"world_size": "8"}, model_path="/moved")) == []
    assert fp.mismatches(fingerprints(tokenizer="sha256:x", vocab_size=5)) == [
        "tokenizer",
        "vocab_size",
        "extra.world_size",
    ]
    with pytest.raises(ValueError, match="fingerprints.vocab_size must be >= 1"):
        fingerprints(vocab_size=0)
    with pytest.raises(ValueError, match="unknown fingerprint keys"):
        Fingerprints.from_json({**fp.to_json(), "gpu": "h100"})


def test_snapshot_requires_fingerprints() -> None:
    with pytest.raises(ValueError, match="fingerprints must be a Fingerprints"):
        Snapshot(trainer_step=0, policy_version=0, fingerprints={"model": "m"})  # type: ignore[arg-type]


def test_example_snapshot_covers_every_state() -> None:
    """The shared example must exercise every state, or tests built on it prove less than they claim."""
    snap = example_snapshot()
    assert {g.state for g in snap.groups} == set(GroupState)
    assert {s.state for _, s in snap.iter_samples()} == set(SampleState)
    assert any(g.is_partial for g in snap.groups)
