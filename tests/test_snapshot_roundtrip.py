"""Saving then loading gives back exactly what was saved, compactly, for any valid snapshot."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from safetensors.numpy import load_file
from snapshot_helpers import (
    VOCAB,
    bytes_per_token,
    example_snapshot,
    fingerprints,
    read_file,
    replace_samples,
    snapshots,
)
from torchdata.stateful_dataloader import StatefulDataLoader

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import (
    SNAPSHOT_FILENAME,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    SnapshotReader,
    container,
    load_snapshot,
    save_snapshot,
)
from partial_rollout.snapshot.checksum import metadata_checksum, tensor_checksum
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
    assert loaded == snap and loaded.groups == () and loaded.loader_state is None


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
    with_state = replace_samples(realistic_snapshot(16, 100), lambda s: dataclasses.replace(s, sampler_state=state))
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


# -- 0-d loader tensors and numpy scalars, through a real file --------------------------------


def _save_and_load(tmp_path: Path, loader_state: dict[str, Any], *, same: bool = True) -> dict[str, Any]:
    path = tmp_path / SNAPSHOT_FILENAME
    save_snapshot(example_snapshot(loader_state=loader_state), path)
    with SnapshotReader(path) as reader:  # the dump's path: open lazily, stream every checksum
        reader.verify_checksums()
        assert reader.group_ids == [g.group_id for g in example_snapshot().groups]
    loaded = load_snapshot(path).loader_state
    assert isinstance(loaded, dict) and (states_equal(loaded, loader_state) or not same)
    return loaded


def test_zero_d_loader_tensors_round_trip(tmp_path: Path) -> None:
    """0-d numpy arrays and torch tensors (the spec allows any shape) load back with dtype, shape () and value."""
    state = {
        "np_int": np.array(7),
        "np_f32": np.array(-0.0, dtype=np.float32),
        "np_nan": np.array(np.nan),
        "np_bool": np.array(True),
        "torch_int": torch.tensor(5),
        "torch_bf16": torch.tensor(-1.5, dtype=torch.bfloat16),
        "torch_u8": torch.tensor(255, dtype=torch.uint8),
        "with_1d": [np.arange(3, dtype=np.int16), torch.zeros(0, dtype=torch.float32)],
    }
    back = _save_and_load(tmp_path, state)
    for key, dtype, value in (
        ("np_int", np.int64, 7),
        ("np_f32", np.float32, -0.0),
        ("np_bool", np.bool_, True),
    ):
        got = back[key]
        assert type(got) is np.ndarray and got.dtype == dtype and got.shape == (), key
        assert got.tobytes() == np.array(value, dtype=dtype).tobytes(), key  # bit for bit (-0.0 stays -0.0)
    assert type(back["np_nan"]) is np.ndarray and back["np_nan"].dtype == np.float64 and back["np_nan"].shape == ()
    assert np.isnan(back["np_nan"])
    for key, dtype, value in (
        ("torch_int", torch.int64, 5),
        ("torch_bf16", torch.bfloat16, -1.5),
        ("torch_u8", torch.uint8, 255),
    ):
        got = back[key]
        assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == (), key
        assert got.item() == value, key
    assert back["with_1d"][0].tolist() == [0, 1, 2] and back["with_1d"][1].shape == (0,)


def _rewrite_keeping_shapes(path: Path, out: Path, edit: Any) -> Path:
    """Like snapshot_helpers.rewrite (every checksum recomputed), but a 0-d tensor stays 0-d."""
    arrays, meta = read_file(path)
    edit(arrays)
    checksums = {k: tensor_checksum(v) for k, v in sorted(arrays.items())}
    meta["checksums"] = json.dumps({"algorithm": "crc32", "metadata": metadata_checksum(meta), "tensors": checksums})
    container.write_file(out, arrays, meta)
    return out


def _refused(path: Path) -> SnapshotError:
    with pytest.raises(SnapshotError) as info:
        load_snapshot(path)
    assert str(path) in str(info.value), str(info.value)
    return info.value


def test_zero_d_tensor_where_the_format_wants_one_dimension_is_refused(tmp_path: Path) -> None:
    """Fixed tensors stay strictly 1-D and bytes stay 1-D U8: a 0-d one is a SnapshotError, never IndexError."""
    saved = tmp_path / "good.safetensors"
    save_snapshot(example_snapshot(loader_state={"b": b"\x07", "x": np.array(1)}), saved)

    def zero_d(name: str) -> Any:
        return lambda arrays: arrays.__setitem__(name, np.ascontiguousarray(arrays[name].reshape(-1)[0]).reshape(()))

    for name in ("group.state", "group.id_offsets", "sample.state", "sample.tokens", "sample.reward"):
        error = _refused(_rewrite_keeping_shapes(saved, tmp_path / f"{name}.safetensors", zero_d(name)))
        assert error.field == name and "must be one-dimensional, got shape []" in str(error), str(error)
    error = _refused(_rewrite_keeping_shapes(saved, tmp_path / "bytes.safetensors", zero_d("loader.0")))  # b"\x07"
    assert error.field == "loader_state" and "bytes must be stored one-dimensional" in str(error), str(error)
    bad_dtype = _rewrite_keeping_shapes(
        saved, tmp_path / "dtype.safetensors", lambda a: a.__setitem__("loader.1", np.array(1.0))
    )
    error = _refused(bad_dtype)
    assert error.field == "loader_state" and "stored as float64, expected int64" in str(error), str(error)


NUMPY_SCALARS = {
    "f64": np.float64(0.1),
    "f64_neg_zero": np.float64(-0.0),
    "f64_subnormal": np.float64(5e-324),
    "f64_max": np.float64(np.finfo(np.float64).max),
    "f64_nan": np.float64(np.nan),
    "f64_inf": np.float64(np.inf),
    "f64_neg_inf": np.float64(-np.inf),
    "f32": np.float32(0.1),
    "f32_nan": np.float32(np.nan),
    "f16": np.float16(-0.0),
    "int_": np.int_(-(2**63)),
    "i32": np.int32(-7),
    "u64": np.uint64(2**64 - 1),
    "u8": np.uint8(255),
    "bool_": np.bool_(True),
}


def test_numpy_scalars_keep_their_type(tmp_path: Path) -> None:
    """Every numpy scalar, np.float64 (a float subclass) included, loads back as itself, bit for bit."""
    state = {"scalars": dict(NUMPY_SCALARS), "plain": 0.1, "in_list": [np.float64(2.5), 2.5]}
    tree, _ = encode(state)
    assert tree["scalars"]["f64"] == {"__type__": "numpy_scalar", "dtype": "float64", "value": 0.1}
    assert tree["scalars"]["f64_nan"]["value"] == {"__type__": "float", "value": "nan"}
    assert tree["plain"] == 0.1 and tree["in_list"][1] == 2.5
    back = _save_and_load(tmp_path, state)
    for key, value in NUMPY_SCALARS.items():
        got = back["scalars"][key]
        assert type(got) is type(value), f"{key}: {type(got).__name__} is not {type(value).__name__}"
        assert got.dtype == value.dtype and got.tobytes() == value.tobytes(), f"{key}: {got!r} != {value!r}"
    assert type(back["in_list"][0]) is np.float64 and back["in_list"][0] == 2.5
    assert type(back["plain"]) is float and type(back["in_list"][1]) is float


def test_numpy_scalars_the_spec_table_does_not_list_keep_todays_behaviour(tmp_path: Path) -> None:
    """np.str_ and np.bytes_ (no safetensors dtype) are stored as str and bytes; complex scalars are refused."""
    back = _save_and_load(tmp_path, {"s": np.str_("\u00e9t\u00e9"), "b": np.bytes_(b"\x00ab")}, same=False)
    assert type(back["s"]) is str and back["s"] == "\u00e9t\u00e9"
    assert type(back["b"]) is bytes and back["b"] == b"\x00ab"
    for value in (np.complex128(1 + 2j), np.complex64(1j), 1 + 2j):
        with pytest.raises(ValueError, match=r"loader_state\['c'\]"):
            encode({"c": value})


def test_files_written_before_the_numpy_scalar_fix_still_read_as_they_did() -> None:
    """An np.float64 saved by the old codec is a plain JSON number: it still loads as a plain float."""
    back = decode({"old_f64": 0.1, "old_nan": {"__type__": "float", "value": "nan"}}, {})
    assert type(back["old_f64"]) is float and back["old_f64"] == 0.1
    assert type(back["old_nan"]) is float and back["old_nan"] != back["old_nan"]
