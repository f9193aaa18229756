"""Saving then loading gives back exactly what was saved, compactly, for any valid snapshot."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from safetensors.numpy import load_file
from snapshot_helpers import VOCAB, bytes_per_token, example_snapshot, fingerprints, read_file, snapshots
from torchdata.stateful_dataloader import StatefulDataLoader

from partial_rollout.snapshot import (
    SNAPSHOT_FILENAME,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    SnapshotReader,
    load_snapshot,
    save_snapshot,
)
from partial_rollout.snapshot.runs import decode_runs, encode_runs
from partial_rollout.snapshot.state_codec import decode, encode, states_equal
from partial_rollout.snapshot.writer import encode_snapshot


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(snapshots())
def test_roundtrip_any_snapshot(snap: Snapshot) -> None:
    """Any valid snapshot (empty, zero-length prefixes, non-ASCII text, every state) loads back equal."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / SNAPSHOT_FILENAME
        size = save_snapshot(snap, path)
        assert size == path.stat().st_size
        loaded = load_snapshot(path)
        assert loaded == snap
        assert loaded.counts() == snap.counts()
        assert load_snapshot(folder) == snap  # the checkpoint folder works as well as the file
        with SnapshotReader(path) as reader:
            for group in snap.groups:
                assert reader.group(group.group_id) == group


def test_roundtrip_keeps_types_and_dtypes(tmp_path: Path) -> None:
    """Arrays come back with the stored dtypes, optional fields keep None, seeds stay per sample."""
    snap = example_snapshot()
    save_snapshot(snap, tmp_path / "s.safetensors")
    loaded = load_snapshot(tmp_path / "s.safetensors")
    assert loaded == snap
    flight = loaded.groups[2].samples[0]
    assert (
        flight.token_ids.dtype == np.int32 and flight.logprobs.dtype == np.float32 and flight.versions.dtype == np.int32
    )
    assert flight.versions.tolist() == [2, 2, 3, 3]
    assert flight.sampling.seed is None and flight.sampling.is_greedy
    assert [s.sampling.seed for s in loaded.groups[1].samples] == [1000, 1001, 1002]
    assert loaded.groups[1].samples[1].sampler_state == b"\x01" * 16
    assert loaded.groups[3].samples[1].reward == 1.0 and loaded.groups[3].samples[1].stop_reason == 1
    assert loaded.groups[0].dispatch_version == -1
    assert isinstance(loaded.loader_state["seen"], tuple)


def test_empty_snapshot(tmp_path: Path) -> None:
    """A snapshot with no group at all (a checkpoint with nothing in flight) saves and loads."""
    snap = Snapshot(trainer_step=0, policy_version=0, fingerprints=fingerprints())
    save_snapshot(snap, tmp_path)
    assert (tmp_path / SNAPSHOT_FILENAME).is_file()
    loaded = load_snapshot(tmp_path)
    assert loaded == snap and loaded.groups == [] and loaded.loader_state is None


def test_file_is_plain_safetensors(tmp_path: Path) -> None:
    """The official safetensors reader opens our files and sees the documented tensors, no pickle."""
    snap = example_snapshot()
    save_snapshot(snap, tmp_path / "s.safetensors")
    arrays, metadata = read_file(tmp_path / "s.safetensors")
    assert metadata["format"] == "partial-rollout-snapshot" and metadata["format_version"] == "1"
    assert arrays["sample.tokens"].dtype == np.int32 and arrays["sample.logprobs"].dtype == np.float32
    expected_tokens = np.concatenate([s.token_ids for _, s in snap.iter_samples()])
    np.testing.assert_array_equal(arrays["sample.tokens"], expected_tokens)
    np.testing.assert_array_equal(arrays["group.sample_offsets"], [0, 2, 5, 6, 8])
    assert b"pickle" not in (tmp_path / "s.safetensors").read_bytes()[:4096]
    ours, _ = encode_snapshot(snap)
    assert sorted(ours) == sorted(load_file(tmp_path / "s.safetensors"))


def test_save_into_folder_and_reuse_path(tmp_path: Path) -> None:
    """Saving into a checkpoint folder writes partial_rollouts.safetensors; saving again replaces it."""
    save_snapshot(example_snapshot(trainer_step=1), tmp_path)
    save_snapshot(example_snapshot(trainer_step=2), tmp_path)
    assert load_snapshot(tmp_path).trainer_step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [SNAPSHOT_FILENAME]


def test_versions_are_run_length_coded() -> None:
    """Runs never cross samples, empty samples have none, and decoding restores every value."""
    samples = [np.array(v, dtype=np.int32) for v in ([3, 3, 4, 4, 4], [], [4], [4, 4, 2, 2, 5])]
    offsets, values, lengths = encode_runs(samples)
    assert offsets.tolist() == [0, 2, 2, 3, 6]
    assert values.tolist() == [3, 4, 4, 4, 2, 5] and lengths.tolist() == [2, 3, 1, 2, 2, 1]
    np.testing.assert_array_equal(decode_runs(values, lengths), np.concatenate(samples))


def realistic_snapshot(num_samples: int, num_tokens: int, *, group_size: int = 8, prompt: int = 64) -> Snapshot:
    """In-flight GRPO groups; one weight update mid-flight in every fourth sample; no sampler state."""
    rng = np.random.default_rng(0)
    groups = []
    for g in range(num_samples // group_size):
        samples = []
        for i in range(group_size):
            versions = np.full(num_tokens, 10, dtype=np.int32)
            if i % 4 == 0:
                versions[: num_tokens // 3] = 9
            samples.append(
                SampleRecord(
                    index=i,
                    state=SampleState.IN_FLIGHT,
                    sampling=SamplingSpec(max_tokens=4096, temperature=1.0, seed=g * group_size + i),
                    token_ids=rng.integers(0, VOCAB, num_tokens, dtype=np.int32),
                    logprobs=-rng.random(num_tokens, dtype=np.float32),
                    versions=versions,
                )
            )
        groups.append(
            GroupRecord(
                group_id=f"prompt-{g:05d}",
                prompt_token_ids=rng.integers(0, VOCAB, prompt, dtype=np.int32),
                data={"task": "math", "answer": str(g)},
                state=GroupState.IN_FLIGHT,
                dispatch_version=9,
                samples=samples,
            )
        )
    return Snapshot(trainer_step=100, policy_version=10, fingerprints=fingerprints(), groups=groups)


def test_compact_bytes_per_token(tmp_path: Path) -> None:
    """Tokens and logprobs cost 4 bytes each, versions next to nothing, fixed costs stay small.

    A generated token's marginal cost is exactly 8 bytes (a format storing versions per token, or
    logprobs as float64, would cost 12); everything else (offsets, codes, seeds, prompts shared by
    8 samples, the header) adds under 0.3 bytes per token at 500 tokens per sample.
    """
    short, long = realistic_snapshot(200, 500), realistic_snapshot(200, 1000)
    short_size = save_snapshot(short, tmp_path / "short.safetensors")
    long_size = save_snapshot(long, tmp_path / "long.safetensors")
    marginal = (long_size - short_size) / (200 * 500)
    assert 8.0 <= marginal <= 8.0 + 1e-3
    assert bytes_per_token(short_size, short) <= 8.3
    assert bytes_per_token(long_size, long) <= 8.15


def test_sampler_state_costs_its_bytes(tmp_path: Path) -> None:
    """A 5056-byte sampler state (a torch MT19937 generator) adds 5056 bytes plus one offset."""
    snap = realistic_snapshot(16, 100)
    state = torch.Generator().manual_seed(1).get_state().numpy().tobytes()
    assert len(state) == 5056
    with_state = realistic_snapshot(16, 100)
    for _, s in with_state.iter_samples():
        s.sampler_state = state
    plain = save_snapshot(snap, tmp_path / "a.safetensors")
    stateful = save_snapshot(with_state, tmp_path / "b.safetensors")
    assert stateful - plain == pytest.approx(16 * 5056, abs=64)
    assert load_snapshot(tmp_path / "b.safetensors") == with_state


def test_100k_samples_keep_the_header_small(tmp_path: Path) -> None:
    """100,000 samples live in flat tensors: the header stays a few KB, far under safetensors' 100 MB."""
    spec = SamplingSpec(max_tokens=8)
    groups = [
        GroupRecord(
            group_id=f"g{g}",
            prompt_token_ids=[g % VOCAB],
            data={"i": g},
            state=GroupState.IN_FLIGHT,
            dispatch_version=0,
            samples=[
                SampleRecord(
                    index=i,
                    state=SampleState.IN_FLIGHT,
                    sampling=spec.with_seed(g * 4 + i),
                    token_ids=[i],
                    logprobs=[-1.0],
                    versions=[0],
                    sampler_state=b"\x07" * 8,
                )
                for i in range(4)
            ],
        )
        for g in range(25_000)
    ]
    snap = Snapshot(trainer_step=1, policy_version=0, fingerprints=fingerprints(), groups=groups)
    path = tmp_path / "big.safetensors"
    start = time.perf_counter()
    save_snapshot(snap, path)
    with SnapshotReader(path) as reader:
        assert reader.num_samples == 100_000 and reader.num_groups == 25_000
        header = int.from_bytes(path.read_bytes()[:8], "little")
        assert header < 16_384
        assert reader.group("g24999") == groups[-1]
    loaded = load_snapshot(path)
    assert loaded.counts()["samples_in_flight"] == 100_000
    assert loaded.groups[12345] == groups[12345]
    assert time.perf_counter() - start < 60


def _batches(loader: StatefulDataLoader, n: int) -> list[list[int]]:
    it = iter(loader)
    return [next(it).tolist() for _ in range(n)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_from_saved_cursor(tmp_path: Path, num_workers: int) -> None:
    """A shuffled StatefulDataLoader's mid-epoch state survives the file: a fresh loader continues identically."""

    def make() -> StatefulDataLoader:
        return StatefulDataLoader(list(range(64)), batch_size=4, shuffle=True, num_workers=num_workers)

    loader = make()
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    expected = [next(it).tolist() for _ in range(5)]

    save_snapshot(example_snapshot(loader_state=state), tmp_path)
    restored = load_snapshot(tmp_path).loader_state
    assert states_equal(restored, state)
    fresh = make()
    fresh.load_state_dict(restored)
    assert _batches(fresh, 5) == expected


def test_state_codec_preserves_types() -> None:
    """Tuples, non-str keys, NaN, bytes, numpy scalars, torch vs numpy and exotic dtypes all survive."""
    state = {
        "t": torch.arange(4, dtype=torch.bfloat16),
        "scalar": torch.tensor(5),
        "np": np.ones((2, 3), dtype=np.float16),
        "tuple": (1, (2.5, "x")),
        7: [None, True, 2**80, float("nan"), float("-inf")],
        "__type__": "a user key that looks like a tag",
        "bytes": b"\x00\xff",
        "np_scalar": np.int16(-3),
    }
    tree, tensors = encode(state)
    back = decode(tree, tensors)
    assert states_equal(back, state)
    assert back["t"].dtype == torch.bfloat16 and back["scalar"].shape == () and isinstance(back["np"], np.ndarray)
    assert isinstance(back["tuple"][1], tuple) and isinstance(back["np_scalar"], np.int16)
    assert not states_equal(back, {**state, "tuple": [1, [2.5, "x"]]})


def test_state_codec_refuses_what_needs_pickle() -> None:
    """An object only pickle could store is refused with its path in the state."""
    with pytest.raises(ValueError, match=r"loader_state\['sampler'\]\['gen'\].*without pickle"):
        encode({"sampler": {"gen": torch.Generator()}})
    with pytest.raises(ValueError, match="dtype object"):
        encode({"x": np.array([object()])})


def test_state_codec_rejects_inconsistent_references() -> None:
    """A decoded tree must use every stored tensor exactly once, with the dtype it names."""
    tree, tensors = encode({"a": np.arange(3)})
    with pytest.raises(ValueError, match="not referenced"):
        decode(tree, {**tensors, "loader.9": np.zeros(1)})
    with pytest.raises(ValueError, match="stored as int32, expected int64"):
        decode(tree, {"loader.0": np.arange(3, dtype=np.int32)})
    with pytest.raises(ValueError, match="does not hold"):
        decode(tree, {})


def test_state_codec_refuses_a_state_nested_too_deeply() -> None:
    """Nesting past Python's recursion limit is a ValueError (a bad state), not a RecursionError."""
    deep: list = []
    for _ in range(5_000):
        deep = [deep]
    with pytest.raises(ValueError, match="loader_state is nested too deeply to store"):
        encode({"deep": deep})
    with pytest.raises(ValueError, match="loader_state is nested too deeply to decode"):
        decode({"deep": deep}, {})
    with pytest.raises(ValueError, match="metadata is nested too deeply"):
        Snapshot(trainer_step=0, policy_version=0, fingerprints=fingerprints(), metadata={"deep": deep})
